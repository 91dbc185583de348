"""Paired comparison of two policies (or two commits) over the same worlds and seeds.

"N runs up, M down" hides how big a change is and whether it is more than noise. Runs of
two versions on the same world and seed share the world's traffic draw, so their
difference cancels most of the world-to-world spread; :func:`paired_comparison` reports
the mean of those differences with a percentile-bootstrap 95 % interval (resampling worlds,
a seeded generator) and a two-sided sign test over the non-zero differences. The family
bench (``benchmarks/family.py``) prints it for ``--compare A,B`` and ``--baseline FILE``.

>>> c = paired_comparison([1.0, 0.9, 0.8, 0.95], [1.0, 0.9, 0.8, 0.95])
>>> (c.mean, c.low, c.high, c.up, c.down, c.p_sign)
(0.0, 0.0, 0.0, 0, 0, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import binomtest

__all__ = ["PairedComparison", "paired_comparison"]

#: Differences smaller than this are ties for the sign test (the bench prints four digits).
TIE = 5e-4


@dataclass(frozen=True)
class PairedComparison:
    """``b − a`` over paired runs: mean, bootstrap 95 % interval, sign-test counts and p."""

    n: int
    mean: float
    low: float
    high: float
    up: int
    down: int
    p_sign: float

    @property
    def significant(self) -> bool:
        """Whether the interval excludes 0 (a difference, at 95 %)."""
        return self.low > 0 or self.high < 0

    def describe(self, what: str = "efficiency") -> str:
        """One line for a closing note."""
        return (
            f"{what} b−a over {self.n} paired runs: {self.mean:+.4f} "
            f"[{self.low:+.4f}, {self.high:+.4f}] (95 % bootstrap), "
            f"{self.up} up / {self.down} down, sign test p = {self.p_sign:.3g}"
        )


def paired_comparison(
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int = 10000,
    seed: int = 0,
) -> PairedComparison:
    """Compare ``b`` with ``a``, pair by pair; NaN pairs are dropped."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    x = np.asarray(a, dtype=float)
    y = np.asarray(b, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    d = y[keep] - x[keep]
    n = int(d.size)
    if n == 0:
        return PairedComparison(0, math.nan, math.nan, math.nan, 0, 0, math.nan)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    means = d[idx].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    up = int((d > TIE).sum())
    down = int((d < -TIE).sum())
    p = 1.0 if up + down == 0 else float(binomtest(up, up + down, 0.5).pvalue)
    return PairedComparison(n, float(d.mean()), float(low), float(high), up, down, p)
