"""The simulator body's ports: metrics only through exposition text, canaries and rollouts
that cost restarts, and scenario events visible where the operator would see them.
"""

from __future__ import annotations

import asyncio

import pytest

import spectune.bench.adapters as adapters
from spectune.bench.adapters import SimActuator, SimGroupMetrics, SimStage, VirtualClock
from spectune.control.ports import Group
from spectune.errors import WindowCutError
from spectune.metrics import Observation, Snapshot
from spectune.search.arms import OFF, Arm
from spectune.sim.fleet import Fleet, Phase
from tests.unit.bench.conftest import tiny_scenario


def stage_of(**changes: object) -> SimStage:
    """A stage whose fleet has one parked slot for the canary, as the runner builds it."""
    scenario = tiny_scenario(**changes)
    n = scenario.fleet.replicas
    fleet = Fleet(scenario, replicas=n + 1, parked=[n])
    return SimStage(fleet, end_s=float(scenario.duration_s), placement="beside")


def test_observations_are_built_from_parsed_pages_and_grouped_by_role(
    monkeypatch: pytest.MonkeyPatch,
):
    stage = stage_of()
    texts: list[int] = []
    parsed: list[str] = []
    real_text, real_parse = stage.fleet.metrics_text, adapters.parse_page

    def text(i: int) -> str:
        texts.append(i)
        return real_text(i)

    def parse(page: str, pod: str = "pod-0") -> Snapshot:
        parsed.append(pod)
        return real_parse(page, pod)

    monkeypatch.setattr(stage.fleet, "metrics_text", text)
    monkeypatch.setattr(adapters, "parse_page", parse)
    stage.start_canary(Arm("eagle3", 2))
    stage.advance_to(60)  # the canary restarts and serves
    assert stage.deployment().canary_ready
    texts.clear()
    parsed.clear()

    t0 = stage.now
    groups = asyncio.run(SimGroupMetrics(stage).observe(120))
    assert set(groups) == {Group.INCUMBENT, Group.CANARY}
    assert all(isinstance(o, Observation) for o in groups.values())
    # Two scrapes (start, end) of each serving replica — the target's two and the canary's
    # extra one — each one parsed.
    assert sorted(texts) == [0, 0, 1, 1, 2, 2]
    assert sorted(parsed) == ["replica-0-0", "replica-0-0", "replica-1-0", "replica-1-0",
                              "replica-2-1", "replica-2-1"]  # fmt: skip
    inc, can = groups[Group.INCUMBENT], groups[Group.CANARY]
    assert inc.pods == ("replica-0-0", "replica-1-0") and can.pods == ("replica-2-1",)
    assert inc.window_s == pytest.approx(120)
    # The incumbent runs off (no spec families); the canary drafts at k = 2.
    assert inc.spec is None
    assert can.spec is not None and can.spec.accepted_per_pos is not None
    assert len(can.spec.accepted_per_pos) == 2
    # The text path is faithful: the e2e histogram counts the requests each replica finished.
    for replicas, obs in (((0, 1), inc), ((2,), can)):
        finished = [r for r in stage.fleet.records(t0, stage.now) if r.replica in replicas]
        assert obs.e2e is not None
        assert obs.e2e.count == pytest.approx(len(finished), abs=2)


def test_a_canary_restarts_only_the_canary_replicas_and_reports_failures():
    # A drafter too large for the memory left cannot start, as in vLLM.
    big = {
        "name": "huge",
        "method": "draft_model",
        "model": "huge",
        "weights_gib": 150,
        "params_b": 70,
        "kv_bytes_per_token": 327680,
        "max_k": 2,
    }
    stage = stage_of(drafters=[*tiny_scenario().model_dump()["drafters"], big])
    stage.start_canary(Arm("eagle3", 1))
    states = stage.fleet.states()
    # The target's replicas keep serving; the canary is an extra pod, starting up.
    assert states[0].phase is Phase.SERVING and states[1].phase is Phase.SERVING
    assert states[2].phase is Phase.DOWN
    assert stage.trials == 1
    stage.stop_canary()
    stage.start_canary(Arm("huge", 1))
    dep = stage.deployment()
    assert dep.canary == Arm("huge", 1)
    assert dep.canary_failure is not None and not dep.canary_ready
    assert stage.trials == 2


def _serving(stage: SimStage) -> int:
    return sum(s.phase is Phase.SERVING for s in stage.fleet.states())


def test_promotion_surges_onto_the_canary_slot_and_never_serves_fewer_replicas():
    # Kubernetes' default rolling update below four replicas (maxSurge 1, maxUnavailable
    # 0): a new pod first, on the GPU the canary slot holds; then each old pod's GPU takes
    # the next new pod; the last old pod is retired and its slot becomes the canary's.
    stage = stage_of(fleet={"replicas": 3})
    stage.advance_to(10)
    stage.promote(Arm("eagle3", 3))
    assert stage.trials == 1
    assert stage.deployment().rolling
    fewest = _serving(stage)
    while stage.rolling:
        stage.advance_to(stage.now + 1.0)
        fewest = min(fewest, _serving(stage))
    assert fewest == 3
    stage.advance_to(stage.now + 300)  # the retired pod finishes what it holds
    states = stage.fleet.states()
    serving = [s for s in states if s.phase is Phase.SERVING]
    assert len(serving) == 3 and all(s.arm == Arm("eagle3", 3) for s in serving)
    assert [s.index for s in states if s.phase is Phase.PARKED] == list(stage.canary_idx)
    assert stage.incumbent_at(stage.now) == "eagle3/3"
    assert stage.incumbent_at(9.0) == "off"
    # The target serves the new arm from the end of its rollout, not from the promotion.
    (t0, first), (t1, arm) = stage.served
    assert (t0, first, arm) == (0.0, "off", "eagle3/3")
    assert t1 >= 10 + 3 * stage.fleet.scenario.target.restart_s
    # Promoting what runs changes nothing and costs nothing.
    stage.promote(Arm("eagle3", 3))
    assert stage.trials == 1 and not stage.rolling
    # The next canary starts on the retired pod's slot, beside the three new ones.
    stage.start_canary(Arm("eagle3", 2))
    stage.advance_to(stage.now + 400)
    roles = [stage.role(s.index) for s in stage.fleet.states() if s.phase is Phase.SERVING]
    assert roles.count(Group.CANARY) == 1 and roles.count(Group.INCUMBENT) == 3


def test_a_one_replica_target_keeps_serving_through_a_promotion():
    stage = stage_of(fleet={"replicas": 1})
    stage.start_canary(Arm("eagle3", 2))
    stage.advance_to(300)
    stage.stop_canary()
    stage.promote(Arm("eagle3", 2))
    while stage.rolling:
        assert _serving(stage) >= 1
        stage.advance_to(stage.now + 5.0)
    states = stage.fleet.states()
    assert [s.arm for s in states if s.phase is Phase.SERVING] == [Arm("eagle3", 2)]
    assert stage.pod(1) == "replica-1-2"  # the canary's slot, restarted for the promotion
    assert stage.trials == 2  # the canary start and the promotion


def test_a_stopped_canary_goes_away_and_the_target_is_untouched():
    stage = stage_of()
    stage.start_canary(Arm("ngram", 1))
    stage.advance_to(60)
    stage.stop_canary()
    stage.advance_to(120)
    states = stage.fleet.states()
    assert [s.arm for s in states[:2]] == [OFF, OFF]
    assert [stage.pod(i) for i in (0, 1)] == ["replica-0-0", "replica-1-0"]  # never restarted
    assert states[2].phase is Phase.PARKED
    assert stage.trials == 1


def test_model_version_and_route_mix_events_reach_the_deployment():
    two_routes = tiny_scenario().model_dump()["routes"]
    second = {**two_routes[0], "name": "summarize", "share": 0.0}
    stage = stage_of(
        routes=[two_routes[0], second],
        events=[
            {"at_s": 100, "kind": "model_version", "version": "v2"},
            {"at_s": 200, "kind": "route_mix", "shares": {"chat": 0.5, "summarize": 0.5}},
        ],
    )
    first = stage.deployment()
    clock = VirtualClock(stage)
    asyncio.run(clock.sleep(150))
    middle = stage.deployment()
    asyncio.run(clock.sleep(100))
    last = asyncio.run(SimActuator(stage).deployment())
    assert (first.model_version, middle.model_version) == ("initial", "v2")
    assert first.routes == middle.routes != last.routes
    assert "summarize=0.5" in last.routes


def test_a_window_that_a_model_version_change_falls_into_is_cut_and_dropped():
    # As the operator cuts a window when the target's model version changes: its figures
    # would mix two models. The next window starts after the change.
    stage = stage_of(events=[{"at_s": 100, "kind": "model_version", "version": "v2"}])
    metrics = SimGroupMetrics(stage)
    with pytest.raises(WindowCutError, match="model version changed to v2 at 100s"):
        asyncio.run(metrics.observe(300))
    assert 100 < stage.now <= 102  # cut within a simulated second, not at the window's end
    assert stage.deployment().model_version == "v2"
    t0 = stage.now
    groups = asyncio.run(metrics.observe(300))
    assert Group.INCUMBENT in groups and stage.now == t0 + 300  # no further event: whole


def test_time_never_runs_past_the_scenario_end():
    stage = stage_of()
    asyncio.run(VirtualClock(stage).sleep(10_000))
    assert stage.now == 600


def test_a_window_that_the_scenario_end_cuts_short_is_dropped():
    # Nothing may be decided on a window shorter than its length: a trial started on one
    # would be a restart the run never measures (the bench counts it in `trials`).
    stage = stage_of()
    metrics = SimGroupMetrics(stage)
    asyncio.run(VirtualClock(stage).sleep(400))
    with pytest.raises(WindowCutError, match="the scenario ends at 600s, 200s into a 300s"):
        asyncio.run(metrics.observe(300))
    assert stage.now == 600
