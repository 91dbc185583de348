"""The trial history stays bounded and keeps what the policy and the controller read."""

from __future__ import annotations

import math

from spectune.search.history import (
    KEPT_FIRST,
    KEPT_LAST,
    KEPT_SUMMARIES,
    History,
    Outcome,
    TrialRecord,
    WindowRecord,
)
from spectune.search.objective import WindowStats

NAN = math.nan


def _stats(running: float) -> WindowStats:
    return WindowStats(
        objective=0.03, objective_low=NAN, objective_high=NAN, requests=100, tpot_mean=0.03,
        tpot_p95=0.03, ttft_p95=0.2, ttft_p95_low=NAN, ttft_p95_high=NAN, queue_p95=0.0,
        queue_p95_low=NAN, queue_p95_high=NAN, e2e_p95=NAN, tokens_per_s=NAN, running=running,
        pods=1, k=3, drafts=1000, accepted_per_pos=(800, 600, 400), mean_accepted_length=2.5,
        num_gpu_blocks=None, preemptions=0.0,
    )  # fmt: skip


def _alone(t: float, running: float = 4.0) -> WindowRecord:
    return WindowRecord(t, t + 300, _stats(running), None, "eagle3/3")


def _monitor(h: History, start: float, n: int, running: float = 4.0) -> History:
    for i in range(n):
        h = h.add_baseline(_alone(start + 300 * i, running))
    return h


def _trial(h: History, arm: str, start: float, windows: int) -> History:
    ws = tuple(
        WindowRecord(start + 300 * i, start + 300 * (i + 1), _stats(4.0), _stats(3.0), "off")
        for i in range(windows)
    )
    return h.add_trial(TrialRecord(arm, "off", h.epoch, start, Outcome.MEASURED, "", ws))


def test_a_long_run_of_windows_alone_keeps_its_first_and_last_windows() -> None:
    h = _monitor(History(), 0.0, 500)
    starts = [w.start_s for w in h.baseline_windows()]
    assert len(starts) == KEPT_FIRST + KEPT_LAST
    assert starts[:KEPT_FIRST] == [300.0 * i for i in range(KEPT_FIRST)]  # the reference
    assert starts[-KEPT_LAST:] == [300.0 * i for i in range(500 - KEPT_LAST, 500)]
    # What was recorded is still counted: the policies seed their draws with it.
    assert h.recorded() == (0, 0, 500)


def test_a_short_run_in_two_epochs_is_kept_whole() -> None:
    # What a one- or two-hour run records, and more: nothing is dropped.
    h = _monitor(History(), 0.0, 2)
    h = _trial(h, "eagle3/2", 600.0, 3)
    h = _monitor(h, 1500.0, KEPT_FIRST + KEPT_LAST)
    h = h.new_epoch()
    h = _trial(h, "ngram/4", 20000.0, 3)
    h = _monitor(h, 21000.0, KEPT_FIRST + KEPT_LAST)
    assert len(h.baseline) == 2 + 2 * (KEPT_FIRST + KEPT_LAST)
    assert h.recorded() == (2, 6, len(h.baseline))
    assert h.compacted().to_json() == h.to_json()


def test_trial_windows_are_kept_and_split_runs() -> None:
    # Windows alone between trials are runs of their own: each short one is kept.
    h = History()
    for i in range(10):
        h = _monitor(h, 10000.0 * i, 2)
        h = _trial(h, f"eagle3/{i % 8 + 1}", 10000.0 * i + 600, 3)
    assert len(h.baseline) == 20 and sum(len(t.windows) for t in h.trials) == 30


def test_an_epoch_two_re_tunes_old_keeps_its_summary_only() -> None:
    h = _monitor(History(), 0.0, 3, running=10.0)
    h = _trial(h, "eagle3/2", 900.0, 2)
    h = h.promoted("eagle3/2").failed("draft/4", True, "CUDA out of memory")
    batch = h.epoch_batch(0)
    h = h.new_epoch(load_moved=True)
    h = _monitor(h, 5000.0, 2, running=30.0)
    assert h.in_epoch(0), "the epoch before the current one keeps its windows"
    h = h.new_epoch(load_moved=True)
    assert not h.in_epoch(0) and not h.baseline_windows(0)
    assert h.epoch_batch(0) == batch == 10.0  # where a learned schedule places epoch 0
    assert h.promotions == ((0, "eagle3/2"),)
    assert h.failures == ((0, "draft/4", True, "CUDA out of memory"),)
    assert h.load_epochs == (1, 2) and h.acceptance_epochs() == (2, 1, 0)
    assert h.recorded() == (1, 2, 5)
    # The summary and the counts survive the status.
    back = History.from_json(h.to_json())
    assert back.epoch_batch(0) == 10.0 and back.recorded() == h.recorded()
    assert back.to_json() == h.to_json()


def test_summaries_of_epochs_long_past_are_dropped() -> None:
    h = History()
    for e in range(KEPT_SUMMARIES + 10):
        h = h.promoted(f"eagle3/{e % 8 + 1}").new_epoch(load_moved=True)
    assert len(h.promotions) == KEPT_SUMMARIES - 1  # the current epoch has none yet
    assert min(e for e, _ in h.promotions) == h.epoch - KEPT_SUMMARIES + 1
    assert len(h.load_epochs) == KEPT_SUMMARIES


def test_compaction_is_idempotent() -> None:
    h = _monitor(History(), 0.0, 100)
    h = h.new_epoch()
    h = _trial(h, "eagle3/2", 40000.0, 3).new_epoch()
    h = _monitor(h, 50000.0, 60)
    assert h.compacted().to_json() == h.to_json()
    assert History.from_json(h.to_json()).to_json() == h.to_json()
