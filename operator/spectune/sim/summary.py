"""Objective figures over a span of finished requests: the numbers `sim run` prints.

The bench computes the same figures per phase for its oracle and efficiency, so they live
here, next to the records they read, rather than in the CLI.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from spectune.sim.fleet import RequestRecord

__all__ = ["Summary", "summarise"]


@dataclass(frozen=True)
class Summary:
    """Latency percentiles (seconds) and throughput of the requests finished in a span."""

    requests: int
    tpot_p50: float
    tpot_p95: float
    ttft_p95: float
    e2e_p95: float
    queue_p95: float
    output_tokens_per_s: float

    def as_dict(self) -> dict[str, float | int]:
        """The figures as a plain mapping (NaN where no request finished)."""
        return asdict(self)


def _pct(values: Sequence[float], q: float) -> float:
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    return float(np.percentile(arr, q)) if arr.size else math.nan


def summarise(records: Sequence[RequestRecord], span_s: float) -> Summary:
    """Figures of ``records``; ``span_s`` is the length of time they finished in."""
    return Summary(
        requests=len(records),
        tpot_p50=_pct([r.tpot_s for r in records], 50),
        tpot_p95=_pct([r.tpot_s for r in records], 95),
        ttft_p95=_pct([r.ttft_s for r in records], 95),
        e2e_p95=_pct([r.e2e_s for r in records], 95),
        queue_p95=_pct([r.queue_s for r in records], 95),
        output_tokens_per_s=(
            sum(r.output_tokens for r in records) / span_s if span_s > 0 else math.nan
        ),
    )
