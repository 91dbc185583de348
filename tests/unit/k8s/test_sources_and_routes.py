"""Prometheus credentials from a Secret, pod scraping of a Deployment, traffic-mix routes."""

from __future__ import annotations

import base64

import httpx
import pytest

from spectune.api.spec import ScrapeMetrics, SecretKeyRef
from spectune.errors import NoDataError
from spectune.k8s.routes import RouteWatch, decode_mix, encode_mix, mix_distance, mix_of
from spectune.k8s.sources import AuthSecretError, PodsScrapeSource, auth_headers, pod_urls


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def test_bearer_token_from_the_named_key() -> None:
    secret = {"type": "Opaque", "data": {"prom": _b64("s3cret\n")}}
    assert auth_headers(secret, SecretKeyRef(name="p", key="prom")) == {
        "Authorization": "Bearer s3cret"
    }


def test_basic_auth_from_a_basic_auth_secret() -> None:
    secret = {"type": "kubernetes.io/basic-auth",
              "data": {"username": _b64("ops"), "password": _b64("pa:ss")}}  # fmt: skip
    header = auth_headers(secret, SecretKeyRef(name="p"))["Authorization"]
    assert base64.b64decode(header.removeprefix("Basic ")).decode() == "ops:pa:ss"


def test_a_missing_key_names_the_field_and_the_keys_there_are() -> None:
    with pytest.raises(AuthSecretError) as err:
        auth_headers({"data": {"password": _b64("x")}}, SecretKeyRef(name="prom-auth"))
    msg = str(err.value)
    assert "spec.metrics.prometheus.authSecretRef.key" in msg
    assert "prom-auth" in msg and "'token'" in msg and "password" in msg


def _pod(name: str, ip: str | None, ready: bool = True, phase: str = "Running") -> dict:  # type: ignore[type-arg]
    return {"metadata": {"name": name},
            "status": {"phase": phase, "podIP": ip,
                       "conditions": [{"type": "Ready", "status": str(ready)}]}}  # fmt: skip


def test_only_serving_pods_are_scraped() -> None:
    pods = [
        _pod("a", "10.0.0.7"),
        _pod("b", "10.0.0.8", ready=False),
        _pod("c", None),
        _pod("d", "fd00::1"),
        _pod("e", "10.0.0.9", phase="Pending"),
    ]
    assert pod_urls(pods, ScrapeMetrics(port=8000, path="/m")) == [
        "http://10.0.0.7:8000/m",
        "http://[fd00::1]:8000/m",
    ]


PAGE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} %d
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} %d
"""


async def test_scrape_source_reads_the_pods_of_the_deployment_twice() -> None:
    """The pods' metrics pages come from a fake HTTP transport (no network)."""
    calls: list[str] = []
    pages = iter([PAGE % (3, 100), PAGE % (5, 400)])

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        return httpx.Response(200, text=next(pages))

    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    async def pods() -> list[dict]:  # type: ignore[type-arg]
        return [_pod("llama-1", "10.0.0.7")]

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        src = PodsScrapeSource(pods, ScrapeMetrics(port=8000), "Deployment llama", sleep, client)
        obs = await src.observe(30.0)
    assert calls == ["http://10.0.0.7:8000/metrics"] * 2 and slept == [30.0]
    assert obs.generation_tokens == 300


async def test_scrape_source_without_serving_pods_has_no_data() -> None:
    async def pods() -> list[dict]:  # type: ignore[type-arg]
        return [_pod("llama-1", "10.0.0.7", ready=False)]

    async def sleep(s: float) -> None:
        return None

    src = PodsScrapeSource(pods, ScrapeMetrics(port=8000), "Deployment llama", sleep)
    with pytest.raises(NoDataError, match="no Running and Ready pod of Deployment llama"):
        await src.observe(30.0)


# -- routes ---------------------------------------------------------------------------------------


def test_mix_round_trips_and_drops_nan_and_negative() -> None:
    rows = [
        {"metric": {"route": "a"}, "value": [0, "1"]},
        {"metric": {"route": "b"}, "value": [0, "NaN"]},
        {"metric": {"route": "c"}, "value": [0, "-2"]},
        {"metric": {"route": "d"}, "value": [0, "3"]},
    ]
    mix = mix_of(rows)
    assert mix == {"route=a": 0.25, "route=d": 0.75}
    assert decode_mix(encode_mix(mix)) == mix
    assert decode_mix("sha-abc") is None and decode_mix("") is None


async def test_many_routes_fit_the_status_field() -> None:
    """400 routes do not fit: the smallest are summed as (other), and the same mix read
    again is no route change."""
    mix = {f"route=r{i:04d}": (i + 1) / 80200 for i in range(400)}
    text = encode_mix(mix)
    assert len(text) <= 1000 and "(other)" in text
    assert abs(sum(decode_mix(text).values()) - 1) < 0.02  # type: ignore[union-attr]
    rows = [{"metric": {"route": f"r{i:04d}"}, "value": [0, str(i + 1)]} for i in range(400)]
    moves: list[float] = []

    async def query(_: str) -> list[dict]:  # type: ignore[type-arg]
        return rows

    watch = RouteWatch(query, "q", 0.05, lambda d, old, new: moves.append(d))
    assert await watch.routes(text) == text and not moves


def test_distance_is_half_the_absolute_share_changes() -> None:
    assert mix_distance({"a": 1.0}, {"a": 1.0}) == 0.0
    assert mix_distance({"a": 0.5, "b": 0.5}, {"a": 0.5, "c": 0.5}) == 0.5


async def test_route_watch_keeps_the_reference_until_the_move_passes_the_threshold() -> None:
    answers = [[{"metric": {"r": "x"}, "value": [0, "1"]}]]
    moves: list[float] = []

    async def query(_: str) -> list[dict]:  # type: ignore[type-arg]
        return answers[0]

    watch = RouteWatch(query, "q", 0.25, lambda d, old, new: moves.append(d))
    ref = await watch.routes(None)
    assert decode_mix(ref) == {"r=x": 1.0}
    answers[0] = [{"metric": {"r": "x"}, "value": [0, "8"]},
                  {"metric": {"r": "y"}, "value": [0, "2"]}]  # fmt: skip
    assert await watch.routes(ref) == ref and not moves  # 0.2 ≤ 0.25
    answers[0] = [{"metric": {"r": "y"}, "value": [0, "1"]}]
    new = await watch.routes(ref)
    assert new != ref and moves == [1.0]
    answers[0] = []
    assert await watch.routes(new) == new
