"""The family bench's statistics: paired comparisons and time-integrated regret."""

from __future__ import annotations

import numpy as np

from spectune.bench.paired import paired_comparison
from spectune.bench.regret import regret_curve
from spectune.bench.scoring import RequestTable
from spectune.search.objective import Metric


def test_a_planted_difference_is_detected_with_its_size() -> None:
    rng = np.random.default_rng(1)
    a = rng.uniform(0.6, 1.0, 100)
    b = a + 0.03 + rng.normal(0, 0.05, 100)  # worlds differ far more than the change
    c = paired_comparison(list(a), list(b))
    assert c.significant
    assert c.low < 0.03 < c.high
    assert c.up > c.down
    assert c.p_sign < 0.05


def test_a_policy_against_itself_shows_no_difference() -> None:
    rng = np.random.default_rng(2)
    a = list(rng.uniform(0.5, 1.0, 60))
    c = paired_comparison(a, a)
    assert (c.mean, c.up, c.down, c.p_sign) == (0.0, 0, 0, 1.0)
    assert not c.significant


def test_noise_alone_is_not_reported_as_a_difference() -> None:
    rng = np.random.default_rng(3)
    a = rng.uniform(0.6, 1.0, 80)
    b = a + rng.normal(0, 0.05, 80)
    assert not paired_comparison(list(a), list(b)).significant


def _table(finish: list[float], tpot: list[float]) -> RequestTable:
    f = np.asarray(finish, dtype=float)
    t = np.asarray(tpot, dtype=float)
    return RequestTable(
        f, t, np.full_like(f, 0.1), np.zeros_like(f), t * 100 + 0.1, np.full_like(f, 100)
    )


def test_regret_is_zero_for_the_oracle_and_counts_a_slower_window_and_an_empty_one() -> None:
    finish = [float(x) for x in np.arange(1, 300, 1.0)]
    oracle = _table(finish, [0.010] * len(finish))
    assert (
        regret_curve(oracle, lambda p: oracle, [(0.0, 300.0)], Metric.TPOT_P95, 100.0)[-1][1] == 0.0
    )
    # the run is 25 % slower in its first window and serves nothing in its last
    slow = [0.0125 if x < 100 else 0.010 for x in finish if x < 200]
    run = _table([x for x in finish if x < 200], slow)
    curve = regret_curve(run, lambda p: oracle, [(0.0, 300.0)], Metric.TPOT_P95, 100.0)
    assert [t for t, _ in curve] == [100.0, 200.0, 300.0]
    assert abs(curve[0][1] - 20.0) < 1e-6  # 1 - 0.010/0.0125 = 0.2 of 100 s
    assert abs(curve[1][1] - 20.0) < 1e-6
    assert abs(curve[2][1] - 120.0) < 1e-6  # the empty window is a whole loss
