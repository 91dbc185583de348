"""What the SpecTuning status says after a step, and that the loop's memory survives a restart."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from spectune.api.status import ConditionStatus, Phase, SpecTuningStatus, parse_status
from spectune.control.controller import ControllerState
from spectune.control.controller import Phase as LoopPhase
from spectune.k8s.projection import (
    MEMORY_VERSION,
    ConditionUpdate,
    Memory,
    StatusInputs,
    acceptance_of,
    api_phase,
    build_status,
    decode_memory,
    load_memory,
    merge_conditions,
    recommendation_of,
    verified_condition,
)
from spectune.search.arms import OFF, Arm
from spectune.search.history import History, Outcome, TrialRecord, WindowRecord
from spectune.search.objective import WindowStats
from spectune.search.policy import Decision, DecisionKind, Estimate

NAN = math.nan
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def status_stats(  # type: ignore[no-untyped-def]
    objective: float, *, k: int = 0, drafts: float = 0.0, per_pos=(), accepted_length: float = 2.5
) -> WindowStats:
    """A one-pod window as the status projection reads it (also the status-command test's)."""
    return WindowStats(
        objective=objective, objective_low=NAN, objective_high=NAN, requests=100,
        tpot_mean=objective, tpot_p95=objective, ttft_p95=0.2, ttft_p95_low=NAN,
        ttft_p95_high=NAN, queue_p95=0.0, queue_p95_low=NAN, queue_p95_high=NAN,
        e2e_p95=NAN, tokens_per_s=NAN, running=4.0, pods=1, k=k, drafts=drafts,
        accepted_per_pos=tuple(per_pos),
        mean_accepted_length=NAN if not drafts else accepted_length,
        num_gpu_blocks=None, preemptions=0.0,
    )  # fmt: skip


def _history() -> History:
    w = WindowRecord(
        100.0,
        110.0,
        status_stats(0.030),
        status_stats(0.020, k=3, drafts=1000, per_pos=(800, 600, 400)),
        "off",
    )
    t = TrialRecord("eagle3/3", "off", 0, 100.0, Outcome.MEASURED, "next arm chosen", (w,))
    running = TrialRecord("eagle3/2", "off", 0, 120.0)
    return History().add_baseline(WindowRecord(80.0, 90.0, status_stats(0.031))).add_trial(
        t).add_trial(running)  # fmt: skip


def test_memory_round_trips_through_the_status_json() -> None:
    state = ControllerState(
        phase=LoopPhase.EXPLORING, model_version="sha-1", reference_acceptance=NAN,
        trial_started_s=120.0,
    )  # fmt: skip
    memory = Memory(_history(), state, original="off")
    doc = build_status(
        SpecTuningStatus(), StatusInputs(phase=Phase.EXPLORING, generation=2, now=T0,
                                          memory=memory)
    )  # fmt: skip
    back = load_memory(parse_status(doc).history)
    assert back.history == memory.history
    assert back.original == "off"
    assert back.state == replace(state, reference_acceptance=None)  # NaN is stored as null
    assert load_memory(None) == Memory(History(), ControllerState())


def test_trials_show_the_measured_values_and_the_running_one() -> None:
    doc = build_status(
        SpecTuningStatus(),
        StatusInputs(phase=Phase.EXPLORING, generation=1, now=T0,
                     memory=Memory(_history(), ControllerState())),
    )  # fmt: skip
    first, second = doc["trials"]
    assert first["arm"] == "eagle3/3" and first["outcome"] == "measured"
    assert first["canaryObjective"] == 0.020 and first["incumbentObjective"] == 0.030
    assert first["windows"] == 1 and first["startedAt"].startswith("1970-01-01T00:01:40")
    assert second["outcome"] == "running" and "canaryObjective" not in second


def test_a_trial_shows_the_per_pod_load_of_both_groups_and_their_ratio() -> None:
    """Canary: 100 requests on 1 pod over 10 s; incumbent: 300 on 2 pods (15/s per pod)."""
    can = replace(status_stats(0.020), requests=100, pods=1, running=6.0)
    inc = replace(status_stats(0.030), requests=300, pods=2, running=9.0)
    beside = WindowRecord(100.0, 110.0, inc, can, "off")
    matched = WindowRecord(110.0, 120.0, inc, replace(can, requests=150), "off")
    t = TrialRecord("eagle3/3", "off", 0, 100.0, Outcome.MEASURED, "", (beside, matched))
    doc = build_status(
        SpecTuningStatus(),
        StatusInputs(phase=Phase.EXPLORING, generation=1, now=T0,
                     memory=Memory(History().add_trial(t), ControllerState())),
    )  # fmt: skip
    (trial,) = doc["trials"]
    assert trial["canaryLoadPerPod"] == 12.5  # (10 + 15) / 2 per pod per second
    assert trial["incumbentLoadPerPod"] == 15.0
    assert (trial["canaryBatch"], trial["incumbentBatch"]) == (6.0, 9.0)
    assert math.isclose(trial["loadRatio"], (10 / 15 + 1.0) / 2)
    assert trial["matchedWindows"] == 1  # 0.67 is outside ±15 %, 1.0 within
    running = build_status(
        SpecTuningStatus(),
        StatusInputs(phase=Phase.EXPLORING, generation=1, now=T0,
                     memory=Memory(History().add_trial(TrialRecord("eagle3/2", "off", 0, 1.0)),
                                   ControllerState())),
    )["trials"][0]  # fmt: skip
    assert "loadRatio" not in running and "matchedWindows" not in running


def test_a_switchback_trial_says_so_and_counts_its_restarts_across_a_restart() -> None:
    """An in-place trial's restarts (two per A/B pair) are kept with the memory; a trial
    that ran on a canary shows neither field."""
    memory = Memory(_history(), ControllerState(), "off", {120.0: 3, 999.0: 7})
    doc = build_status(
        SpecTuningStatus(),
        StatusInputs(phase=Phase.EXPLORING, generation=1, now=T0, memory=memory),
    )
    canary, switchback = doc["trials"]
    assert "switchback" not in canary and "restarts" not in canary
    assert switchback["switchback"] is True and switchback["restarts"] == 3
    back = load_memory(parse_status(doc).history)
    assert back.restarts == {120.0: 3}, "a trial no longer in the history is forgotten"


def test_acceptance_from_per_position_counts() -> None:
    acc = acceptance_of(status_stats(0.02, k=3, drafts=1000, per_pos=(800, 600, 400)), 10.0)
    assert acc is not None
    assert acc.per_position == (0.8, 0.6, 0.4)
    assert math.isclose(acc.rate, 0.6) and acc.window == "10s"
    assert acceptance_of(status_stats(0.03), 10.0) is None  # off: no drafts, no acceptance


def test_acceptance_across_a_rollout_is_the_engines_own_rate() -> None:
    # A window spanning a promotion 8 → 3: old pods' passes reported positions 4..8 while
    # the new pods drafted 3 tokens a pass. Σ P(L ≥ i) / 8 would read 0.24; the engine's
    # accepted / draft tokens is what `spectune:acceptance_rate` shows.
    per_pos = (700, 500, 300, 60, 40, 20, 10, 5)  # Σ = 1635 accepted of 1000 passes
    stats = replace(
        status_stats(0.02, k=8, drafts=1000, per_pos=per_pos),
        mean_accepted_length=2.635,
        draft_tokens=3000.0,
    )
    acc = acceptance_of(stats, 10.0)
    assert acc is not None
    assert math.isclose(acc.rate, 1635 / 3000)


def test_recommendation_speedup_is_against_off() -> None:
    est = {
        "off": Estimate(1.0, 0.97, 1.03, True),
        "eagle3/3": Estimate(0.66, 0.60, 0.70, True),
        "eagle3/1": Estimate(0.80, 0.75, 0.85, False),
    }
    d = Decision(DecisionKind.PROMOTE, Arm("eagle3", 3), "eagle3/3 wins", estimates=est)
    rec = recommendation_of(d, OFF, minimise=True)
    assert rec is not None and rec.arm == "eagle3/3" and rec.k == 3
    assert rec.expected_speedup == round(1 / 0.66, 2)  # two decimals: 1.52
    assert rec.interval is not None
    assert rec.interval.low < rec.expected_speedup < rec.interval.high
    # While exploring, the recommendation is the best estimate so far, not the arm on trial.
    trial = Decision(DecisionKind.TRIAL, Arm("eagle3", 1), "try k=1", estimates=est)
    assert recommendation_of(trial, OFF, minimise=True).arm == "eagle3/3"  # type: ignore[union-attr]


def test_speedup_is_the_applied_arms_measured_gain_not_the_recommendations() -> None:
    # SPEEDUP (printer column .status.applied.speedup): the target's own arm, measured
    # against off, on the objective. A better arm still predicted (eagle3/5) moves the
    # recommendation's expectedSpeedup, never the applied arm's figure.
    est = {
        "off": Estimate(1.0, 0.97, 1.03, True),
        "eagle3/3": Estimate(0.65, 0.62, 0.68, True),
        "eagle3/5": Estimate(0.50, 0.30, 0.90, False),
    }
    d = Decision(DecisionKind.TRIAL, Arm("eagle3", 5), "try k=5", estimates=est)
    applied = Arm("eagle3", 3)

    def step(prev: SpecTuningStatus, decision: Decision | None, arm: Arm) -> SpecTuningStatus:
        doc = build_status(
            prev,
            StatusInputs(
                phase=Phase.EXPLORING,
                generation=1,
                now=T0,
                decision=decision,
                applied=arm,
                fingerprint="f",
            ),
        )
        return parse_status(doc)

    first = step(SpecTuningStatus(), d, applied)
    assert first.applied is not None and first.applied.speedup is not None
    assert first.applied.speedup == 1.54  # 1 / 0.65, to two decimals as kubectl shows it
    rec = first.recommendation
    assert rec is not None and rec.arm == "eagle3/5" and rec.expected_speedup == 2.0
    # A step that decided nothing keeps the figure; another arm applied starts unset.
    kept = step(first, None, applied)
    assert kept.applied is not None and kept.applied.speedup == first.applied.speedup
    moved = step(kept, None, Arm("eagle3", 5))
    assert moved.applied is not None and moved.applied.speedup is None
    # off never measured: no figure, however good the prediction.
    unmeasured = {**est, "off": Estimate(1.0, 0.9, 1.1, False)}
    blind = step(SpecTuningStatus(), replace(d, estimates=unmeasured), applied)
    assert blind.applied is not None and blind.applied.speedup is None
    # off applied: 1 by definition; a throughput objective reads the ratio the other way.
    assert step(SpecTuningStatus(), None, OFF).applied.speedup == 1.0  # type: ignore[union-attr]
    tput = build_status(
        SpecTuningStatus(),
        StatusInputs(
            phase=Phase.EXPLORING,
            generation=1,
            now=T0,
            decision=d,
            applied=applied,
            fingerprint="f",
            minimise=False,
        ),
    )
    assert math.isclose(tput["applied"]["speedup"], 0.65)


def test_conditions_keep_their_transition_time_until_the_status_changes() -> None:
    ok = ConditionUpdate("MetricsAvailable", ConditionStatus.TRUE, "MetricsAnswer", "fine")
    down = ConditionUpdate("MetricsAvailable", ConditionStatus.FALSE, "SourceUnavailable", "x")
    first = merge_conditions((), [ok], T0, 1)
    later = T0 + timedelta(minutes=5)
    same = merge_conditions(first, [ok], later, 2)
    assert same[0].last_transition_time == T0 and same[0].observed_generation == 2
    moved = merge_conditions(same, [down], later, 2)
    assert moved[0].last_transition_time == later and moved[0].reason == "SourceUnavailable"


def test_a_step_without_news_keeps_the_previous_recommendation() -> None:
    est = {"off": Estimate(1.0, 0.9, 1.1, True), "eagle3/3": Estimate(0.7, 0.6, 0.8, True)}
    d = Decision(DecisionKind.PROMOTE, Arm("eagle3", 3), "done", estimates=est)
    doc = build_status(
        SpecTuningStatus(),
        StatusInputs(phase=Phase.MONITORING, generation=1, now=T0, decision=d, applied=OFF,
                     fingerprint="abc"),
    )  # fmt: skip
    again = build_status(
        parse_status(doc), StatusInputs(phase=Phase.MONITORING, generation=1, now=T0)
    )
    assert again["recommendation"] == doc["recommendation"]
    assert again["applied"] == {
        "drafter": "off",
        "k": 0,
        "arm": "off",
        "fingerprint": "abc",
        "speedup": 1.0,
    }


def test_a_verification_in_progress_survives_a_restart_and_shows_in_phase_and_condition() -> None:
    state = ControllerState(
        phase=LoopPhase.EXPLORING, floor_arm="off", verify_arm="eagle3/3",
        verify_predecessor="off", verify_since_s=900.0, verify_seen=1, verify_judged=1,
        verified_status="Unknown", verified_reason="Verifying", verified_message="comparing",
    )  # fmt: skip
    history = _history().failed("ngram/8", False, "worse").failed("draft/4", True, "OOM")
    memory = Memory(history, state, original="off")
    doc = build_status(
        SpecTuningStatus(), StatusInputs(phase=api_phase(state.shown_phase), generation=2,
                                          now=T0, memory=memory)
    )  # fmt: skip
    assert doc["phase"] == "Verifying"
    back = load_memory(parse_status(doc).history)
    assert back.state == state and back.history.failures == history.failures
    cond = verified_condition(back.state)
    assert cond is not None and cond.status is ConditionStatus.UNKNOWN
    assert cond.reason == "Verifying"
    assert verified_condition(ControllerState()) is None


def _v1_status(windows: int) -> dict[str, object]:
    """A status as operators before memory version 2 wrote it: the memory as an object,
    every window of a ``windows``-long monitoring run in it."""
    runs = [(1000.0 + 300.0 * i, 1300.0 + 300.0 * i) for i in range(windows)]  # after the trial
    baseline = tuple((0, WindowRecord(a, b, status_stats(0.03))) for a, b in runs)
    history = History(trials=_history().trials, baseline=baseline).to_json()
    del history["batches"], history["dropped"]  # version 1 had neither
    state = {"phase": "Monitoring", "model_version": "sha-1", "reference_acceptance": 0.8,
             "converged_at_s": 0.0}  # fmt: skip
    memory = {"version": 1, "history": history, "state": state, "original": "off"}
    return {"phase": "Monitoring", "history": memory}


def test_a_version_1_status_is_read_and_compacted() -> None:
    old = parse_status(_v1_status(3000))  # ten days of 5-minute windows
    memory = load_memory(old.history)
    assert memory.state.phase is LoopPhase.MONITORING and memory.original == "off"
    assert memory.state.reference_acceptance == 0.8 and memory.state.model_version == "sha-1"
    assert [t.arm for t in memory.history.trials] == ["eagle3/3", "eagle3/2"]
    kept = [w.start_s for w in memory.history.baseline_windows()]
    assert len(kept) == 36 and kept[0] == 1000.0 and kept[-1] == 1000.0 + 300.0 * 2999
    assert memory.history.recorded() == (2, 1, 3000)
    # The next write is version 2: one string, a fraction of the object it replaces.
    doc = build_status(
        old, StatusInputs(phase=Phase.MONITORING, generation=1, now=T0, memory=memory)
    )
    assert isinstance(doc["history"], str)
    assert decode_memory(doc["history"])["version"] == MEMORY_VERSION == 2
    assert len(json.dumps(doc)) < len(json.dumps(_v1_status(3000))) / 50
    assert load_memory(doc["history"]).history.to_json() == memory.history.to_json()


def test_a_status_history_that_is_not_a_memory_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"status.history is not the operator's memory"):
        load_memory("not base64 of gzip!")


@pytest.mark.parametrize(
    ("arm", "shown"),
    [
        (
            Arm.verifying("eagle3", 8, ((1, 32, 5), (33, 512, 3))),
            "verify: vLLM adaptive verification: a verify budget of N x optimal_K per step",
        ),
        (Arm.tiered("eagle3", (1, 3, 7)), "tiers: SGLang --speculative-adaptive"),
        (
            Arm.scheduled("eagle3", ((1, 64, 3), (65, 512, 1))),
            "batch-table: vLLM Dynamic SD: k per batch size from the table",
        ),
    ],
)
def test_an_applied_adaptive_arm_shows_its_mode_in_status_and_in_spectune_status(
    arm: Arm, shown: str
) -> None:
    from rich.console import Console

    from spectune.status_command import render, view

    doc = build_status(
        SpecTuningStatus(),
        StatusInputs(phase=Phase.CONVERGED, generation=1, now=T0, decision=None, applied=arm,
                     fingerprint="f"),
    )  # fmt: skip
    applied = parse_status(doc).applied
    assert applied is not None and applied.arm == arm.name
    assert applied.adaptive is not None and applied.adaptive.startswith(shown)
    console = Console(record=True, width=200)
    console.print(render(view({"metadata": {"name": "llama"}, "status": doc})))
    lines = [line for line in console.export_text().splitlines() if "Adaptive" in line]
    assert len(lines) == 1 and shown in lines[0], console.export_text()


def test_a_fixed_k_shows_no_adaptive_mode() -> None:
    from rich.console import Console

    from spectune.status_command import render, view

    doc = build_status(
        SpecTuningStatus(),
        StatusInputs(phase=Phase.CONVERGED, generation=1, now=T0, decision=None,
                     applied=Arm("eagle3", 3), fingerprint="f"),
    )  # fmt: skip
    assert parse_status(doc).applied.adaptive is None  # type: ignore[union-attr]
    console = Console(record=True, width=200)
    console.print(render(view({"metadata": {"name": "llama"}, "status": doc})))
    assert "Adaptive" not in console.export_text()
