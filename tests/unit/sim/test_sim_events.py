"""Events injected into a running replica (``sim serve``'s ``POST /sim/events``).

The e2e tier drops a running pod's acceptance this way to make the drift alert fire; here,
in virtual time, the drop must show in the replica's own counters, and a bad event must be
refused with the field named and nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from spectune.errors import SpecError
from spectune.search.arms import Arm
from spectune.sim import Fleet, Scenario
from spectune.sim.scenario import ModelVersionEvent, injectable_event


def _acceptance(fleet: Fleet, until_s: float) -> float:
    before = fleet.totals()
    fleet.advance(until_s)
    after = fleet.totals()
    return (after.accepted_tokens - before.accepted_tokens) / (
        after.draft_tokens - before.draft_tokens
    )


def test_an_injected_acceptance_drop_shows_in_the_counters(
    make_scenario: Callable[..., Scenario],
) -> None:
    scenario = make_scenario()
    fleet = Fleet(scenario, arms=Arm("eagle3", 3), replicas=1)
    before = _acceptance(fleet, 600.0)
    event = injectable_event(
        scenario, {"kind": "model_version", "version": "v1", "acceptance_scale": {"eagle3": 0.4}}
    )
    applied = fleet.inject(event)
    fleet.advance(660.0)  # requests admitted before the drop finish on the old acceptance
    after = _acceptance(fleet, 1260.0)
    assert applied.at_s == 600.0 and applied.kind == "model_version"
    assert fleet.model_version == "v1"
    assert after < 0.6 * before, (before, after)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("drop", "event: an event is a mapping"),
        ({"kind": "load", "requests_per_s": 3}, "event.kind: 'load' cannot be injected"),
        ({"kind": "surprise"}, "event.kind: 'surprise' cannot be injected"),
        ({"kind": "model_version"}, "event.version: Field required"),
        (
            {"kind": "model_version", "version": "v", "acceptance_scale": {"eagle3": -1}},
            "event.acceptance_scale.eagle3:",
        ),
        (
            {"kind": "model_version", "version": "v", "acceptance_scale": {"medusa": 0.5}},
            "event.acceptance_scale.medusa: unknown drafter 'medusa'",
        ),
        ({"kind": "route_mix", "shares": {"code": 1}}, "event.shares.code: unknown route 'code'"),
        (
            {"kind": "drafter_broken", "drafter": "eagel3"},
            "event.drafter: unknown drafter 'eagel3'",
        ),
        (
            {"kind": "pod_decay", "pod": 0, "acceptance_per_hour": 0.9},
            "event.kind: 'pod_decay' cannot be injected",
        ),
    ],
)
def test_a_bad_event_is_refused_naming_the_field(
    make_scenario: Callable[..., Scenario], data: Any, message: str
) -> None:
    with pytest.raises(SpecError) as err:
        injectable_event(make_scenario(), data)
    assert message in str(err.value)


def test_at_s_is_optional_and_ignored_by_inject(make_scenario: Callable[..., Scenario]) -> None:
    scenario = make_scenario()
    fleet = Fleet(scenario, arms=Arm("eagle3", 3), replicas=1)
    fleet.advance(30.0)
    event = injectable_event(scenario, {"kind": "route_mix", "shares": {"chat": 1.0}})
    assert isinstance(injectable_event(scenario, {**event.model_dump(), "at_s": 5}), type(event))
    assert fleet.inject(event).at_s == 30.0
    assert not isinstance(event, ModelVersionEvent)
