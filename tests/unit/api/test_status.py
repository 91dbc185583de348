"""The status the operator writes reads back the same, stays bounded, and survives upgrades."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spectune.api import SpecTuningStatus, parse_status
from spectune.api.status import (
    MAX_TRIALS_IN_STATUS,
    Acceptance,
    Applied,
    Condition,
    ConditionStatus,
    Finding,
    Interval,
    Phase,
    Recommendation,
    Trial,
    TrialOutcome,
)
from spectune.api.validation import InvalidSpecError

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def _trial(i: int) -> Trial:
    return Trial(
        arm=f"eagle3/{i % 8 + 1}",
        outcome=TrialOutcome.MEASURED,
        started_at=T0 + timedelta(minutes=10 * i),
        windows=2,
        incumbent="off",
        canary_objective=0.031,
        incumbent_objective=0.044,
        reason="next arm chosen",
    )


def _status(trials: int = 3) -> SpecTuningStatus:
    return SpecTuningStatus(
        phase=Phase.CONVERGED,
        applied=Applied(drafter="eagle3", k=3, arm="eagle3/3", fingerprint="9f2c1a"),
        recommendation=Recommendation(
            arm="eagle3/3",
            drafter="eagle3",
            k=3,
            expected_speedup=1.42,
            interval=Interval(low=1.31, high=1.55),
            reason="best tpotP95",
        ),
        acceptance=Acceptance(
            rate=0.71, per_position=(0.82, 0.7, 0.61), mean_accepted_length=3.13, window="5m"
        ),
        diagnosis=(Finding(code="HEALTHY", message="pays", evidence={"speedup": 1.42}),),
        trials=tuple(_trial(i) for i in range(trials)),
        observed_model_version="llama-3.1-8b@sha256:abc",
        observed_routes="r1",
        observed_generation=4,
        conditions=(
            Condition(
                type="Ready",
                status=ConditionStatus.TRUE,
                reason="Converged",
                message="tuned",
                last_transition_time=T0,
                observed_generation=4,
            ),
        ),
        history={"epoch": 0, "trials": [{"arm": "eagle3/3"}]},
    )


def test_a_written_status_reads_back_equal() -> None:
    status = _status()
    written = status.model_dump(mode="json", exclude_none=True)
    assert written["applied"] == {
        "drafter": "eagle3",
        "k": 3,
        "arm": "eagle3/3",
        "fingerprint": "9f2c1a",
    }
    assert written["trials"][0]["startedAt"] == "2025-01-02T03:04:05Z"
    assert written["conditions"][0]["lastTransitionTime"] == "2025-01-02T03:04:05Z"
    assert parse_status({"metadata": {}, "status": written}) == status


def test_a_resource_without_status_has_an_empty_one() -> None:
    assert parse_status({"metadata": {"name": "x"}, "spec": {}}) == SpecTuningStatus()


def test_the_trial_list_is_bounded() -> None:
    written = _status(trials=MAX_TRIALS_IN_STATUS).model_dump(mode="json")
    assert len(parse_status(written).trials) == MAX_TRIALS_IN_STATUS
    written["trials"].append(written["trials"][0])
    with pytest.raises(InvalidSpecError) as err:
        parse_status(written)
    assert err.value.fields == ("status.trials",)


def test_a_field_from_a_newer_operator_is_ignored() -> None:
    written = _status().model_dump(mode="json") | {"addedLater": {"x": 1}}
    assert parse_status(written) == _status()


def test_a_bad_phase_is_named() -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_status({"phase": "Happy"})
    assert err.value.fields == ("status.phase",)
