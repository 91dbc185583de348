"""The port every metric source implements, so callers never know how metrics are fetched.

``spectune diagnose``, the operator's controller and the bench ask a :class:`MetricSource`
for one window of observations; behind it sit Prometheus, a direct pod scrape, or the
simulator. Keep *what to ask* (``spectune.engines``) apart from *how to ask* (here).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from spectune.metrics.observation import Observation

__all__ = ["MetricSource"]


@runtime_checkable
class MetricSource(Protocol):
    """A place that can say what a set of pods did over the last ``window_s`` seconds.

    Implementations raise :class:`~spectune.errors.NoDataError` when the source answers
    but has no samples (an idle ``rate()`` is NaN: that is "no data", never "0"), and
    :class:`~spectune.errors.SourceUnavailableError` when it cannot be reached or answers
    garbage.
    """

    async def observe(self, window_s: float) -> Observation:
        """Return the observation for the window that ends now."""
        ...

    async def is_online(self) -> bool:
        """Whether the source answers at all (for the ``MetricsAvailable`` condition)."""
        ...
