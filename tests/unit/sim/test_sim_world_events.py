"""Scenario events that break the drafter: ``pod_decay`` (one pod's acceptance falls with its
uptime, a restart brings it back) and ``drafter_broken`` (a drafter stops accepting on every
pod, across restarts, until a new model version).

What a user sees is each pod's ``/metrics`` page: its accepted and drafted token counters
over a stretch of simulated time, as the operator reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from spectune.errors import SpecError
from spectune.metrics import parse_page
from spectune.search.arms import Arm
from spectune.sim import Fleet, Scenario
from spectune.sim.scenario import injectable_event

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTED = "vllm:spec_decode_num_draft_tokens_total"


def _counts(fleet: Fleet, pod: int) -> tuple[float, float]:
    page = parse_page(fleet.metrics_text(pod), f"pod-{pod}")
    return page.total(ACCEPTED) or 0.0, page.total(DRAFTED) or 0.0


def _acceptance(fleet: Fleet, pod: int, start_s: float, end_s: float) -> float:
    """Accepted / drafted tokens on ``pod``'s page between ``start_s`` and ``end_s``."""
    fleet.advance(start_s)
    a0, d0 = _counts(fleet, pod)
    fleet.advance(end_s)
    a1, d1 = _counts(fleet, pod)
    assert d1 > d0, "the pod drafted nothing in the span"
    return (a1 - a0) / (d1 - d0)


def _decaying(make_scenario: Callable[..., Scenario], **event: Any) -> Scenario:
    ev = {"at_s": 0, "kind": "pod_decay", "pod": 0, "acceptance_per_hour": 0.1, **event}
    return make_scenario(
        duration_s=7200,
        load=[{"at_s": 0, "requests_per_s": 2.0}],
        fleet={"replicas": 2, "balancer": "round_robin"},
        events=[ev],
    )


def test_a_decaying_pod_accepts_less_as_it_runs_and_its_peer_does_not(
    make_scenario: Callable[..., Scenario],
) -> None:
    fleet = Fleet(_decaying(make_scenario), arms=Arm("eagle3", 3))
    fresh = _acceptance(fleet, 0, 30.0, 330.0)
    peer_fresh = _acceptance(fleet, 1, 330.0, 630.0)
    decayed = _acceptance(fleet, 0, 1800.0, 2100.0)  # half an hour up: α × 0.1^0.5 ≈ 0.3
    peer_late = _acceptance(fleet, 1, 2100.0, 2400.0)
    assert decayed < 0.6 * fresh, (fresh, decayed)
    assert peer_late == pytest.approx(peer_fresh, abs=0.05)
    (applied,) = fleet.applied_events
    assert applied.kind == "pod_decay" and "pod 0" in applied.detail


def test_a_restarted_pod_accepts_as_it_did_and_then_decays_again(
    make_scenario: Callable[..., Scenario],
) -> None:
    fleet = Fleet(_decaying(make_scenario), arms=Arm("eagle3", 3))
    fresh = _acceptance(fleet, 0, 30.0, 330.0)
    decayed = _acceptance(fleet, 0, 1800.0, 2100.0)
    fleet.apply(Arm("eagle3", 3), [0])  # the pod is deleted and replaced
    t = fleet.now
    while fleet.state(0).phase.value != "serving":
        t += 1.0
        fleet.advance(t)
    back = _acceptance(fleet, 0, t + 30.0, t + 330.0)
    again = _acceptance(fleet, 0, t + 1800.0, t + 2100.0)
    assert decayed < 0.6 * fresh
    assert back == pytest.approx(fresh, abs=0.06), (fresh, decayed, back)
    assert again == pytest.approx(decayed, abs=0.06), (decayed, again)


def test_the_floor_bounds_the_decay_and_another_drafter_is_untouched(
    make_scenario: Callable[..., Scenario],
) -> None:
    scenario = _decaying(make_scenario, acceptance_per_hour=0.01, floor=0.5, drafter="eagle3")
    fleet = Fleet(scenario, arms=Arm("eagle3", 3))
    fresh = _acceptance(fleet, 0, 10.0, 130.0)
    floored = _acceptance(fleet, 0, 3600.0, 3900.0)  # 0.01 per hour would leave α × 0.01
    assert 0.3 * fresh < floored < 0.7 * fresh, (fresh, floored)
    ngram = Fleet(scenario, arms=Arm("ngram", 3))
    old_pod = _acceptance(ngram, 0, 3600.0, 3900.0)
    assert old_pod == pytest.approx(_acceptance(ngram, 1, 3900.0, 4200.0), abs=0.06)


def _broken(make_scenario: Callable[..., Scenario], *more: dict[str, Any]) -> Scenario:
    return make_scenario(
        duration_s=3600,
        load=[{"at_s": 0, "requests_per_s": 2.0}],
        fleet={"replicas": 2},
        events=[{"at_s": 600, "kind": "drafter_broken", "drafter": "eagle3"}, *more],
    )


def test_a_broken_drafter_accepts_nothing_on_every_pod_even_after_a_restart(
    make_scenario: Callable[..., Scenario],
) -> None:
    fleet = Fleet(_broken(make_scenario), arms=Arm("eagle3", 3))
    before = _acceptance(fleet, 0, 60.0, 600.0)
    # requests admitted before 600 s finish on the old acceptance; after that, nothing lands
    after = [_acceptance(fleet, pod, 700.0 + 300 * pod, 1000.0 + 300 * pod) for pod in (0, 1)]
    fleet.apply(Arm("eagle3", 3), [0, 1])
    fleet.advance(1500.0)
    restarted = _acceptance(fleet, 0, 1500.0, 1800.0)
    assert before > 0.4
    assert after == [0.0, 0.0] and restarted == 0.0
    assert [e.kind for e in fleet.applied_events] == ["drafter_broken"]


def test_a_new_model_version_repairs_a_broken_drafter_and_other_drafters_never_broke(
    make_scenario: Callable[..., Scenario],
) -> None:
    repair = {"at_s": 1200, "kind": "model_version", "version": "v2"}
    scenario = _broken(make_scenario, repair)
    fleet = Fleet(scenario, arms=Arm("eagle3", 3))
    assert _acceptance(fleet, 0, 700.0, 1200.0) == 0.0
    assert _acceptance(fleet, 0, 1300.0, 1800.0) > 0.4
    assert "repaired eagle3" in fleet.applied_events[-1].detail
    ngram = Fleet(scenario, arms=Arm("ngram", 3))
    assert _acceptance(ngram, 0, 700.0, 1200.0) > 0.1


def test_a_drafter_broken_event_posted_to_a_running_pod_stops_its_acceptance(
    make_scenario: Callable[..., Scenario],
) -> None:
    """``sim serve``'s ``POST /sim/events`` path."""
    scenario = make_scenario(duration_s=3600, load=[{"at_s": 0, "requests_per_s": 2.0}])
    fleet = Fleet(scenario, arms=Arm("eagle3", 3), replicas=1)
    before = _acceptance(fleet, 0, 60.0, 600.0)
    applied = fleet.inject(
        injectable_event(scenario, {"kind": "drafter_broken", "drafter": "eagle3"})
    )
    assert applied.at_s == 600.0 and applied.kind == "drafter_broken"
    assert before > 0.4 and _acceptance(fleet, 0, 700.0, 1000.0) == 0.0


def test_scenarios_without_the_new_events_run_as_before(
    make_scenario: Callable[..., Scenario],
) -> None:
    """A pod_decay event on a drafter the arm does not run changes no draw."""
    plain = make_scenario(fleet={"replicas": 2})
    other = make_scenario(
        fleet={"replicas": 2},
        events=[
            {
                "at_s": 0,
                "kind": "pod_decay",
                "pod": 0,
                "drafter": "ngram",
                "acceptance_per_hour": 0.5,
            }
        ],
    )
    runs = []
    for scenario in (plain, other):
        fleet = Fleet(scenario, arms=Arm("eagle3", 3))
        fleet.advance(300.0)
        runs.append([fleet.metrics_text(i) for i in range(2)])
    assert runs[0] == runs[1]


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (
            {"at_s": 10, "kind": "drafter_broken", "drafter": "eagel3"},
            "events[0].drafter: unknown drafter 'eagel3'; drafters are: eagle3, ngram, draft8b",
        ),
        ({"at_s": 10, "kind": "drafter_broken"}, "events[0].drafter: required field is missing"),
        (
            {
                "at_s": 10,
                "kind": "pod_decay",
                "pod": 0,
                "drafter": "egale3",
                "acceptance_per_hour": 0.9,
            },
            "events[0].drafter: unknown drafter 'egale3'",
        ),
        (
            {"at_s": 10, "kind": "pod_decay", "pod": 3, "acceptance_per_hour": 0.9},
            "events[0].pod: no pod 3; the fleet's pods are 0..1",
        ),
        (
            {"at_s": 10, "kind": "pod_decay", "pod": 0, "acceptance_per_hour": 1.5},
            "events[0].acceptance_per_hour: must be at most 1.0, got 1.5",
        ),
        (
            {"at_s": 10, "kind": "pod_decay", "pod": 0, "acceptance_per_hr": 0.9},
            "events[0].acceptance_per_hr: unknown field; did you mean 'acceptance_per_hour'?",
        ),
        (
            {"at_s": 10, "kind": "pod_decay", "pod": 0, "acceptance_per_hour": 0.9, "floor": 2},
            "events[0].floor: must be at most 1.0, got 2",
        ),
        ({"at_s": 10, "kind": "pod_rot"}, "events[0].kind: 'pod_rot' is not one of"),
    ],
)
def test_a_bad_event_is_refused_naming_the_field(
    make_scenario: Callable[..., Scenario], event: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError) as err:
        make_scenario(fleet={"replicas": 2}, events=[event])
    assert message in str(err.value)


def test_both_events_validate(make_scenario: Callable[..., Scenario]) -> None:
    scenario = make_scenario(
        fleet={"replicas": 2},
        events=[
            {"at_s": 0, "kind": "pod_decay", "pod": 1, "acceptance_per_hour": 0.8},
            {"at_s": 100, "kind": "drafter_broken", "drafter": "ngram"},
        ],
    )
    assert [e.kind for e in scenario.events] == ["pod_decay", "drafter_broken"]
