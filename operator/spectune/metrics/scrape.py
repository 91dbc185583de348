"""Read metrics straight from the serving pods' ``/metrics`` endpoints.

Used by ``spectune diagnose --scrape`` and by the operator when a SpecTuning names
``metrics.scrape`` instead of Prometheus. One window is two scrapes of every pod, the
window apart. A pod that fails is reported in the observation, not fatal, unless every
pod fails.

A page costs the operator memory and CPU in proportion to its size, and the page is
whatever the pod's port answers, so it is read as a stream and refused once it passes
``max_bytes`` (an engine's page is tens to hundreds of KiB; 8 MiB is a hundred times
that). Parsing runs in a worker thread, off the event loop that serves every other
SpecTuning.
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
MAX_PAGE_BYTES = 8 * 1024 * 1024
"""The default limit of one metrics page, in bytes (after decompression)."""


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
    max_bytes
        The largest page read, in bytes after decompression; a larger one is bad input.
    """

    def __init__(
        self,
        urls: Sequence[str],
        timeout_s: float = 5.0,
        sleep: Sleep = asyncio.sleep,
        client: httpx.AsyncClient | None = None,
        max_bytes: int = MAX_PAGE_BYTES,
    ) -> None:
        if not urls:
            raise InputError("no pod URLs to scrape; give at least one --scrape URL")
        self._urls = list(urls)
        self._timeout = timeout_s
        self._sleep = sleep
        self._client = client
        self._max = max_bytes

    async def _fetch(self, client: httpx.AsyncClient, url: str) -> Snapshot:
        async with client.stream("GET", url, timeout=self._timeout) as resp:
            if resp.status_code != 200:
                raise SourceUnavailableError(f"{url} answered HTTP {resp.status_code}")
            too_big = InputError(
                f"{url}: the metrics page is larger than {self._max} bytes "
                "(SPECTUNE_SCRAPE_MAX_BYTES); not read. Is this the engine's /metrics port?"
            )
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self._max:
                raise too_big
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > self._max:
                    raise too_big
                chunks.append(chunk)
            text = b"".join(chunks).decode(resp.encoding or "utf-8", errors="replace")
        return await asyncio.to_thread(parse_page, text, url)

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
