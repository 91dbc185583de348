"""Time-integrated regret: what a run lost against the oracle, second by second.

A run's ``efficiency`` judges where it ended and ``run_efficiency`` its whole-run value,
but neither says *when* it paid: a policy that explores for an hour and lands on the oracle
at the finish line scores 1.0 on the first and can still look good on the second. The
family bench (``benchmarks/family.py``) sums the loss over time instead. The run is cut
into bins (one measurement window each); in a bin the loss is ``1 − efficiency`` of the
run's own finished requests against the phase oracle's static run over the same bin
(the ratio of ``bench/scoring.py``), and the regret is the sum of ``loss × bin seconds``:
the seconds of serving the run gave away, exploration, restarts and rollouts included.
A bin in which the run finished no request while the oracle did counts as a whole loss
(the fleet served nobody there); a bin where neither did counts nothing. Noise makes some
bins negative (the run beat the oracle there by luck); they are kept, so the sum has no
bias from clipping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from spectune.bench.scoring import RequestTable, efficiency_ratio, metric_value
from spectune.search.objective import Metric

__all__ = ["regret_curve"]


def regret_curve(
    run: RequestTable,
    oracle_of_phase: Callable[[int], RequestTable],
    phases: Sequence[tuple[float, float]],
    metric: Metric,
    bin_s: float,
) -> tuple[tuple[float, float], ...]:
    """``(bin end, cumulative regret seconds)`` for each bin of every phase, in time order.

    ``oracle_of_phase(p)`` is the request table of phase ``p``'s oracle arm (its static run
    over the whole scenario); bins do not cross a phase boundary.
    """
    if not bin_s > 0:
        raise ValueError(f"bin_s must be positive, got {bin_s}")
    total = 0.0
    out: list[tuple[float, float]] = []
    for p, (start, end) in enumerate(phases):
        oracle = oracle_of_phase(p)
        edges = np.arange(start, end, bin_s)
        for a in edges:
            b = min(float(a) + bin_s, end)
            best = metric_value(oracle, metric, float(a), b)
            got = metric_value(run, metric, float(a), b)
            if math.isfinite(best) and best > 0:
                eff = efficiency_ratio(best, got, metric.minimise)
                loss = 1.0 if not math.isfinite(eff) else 1.0 - eff
                total += loss * (b - float(a))
            out.append((b, total))
    return tuple(out)
