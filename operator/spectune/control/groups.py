"""GroupMetrics over two metric sources: one for the incumbent's pods, one for the canary's.

The operator body builds one per SpecTuning (two Prometheus selectors, or two pod-URL
lists) and hands it to the controller. Both groups are read for the same window, so a
canary and its incumbent are always compared on the same traffic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from spectune.control.ports import Group
from spectune.errors import NoDataError
from spectune.metrics.observation import Observation

__all__ = ["PairedSources", "WindowedSource"]


class WindowedSource(Protocol):
    """A source that reads the window that ends now (Prometheus: ``increase()[w]``)."""

    async def observe(self, window_s: float) -> Observation:
        """The observation of the ``window_s`` seconds that end now."""
        ...


class PairedSources:
    """The controller's :class:`~spectune.control.ports.GroupMetrics` for a real deployment.

    Parameters
    ----------
    incumbent
        The source of the target's pods.
    canary
        A callable returning the canary's source, or None when no canary runs (the canary's
        pods change with every trial).
    sleep
        How to wait out the window (the operator's clock).
    waits
        Whether the sources wait out the window themselves (the pod scraper does;
        Prometheus reads history, so the window is waited here first).
    """

    def __init__(
        self,
        incumbent: WindowedSource,
        canary: Callable[[], WindowedSource | None],
        sleep: Callable[[float], Awaitable[None]],
        waits: bool,
    ) -> None:
        self._incumbent = incumbent
        self._canary = canary
        self._sleep = sleep
        self._waits = waits

    async def observe(self, window_s: float) -> Mapping[Group, Observation]:
        """Both groups' observations of the same window.

        A canary with no data is absent (its pods may not have served, or been scraped, in
        the window). The incumbent with no data raises :class:`NoDataError`: the target's
        pods are the reference of every comparison and the baseline of the search, and a
        window without them is no evidence of anything.
        """
        if not self._waits:
            await self._sleep(window_s)
        canary = self._canary()
        jobs = [self._incumbent.observe(window_s)]
        if canary is not None:
            jobs.append(canary.observe(window_s))
        results = await asyncio.gather(*jobs, return_exceptions=True)
        out: dict[Group, Observation] = {}
        for group, res in zip((Group.INCUMBENT, Group.CANARY), results, strict=False):
            if isinstance(res, Observation):
                out[group] = res
            elif isinstance(res, NoDataError) and group is Group.CANARY:
                continue  # no pod of the canary served in the window
            elif isinstance(res, BaseException):
                raise res
        return out
