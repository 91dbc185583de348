"""Load-matched trials in the simulator body: the canary takes the place of target pods.

With N target replicas and a canary of c, ``replace`` placement first lets the canary's
pods become ready (surge), then c of the target's pods leave, so N pods serve and each
carries the target's own per-pod load; at the end the target comes back to N before the
canary goes. Capacity never dips below N serving pods.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from spectune.bench.adapters import SimGroupMetrics, SimStage
from spectune.bench.oracle import Oracle
from spectune.bench.runner import bench_objective, run_bench, sim_controller
from spectune.control.placement import choose_placement
from spectune.control.ports import Group, Placement
from spectune.errors import SpecError
from spectune.search.arms import OFF, Arm
from spectune.search.objective import window_stats
from spectune.search.policy import SearchSpace
from spectune.search.spectune_policy import SpectunePolicy
from spectune.sim.fleet import Fleet, Phase
from spectune.sim.scenario import Scenario
from tests.unit.bench.conftest import WINDOW, tiny_scenario


def stage_of(replicas: int = 3, placement: str = "auto") -> SimStage:
    scenario = tiny_scenario(
        fleet={"replicas": replicas, "balancer": "round_robin"}, duration_s=3000
    )
    # The stage is driven by hand here; the controller sim_controller builds goes unused.
    _, stage, _ = sim_controller(
        scenario, SpectunePolicy(), _space(scenario), seed=3, placement=placement
    )
    return stage


def _space(scenario: Scenario) -> SearchSpace:
    """The scenario's own candidate arms."""
    return Oracle(scenario, 3, use_cache=False).space


def _serving(stage: SimStage, group: Group | None = None) -> int:
    return sum(
        s.phase is Phase.SERVING and (group is None or stage.role(s.index) is group)
        for s in stage.fleet.states()
    )


def _advance_watching(stage: SimStage, until_s: float) -> int:
    """Advance second by second; the fewest pods serving on the way."""
    assert until_s <= stage.end_s
    fewest = _serving(stage)
    while stage.now < until_s:
        stage.advance_to(stage.now + 1.0)
        stage.deployment()
        fewest = min(fewest, _serving(stage))
    return fewest


def test_the_canary_takes_the_place_of_a_target_pod_and_gives_it_back():
    stage = stage_of(replicas=3)
    assert stage.deployment().placement is Placement.REPLACE
    stage.start_canary(Arm("eagle3", 2))
    # Until the target is at N−c the trial's first window does not start.
    assert not stage.deployment().canary_ready
    fewest = _advance_watching(stage, 120)
    dep = stage.deployment()
    assert dep.canary_ready and dep.placement_reason is None
    assert (_serving(stage, Group.INCUMBENT), _serving(stage, Group.CANARY)) == (2, 1)
    stage.stop_canary()
    assert stage.deployment().rolling  # the target's return to N
    fewest = min(fewest, _advance_watching(stage, 240))
    assert not stage.deployment().rolling
    assert (_serving(stage, Group.INCUMBENT), _serving(stage, Group.CANARY)) == (3, 0)
    assert all(s.arm == OFF for s in stage.fleet.states() if s.phase is Phase.SERVING)
    assert fewest >= 3  # capacity never dipped


def test_a_window_of_a_replace_trial_sees_the_targets_load_per_pod():
    # Round robin at 3 requests/s over 3 pods: 1 per pod, on the canary too; beside, the
    # canary's fourth pod would take each pod down to 0.75.
    scenario = tiny_scenario(
        fleet={"replicas": 3, "balancer": "round_robin"},
        load=[{"at_s": 0, "requests_per_s": 3.0}],
    )
    rates = {}
    for placement in ("replace", "beside"):
        _, stage, _ = sim_controller(
            scenario, SpectunePolicy(), _space(scenario), seed=3, placement=placement
        )
        stage.start_canary(OFF)
        _advance_watching(stage, 120)
        assert stage.deployment().canary_ready
        obs = asyncio.run(SimGroupMetrics(stage).observe(300))
        objective = bench_objective(scenario)
        rates[placement] = {
            g: window_stats(o, objective).requests / 300 / len(o.pods) for g, o in obs.items()
        }
    assert rates["replace"][Group.CANARY] == pytest.approx(1.0, rel=0.2)
    assert rates["replace"][Group.INCUMBENT] == pytest.approx(1.0, rel=0.2)
    assert rates["beside"][Group.CANARY] == pytest.approx(0.75, rel=0.2)


def test_a_trial_that_follows_another_surges_and_keeps_the_target_at_n_minus_c():
    stage = stage_of(replicas=3)
    stage.start_canary(Arm("eagle3", 2))
    _advance_watching(stage, 120)
    target_pods = [stage.pod(i) for i in range(3)]
    stage.start_canary(Arm("ngram", 1))
    assert not stage.deployment().canary_ready  # the old canary still serves
    fewest = _advance_watching(stage, 240)
    dep = stage.deployment()
    assert dep.canary_ready and dep.canary == Arm("ngram", 1)
    assert fewest >= 3
    assert (_serving(stage, Group.INCUMBENT), _serving(stage, Group.CANARY)) == (2, 1)
    # The target was not restarted between the trials.
    assert [stage.pod(i) for i in range(3)] == target_pods


def test_a_promotion_after_a_replace_trial_rolls_the_target_at_n():
    stage = stage_of(replicas=3)
    stage.start_canary(Arm("eagle3", 2))
    _advance_watching(stage, 120)
    stage.stop_canary()
    stage.promote(Arm("eagle3", 2))
    assert stage.deployment().rolling
    fewest = _advance_watching(stage, 900)
    assert not stage.deployment().rolling and fewest >= 3
    serving = [s for s in stage.fleet.states() if s.phase is Phase.SERVING]
    assert len(serving) == 3 and all(s.arm == Arm("eagle3", 2) for s in serving)


@pytest.mark.parametrize(
    ("replicas", "placement", "reason"),
    [(1, "auto", "SingleReplica"), (3, "beside", "Requested"), (1, "replace", "SingleReplica")],
)
def test_where_replace_cannot_hold_the_canary_runs_beside_and_says_why(
    replicas: int, placement: str, reason: str
):
    stage = stage_of(replicas=replicas, placement=placement)
    dep = stage.deployment()
    assert dep.placement is Placement.BESIDE and dep.placement_reason == reason
    assert dep.placement_message
    stage.start_canary(Arm("eagle3", 2))
    _advance_watching(stage, 120)
    assert _serving(stage, Group.INCUMBENT) == replicas  # nothing scaled


def test_choose_placement_names_every_reason():
    assert choose_placement("auto", 3, 1).placement is Placement.REPLACE
    assert choose_placement("replace", 2, 1).matched
    assert choose_placement("auto", 1, 1).reason == "SingleReplica"
    assert choose_placement("auto", 2, 2).reason == "CanaryNotSmaller"
    hpa = choose_placement("auto", 4, 1, autoscaler="HorizontalPodAutoscaler ns/llm")
    assert hpa.reason == "Autoscaled" and "ns/llm" in (hpa.message or "")
    assert choose_placement("beside", 4, 1).reason == "Requested"


def test_a_stage_refuses_a_fleet_without_the_slots_its_placement_needs():
    scenario = tiny_scenario(fleet={"replicas": 3, "balancer": "round_robin"})
    fleet = Fleet(scenario, replicas=4, parked=[3])
    with pytest.raises(SpecError, match="parked slots"):
        SimStage(fleet, end_s=600.0)  # replace needs two slots: one per canary and a surge
    with pytest.raises(SpecError, match="placement must be"):
        SimStage(fleet, end_s=600.0, placement="sideways")


def test_the_bench_reports_the_placement_and_each_trials_load_ratio(cache_dir: Path) -> None:
    scenario = tiny_scenario(fleet={"replicas": 3, "balancer": "round_robin"})
    r = run_bench(scenario, "spectune", window_s=WINDOW, cache_dir=cache_dir, placement="replace")
    assert r.placement == "replace"
    assert r.load_ratios and all(0.5 < x < 2.0 for x in r.load_ratios)
