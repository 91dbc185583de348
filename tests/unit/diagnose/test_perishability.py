"""A drafter that stopped working, and a pod whose acceptance decays with its uptime.

Both are told apart from what they are not: a poor but working drafter (LOW_ACCEPTANCE),
a window too short to say, and a change of the traffic or the model, which moves every pod
of the arm together.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from spectune.diagnose import Code, Thresholds, diagnose, drafter_broken, pod_decay
from spectune.engines import Dialect
from spectune.metrics import Observation, PodCounts, SpecCounts, observation_from_pages
from spectune.metrics.exposition import parse_page

HOUR = 3600.0


def fleet(levels: dict[str, tuple[float, float]], drafts: float = 20_000) -> Observation:
    """A FAKE window of pods: per pod its P(L>=1) and its engine's start (Unix seconds)."""
    per_pod = {
        name: PodCounts(drafts, drafts * p1, drafts * p1 * 2.0, started)
        for name, (p1, started) in levels.items()
    }
    total = drafts * len(levels)
    first = sum(c.first_accepted or 0.0 for c in per_pod.values())
    return Observation(
        dialect=Dialect.VLLM_V1,
        window_s=300,
        pods=tuple(levels),
        spec=SpecCounts(total, total * 3, first * 2.0, (first, first * 0.7, first * 0.3)),
        per_pod=per_pod,
    )


# -- a broken drafter -----------------------------------------------------------------------


def test_a_drafter_whose_first_token_never_lands_is_broken_with_its_numbers() -> None:
    f = drafter_broken(drafts=5000, first_accepted=4)
    assert f is not None and f.code is Code.DRAFTER_BROKEN
    assert f.evidence["drafts"] == 5000 and f.evidence["p_len_ge_1"] == pytest.approx(0.0008)
    assert f.evidence["p_len_ge_1_upper"] < 0.03
    assert "5000 drafts" in f.message


def test_too_few_drafts_cannot_call_a_drafter_broken_however_low() -> None:
    # Nothing landed in 120 drafts: the upper bound is still above 3 %.
    assert drafter_broken(drafts=120, first_accepted=0) is None
    assert drafter_broken(drafts=400, first_accepted=0) is not None


def test_a_poor_but_working_drafter_is_not_broken() -> None:
    # An n-gram drafter on chat lands a tenth of its first tokens: a poor fit, not broken.
    assert drafter_broken(drafts=50_000, first_accepted=5_000) is None
    # 2.5 % measured over few drafts: the bound does not exclude 3 %.
    assert drafter_broken(drafts=1000, first_accepted=25) is None


def test_without_per_position_counters_the_accepted_tokens_bound_the_first_position() -> None:
    f = drafter_broken(drafts=5000, first_accepted=None, accepted=10)
    assert f is not None and "upper bound" in f.evidence["source"]
    assert drafter_broken(drafts=5000, first_accepted=None, accepted=2000) is None
    assert drafter_broken(drafts=5000, first_accepted=None, accepted=None) is None


def test_diagnose_reports_a_broken_drafter_instead_of_low_acceptance() -> None:
    drafts = 10_000.0
    obs = Observation(
        dialect=Dialect.VLLM_V1,
        window_s=300,
        pods=("p",),
        spec=SpecCounts(drafts, drafts * 3, 3.0, (2.0, 1.0, 0.0)),
    )
    d = diagnose(obs, draft_cost=0.05)
    assert Code.DRAFTER_BROKEN in d.codes
    assert Code.LOW_ACCEPTANCE not in d.codes and Code.HEALTHY not in d.codes
    (f,) = [f for f in d.findings if f.code is Code.DRAFTER_BROKEN]
    assert f.evidence["mean_accepted_length"] == pytest.approx(1.0003)


def test_a_custom_broken_level_changes_the_verdict() -> None:
    # 2 % of 50 000 drafts is below the default 3 %, and above a stricter 1 %.
    assert drafter_broken(drafts=50_000, first_accepted=1_000) is not None
    strict = Thresholds(broken_level=0.01)
    assert drafter_broken(drafts=50_000, first_accepted=1_000, thresholds=strict) is None
    assert drafter_broken(drafts=50_000, first_accepted=300, thresholds=strict) is not None


# -- per-pod decay ----------------------------------------------------------------------------


def test_an_old_pod_below_its_younger_peers_decays_with_its_uptime() -> None:
    obs = fleet({"old": (0.62, 0.0), "mid": (0.80, 5 * HOUR), "new": (0.81, 6 * HOUR)})
    (f,) = pod_decay(obs)
    assert f.code is Code.POD_ACCEPTANCE_DECAY and f.evidence["pod"] == "old"
    assert f.evidence["p_len_ge_1"] == pytest.approx(0.62)
    assert f.evidence["peers_p_len_ge_1"] == pytest.approx(0.805)
    assert f.evidence["peers"] == 2 and f.evidence["older_than_peers_s"] == 5.5 * HOUR
    assert "pod old" in f.message and "5.5 h" in f.message
    # The diagnosis the status shows carries it, and no longer calls the group healthy.
    d = diagnose(obs, draft_cost=0.05)
    assert Code.POD_ACCEPTANCE_DECAY in d.codes and Code.HEALTHY not in d.codes


def test_traffic_drift_moves_every_pod_together_and_is_not_pod_decay() -> None:
    # The traffic changed: every pod's acceptance fell from 0.8 to 0.6, old and new alike.
    obs = fleet({"old": (0.60, 0.0), "mid": (0.61, 5 * HOUR), "new": (0.60, 6 * HOUR)})
    assert pod_decay(obs) == ()
    d = diagnose(obs, draft_cost=0.05)
    assert Code.POD_ACCEPTANCE_DECAY not in d.codes


def test_the_youngest_pod_low_is_not_decay_with_age() -> None:
    # A pod low from its start has no younger peer: whatever it is, it is not ageing.
    obs = fleet({"old": (0.80, 0.0), "mid": (0.81, 5 * HOUR), "new": (0.60, 6 * HOUR)})
    assert pod_decay(obs) == ()


def test_a_small_gap_between_pods_is_noise_not_decay() -> None:
    # 0.78 against 0.80 is within the margin (and near the noise of 20 000 drafts).
    obs = fleet({"old": (0.78, 0.0), "new": (0.80, 6 * HOUR)})
    assert pod_decay(obs) == ()
    # The same gap over few drafts is not evidence either.
    few = fleet({"old": (0.70, 0.0), "new": (0.80, 6 * HOUR)}, drafts=1000)
    assert pod_decay(few) == ()
    assert pod_decay(fleet({"old": (0.70, 0.0), "new": (0.80, 6 * HOUR)})) != ()


def test_pods_without_a_start_time_are_not_compared() -> None:
    obs = fleet({"old": (0.60, 0.0), "new": (0.80, 6 * HOUR)})
    unknown = {n: PodCounts(c.drafts, c.first_accepted, c.accepted) for n, c in obs.per_pod.items()}
    assert pod_decay(replace(obs, per_pod=unknown)) == ()


def test_each_pods_counts_and_start_come_from_its_own_pages() -> None:
    def page(drafts: int, first: int, started: float) -> str:
        return (
            "# TYPE vllm:spec_decode_num_drafts counter\n"
            f"vllm:spec_decode_num_drafts_total {drafts}\n"
            "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
            f"vllm:spec_decode_num_draft_tokens_total {drafts * 2}\n"
            "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
            f"vllm:spec_decode_num_accepted_tokens_total {first + first // 2}\n"
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter\n"
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {first}\n'
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="1"}} {first // 2}\n'
            "# TYPE process_start_time_seconds gauge\n"
            f"process_start_time_seconds {started}\n"
        )

    before = [parse_page(page(0, 0, 100.0), pod="a"), parse_page(page(0, 0, 900.0), pod="b")]
    after = [
        parse_page(page(1000, 600, 100.0), pod="a"),
        parse_page(page(500, 400, 900.0), pod="b"),
    ]
    obs = observation_from_pages(before, after, 60)
    assert obs.per_pod["a"] == PodCounts(1000, 600, 900, 100.0)
    assert obs.per_pod["b"] == PodCounts(500, 400, 600, 900.0)
