"""The baseline policies decide as their names say, from the history alone.

Histories are built by hand: each trial window pairs a canary's objective with the
incumbent's in the same window, as the controller records them.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from spectune.search.arms import OFF, Arm
from spectune.search.baselines import (
    ACCEPTANCE_HIGH,
    EPSILON,
    AcceptanceThresholdPolicy,
    EpsilonGreedyPolicy,
    GridPolicy,
    OraclePolicy,
    StaticPolicy,
    UCB1Policy,
    paired_ratios,
)
from spectune.search.history import History, Outcome, TrialRecord, WindowRecord
from spectune.search.objective import Metric, Objective, WindowStats
from spectune.search.policy import DecisionKind, DrafterSpec, SearchSpace, TuningContext

SPACE = SearchSpace((DrafterSpec("eagle3", "eagle3", 3), DrafterSpec("ngram", "ngram", 1)))
ARMS = [a.name for a in SPACE.arms()]  # off, eagle3/1..3, ngram/1


def stats(objective: float, requests: float = 100.0, **kw: object) -> WindowStats:
    base = WindowStats(
        objective=objective,
        objective_low=math.nan,
        objective_high=math.nan,
        requests=requests,
        tpot_mean=objective,
        tpot_p95=objective,
        ttft_p95=0.1,
        ttft_p95_low=0.09,
        ttft_p95_high=0.11,
        queue_p95=0.01,
        queue_p95_low=0.0,
        queue_p95_high=0.02,
        e2e_p95=2.0,
        tokens_per_s=100.0,
        running=4.0,
        pods=1,
        k=0,
        drafts=0.0,
        accepted_per_pos=(),
        mean_accepted_length=1.0,
        num_gpu_blocks=1000,
        preemptions=0.0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def ctx(
    incumbent: Arm = OFF,
    now: float = 1000.0,
    metric: Metric = Metric.TPOT_P95,
    max_trials: int = 12,
    seed: int = 0,
) -> TuningContext:
    return TuningContext(
        space=SPACE,
        objective=Objective(metric),
        incumbent=incumbent,
        now_s=now,
        max_trials=max_trials,
        seed=seed,
    )


def trial(
    arm: str,
    values: list[float],
    incumbent_value: float | None = 0.02,
    outcome: Outcome = Outcome.MEASURED,
    requests: float = 100.0,
) -> TrialRecord:
    windows = tuple(
        WindowRecord(
            i * 60.0,
            (i + 1) * 60.0,
            None if incumbent_value is None else stats(incumbent_value),
            stats(v, requests=requests),
        )
        for i, v in enumerate(values)
    )
    return TrialRecord(arm, "off", 0, 0.0, outcome, "", windows)


def history(*trials: TrialRecord) -> History:
    h = History()
    for t in trials:
        h = h.add_trial(t)
    return h


# --- paired evidence ---------------------------------------------------------------------


def test_paired_ratio_is_incumbent_over_canary_for_a_latency():
    h = history(trial("eagle3/2", [0.01]))
    assert paired_ratios(ctx(), h) == {"eagle3/2": [pytest.approx(2.0)]}


def test_paired_ratio_is_canary_over_incumbent_for_a_throughput():
    h = history(trial("eagle3/2", [150.0], incumbent_value=100.0))
    got = paired_ratios(ctx(metric=Metric.OUTPUT_TOKENS_PER_SECOND), h)
    assert got == {"eagle3/2": [pytest.approx(1.5)]}


def test_one_replica_fleet_pairs_against_the_baseline_windows():
    h = History().add_baseline(WindowRecord(0, 60, stats(0.03)))
    h = h.add_trial(trial("eagle3/1", [0.015], incumbent_value=None))
    assert paired_ratios(ctx(), h) == {"eagle3/1": [pytest.approx(2.0)]}


def test_a_window_with_too_few_canary_requests_is_no_evidence():
    h = history(trial("eagle3/1", [0.01], requests=5))
    assert paired_ratios(ctx(), h) == {}


# --- static ------------------------------------------------------------------------------


def test_static_promotes_its_arm_and_is_named_after_it():
    p = StaticPolicy(Arm("eagle3", 2))
    d = p.decide(ctx(), History())
    assert p.name == "static:eagle3/2"
    assert (d.kind, d.arm) == (DecisionKind.PROMOTE, Arm("eagle3", 2))


# --- grid --------------------------------------------------------------------------------


def test_grid_tries_every_arm_in_order_then_promotes_the_best_measured():
    p = GridPolicy()
    h = History()
    tried = []
    values = {
        "off": 0.02,
        "eagle3/1": 0.015,
        "eagle3/2": 0.011,
        "eagle3/3": 0.012,
        "ngram/1": 0.019,
    }
    for _ in range(len(ARMS)):
        d = p.decide(ctx(), h)
        assert d.kind is DecisionKind.TRIAL and d.arm is not None
        tried.append(d.arm.name)
        h = h.add_trial(trial(d.arm.name, [values[d.arm.name]], outcome=Outcome.RUNNING))
        h = h.update_last(h.trials[-1].ended(Outcome.MEASURED, ""))
    assert tried == ARMS
    d = p.decide(ctx(), h)
    assert (d.kind, d.arm) == (DecisionKind.PROMOTE, Arm("eagle3", 2))


def test_grid_keeps_measuring_a_trial_without_enough_requests():
    h = history(trial("off", [0.02], outcome=Outcome.RUNNING, requests=3))
    d = GridPolicy().decide(ctx(), h)
    assert (d.kind, d.arm, d.end_running) == (DecisionKind.TRIAL, OFF, None)


def test_grid_never_promotes_an_arm_that_could_not_start():
    ts = [trial(a, [0.02]) for a in ARMS if a != "eagle3/3"]
    ts.append(trial("eagle3/3", [], outcome=Outcome.INFEASIBLE))
    d = GridPolicy().decide(ctx(), history(*ts))
    assert d.kind is DecisionKind.PROMOTE and d.arm is not None
    assert d.arm.name != "eagle3/3"


# --- ε-greedy ----------------------------------------------------------------------------


def test_egreedy_exploits_the_best_mean_and_explores_at_about_epsilon():
    h = history(trial("eagle3/1", [0.015]), trial("eagle3/2", [0.01]))
    picks = [EpsilonGreedyPolicy().decide(ctx(seed=s), h).arm for s in range(400)]
    exploit = sum(a == Arm("eagle3", 2) for a in picks) / len(picks)
    # exploitation, plus exploration that lands on eagle3/2 by chance (1 of 4 candidates)
    expected = 1 - EPSILON + EPSILON / 4
    assert abs(exploit - expected) < 0.07


def test_egreedy_is_deterministic_for_a_seed_and_history():
    h = history(trial("eagle3/1", [0.015]))
    a = [EpsilonGreedyPolicy().decide(ctx(seed=7), h) for _ in range(3)]
    assert len({d.arm for d in a}) == 1


def test_egreedy_promotes_the_best_measured_arm_when_the_budget_is_spent():
    h = history(trial("eagle3/1", [0.015, 0.016]), trial("eagle3/2", [0.01]))
    d = EpsilonGreedyPolicy().decide(ctx(max_trials=3), h)
    assert (d.kind, d.arm) == (DecisionKind.PROMOTE, Arm("eagle3", 2))


def test_egreedy_keeps_the_incumbent_when_nothing_beat_it():
    h = history(trial("eagle3/1", [0.03]), trial("ngram/1", [0.025]))
    d = EpsilonGreedyPolicy().decide(ctx(max_trials=2), h)
    assert (d.kind, d.arm) == (DecisionKind.PROMOTE, OFF)


# --- UCB1 --------------------------------------------------------------------------------


def test_ucb1_pulls_every_non_incumbent_arm_once_in_order_first():
    h = history(trial("eagle3/1", [0.015]))
    d = UCB1Policy().decide(ctx(), h)
    assert (d.kind, d.arm, d.end_running) == (DecisionKind.TRIAL, Arm("eagle3", 2), None)


def test_ucb1_bonus_sends_it_back_to_a_rarely_pulled_arm():
    # eagle3/2 has the best mean after many pulls; eagle3/3 is a close second with one pull.
    ts = [
        trial("eagle3/1", [0.03]),
        trial("eagle3/2", [0.0105] * 8),
        trial("eagle3/3", [0.011]),
        trial("ngram/1", [0.03]),
    ]
    d = UCB1Policy().decide(ctx(max_trials=100), history(*ts))
    assert d.arm == Arm("eagle3", 3)


def test_ucb1_exploits_once_the_bonus_is_small():
    ts = [
        trial("eagle3/1", [0.03] * 20),
        trial("eagle3/2", [0.01] * 20),
        trial("eagle3/3", [0.03] * 20),
        trial("ngram/1", [0.03] * 20),
    ]
    d = UCB1Policy().decide(ctx(max_trials=1000), history(*ts))
    assert d.arm == Arm("eagle3", 2)


def test_ucb1_continues_the_running_arm_without_a_restart():
    ts = [trial(a, [0.03]) for a in ("eagle3/1", "eagle3/3", "ngram/1")]
    ts.append(trial("eagle3/2", [0.01], outcome=Outcome.RUNNING))
    d = UCB1Policy().decide(ctx(max_trials=100), history(*ts))
    assert (d.arm, d.end_running) == (Arm("eagle3", 2), None)


# --- acceptance-threshold --------------------------------------------------------------------


def accepting(
    rate: float, k: int, now: float = 1000.0, drafts: float = 1000.0, objective: float = 0.01
) -> History:
    """A baseline window that ended at ``now`` with a flat per-position acceptance ``rate``."""
    w = stats(objective, k=k, drafts=drafts, accepted_per_pos=tuple([rate * drafts] * k))
    return History().add_baseline(WindowRecord(now - 60, now, w))


def test_acceptance_threshold_raises_k_above_the_band():
    d = AcceptanceThresholdPolicy().decide(ctx(Arm("eagle3", 2)), accepting(0.9, 2))
    assert (d.kind, d.arm) == (DecisionKind.PROMOTE, Arm("eagle3", 3))


def test_acceptance_threshold_lowers_k_below_the_band_and_switches_off_below_k1():
    p = AcceptanceThresholdPolicy()
    assert p.decide(ctx(Arm("eagle3", 2)), accepting(0.3, 2)).arm == Arm("eagle3", 1)
    assert p.decide(ctx(Arm("eagle3", 1)), accepting(0.3, 1)).arm == OFF


def test_acceptance_threshold_holds_inside_the_band_and_at_max_k():
    p = AcceptanceThresholdPolicy()
    assert p.decide(ctx(Arm("eagle3", 2)), accepting(0.6, 2)).kind is DecisionKind.HOLD
    high = min(1.0, ACCEPTANCE_HIGH + 0.2)
    assert p.decide(ctx(Arm("eagle3", 3)), accepting(high, 3)).kind is DecisionKind.HOLD


def test_acceptance_threshold_ignores_latency_entirely():
    # The #26504 failure: acceptance is flat and high while speculation costs latency.
    p = AcceptanceThresholdPolicy()
    fast = p.decide(ctx(Arm("eagle3", 2)), accepting(0.9, 2, objective=0.01))
    slow = p.decide(ctx(Arm("eagle3", 2)), accepting(0.9, 2, objective=9.9))
    assert fast == slow
    assert slow.arm == Arm("eagle3", 3)


def test_acceptance_threshold_waits_for_a_window_measured_after_the_rollout():
    d = AcceptanceThresholdPolicy().decide(ctx(Arm("eagle3", 2), now=1500), accepting(0.9, 2))
    assert d.kind is DecisionKind.HOLD


def test_acceptance_threshold_starts_speculating_once_and_stays_off_after_turning_off():
    p = AcceptanceThresholdPolicy()
    d = p.decide(ctx(OFF), History())
    assert (d.kind, d.arm) == (DecisionKind.PROMOTE, Arm("eagle3", 3))
    turned_off = History().promoted("eagle3/3").promoted("off")
    assert p.decide(ctx(OFF), turned_off).kind is DecisionKind.HOLD


# --- oracle --------------------------------------------------------------------------------


def test_oracle_promotes_the_phase_arm_and_holds_once_it_runs():
    p = OraclePolicy(((0.0, 300.0, "eagle3/3"), (300.0, 600.0, "off")))
    assert p.decide(ctx(OFF, now=60), History()).arm == Arm("eagle3", 3)
    assert p.decide(ctx(Arm("eagle3", 3), now=120), History()).kind is DecisionKind.HOLD
    assert p.decide(ctx(Arm("eagle3", 3), now=360), History()).arm == OFF
    assert p.arm_at(10_000) == OFF
