"""Unusable inputs raise InputError with a message that names the problem; empty windows are NaN.

An idle window (zero drafts, or an idle rate() that is NaN) is "no data", never an error and
never an acceptance of 0. Inputs that break a counter's invariants are errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from spectune.core import (
    acceptance_rate,
    beta_interval,
    break_even_survival,
    draft_cost_from_tpot,
    expected_tokens,
    expected_tokens_flat,
    flat_survival,
    kv_pool_tokens,
    mean_accepted_length,
    predict_speedup,
    speedup,
    survival_from_counts,
    survival_intervals,
    wilson_interval,
)
from spectune.errors import InputError, SpecError

CASES = {
    "acceptance: negative accepted": (lambda: acceptance_rate(-1, 10), "accepted"),
    "acceptance: negative draft tokens": (lambda: acceptance_rate(1, -10), "draft_tokens"),
    "acceptance: more accepted than drafted": (lambda: acceptance_rate(11, 10), "exceeds"),
    "mean length: negative accepted": (lambda: mean_accepted_length(-1, 10), "accepted"),
    "mean length: negative drafts": (lambda: mean_accepted_length(5, -1), "drafts"),
    "survival: negative drafts": (lambda: survival_from_counts([1, 0], -1), "drafts"),
    "survival: negative count": (lambda: survival_from_counts([5, -1], 10), ">= 0"),
    "survival: count rises with position": (
        lambda: survival_from_counts([5, 6, 2], 10),
        "position 1",
    ),
    "survival: position 0 above drafts": (lambda: survival_from_counts([11, 3], 10), "exceeds"),
    "survival: not 1-D": (lambda: survival_from_counts([[1, 0], [1, 0]], 10), "1-D"),
    "flat survival: a below 0": (lambda: flat_survival(-0.1, 3), "[0, 1]"),
    "flat survival: a above 1": (lambda: flat_survival(1.1, 3), "[0, 1]"),
    "flat survival: negative k": (lambda: flat_survival(0.5, -1), "draft length k"),
    "expected tokens: scalar": (lambda: expected_tokens(0.5), "1-D"),
    "expected tokens: probability above 1": (lambda: expected_tokens([1.2, 0.5]), "[0, 1]"),
    "expected tokens: negative probability": (lambda: expected_tokens([0.5, -0.2]), "[0, 1]"),
    "flat expected: a above 1": (lambda: expected_tokens_flat(1.5, 3), "[0, 1]"),
    "flat expected: negative k": (lambda: expected_tokens_flat(0.5, -1), "draft length k"),
    "flat expected: fractional k": (lambda: expected_tokens_flat(0.5, 2.5), "whole"),
    "speedup: negative cost": (lambda: speedup([1.0, 1.7], -0.1, [0, 1]), "draft cost c"),
    "speedup: NaN cost": (lambda: speedup([1.0, 1.7], math.nan, [0, 1]), "draft cost c"),
    "speedup: negative k": (lambda: speedup([1.0], 0.1, [-1]), "draft length k"),
    "predict: NaN curve (no drafts)": (
        lambda: predict_speedup(survival_from_counts([0, 0], 0), 0.1),
        "insufficient data",
    ),
    "predict: 2-D curve": (lambda: predict_speedup([[0.5], [0.4]], 0.1), "1-D"),
    "predict: negative cost": (lambda: predict_speedup([0.5], -0.1), "draft cost c"),
    "break-even: negative cost": (lambda: break_even_survival([1.0, 1.5], -0.1), "draft cost c"),
    "break-even: 2-D expected": (lambda: break_even_survival([[1.0, 1.5]], 0.1), "1-D"),
    "wilson: negative successes": (lambda: wilson_interval(-1, 10), ">= 0"),
    "wilson: negative trials": (lambda: wilson_interval(0, -10), ">= 0"),
    "wilson: successes above trials": (lambda: wilson_interval(11, 10), "exceed"),
    "wilson: confidence 0": (lambda: wilson_interval(5, 10, confidence=0.0), "confidence"),
    "wilson: confidence 1": (lambda: wilson_interval(5, 10, confidence=1.0), "confidence"),
    "wilson: confidence as percent": (lambda: wilson_interval(5, 10, confidence=95), "confidence"),
    "beta: negative successes": (lambda: beta_interval(-1, 10), ">= 0"),
    "beta: successes above trials": (lambda: beta_interval(11, 10), "exceed"),
    "beta: bad confidence": (lambda: beta_interval(5, 10, confidence=1.5), "confidence"),
    "beta: zero prior": (lambda: beta_interval(5, 10, prior=(0.0, 1.0)), "prior"),
    "survival intervals: rising counts": (lambda: survival_intervals([5, 6], 10), "position 1"),
    "survival intervals: negative drafts": (lambda: survival_intervals([0], -1), "drafts"),
    "survival intervals: bad confidence": (
        lambda: survival_intervals([5, 3], 10, confidence=0.0),
        "confidence",
    ),
    "draft cost: zero tpot_on": (lambda: draft_cost_from_tpot(0.0, 0.03, 2.0, 3), "tpot_on"),
    "draft cost: negative tpot_off": (
        lambda: draft_cost_from_tpot(0.02, -0.03, 2.0, 3),
        "tpot_off",
    ),
    "draft cost: infinite tpot_on": (
        lambda: draft_cost_from_tpot(math.inf, 0.03, 2.0, 3),
        "tpot_on",
    ),
    "draft cost: zero expected tokens": (
        lambda: draft_cost_from_tpot(0.02, 0.03, 0.0, 3),
        "expected_tokens",
    ),
    "draft cost: expected tokens below 1": (
        lambda: draft_cost_from_tpot(0.02, 0.03, 0.8, 3),
        "at least 1",
    ),
    "draft cost: k = 0": (lambda: draft_cost_from_tpot(0.02, 0.03, 2.0, 0), "draft length k"),
    "kv pool: negative blocks": (lambda: kv_pool_tokens(-1, 16), "num_gpu_blocks"),
    "kv pool: negative block size": (lambda: kv_pool_tokens(100, -16), "block_size"),
    "kv pool: negative engine count": (lambda: kv_pool_tokens(100, 16, -5), "kv_cache_size"),
    "kv pool: zero block size": (lambda: kv_pool_tokens(100, 0), "block_size"),
    "kv pool: fractional blocks": (lambda: kv_pool_tokens(100.5, 16), "whole"),  # type: ignore[arg-type]
}


@pytest.mark.parametrize(("call", "says"), CASES.values(), ids=CASES.keys())
def test_unusable_input_raises_input_error(call, says):
    with pytest.raises(InputError) as caught:
        call()
    assert says in str(caught.value)
    # InputError is permanent: retrying with the same input cannot help.
    assert isinstance(caught.value, SpecError)


def test_counts_that_rise_only_by_rounding_are_accepted():
    # increase() over one window may leave float dust between equal counters.
    curve = survival_from_counts([5000.0, 5000.0 * (1 + 1e-13), 2500.0], 10_000.0)
    np.testing.assert_allclose(curve, [0.5, 0.5, 0.25])
    assert acceptance_rate(10_000 * (1 + 1e-13), 10_000) == 1.0


def test_empty_window_is_nan_not_zero():
    assert math.isnan(acceptance_rate(0, 0))
    assert math.isnan(mean_accepted_length(0, 0))
    curve = survival_from_counts([0, 0, 0, 0], 0)
    assert curve.shape == (4,)
    assert np.isnan(curve).all()


def test_idle_rate_is_nan_not_zero():
    # PromQL rate() over an idle window returns NaN for both numerator and denominator.
    assert math.isnan(acceptance_rate(math.nan, math.nan))
    assert math.isnan(mean_accepted_length(math.nan, math.nan))
    assert np.isnan(survival_from_counts([math.nan, math.nan], math.nan)).all()
