"""PodScrapeSource with a fake HTTP transport (httpx.MockTransport) and a fake sleep."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from spectune.errors import SourceUnavailableError
from spectune.metrics import PodScrapeSource
from tests.unit.metrics.test_windows import vllm_page


class FakePods:
    """Fake pods: each URL serves a page from a list, one per scrape round."""

    def __init__(self, pages: dict[str, list[str | int]]) -> None:
        self.pages = pages
        self.calls: dict[str, int] = {u: 0 for u in pages}

    def handler(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        answer = self.pages[url][self.calls[url]]
        self.calls[url] += 1
        if isinstance(answer, int):
            if answer == 0:
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(answer, text="nope")
        return httpx.Response(200, text=answer)


def run(source: PodScrapeSource, window: float) -> object:
    return asyncio.run(source.observe(window))


def make(pods: FakePods, slept: list[float]) -> PodScrapeSource:
    async def fake_sleep(s: float) -> None:
        slept.append(s)

    client = httpx.AsyncClient(transport=httpx.MockTransport(pods.handler))
    return PodScrapeSource(list(pods.pages), sleep=fake_sleep, client=client)


def test_one_window_is_two_scrapes_the_window_apart() -> None:
    pods = FakePods({"http://a/metrics": [vllm_page(100, [80]), vllm_page(1100, [880])]})
    slept: list[float] = []
    obs = run(make(pods, slept), 30)
    assert slept == [30]
    assert obs.spec.drafts == 1000 and obs.window_s == 30  # type: ignore[attr-defined]


def test_a_failing_pod_is_reported_not_fatal() -> None:
    pods = FakePods(
        {
            "http://a/metrics": [vllm_page(100, [80]), vllm_page(1100, [880])],
            "http://b/metrics": [503, 0],
        }
    )
    obs = run(make(pods, []), 10)
    assert obs.pods == ("http://a/metrics",)  # type: ignore[attr-defined]
    failed = obs.failed_pods  # type: ignore[attr-defined]
    assert "HTTP 503" in failed["http://b/metrics"] or "refused" in failed["http://b/metrics"]


def test_every_pod_failing_is_source_unavailable() -> None:
    pods = FakePods({"http://a/metrics": [0], "http://b/metrics": ["<html>login</html>"]})
    with pytest.raises(SourceUnavailableError, match="every pod failed") as info:
        run(make(pods, []), 10)
    assert "http://a/metrics" in str(info.value) and "http://b/metrics" in str(info.value)
