"""spectune-v2's decision rule (search/decide.py) against a fake world of known physics."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from spectune.search.arms import OFF, Arm
from spectune.search.decide import ModelPolicy, target_load, try_first, worse_with_confidence
from spectune.search.history import History, Outcome, TrialRecord, WindowRecord
from spectune.search.objective import Objective
from spectune.search.policy import DecisionKind, DrafterSpec, SearchSpace, TuningContext
from tests.unit.search.test_perf import batch_at, fake_stats

SPACE = SearchSpace((DrafterSpec("d", "eagle3", 6),))
LOAD = fake_stats(OFF, 8.0).tokens_per_s


def window(
    i: int, inc: Arm, can: Arm | None, noise: tuple[float, float] = (1.0, 1.0)
) -> WindowRecord:
    """One window of the fake world at :data:`LOAD` per pod, both groups load-matched."""

    def at(arm: Arm, f: float):  # type: ignore[no-untyped-def]
        s = fake_stats(arm, batch_at(arm, LOAD))
        return replace(s, objective=s.objective * f, objective_low=s.objective_low * f,
                       objective_high=s.objective_high * f)  # fmt: skip

    return WindowRecord(300.0 * i, 300.0 * (i + 1), at(inc, noise[0]),
                        at(can, noise[1]) if can else None, inc.name)  # fmt: skip


def drive(
    incumbent: Arm, space: SearchSpace = SPACE, steps: int = 30
) -> tuple[Arm, History, list[str]]:
    """Run the policy on the fake world until its final promotion; (arm, history, reasons)."""
    policy = ModelPolicy()
    history = History(baseline=((0, window(0, incumbent, None)),))
    reasons: list[str] = []
    i = 1
    for _ in range(steps):
        ctx = TuningContext(space, Objective(), incumbent, 300.0 * i, seed=3)
        d = policy.decide(ctx, history)
        reasons.append(d.reason)
        epoch = history.in_epoch()
        running = epoch[-1] if epoch and epoch[-1].outcome is Outcome.RUNNING else None
        if running is not None and d.end_running is not None:
            history = history.update_last(running.ended(d.end_running, d.reason))
            running = None
        if d.kind is DecisionKind.PROMOTE:
            assert d.arm is not None
            if d.final:
                return d.arm, history, reasons
            incumbent = d.arm
            continue
        if d.kind is DecisionKind.TRIAL:
            assert d.arm is not None
            if running is None or running.arm != d.arm.name:
                history = history.add_trial(TrialRecord(d.arm.name, incumbent.name, 0, 300.0 * i))
            last = history.in_epoch()[-1]
            history = history.update_last(last.with_window(window(i, incumbent, d.arm)))
        i += 1
    raise AssertionError(f"no final decision in {steps} steps: {reasons[-3:]}")


def true_objective(arm: Arm) -> float:
    return fake_stats(arm, batch_at(arm, LOAD)).objective


def test_finds_an_arm_within_epsilon_of_the_best_in_few_trials() -> None:
    arm, history, _ = drive(OFF)
    best = min(SPACE.arms(), key=true_objective)
    assert true_objective(arm) <= true_objective(best) * 1.02
    assert len(history.trials) <= 4  # restarts: far fewer than the 7 arms


def test_keeps_the_incumbent_when_the_leader_is_not_better_by_epsilon() -> None:
    # An A/A world: the drafter's twin is the same physics under another name.
    twin = SearchSpace(
        (DrafterSpec("d", "eagle3", 1), DrafterSpec("t", "eagle3", 1)), allow_off=False
    )
    incumbent = Arm("d", 1)
    policy = ModelPolicy()
    trial = TrialRecord("t/1", "d/1", 0, 300.0)
    # The twin reads 1.5 % faster in each of three windows: inside ε = 2 %.
    for i in range(1, 4):
        w = window(i, incumbent, incumbent, noise=(1.0, 0.985))
        can = replace(w.canary, accepted_per_pos=w.canary.accepted_per_pos)  # type: ignore[arg-type]
        trial = trial.with_window(replace(w, canary=can))
    history = History(baseline=((0, window(0, incumbent, None)),)).add_trial(trial)
    ctx = TuningContext(twin, Objective(), incumbent, 1200.0, seed=3)
    d = policy.decide(ctx, history)
    assert d.kind is DecisionKind.PROMOTE and d.final
    assert d.arm == incumbent, d.reason


def test_the_sequential_test_vetoes_an_arm_its_windows_show_worse() -> None:
    t = TrialRecord("d/3", "off", 0, 0.0)
    for i in range(4):
        t = t.with_window(window(i, OFF, OFF, noise=(1.0, 1.15)))
    assert worse_with_confidence([t], "d/3", "off", minimise=True, delta=0.05)
    assert not worse_with_confidence([t], "d/3", "off", minimise=False, delta=0.05)


def test_the_sequential_test_holds_its_level_on_noise_read_every_window() -> None:
    # Paired differences that are pure noise of the size the windows' intervals state (each
    # group ±2 % at one sigma), read after every window of 10: the share of sequences that
    # ever cross the boundary stays at most δ.
    rng = np.random.default_rng(7)
    crossed = 0
    for _ in range(400):
        t = TrialRecord("d/3", "off", 0, 0.0)
        for i in range(10):
            f = math.exp(rng.normal(0.0, 0.02 * math.sqrt(2)))
            t = t.with_window(window(i, OFF, OFF, noise=(1.0, f)))
            if worse_with_confidence([t], "d/3", "off", True, 0.05):
                crossed += 1
                break
    assert crossed / 400 <= 0.05


def test_a_guardrail_breach_aborts_the_trial() -> None:
    inc = OFF
    w = window(2, inc, Arm("d", 3))
    slow = replace(w.canary, ttft_p95=1.0, ttft_p95_low=0.9, ttft_p95_high=1.1)  # type: ignore[arg-type]
    trial = TrialRecord("d/3", "off", 0, 300.0).with_window(window(1, inc, Arm("d", 3)))
    trial = trial.with_window(replace(w, canary=slow))  # its second window: no catch-up burst
    history = History(baseline=((0, window(0, inc, None)),)).add_trial(trial)
    d = ModelPolicy().decide(TuningContext(SPACE, Objective(), inc, 600.0), history)
    assert d.end_running is Outcome.ABORTED
    assert d.arm != Arm("d", 3)
    assert "guardrail" in d.reason


def test_target_load_counts_the_pods_that_serve_after_the_trial() -> None:
    w = window(0, OFF, Arm("d", 3))
    h = History().add_trial(TrialRecord("d/3", "off", 0, 0.0).with_window(w))
    both = w.incumbent.tokens_per_s + w.canary.tokens_per_s  # type: ignore[union-attr]
    # The canary took a target pod's place: two pods serve afterwards; beside, one.
    assert target_load(h, beside=False) == both / 2
    assert target_load(h, beside=True) == both


def test_a_challenger_worth_more_than_the_leaders_gain_is_tried_before_promoting() -> None:
    # d/1 beats off with confidence; d/1's counters put longer drafts far ahead of it, by
    # more than d/1 gains over off: one trial now saves a rollout and its verification.
    trial = TrialRecord("d/1", "off", 0, 300.0)
    for i in (1, 2):
        trial = trial.with_window(window(i, OFF, Arm("d", 1)))
    history = History(baseline=((0, window(0, OFF, None)),)).add_trial(trial)
    d = ModelPolicy().decide(TuningContext(SPACE, Objective(), OFF, 900.0, seed=3), history)
    assert d.kind is DecisionKind.TRIAL and d.arm is not None and d.arm.k > 1, d.reason
    assert "trying first" in d.reason
    # With a leader whose gain dwarfs what is left, it is promoted at once.
    assert not try_first(lead_gain=0.4, challenger_gain=0.05)
