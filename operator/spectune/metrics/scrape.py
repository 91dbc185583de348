"""Read metrics straight from the serving pods' ``/metrics`` endpoints.

Used by ``spectune diagnose --scrape`` and by the operator when a SpecTuning names
``metrics.scrape`` instead of Prometheus. One window is two scrapes of every pod, the
window apart. A pod that fails is reported in the observation, not fatal, unless every
pod fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import httpx

from spectune.errors import InputError, SourceUnavailableError
from spectune.metrics.exposition import Snapshot, parse_page
from spectune.metrics.observation import Observation, observation_from_pages

__all__ = ["PodScrapeSource"]

Sleep = Callable[[float], Awaitable[None]]


class PodScrapeSource:
    """Scrape a fixed list of pod URLs with httpx.

    Parameters
    ----------
    urls
        One ``/metrics`` URL per pod.
    timeout_s
        Per-pod timeout of one scrape, in seconds.
    sleep
        How to wait out the window; tests pass a fake clock's sleep.
    client
        An ``httpx.AsyncClient`` to reuse; one is made per call when omitted.
    """

    def __init__(
        self,
        urls: Sequence[str],
        timeout_s: float = 5.0,
        sleep: Sleep = asyncio.sleep,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if not urls:
            raise InputError("no pod URLs to scrape; give at least one --scrape URL")
        self._urls = list(urls)
        self._timeout = timeout_s
        self._sleep = sleep
        self._client = client

    async def _fetch(self, client: httpx.AsyncClient, url: str) -> Snapshot:
        resp = await client.get(url, timeout=self._timeout)
        if resp.status_code != 200:
            raise SourceUnavailableError(f"{url} answered HTTP {resp.status_code}")
        return parse_page(resp.text, pod=url)

    async def scrape(self) -> tuple[list[Snapshot], dict[str, str]]:
        """Scrape every pod once; return the pages and the failures by URL."""
        async with _client_or(self._client) as client:
            results = await asyncio.gather(
                *(self._fetch(client, u) for u in self._urls), return_exceptions=True
            )
        pages: list[Snapshot] = []
        failed: dict[str, str] = {}
        for url, res in zip(self._urls, results, strict=True):
            if isinstance(res, Snapshot):
                pages.append(res)
            elif isinstance(res, (httpx.HTTPError, SourceUnavailableError, InputError)):
                failed[url] = _one_line(res)
            else:
                raise res
        if not pages:
            detail = "; ".join(f"{u}: {why}" for u, why in failed.items())
            raise SourceUnavailableError(f"every pod failed to answer: {detail}")
        return pages, failed

    async def observe(self, window_s: float) -> Observation:
        """Scrape, wait ``window_s`` seconds, scrape again, and return the difference."""
        first, failed_first = await self.scrape()
        await self._sleep(window_s)
        second, failed_second = await self.scrape()
        failed = {**failed_first, **failed_second}
        ended = {p.pod for p in second}
        started = [p for p in first if p.pod in ended]
        return observation_from_pages(started, second, window_s, failed_pods=failed)

    async def is_online(self) -> bool:
        """Whether at least one pod answers."""
        try:
            await self.scrape()
        except SourceUnavailableError:
            return False
        return True


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class _client_or:
    """Use the given client, or open (and close) a fresh one."""

    def __init__(self, client: httpx.AsyncClient | None) -> None:
        self._given = client
        self._own: httpx.AsyncClient | None = None

    async def __aenter__(self) -> httpx.AsyncClient:
        if self._given is not None:
            return self._given
        self._own = httpx.AsyncClient()
        return self._own

    async def __aexit__(self, *exc: object) -> None:
        if self._own is not None:
            await self._own.aclose()
