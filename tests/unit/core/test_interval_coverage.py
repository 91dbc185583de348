"""Intervals on acceptance hold their promised coverage, including near 0 and 1."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize

from spectune.core import (
    ConfidenceInterval,
    beta_interval,
    survival_from_counts,
    survival_intervals,
    wilson_interval,
)

# Acceptance lives near the edges: n-gram misses (low), a good drafter's first position (high).
PROPORTIONS = [0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98]


def _coverage(interval, rng, n, p, confidence, repeats=20_000):
    bounds = [interval(x, n, confidence) for x in range(n + 1)]
    low = np.array([b.low for b in bounds])
    high = np.array([b.high for b in bounds])
    hits = rng.binomial(n, p, size=repeats)
    return float(np.mean((low[hits] <= p) & (p <= high[hits])))


@pytest.mark.parametrize("interval", [wilson_interval, beta_interval])
@pytest.mark.parametrize("n", [30, 200])
def test_coverage_is_near_nominal_at_95(interval, n):
    rng = np.random.default_rng(1927)
    cover = [_coverage(interval, rng, n, p, 0.95) for p in PROPORTIONS]
    # Binomial intervals oscillate around the nominal level; neither may dip far below it.
    assert min(cover) >= 0.92, cover
    assert 0.94 <= float(np.mean(cover)) <= 0.97, cover


@pytest.mark.parametrize("interval", [wilson_interval, beta_interval])
def test_lower_confidence_gives_lower_coverage(interval):
    rng = np.random.default_rng(2001)
    cover = [_coverage(interval, rng, 200, p, 0.80) for p in (0.3, 0.5, 0.7)]
    assert 0.76 <= float(np.mean(cover)) <= 0.84, cover


@pytest.mark.parametrize(("x", "n"), [(0, 40), (3, 40), (28, 40), (40, 40), (140.5, 200)])
def test_wilson_is_the_inverted_score_test(x, n):
    # Independent computation: the bounds are the roots of |p_hat - p| = z sqrt(p(1-p)/n).
    z = 1.959963984540054
    p_hat = x / n

    def score(p):
        return abs(p_hat - p) - z * math.sqrt(p * (1 - p) / n)

    ci = wilson_interval(x, n)
    # At x = n the score is also 0 at p = 1 (and at p = 0 for x = 0), so bracket strictly
    # away from p_hat to find the real bound.
    low = 0.0 if x == 0 else optimize.brentq(score, 1e-15, p_hat - 1e-12)
    high = 1.0 if x == n else optimize.brentq(score, p_hat + 1e-12, 1 - 1e-15)
    assert ci.low == pytest.approx(low, abs=1e-9)
    assert ci.high == pytest.approx(high, abs=1e-9)
    assert ci.confidence == 0.95


@pytest.mark.parametrize(("x", "n"), [(3, 40), (28, 40), (190, 200)])
def test_jeffreys_bounds_are_posterior_quantiles(x, n):
    # Independent computation: quantiles of posterior draws under the Jeffreys prior.
    draws = np.random.default_rng(7).beta(x + 0.5, n - x + 0.5, size=400_000)
    ci = beta_interval(x, n)
    assert ci.low == pytest.approx(np.quantile(draws, 0.025), abs=2e-3)
    assert ci.high == pytest.approx(np.quantile(draws, 0.975), abs=2e-3)


def test_jeffreys_edges_reach_zero_and_one():
    assert beta_interval(0, 40).low == 0.0
    assert beta_interval(40, 40).high == 1.0
    assert 0.0 < beta_interval(0, 40).high < 0.1
    assert 0.9 < beta_interval(40, 40).low < 1.0


def test_other_prior_moves_the_interval():
    flat = beta_interval(3, 40, prior=(1.0, 1.0))
    jeffreys = beta_interval(3, 40)
    optimistic = beta_interval(3, 40, prior=(20.0, 2.0))
    assert flat.low > jeffreys.low
    assert optimistic.low > 0.2


def test_more_evidence_narrows_the_interval():
    widths = [
        wilson_interval(0.7 * n, n).high - wilson_interval(0.7 * n, n).low
        for n in (100, 1_000, 10_000)
    ]
    assert widths[0] > widths[1] > widths[2]
    assert widths[2] < 0.02


def test_no_trials_gives_no_interval():
    for ci in (wilson_interval(0, 0), beta_interval(0, 0)):
        assert math.isnan(ci.low) and math.isnan(ci.high)
        assert ci.confidence == 0.95


def test_interval_is_a_small_value_object():
    ci = wilson_interval(70, 100, confidence=0.9)
    assert ci == ConfidenceInterval(ci.low, ci.high, 0.9)
    with pytest.raises(AttributeError):
        ci.low = 0.0  # type: ignore[misc]


def test_survival_intervals_are_wilson_per_position():
    counts = [360, 270, 180, 90, 0]
    low, high = survival_intervals(counts, 400, confidence=0.9)
    for i, count in enumerate(counts):
        ci = wilson_interval(count, 400, confidence=0.9)
        assert low[i] == pytest.approx(ci.low, abs=1e-12)
        assert high[i] == pytest.approx(ci.high, abs=1e-12)
    point = survival_from_counts(counts, 400)
    assert np.all((low <= point) & (point <= high))


def test_survival_intervals_without_drafts_are_nan():
    low, high = survival_intervals([0, 0, 0], 0)
    assert low.shape == high.shape == (3,)
    assert np.isnan(low).all() and np.isnan(high).all()


def test_survival_intervals_cover_a_simulated_drafter(rng, simulate):
    conditional = [0.92, 0.85, 0.8, 0.7, 0.6]
    truth = np.cumprod(conditional)
    windows = 2_000
    covered = np.zeros(len(conditional))
    for _ in range(windows):
        window = simulate(rng, conditional, 300)
        low, high = survival_intervals(window.accepted_per_pos, window.drafts)
        covered += (low <= truth) & (truth <= high)
    assert np.all(covered / windows >= 0.93), covered / windows
