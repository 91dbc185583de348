"""Per-batch-size tables learned from the answers the search gave at different loads."""

from __future__ import annotations

from dataclasses import replace

from spectune.search.arms import Arm, parse_arm
from spectune.search.history import History, WindowRecord
from spectune.search.schedule import learned_schedule
from tests.unit.search.test_spectune_policy import WORLDS

STATS = WORLDS["chat: eagle3 wins at a small k"].stats(parse_arm("eagle3/3"))


def history_of(epochs: list[tuple[float, str]], load_moves: bool = True) -> History:
    """One baseline window at the given batch per epoch, and its final promotion; each
    epoch opened by a load move (or, with ``load_moves=False``, by a model change)."""
    h = History()
    for i, (batch, promoted) in enumerate(epochs):
        if i:
            h = h.new_epoch(load_moved=load_moves)
        h = h.add_baseline(WindowRecord(0, 300, replace(STATS, running=batch), None, promoted))
        h = h.promoted(promoted)
    return h.new_epoch(load_moved=load_moves)


def test_three_load_regimes_make_a_table_that_switches_speculation_off_at_high_load() -> None:
    h = history_of([(2.0, "eagle3/4"), (120.0, "off")])
    arm = learned_schedule(h, Arm("eagle3", 2), now_batch=30.0, load_factor=1.6)
    assert arm is not None
    assert arm.name == "eagle3/sched:1-7=4,8-60=2,61-1024=0"
    assert arm.k == 4  # vLLM's num_speculative_tokens is the table's largest k
    assert [arm.k_at(b) for b in (1, 7, 8, 60, 61, 500)] == [4, 4, 2, 2, 0, 0]


def test_one_regime_or_one_answer_keeps_the_static_arm() -> None:
    same_load = history_of([(28.0, "eagle3/4")])
    assert learned_schedule(same_load, Arm("eagle3", 2), 30.0, 1.6) is None
    same_k = history_of([(2.0, "eagle3/2")])
    assert learned_schedule(same_k, Arm("eagle3", 2), 30.0, 1.6) is None
    other_drafter = history_of([(2.0, "ngram/6")])
    assert learned_schedule(other_drafter, Arm("eagle3", 2), 30.0, 1.6) is None
    assert learned_schedule(history_of([(2.0, "eagle3/4")]), Arm(None), 30.0, 1.6) is None


def test_answers_from_before_a_model_change_do_not_make_a_table() -> None:
    # The same two regimes, but the epochs were opened by model changes: the old answers
    # were for another model's acceptance.
    h = history_of([(2.0, "eagle3/4"), (120.0, "off")], load_moves=False)
    assert learned_schedule(h, Arm("eagle3", 2), now_batch=30.0, load_factor=1.6) is None


def test_a_k_that_grows_with_the_batch_makes_no_table() -> None:
    # eagle3/3 at batch 2 and eagle3/8 at batch 170: the answers differ by something other
    # than the load (verification only gets dearer with the batch).
    h = history_of([(2.0, "eagle3/3")])
    assert learned_schedule(h, Arm("eagle3", 8), now_batch=170.0, load_factor=1.6) is None
    assert learned_schedule(h, Arm("eagle3", 1), now_batch=170.0, load_factor=1.6) is not None
