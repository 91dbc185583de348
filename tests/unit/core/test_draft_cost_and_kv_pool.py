"""The cost side: draft cost recovered from per-token latencies, and the KV pool's size."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spectune.core import (
    draft_cost_from_tpot,
    expected_tokens_flat,
    flat_survival,
    kv_pool_tokens,
    predict_speedup,
)

TPOT_OFF = 0.030  # seconds per token without speculation


def _tpot_on(c: float, a: float, k: int) -> float:
    # Synthetic latency: a pass costs (1 + c k) target steps and emits E tokens.
    return TPOT_OFF * (1 + c * k) / float(expected_tokens_flat(a, k))


@pytest.mark.parametrize("c", [0.0, 0.02, 0.15, 0.6])
@pytest.mark.parametrize(("a", "k"), [(0.5, 1), (0.7, 3), (0.9, 8)])
def test_recovers_a_known_draft_cost(c, a, k):
    e = float(expected_tokens_flat(a, k))
    assert draft_cost_from_tpot(_tpot_on(c, a, k), TPOT_OFF, e, k) == pytest.approx(c, abs=1e-12)


def test_recovered_cost_predicts_the_measured_speedup_at_other_k():
    c_true, a = 0.12, 0.75
    e3 = float(expected_tokens_flat(a, 3))
    c = draft_cost_from_tpot(_tpot_on(c_true, a, 3), TPOT_OFF, e3, 3)
    table = predict_speedup(flat_survival(a, 8), c)
    for k in (1, 5, 8):
        assert table.speedup[k] == pytest.approx(TPOT_OFF / _tpot_on(c_true, a, k))


def test_noise_below_the_physical_floor_clips_to_free_drafting():
    # Measured TPOT slightly better than E tokens per target step: impossible, so noise.
    e = 2.5
    tpot_on = 0.98 * TPOT_OFF / e
    assert draft_cost_from_tpot(tpot_on, TPOT_OFF, e, 3) == 0.0
    # A clipped cost can never predict more than E tokens per target step.
    table = predict_speedup([0.8, 0.5, 0.2], 0.0)
    assert table.speedup[3] == pytest.approx(table.expected_tokens[3])


def test_speculation_that_made_decoding_slower_gives_a_large_cost():
    # TPOT rose from 30 ms to 36 ms at k = 4 with 2 tokens per pass: c = (0.036*2/0.03 - 1)/4.
    assert draft_cost_from_tpot(0.036, 0.030, 2.0, 4) == pytest.approx(0.35)


def test_missing_latency_sample_is_nan_not_zero():
    assert math.isnan(draft_cost_from_tpot(math.nan, TPOT_OFF, 2.0, 3))
    assert math.isnan(draft_cost_from_tpot(0.02, math.nan, 2.0, 3))


def test_kv_pool_prefers_the_engines_group_aware_count():
    # Hybrid model: blocks x size overstates the pool; vLLM's own count wins.
    assert kv_pool_tokens(10_000, 16, kv_cache_size_tokens=120_000) == 120_000
    assert kv_pool_tokens(10_000, 16) == 160_000
    assert kv_pool_tokens(10_000, 16, kv_cache_size_tokens=0) == 0


def test_kv_pool_reads_whole_numbers_from_labels_or_gauges():
    assert kv_pool_tokens(97_000.0, 16.0) == 1_552_000  # type: ignore[arg-type]
    assert isinstance(kv_pool_tokens(np.int64(5), np.int64(16)), int)  # type: ignore[arg-type]
