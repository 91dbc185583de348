"""The p95 of per-token latency under speculation, from how acceptance varies by request.

The closed forms of ``core._tail`` are checked against a seeded Monte-Carlo of requests that
draft, get accepted position by position and finish, as the scenario format defines them.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from spectune.core import AcceptanceSpread, fit_acceptance_spread, tail_ratio


def _requests(
    alpha: float, concentration: float, k: int, *, decay: float = 0.97, n: int = 3000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-request passes per token, plus the engine's per-position counters and drafts."""
    rng = np.random.default_rng(seed)
    rate = rng.beta(alpha * concentration, (1 - alpha) * concentration, n)
    tokens_wanted = rng.integers(200, 600, n)
    emitted = np.zeros(n)
    passes = np.zeros(n)
    accepted = np.zeros(k)
    drafts = 0.0
    cond = rate[:, None] * decay ** np.arange(k)[None, :]
    while True:
        live = emitted < tokens_wanted - 1
        if not live.any():
            break
        hits = rng.random((int(live.sum()), k)) < cond[live]
        length = np.argmin(np.concatenate([hits, np.zeros((len(hits), 1), bool)], 1), axis=1)
        accepted += (np.arange(k)[None, :] < length[:, None]).sum(axis=0)
        drafts += len(length)
        emitted[live] += length + 1
        passes[live] += 1
    return passes / (tokens_wanted - 1), accepted, drafts


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_the_p95_over_mean_matches_a_simulation_of_requests(k: int) -> None:
    per_token, _, _ = _requests(0.8, 8.0, k)
    simulated = np.quantile(per_token, 0.95) / per_token.mean()
    assert tail_ratio(AcceptanceSpread(0.8, 0.97, 8.0), k) == pytest.approx(simulated, rel=0.03)


def test_a_longer_draft_widens_the_tail_and_alike_requests_keep_it_narrow() -> None:
    varied, alike = AcceptanceSpread(0.8, 0.97, 8.0), AcceptanceSpread(0.8, 0.97, 200.0)
    ratios = [tail_ratio(varied, k) for k in range(0, 9)]
    assert ratios[0] == 1.0
    assert all(b > a for a, b in itertools.pairwise(ratios))
    assert tail_ratio(alike, 4) < 1.1 < 1.4 < tail_ratio(varied, 4)


@pytest.mark.parametrize("concentration", [4.0, 40.0])
def test_the_spread_across_requests_is_read_from_the_counters(concentration: float) -> None:
    _per_token, accepted, drafts = _requests(0.75, concentration, 4, seed=3)
    fit = fit_acceptance_spread([(tuple(accepted), drafts)])
    assert fit is not None
    assert fit.alpha == pytest.approx(0.75, abs=0.03)
    assert fit.concentration == pytest.approx(concentration, rel=0.5)
    # What the policy uses: the tail the fit implies at another k, against the simulation.
    other, _, _ = _requests(0.75, concentration, 2, seed=4)
    simulated = np.quantile(other, 0.95) / other.mean()
    assert tail_ratio(fit, 2) == pytest.approx(simulated, rel=0.05)


def test_windows_at_several_k_pool_and_two_positions_alone_say_nothing() -> None:
    _, acc4, d4 = _requests(0.8, 6.0, 4, seed=5)
    _, acc2, d2 = _requests(0.78, 6.0, 2, seed=6)
    assert fit_acceptance_spread([(tuple(acc2), d2)]) is None
    assert fit_acceptance_spread([(tuple(acc2), d2), (tuple(acc2), d2)]) is None
    pooled = fit_acceptance_spread([(tuple(acc4), d4), (tuple(acc2), d2)])
    assert pooled is not None
    assert pooled.concentration == pytest.approx(6.0, rel=0.5)


def test_a_window_with_a_scrape_gap_is_left_out_of_the_fit() -> None:
    _, acc, drafts = _requests(0.8, 6.0, 4, seed=7)
    clean = fit_acceptance_spread([(tuple(acc), drafts)])
    gap = (float("nan"), *acc[1:])
    assert fit_acceptance_spread([(tuple(acc), drafts), (gap, drafts)]) == clean
    assert fit_acceptance_spread([(gap, drafts)]) is None
