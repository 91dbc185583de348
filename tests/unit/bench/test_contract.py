"""The bench prints DESIGN.md §5's object, reproducibly, scored against a true oracle."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from spectune.bench.oracle import Oracle
from spectune.bench.runner import BenchResult, run_bench
from spectune.bench.scoring import metric_value
from spectune.control.controller import ControllerConfig
from spectune.search.objective import Metric
from tests.unit.bench.conftest import TINY_ARMS, WINDOW, tiny_scenario

TOP_KEYS = {
    "scenario": str,
    "policy": str,
    "seed": int,
    "objective": str,
    "phases": list,
    "efficiency": float,
    "run_efficiency": float,
    "trials": int,
    "guardrail_breach_s": (int, float),
    "sim_seconds": (int, float),
    "wall_seconds": float,
}
PHASE_KEYS = {
    "start_s": (int, float),
    "end_s": (int, float),
    "oracle_arm": str,
    "oracle_value": float,
    "chosen_arm": str,
    "chosen_value": float,
    "efficiency": float,
}


def test_json_has_exactly_the_contract_keys_and_types(bench: Callable[..., BenchResult]):
    doc = json.loads(json.dumps(bench("grid").to_json()))
    assert set(doc) == set(TOP_KEYS)
    for key, kind in TOP_KEYS.items():
        assert isinstance(doc[key], kind), key
    assert not isinstance(doc["trials"], bool)
    assert doc["phases"]
    for phase in doc["phases"]:
        assert set(phase) == set(PHASE_KEYS)
        for key, kind in PHASE_KEYS.items():
            assert isinstance(phase[key], kind), key
    assert (doc["scenario"], doc["policy"], doc["seed"], doc["objective"]) == (
        "tiny",
        "grid",
        3,
        "tpotP95",
    )
    assert doc["sim_seconds"] == 600


def test_phases_are_the_spans_between_scenario_events(bench: Callable[..., BenchResult]):
    doc = bench("static:off", "drift").to_json()
    assert [(p["start_s"], p["end_s"]) for p in doc["phases"]] == [(0, 300), (300, 600)]


def test_same_seed_gives_the_same_json_but_for_wall_time(cache_dir: Path):
    def once() -> dict[str, object]:
        doc = run_bench(
            tiny_scenario(), "egreedy", window_s=WINDOW, cache_dir=cache_dir, jobs=1
        ).to_json()
        doc.pop("wall_seconds")
        return doc

    assert once() == once()


def test_the_oracle_is_the_best_static_arm_of_each_phase(
    bench: Callable[..., BenchResult], cache_dir: Path
):
    scenario = tiny_scenario(name="tiny-drift", events=[
        {"at_s": 300, "kind": "model_version", "version": "v2",
         "acceptance_scale": {"eagle3": 0.1}},
    ])  # fmt: skip
    result = bench("static:off", "drift")
    runs = Oracle(scenario, scenario.seed, cache_dir=cache_dir, jobs=1).runs(TINY_ARMS)
    for p in result.phases:
        values = {
            arm: metric_value(r.requests, Metric.TPOT_P95, p.start_s, p.end_s)
            for arm, r in runs.items()
        }
        assert p.oracle_value == pytest.approx(min(values.values()))
        assert values[p.oracle_arm] == pytest.approx(p.oracle_value)
    # A new checkpoint that ruins the EAGLE head moves the oracle off it.
    assert result.phases[0].oracle_arm.startswith("eagle3/")
    assert not result.phases[1].oracle_arm.startswith("eagle3/")


def test_recovery_after_a_model_change_is_measured_from_the_arms_served(
    bench: Callable[..., BenchResult],
):
    # After the checkpoint that ruins the EAGLE head, a target left on EAGLE never gets back
    # within 0.95 of the new oracle; one already on the new oracle's arm is back at once.
    stuck = bench("static:eagle3/3", "drift")
    assert stuck.recoveries == ((300.0, None),)
    new_best = stuck.phases[1].oracle_arm
    assert bench(f"static:{new_best}", "drift").recoveries == ((300.0, 0.0),)
    # The contract's object is unchanged: recovery is reported beside it.
    assert "recoveries" not in stuck.to_json()
    # No model change, no recovery to report.
    assert bench("static:off").recoveries == ()


def test_static_on_the_oracle_arm_scores_one(bench: Callable[..., BenchResult]):
    oracle_arm = bench("static:off").phases[0].oracle_arm
    result = bench(f"static:{oracle_arm}")
    assert result.efficiency == 1.0
    assert [p.chosen_arm for p in result.phases] == [oracle_arm]
    # ...and the untuned deployment scores below one, by the oracle's own numbers.
    off = bench("static:off")
    assert off.efficiency == pytest.approx(off.phases[0].oracle_value / off.phases[0].chosen_value)
    assert off.efficiency < 0.9
    assert off.trials == 0 and result.trials == 1


def test_run_efficiency_counts_exploration_and_is_worse_than_the_choice(
    bench: Callable[..., BenchResult],
):
    result = bench("grid")
    assert 0 < result.run_efficiency < result.efficiency <= 1.0
    assert result.run_value == pytest.approx(result.phases[0].oracle_value / result.run_efficiency)


def test_grid_trials_every_arm_once_then_promotes(cache_dir: Path):
    # load_shift disabled: at two requests per second the running batch is too small to
    # compare, and a re-tune would start a second grid.
    result = run_bench(
        tiny_scenario(),
        "grid",
        window_s=WINDOW,
        cache_dir=cache_dir,
        jobs=1,
        controller_config=ControllerConfig(load_shift=1e9),
    )
    started = [e.message.split(" ")[0] for e in result.events if e.reason == "TrialStarted"]
    assert started == TINY_ARMS
    promoted = [arm for _, arm in result.promotions]
    assert len(promoted) == 1
    assert result.trials == len(TINY_ARMS) + 1
    assert result.phases[0].chosen_arm == promoted[0]


def test_efficiency_is_undefined_not_zero_without_requests():
    from spectune.bench.scoring import efficiency_ratio

    assert math.isnan(efficiency_ratio(0.01, math.nan, True))
    assert efficiency_ratio(0.01, 0.02, True) == 0.5
    assert efficiency_ratio(100.0, 50.0, False) == 0.5
