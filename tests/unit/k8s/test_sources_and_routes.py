"""Prometheus credentials from a Secret, pod scraping of a Deployment, traffic-mix routes."""

from __future__ import annotations

import base64

import httpx
import pytest

from spectune.api.spec import ScrapeMetrics, SecretKeyRef
from spectune.errors import NoDataError, SpecError
from spectune.k8s import sources
from spectune.k8s.routes import RouteWatch, decode_mix, encode_mix, mix_distance, mix_of
from spectune.k8s.sources import (
    ANNOTATION_PROMETHEUS_URL,
    LABEL_CREDENTIALS,
    AuthSecretError,
    PodsScrapeSource,
    auth_headers,
    check_url_allowed,
    pod_urls,
    prometheus_headers,
    url_allowed,
)


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


def test_a_missing_key_names_the_field_and_the_key_but_never_the_secrets_other_keys() -> None:
    """The status is read by whoever may read the SpecTuning, who may not read the Secret:
    naming the keys it has would tell them what it holds."""
    secret = {"data": {"password": _b64("x"), "aws-secret-access-key": _b64("y")}}
    with pytest.raises(AuthSecretError) as err:
        auth_headers(secret, SecretKeyRef(name="prom-auth"))
    msg = str(err.value)
    assert "spec.metrics.prometheus.authSecretRef.key" in msg
    assert "prom-auth" in msg and "'token'" in msg
    assert "password" not in msg and "aws-secret-access-key" not in msg


# -- credentials confinement (issue O item 1) ------------------------------------------------------

TOKEN = "s3cret-token-of-another-team"


def _secret(
    labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict:  # type: ignore[type-arg]
    meta: dict[str, object] = {"name": "db-creds", "namespace": "ns"}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "type": "Opaque", "data": {"token": _b64(TOKEN)}}


@pytest.fixture
def secret_store(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict]:  # type: ignore[type-arg]
    """A fake of the Secret reads (no API server): name → Secret as the API returns it."""
    from kubernetes.client.exceptions import ApiException

    store: dict[str, dict] = {}  # type: ignore[type-arg]

    def read_json(call: object, name: str, namespace: str) -> dict:  # type: ignore[type-arg]
        if name not in store:
            raise ApiException(status=404, reason="Not Found")
        return store[name]

    monkeypatch.setattr(sources, "read_json", read_json)
    return store


REF = SecretKeyRef(name="db-creds")
URL = "http://prometheus.monitoring:9090"


async def test_a_secret_that_did_not_opt_in_is_never_used(secret_store: dict) -> None:  # type: ignore[type-arg]
    """A SpecTuning naming any Secret of its namespace no longer gets it sent as a bearer
    token: without the label nothing of it is used, and the message is the one a missing
    Secret gets (a SpecTuning cannot probe which Secrets exist)."""
    secret_store["db-creds"] = _secret()
    with pytest.raises(AuthSecretError) as unlabelled:
        await prometheus_headers(None, "ns", REF, URL)  # type: ignore[arg-type]
    secret_store["db-creds"] = _secret({LABEL_CREDENTIALS: "yes"})
    with pytest.raises(AuthSecretError) as wrong_value:
        await prometheus_headers(None, "ns", REF, URL)  # type: ignore[arg-type]
    del secret_store["db-creds"]
    with pytest.raises(AuthSecretError) as missing:
        await prometheus_headers(None, "ns", REF, URL)  # type: ignore[arg-type]
    assert str(unlabelled.value) == str(missing.value) == str(wrong_value.value)
    msg = str(unlabelled.value)
    assert LABEL_CREDENTIALS in msg and "spec.metrics.prometheus.authSecretRef" in msg
    assert TOKEN not in msg


async def test_a_secret_that_opted_in_gives_the_header(secret_store: dict) -> None:  # type: ignore[type-arg]
    secret_store["db-creds"] = _secret({LABEL_CREDENTIALS: "true"})
    headers = await prometheus_headers(None, "ns", REF, URL)  # type: ignore[arg-type]
    assert headers == {"Authorization": f"Bearer {TOKEN}"}


async def test_a_secret_bound_to_a_url_is_sent_to_no_other(secret_store: dict) -> None:  # type: ignore[type-arg]
    """The Secret's own annotation names where it may go; a SpecTuning pointing the URL at
    its author's listener gets an error, not the token."""
    secret_store["db-creds"] = _secret(
        {LABEL_CREDENTIALS: "true"}, {ANNOTATION_PROMETHEUS_URL: URL + "/"}
    )
    headers = await prometheus_headers(None, "ns", REF, "http://PROMETHEUS.monitoring:9090")  # type: ignore[arg-type]
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    for elsewhere in ("http://attacker.example:9090", "http://prometheus.monitoring:9091",
                      "https://prometheus.monitoring:9090", URL + "/other"):  # fmt: skip
        with pytest.raises(AuthSecretError, match=r"spec\.metrics\.prometheus\.url") as err:
            await prometheus_headers(None, "ns", REF, elsewhere)  # type: ignore[arg-type]
        assert TOKEN not in str(err.value) and ANNOTATION_PROMETHEUS_URL in str(err.value)


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://prom.monitoring:9090", True),
        ("http://prom.monitoring:9090/", True),
        ("http://PROM.monitoring:9090/prometheus", True),
        ("http://prom.monitoring:9090.attacker.example", False),
        ("http://prom.monitoring:9090@attacker.example", False),
        ("http://prom.monitoring:9091", False),
        ("https://prom.monitoring:9090", False),
        ("http://prom.monitoringx:9090", False),
        ("http://thanos.monitoring/query/api", True),
        ("http://thanos.monitoring/query-evil", False),
        ("http://thanos.monitoring:80/query", True),
    ],
)
def test_the_url_allowlist_matches_origins_and_paths_at_a_slash(url: str, allowed: bool) -> None:
    allowlist = ["http://prom.monitoring:9090", "http://thanos.monitoring/query"]
    assert url_allowed(url, allowlist) is allowed


def test_a_url_off_the_allowlist_is_a_spec_error_naming_the_field_and_the_setting() -> None:
    with pytest.raises(SpecError) as err:
        check_url_allowed("http://attacker.example:9090", ["http://prom.monitoring:9090"])
    msg = str(err.value)
    assert "spec.metrics.prometheus.url" in msg and "SPECTUNE_PROMETHEUS_URL_ALLOWLIST" in msg
    check_url_allowed("http://anything.example", [])  # no list: every URL


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


async def test_a_ca_bundle_comes_only_from_an_opted_in_secret_holding_pem(
    secret_store: dict,  # type: ignore[type-arg]
) -> None:
    """tls.caSecretRef: the Secret must opt in as credentials do, and hold PEM; each problem
    names the field, and the Secret's data is never repeated."""
    from spectune.api.spec import CaSecretRef, PrometheusTLS
    from spectune.k8s.sources import prometheus_tls

    tls = PrometheusTLS(ca_secret_ref=CaSecretRef(name="ca"))
    secret_store["ca"] = {"metadata": {"name": "ca"}, "data": {"ca.crt": _b64("x")}}
    with pytest.raises(AuthSecretError, match=LABEL_CREDENTIALS):
        await prometheus_tls(None, "ns", tls)  # type: ignore[arg-type]
    secret_store["ca"]["metadata"]["labels"] = {LABEL_CREDENTIALS: "true"}
    with pytest.raises(AuthSecretError, match=r"tls\.caSecretRef: .*not PEM") as err:
        await prometheus_tls(None, "ns", tls)  # type: ignore[arg-type]
    assert "'x'" not in str(err.value)
    other = PrometheusTLS(ca_secret_ref=CaSecretRef(name="ca", key="root.pem"))
    with pytest.raises(AuthSecretError, match=r"tls\.caSecretRef\.key: .*no key 'root\.pem'"):
        await prometheus_tls(None, "ns", other)  # type: ignore[arg-type]
    skip = await prometheus_tls(None, "ns", PrometheusTLS(insecure_skip_verify=True))  # type: ignore[arg-type]
    assert skip.verify_mode.name == "CERT_NONE" and not skip.check_hostname
