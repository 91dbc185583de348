"""The closed forms agree with a simulated chain drafter (Bernoulli acceptances per position).

What a user relies on: the acceptance numbers spectune reports from vLLM's counters, and the
tokens per pass it predicts for draft lengths it never ran, match what the drafter does.
"""

from __future__ import annotations

import numpy as np
import pytest

from spectune.core import (
    acceptance_rate,
    expected_tokens,
    expected_tokens_flat,
    flat_survival,
    mean_accepted_length,
    survival_from_counts,
)

PASSES = 200_000

# Conditional acceptance per position: a flat drafter, an EAGLE-like decaying one, and an
# n-gram-like one that either copies a whole span or misses at once.
DRAFTERS = {
    "flat": [0.7] * 8,
    "decaying": [0.9, 0.85, 0.8, 0.72, 0.65, 0.6, 0.55, 0.5],
    "all_or_nothing": [0.35, 0.97, 0.97, 0.96, 0.95, 0.95],
}


def _five_sigma(samples: np.ndarray) -> float:
    return 5.0 * float(samples.std()) / np.sqrt(samples.size)


@pytest.mark.parametrize("conditional", DRAFTERS.values(), ids=DRAFTERS.keys())
def test_survival_from_counters_matches_the_drafters_true_curve(rng, simulate, conditional):
    window = simulate(rng, conditional, PASSES)
    measured = survival_from_counts(window.accepted_per_pos, window.drafts)
    truth = np.cumprod(conditional)
    # Each point is a binomial proportion over PASSES trials.
    sigma = np.sqrt(truth * (1 - truth) / PASSES)
    np.testing.assert_array_less(np.abs(measured - truth), 5 * sigma + 1e-12)


@pytest.mark.parametrize("conditional", DRAFTERS.values(), ids=DRAFTERS.keys())
def test_per_position_counter_is_the_count_of_passes_with_l_at_least_i(rng, simulate, conditional):
    window = simulate(rng, conditional, 20_000)
    k = len(conditional)
    by_length = np.array([(window.accepted_lengths >= i).sum() for i in range(1, k + 1)])
    np.testing.assert_array_equal(window.accepted_per_pos, by_length)
    # So the counter curve is P(L >= i) exactly, on the sample itself.
    np.testing.assert_allclose(
        survival_from_counts(window.accepted_per_pos, window.drafts),
        by_length / window.drafts,
    )


@pytest.mark.parametrize("conditional", DRAFTERS.values(), ids=DRAFTERS.keys())
def test_expected_tokens_predicts_every_smaller_draft_length(rng, simulate, conditional):
    k_max = len(conditional)
    truth = expected_tokens(np.cumprod(conditional))
    window = simulate(rng, conditional, PASSES)
    for k in range(k_max + 1):
        # A run at draft length k: the first k positions behave as in the K run (chain
        # drafter), and each pass emits min(L, k) + 1 tokens.
        tokens = np.minimum(window.accepted_lengths, k) + 1
        assert abs(truth[k] - tokens.mean()) <= max(_five_sigma(tokens), 1e-12), k


def test_one_measurement_at_k8_predicts_a_separate_run_at_k3(rng, simulate):
    conditional = DRAFTERS["decaying"]
    at_8 = simulate(rng, conditional, PASSES)
    predicted_k3 = expected_tokens(survival_from_counts(at_8.accepted_per_pos, at_8.drafts))[3]
    at_3 = simulate(rng, conditional[:3], PASSES)
    observed_k3 = mean_accepted_length(at_3.accepted, at_3.drafts)
    tokens = np.minimum(at_3.accepted_lengths, 3) + 1
    assert abs(predicted_k3 - observed_k3) <= 2 * _five_sigma(tokens)


@pytest.mark.parametrize("a", [0.0, 0.3, 0.7, 0.95, 1.0])
@pytest.mark.parametrize("k", [0, 1, 3, 8])
def test_flat_closed_form_matches_simulation(rng, simulate, a, k):
    window = simulate(rng, [a] * max(k, 1), PASSES)
    tokens = np.minimum(window.accepted_lengths, k) + 1
    closed = float(expected_tokens_flat(a, k))
    assert abs(closed - tokens.mean()) <= max(_five_sigma(tokens), 1e-12)
    assert closed == pytest.approx(float(expected_tokens(flat_survival(a, k))[-1]))


def test_rate_and_mean_length_match_the_simulated_passes(rng, simulate):
    conditional = DRAFTERS["decaying"]
    window = simulate(rng, conditional, PASSES)
    k = len(conditional)
    rate = acceptance_rate(window.accepted, window.draft_tokens)
    assert rate == pytest.approx(window.accepted_lengths.mean() / k)
    # vLLM's mean acceptance length is tokens per pass, bonus token included, at k = K ...
    length = mean_accepted_length(window.accepted, window.drafts)
    assert length == pytest.approx(window.accepted_lengths.mean() + 1)
    # ... which is what the survival curve predicts for k = K.
    curve = survival_from_counts(window.accepted_per_pos, window.drafts)
    assert expected_tokens(curve)[-1] == pytest.approx(length)
