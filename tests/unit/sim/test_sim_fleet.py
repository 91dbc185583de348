"""The fleet as the bench and the actuator drive it: restarts, failures, events, balancing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from spectune.errors import SourceUnavailableError, SpecError
from spectune.search.arms import Arm, parse_arm
from spectune.sim import Fleet, Phase, Scenario


def test_apply_restarts_with_drain_and_downtime(make_scenario: Callable[..., Scenario]) -> None:
    scenario = make_scenario(fleet={"replicas": 2}, target={"restart_s": 30})
    fleet = Fleet(scenario, arms=Arm(None))
    fleet.advance(60.0)
    result = fleet.apply(parse_arm("eagle3/4"), [1])
    assert result.ok and result.failure is None and result.replicas == (1,)
    assert fleet.state(1).phase in (Phase.DRAINING, Phase.DOWN)
    assert fleet.state(0).phase is Phase.SERVING
    fleet.advance(70.0)
    assert fleet.state(1).phase is Phase.DOWN
    with pytest.raises(SourceUnavailableError, match="replica 1 is not serving"):
        fleet.metrics_text(1)
    ready = fleet.state(1).ready_at_s
    assert ready is not None and 60.0 + 30.0 <= ready < 60.0 + 30.0 + 10.0
    fleet.advance(ready + 60.0)
    state = fleet.state(1)
    assert state.phase is Phase.SERVING and state.arm == parse_arm("eagle3/4")
    page = fleet.metrics_text(1)
    assert "vllm:spec_decode_num_drafts_total" in page
    # the restarted replica's counters started from zero; the other kept serving
    served = Counter(r.replica for r in fleet.records() if 60.5 < r.arrival_s < 90.0)
    assert served[0] > 0 and served[1] == 0
    arms_after = {r.arm for r in fleet.records(ready + 1.0) if r.replica == 1}
    assert arms_after == {"eagle3/4"}


def test_an_arm_that_cannot_start_is_reported_and_never_serves(
    make_scenario: Callable[..., Scenario],
) -> None:
    scenario = make_scenario(
        fleet={"replicas": 2},
        hardware={"memory_gib": 180},
        target={"max_model_len": 20000, "restart_s": 10},
    )
    fleet = Fleet(scenario, arms=Arm(None))
    fleet.advance(20.0)
    result = fleet.apply(parse_arm("draft8b/3"), [0])
    assert not result.ok
    assert result.failure is not None and "KV cache" in result.failure
    fleet.advance(120.0)
    state = fleet.state(0)
    assert state.phase is Phase.FAILED and state.failure == result.failure
    with pytest.raises(SourceUnavailableError, match="failed to start"):
        fleet.metrics_text(0)
    assert {r.replica for r in fleet.records(60.0)} == {1}  # traffic went to the other
    # a working arm brings it back
    assert fleet.apply(Arm(None), [0]).ok
    fleet.advance(200.0)
    assert fleet.state(0).phase is Phase.SERVING


def test_requests_wait_at_the_balancer_while_every_replica_restarts(
    make_scenario: Callable[..., Scenario],
) -> None:
    scenario = make_scenario(target={"restart_s": 20})
    fleet = Fleet(scenario, arms=Arm(None))
    fleet.advance(10.0)
    fleet.apply(parse_arm("eagle3/3"), [0])
    fleet.advance(120.0)
    waited = [r for r in fleet.records() if 10.0 < r.arrival_s < 30.0]
    assert waited and all(r.queue_s > 0 for r in waited)
    assert max(r.queue_s for r in waited) > 5.0


def test_apply_rejects_unknown_arms_and_replicas(make_scenario: Callable[..., Scenario]) -> None:
    fleet = Fleet(make_scenario())
    with pytest.raises(SpecError, match="unknown drafter"):
        fleet.apply(parse_arm("medusa/2"), [0])
    with pytest.raises(SpecError, match="max_k"):
        fleet.apply(parse_arm("eagle3/9"), [0])
    with pytest.raises(SpecError, match="replica 3 does not exist"):
        fleet.apply(parse_arm("eagle3/2"), [3])


def test_model_version_event_changes_version_and_acceptance(
    make_scenario: Callable[..., Scenario],
) -> None:
    scenario = make_scenario(
        load=[{"at_s": 0, "requests_per_s": 2.0}],
        events=[
            {"at_s": 100, "kind": "model_version", "version": "v2",
             "acceptance_scale": {"eagle3": 0.5}},
        ],
    )  # fmt: skip
    fleet = Fleet(scenario, arms=parse_arm("eagle3/3"))
    fleet.advance(100.0)
    assert fleet.model_version == "initial"
    before = [r.alpha for r in fleet.records() if r.route == "chat"]
    fleet.advance(220.0)
    assert fleet.model_version == "v2"
    (event,) = fleet.applied_events
    assert event.kind == "model_version" and "v2" in event.detail and event.at_s == 100
    after = [r.alpha for r in fleet.records() if r.route == "chat" and r.arrival_s > 100]
    assert sum(after) / len(after) < 0.6 * sum(before) / len(before)


def test_route_mix_and_load_events(make_scenario: Callable[..., Scenario]) -> None:
    scenario = make_scenario(
        load=[{"at_s": 0, "requests_per_s": 1.0}],
        events=[
            {"at_s": 100, "kind": "route_mix", "shares": {"chat": 0.0, "summarize": 1.0}},
            {"at_s": 100, "kind": "load", "requests_per_s": 3.0},
        ],
    )
    fleet = Fleet(scenario, arms=Arm(None))
    fleet.advance(200.0)
    early = [r for r in fleet.records() if r.arrival_s < 100]
    late = [r for r in fleet.records() if r.arrival_s >= 100]
    assert {r.route for r in early} == {"chat", "summarize"}
    assert {r.route for r in late} == {"summarize"}
    assert len(late) > 2 * len(early)
    assert [e.kind for e in fleet.applied_events] == ["route_mix", "load"]


def test_a_load_ramp_raises_arrivals_linearly(make_scenario: Callable[..., Scenario]) -> None:
    scenario = make_scenario(
        load=[{"at_s": 0, "requests_per_s": 0.0, "ramp_to": 4.0, "over_s": 200}]
    )
    fleet = Fleet(scenario, arms=Arm(None))
    fleet.advance(230.0)
    arrivals = [r.arrival_s for r in fleet.records()]
    first = sum(1 for t in arrivals if t < 100)
    second = sum(1 for t in arrivals if 100 <= t < 200)
    assert 70 < first < 130 and 2.2 * first < second  # ∫ rate: 100 then 300


@pytest.mark.parametrize("balancer", ["round_robin", "least_outstanding"])
def test_balancers_share_the_load(make_scenario: Callable[..., Scenario], balancer: str) -> None:
    scenario = make_scenario(fleet={"replicas": 3, "balancer": balancer}, **{
        "load": [{"at_s": 0, "requests_per_s": 3.0}]})  # fmt: skip
    fleet = Fleet(scenario, arms=parse_arm("eagle3/3"))
    fleet.advance(150.0)
    served = Counter(r.replica for r in fleet.records())
    assert set(served) == {0, 1, 2}
    assert max(served.values()) < 1.3 * min(served.values())


def test_records_cover_any_span(make_scenario: Callable[..., Scenario]) -> None:
    fleet = Fleet(make_scenario(), arms=parse_arm("eagle3/3"))
    fleet.advance(100.0)
    records = fleet.records()
    assert records == sorted(records, key=lambda r: r.finish_s)
    assert len(fleet.records(0, 50)) + len(fleet.records(50, 100)) == len(records)
    for r in records:
        assert r.queue_s >= 0 and 0 < r.ttft_s <= r.e2e_s
        assert r.e2e_s == pytest.approx(r.finish_s - r.arrival_s)
        assert r.output_tokens >= 1 and r.arm == "eagle3/3"
    with pytest.raises(SpecError, match="back in time"):
        fleet.advance(50.0)


def test_initial_arm_and_per_replica_arms(make_scenario: Callable[..., Scenario]) -> None:
    scenario = make_scenario(fleet={"replicas": 2})
    assert Fleet(scenario).state(0).arm == parse_arm("eagle3/3")
    fleet = Fleet(scenario, arms=[Arm(None), parse_arm("ngram/4")])
    assert [s.arm.name for s in fleet.states()] == ["off", "ngram/4"]
    with pytest.raises(SpecError, match="2 replicas"):
        Fleet(scenario, arms=[Arm(None)])


def test_a_parked_slot_serves_only_between_apply_and_park() -> None:
    from pathlib import Path

    from spectune.sim.scenario import load_scenario

    scenario = load_scenario(Path(__file__).parents[3] / "examples/scenarios/chat-eagle3.yaml")
    n = scenario.fleet.replicas
    fleet = Fleet(scenario, replicas=n + 1, parked=[n])
    fleet.advance(60)
    assert fleet.state(n).phase is Phase.PARKED
    assert all(r.replica < n for r in fleet.records())  # no traffic to a parked slot
    fleet.apply(parse_arm("eagle3/3"), [n])
    fleet.advance(60 + scenario.target.restart_s + 120)
    assert fleet.state(n).phase is Phase.SERVING
    assert any(r.replica == n and r.arm == "eagle3/3" for r in fleet.records())
    fleet.park([n])
    fleet.advance(fleet.now + 600)
    assert fleet.state(n).phase is Phase.PARKED
    assert fleet.state(0).arm == Arm(None)  # the target was never touched


def test_a_fleet_started_late_gets_the_requests_of_one_started_at_zero() -> None:
    """``start_s`` (``sim serve --clock-epoch``): a pod that comes up at 2000 s serves, from
    then on, the very requests (routes, lengths, difficulty) a pod up since 0 gets — after
    the route-mix event at 1800 s, which it has taken too — and starts empty."""
    from pathlib import Path

    from spectune.sim.scenario import load_scenario

    scenario = load_scenario(
        Path(__file__).parents[3] / "examples" / "scenarios" / "sglang-mixed.yaml"
    )
    early = Fleet(scenario, replicas=1)
    early.advance(3500.0)
    late = Fleet(scenario, replicas=1, start_s=2000.0)
    assert late.now == 2000.0 and not late.records()
    assert [e.kind for e in late.applied_events] == ["route_mix"]
    late.advance(3500.0)

    def drawn(fleet: Fleet) -> dict[int, tuple[str, float, int, int]]:
        return {
            r.id: (r.route, r.arrival_s, r.prompt_tokens, r.output_tokens)
            for r in fleet.records()
            if 2100.0 <= r.arrival_s < 2300.0
        }

    same = drawn(late)
    assert len(same) > 20 and same == drawn(early)
    assert {route for route, *_ in same.values()} == {"chat", "summarize"}
    assert min(r.arrival_s for r in late.records()) >= 2000.0
    with pytest.raises(SpecError, match="starts at a finite time"):
        Fleet(scenario, replicas=1, start_s=-1.0)
