"""Arm names: the strings the bench prints, the CLI takes and the trial history stores."""

from __future__ import annotations

import pytest

from spectune.errors import SpecError
from spectune.search.arms import OFF, Arm, parse_arm


@pytest.mark.parametrize(
    "name",
    ["off", "eagle3/3", "ngram/8", "draft_model-1.5b/1", "eagle3/sched:1-64=3,65-128=1,129-512=0"],
)
def test_names_round_trip(name: str) -> None:
    assert parse_arm(name).name == name
    assert str(parse_arm(name)) == name


def test_fields_of_each_kind() -> None:
    assert parse_arm("off") == OFF == Arm(None)
    assert OFF.k == 0 and OFF.schedule is None and OFF.is_off
    assert parse_arm("eagle3/5") == Arm("eagle3", 5)
    sched = parse_arm("eagle3/sched:1-64=3,65-512=0")
    assert sched.drafter == "eagle3"
    assert sched.k == 3  # num_speculative_tokens is the schedule's largest k
    assert sched.schedule == ((1, 64, 3), (65, 512, 0))


def test_schedule_picks_k_by_batch_size() -> None:
    arm = parse_arm("eagle3/sched:1-4=4,5-16=2,17-256=0")
    assert [arm.k_at(b) for b in (1, 4, 5, 16, 17, 256)] == [4, 4, 2, 2, 0, 0]
    assert arm.k_at(300) == 4  # outside the table: the static num_speculative_tokens
    assert Arm("eagle3", 3).k_at(100) == 3


def test_arms_are_hashable_values() -> None:
    assert {parse_arm("eagle3/3"), Arm("eagle3", 3)} == {Arm("eagle3", 3)}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("eagle3", "arms are named"),
        ("eagle3/", "arms are named"),
        ("/3", "arms are named"),
        ("eagle3/x", "not a whole number"),
        ("eagle3/0", "at least 1"),
        ("eagle3/-1", "not a whole number"),
        ("eagle3/sched:", "not <lo>-<hi>=<k>"),
        ("eagle3/sched:1-4", "not <lo>-<hi>=<k>"),
        ("eagle3/sched:5-4=2", "1 <= lo <= hi"),
        ("eagle3/sched:1-8=2,4-16=1", "must not overlap"),
        ("eagle3/sched:1-8=0,9-16=0", "use the arm 'off'"),
        ("eag le/3", "bad drafter name"),
        ("off/3", "bad drafter name"),
    ],
)
def test_malformed_names_are_rejected_with_a_reason(text: str, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        parse_arm(text)


def test_direct_construction_is_validated() -> None:
    with pytest.raises(SpecError):
        Arm(None, 3)
    with pytest.raises(SpecError):
        Arm("eagle3", 0)
    with pytest.raises(SpecError, match="largest k"):
        Arm("eagle3", 5, ((1, 8, 3),))
