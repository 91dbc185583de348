"""The trial history: everything measured, in the order it happened.

The history is the policy's only memory (STYLE.md, "Algorithms that survive a restart"):
the controller appends to it, the operator stores it in the SpecTuning status, and the
policy rebuilds every estimate from it on each decision. So a restarted controller that
reloads the history reaches the same decision without repeating a finished trial.

It is bounded (:meth:`History.compacted`, applied on every append that can grow it and on
every load), so that a SpecTuning that monitors for months fits its status: etcd refuses
an object over 1.5 MiB, and an incumbent-only window costs about 1.1 KB of JSON (two
groups' figures in a trial window, about 2.2 KB), so keeping every 5-minute window would
pass it in five days. Compacting in the history itself, not in the status writer, keeps
the running controller and one restarted from the status on the same record.
"""

from __future__ import annotations

import bisect
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from spectune.search.objective import WindowStats, saturated

__all__ = [
    "KEPT_EPOCHS",
    "KEPT_FIRST",
    "KEPT_LAST",
    "KEPT_SUMMARIES",
    "MATCHED_LOAD_BAND",
    "History",
    "Outcome",
    "TrialRecord",
    "WindowRecord",
]

#: Largest relative difference of per-pod load (finished requests per pod per second)
#: between canary and incumbent for a window to be read as a matched pair. The payoff of
#: speculation depends on the batch each pod runs: a canary at a different load per pod is
#: measured at another point of the cost curve. ±15 % is the Poisson noise of a rate from
#: about 50 requests per pod (1/√50 ≈ 0.14), the fewest a judged window holds.
MATCHED_LOAD_BAND = 0.15

#: Incumbent-only windows kept at the start of each run of them (a run: the windows between
#: two trial windows of an epoch, or after its last — in practice, monitoring). The run's
#: first windows hold the monitoring reference, the first window on the promoted setting
#: that the controller compares the load with for as long as it monitors (at most a window
#: or two into the run: a search ends at the decision after its last window), and the
#: epoch's first load. Twelve is an hour at 5-minute windows.
KEPT_FIRST = 12

#: ...and at its end: what the latest windows are read for — a promoted arm's verification
#: against its predecessor's last windows (``search.verifyWindows`` is at most 20), a load
#: move confirmed over the last two windows, the target's current load. Twenty-four is two
#: hours at 5-minute windows; a run of at most ``KEPT_FIRST + KEPT_LAST`` windows is whole.
KEPT_LAST = 24

#: Epochs whose windows and trials are kept: the current one and the one before it. What
#: is read across epochs: acceptance and service-rate windows of earlier epochs of the same
#: model (load moves), draft costs of an earlier epoch at the same load, and the first and
#: last window of the epoch a load move closed. The epoch before holds what the last two
#: need; from older ones acceptance and costs are re-measured (the current epoch's windows
#: outweigh them within a trial), and each keeps a summary: its median running batch (what
#: ``search/schedule.py`` places its learned ranges at), its promotions and failures.
KEPT_EPOCHS = 2

#: Epochs whose promotions, failures and load-move marks are kept (each about 50 bytes):
#: sixty-four re-tunes is months of diurnal load moves; a chain of load epochs longer than
#: that lends nothing that its last sixty-four do not.
KEPT_SUMMARIES = 64


class Outcome(enum.Enum):
    """How a trial ended."""

    RUNNING = "running"
    MEASURED = "measured"
    ABORTED = "aborted"  # a guardrail fired
    INFEASIBLE = "infeasible"  # the arm could not start


@dataclass(frozen=True)
class WindowRecord:
    """One window: the incumbent's figures and, during a trial, the canary's."""

    start_s: float
    end_s: float
    incumbent: WindowStats | None
    canary: WindowStats | None = None
    incumbent_arm: str = ""
    """The arm the incumbent replicas ran (empty when unknown)."""

    @property
    def load_ratio(self) -> float:
        """The canary's finished requests per pod per second over the incumbent's (NaN
        unless both groups finished requests on known pods)."""
        can, inc = self.canary, self.incumbent
        if can is None or inc is None or not can.pods or not inc.pods:
            return math.nan
        if not (can.requests > 0 and inc.requests > 0):
            return math.nan
        return (can.requests / can.pods) / (inc.requests / inc.pods)

    @property
    def matched(self) -> bool:
        """Whether canary and incumbent carried the same load per pod, within
        :data:`MATCHED_LOAD_BAND`: only then is the window a matched pair."""
        r = self.load_ratio
        return math.isfinite(r) and abs(r - 1.0) <= MATCHED_LOAD_BAND

    @property
    def backlog_pair(self) -> bool:
        """Whether this window pairs a saturated incumbent with a canary that is not and
        carried less load per pod: then it compares a backlog with a light batch, not
        two arms.

        A saturated group finishes requests at its capacity, and its latency counts the
        backlog it built while it carried the load alone (an e2e p95 of minutes) and a
        batch pinned at its limit. A canary that finished at least as many requests per
        pod (within :data:`MATCHED_LOAD_BAND`) served at least the load at which the
        incumbent's arm saturates without saturating: its arm has more capacity, and the
        contrast is the measurement the search wants. One that finished fewer carried its
        share of the traffic beside the target — a lighter load at which either arm
        keeps up — and its low latency is its share's, not its arm's: the window says
        nothing about either arm at the target's load.
        """
        can, inc = self.canary, self.incumbent
        if can is None or inc is None or not saturated(inc) or saturated(can):
            return False
        r = self.load_ratio
        return math.isfinite(r) and r < 1.0 - MATCHED_LOAD_BAND


@dataclass(frozen=True)
class TrialRecord:
    """One arm tried on the canary against the incumbent, window by window."""

    arm: str
    incumbent: str
    epoch: int
    started_s: float
    outcome: Outcome = Outcome.RUNNING
    reason: str = ""
    windows: tuple[WindowRecord, ...] = ()

    def with_window(self, w: WindowRecord) -> TrialRecord:
        """This trial with one more window."""
        return replace(self, windows=(*self.windows, w))

    def ended(self, outcome: Outcome, reason: str) -> TrialRecord:
        """This trial, finished."""
        return replace(self, outcome=outcome, reason=reason)


@dataclass(frozen=True)
class History:
    """Trials and incumbent-only windows, grouped by epoch.

    An epoch starts at every re-tune (model version, routes, schedule, drift): evidence
    from earlier epochs may warm-start the model, but new windows are trusted over it.
    """

    trials: tuple[TrialRecord, ...] = ()
    baseline: tuple[tuple[int, WindowRecord], ...] = ()
    epoch: int = 0
    promotions: tuple[tuple[int, str], ...] = field(default=())
    load_epochs: tuple[int, ...] = field(default=())
    """Epochs opened because the load moved: the model and routes, so acceptance, held."""
    failures: tuple[tuple[int, str, bool, str], ...] = field(default=())
    """``(epoch, arm, infeasible, why)`` for each arm rolled back from the target: worse
    than its predecessor after a promotion, or unable to start there (``infeasible``)."""
    batches: tuple[tuple[int, float], ...] = field(default=())
    """``(epoch, median running batch per pod)`` of each epoch whose windows were dropped
    (:meth:`compacted`): :meth:`epoch_batch` of an epoch that holds no window any more."""
    dropped: tuple[int, int, int] = (0, 0, 0)
    """Trials, trial windows and incumbent-only windows dropped by :meth:`compacted`: the
    policies seed their random draws with how much was recorded (:meth:`recorded`), and a
    compaction must not change a draw."""

    def in_epoch(self, epoch: int | None = None) -> tuple[TrialRecord, ...]:
        """The trials of one epoch (the current one by default)."""
        e = self.epoch if epoch is None else epoch
        return tuple(t for t in self.trials if t.epoch == e)

    def baseline_windows(self, epoch: int | None = None) -> tuple[WindowRecord, ...]:
        """Incumbent-only windows of one epoch."""
        e = self.epoch if epoch is None else epoch
        return tuple(w for ep, w in self.baseline if ep == e)

    def add_trial(self, t: TrialRecord) -> History:
        """The history with a new trial."""
        return replace(self, trials=(*self.trials, t))

    def update_last(self, t: TrialRecord) -> History:
        """The history with its last trial replaced."""
        return replace(self, trials=(*self.trials[:-1], t))

    def add_baseline(self, w: WindowRecord) -> History:
        """The history with one more incumbent-only window (compacted)."""
        return replace(self, baseline=(*self.baseline, (self.epoch, w))).compacted()

    def new_epoch(self, load_moved: bool = False) -> History:
        """The history at the start of a re-tune (``load_moved``: only the load changed),
        compacted."""
        loads = (*self.load_epochs, self.epoch + 1) if load_moved else self.load_epochs
        return replace(self, epoch=self.epoch + 1, load_epochs=loads).compacted()

    def recorded(self) -> tuple[int, int, int]:
        """Trials, trial windows and incumbent-only windows recorded since the start,
        those :meth:`compacted` dropped included."""
        t, tw, b = self.dropped
        return (
            len(self.trials) + t,
            sum(len(x.windows) for x in self.trials) + tw,
            len(self.baseline) + b,
        )

    def epoch_batch(self, epoch: int) -> float:
        """Median running batch per pod of the incumbent over one epoch's windows (NaN if
        none): from its windows, or from its summary once they were dropped."""
        values = [w.incumbent.running for w in self.baseline_windows(epoch) if w.incumbent]
        values += [
            w.incumbent.running for t in self.in_epoch(epoch) for w in t.windows if w.incumbent
        ]
        values = sorted(v for v in values if not math.isnan(v))
        if not values:
            return next((b for e, b in self.batches if e == epoch), math.nan)
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    def compacted(self) -> History:
        """The history within its bound: what the policy and the controller read, kept.

        * every run of incumbent-only windows in an epoch (the windows between two of its
          trial windows, or after the last) keeps its first :data:`KEPT_FIRST` and its last
          :data:`KEPT_LAST` windows; trial windows are all kept (at most three a trial);
        * epochs older than the :data:`KEPT_EPOCHS` latest keep no window and no trial,
          only a summary: their median batch (:meth:`epoch_batch`), promotions, failures;
        * promotions, failures, load-move marks and summaries of epochs older than the
          :data:`KEPT_SUMMARIES` latest are dropped.

        The bound, in JSON (``Memory.to_json``): an incumbent-only window is about 1.1 KB
        (about 30 figures of one group), a trial window about 2.2 KB (two groups). An epoch
        holds at most ``3 × maxTrials`` trial windows, the incumbent-only windows its search
        looked at alone (one after a promotion or a stale rollout, so no more than its
        trials and one), and a monitoring run of ``KEPT_FIRST + KEPT_LAST = 36`` windows.
        At the default 12 trials: 36 × 2.2 + 13 × 1.1 + 36 × 1.1 ≈ 133 KB an epoch; two
        epochs and 64 summaries (≈ 4 KB): ≈ 270 KB of JSON, ≈ 105 KB once gzipped as the
        status stores it (floats of 17 digits compress about 2.6 times; field names to
        nothing). At the most trials a SpecTuning allows (50): ≈ 760 KB of JSON, ≈ 300 KB
        stored: inside etcd's 1.5 MiB either way, however long the SpecTuning runs.

        Idempotent. A run shorter than ``KEPT_FIRST + KEPT_LAST`` windows (three hours at
        5-minute windows) in one of two epochs loses nothing: a short run sees everything.
        """
        keep_from = self.epoch - KEPT_EPOCHS + 1
        old = sorted(
            {t.epoch for t in self.trials if t.epoch < keep_from}
            | {e for e, _ in self.baseline if e < keep_from}
        )
        batches = tuple((e, self.epoch_batch(e)) for e in old)
        trials = tuple(t for t in self.trials if t.epoch >= keep_from)
        baseline = tuple((e, w) for e, w in self.baseline if e >= keep_from)
        baseline = _thin_runs(baseline, trials)
        gone_trials = [t for t in self.trials if t.epoch < keep_from]
        t, tw, b = self.dropped
        dropped = (
            t + len(gone_trials),
            tw + sum(len(x.windows) for x in gone_trials),
            b + len(self.baseline) - len(baseline),
        )
        summary_from = self.epoch - KEPT_SUMMARIES + 1
        out = replace(
            self,
            trials=trials,
            baseline=baseline,
            promotions=tuple(p for p in self.promotions if p[0] >= summary_from),
            load_epochs=tuple(e for e in self.load_epochs if e >= summary_from),
            failures=tuple(f for f in self.failures if f[0] >= summary_from),
            batches=tuple(x for x in (*self.batches, *batches) if x[0] >= summary_from),
            dropped=dropped,
        )
        return out

    def acceptance_epochs(self) -> tuple[int, ...]:
        """The current epoch and the earlier ones whose acceptance still holds.

        A re-tune because the load moved keeps the model and the traffic, so acceptance —
        a property of the drafter on this traffic, not of the batch — carries over; any
        other re-tune (model version, routes, drift, schedule) starts afresh.
        """
        out = [self.epoch]
        while out[-1] > 0 and out[-1] in self.load_epochs:
            out.append(out[-1] - 1)
        return tuple(out)

    def promoted(self, arm: str) -> History:
        """The history with a promotion recorded."""
        return replace(self, promotions=(*self.promotions, (self.epoch, arm)))

    def failed(self, arm: str, infeasible: bool, why: str) -> History:
        """The history with an arm marked as failing on the target in this epoch."""
        return replace(self, failures=(*self.failures, (self.epoch, arm, infeasible, why)))

    # -- serialisation (the SpecTuning status stores this) ----------------------------------

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (NaN becomes None)."""
        doc: dict[str, Any] = _clean(asdict(self))
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> History:
        """Rebuild a history from :meth:`to_json`'s output."""
        trials = tuple(_trial(t) for t in doc.get("trials", ()))
        baseline = tuple((int(e), _window(w)) for e, w in doc.get("baseline", ()))
        promotions = tuple((int(e), str(a)) for e, a in doc.get("promotions", ()))
        loads = tuple(int(e) for e in doc.get("load_epochs", ()))
        failures = tuple(
            (int(e), str(a), bool(i), str(w)) for e, a, i, w in doc.get("failures", ())
        )
        batches = tuple(
            (int(e), math.nan if b is None else float(b)) for e, b in doc.get("batches", ())
        )
        t, tw, b = (int(x) for x in doc.get("dropped", (0, 0, 0)))
        h = cls(
            trials,
            baseline,
            int(doc.get("epoch", 0)),
            promotions,
            loads,
            failures,
            batches,
            (t, tw, b),
        )
        # A history written before it was bounded (status version 1) is compacted here.
        return h.compacted()


def _thin_runs(
    baseline: tuple[tuple[int, WindowRecord], ...], trials: Sequence[TrialRecord]
) -> tuple[tuple[int, WindowRecord], ...]:
    """``baseline`` with each run of incumbent-only windows cut to its first
    :data:`KEPT_FIRST` and last :data:`KEPT_LAST` (see :meth:`History.compacted`)."""
    starts: dict[int, list[float]] = {}
    for t in trials:
        starts.setdefault(t.epoch, []).extend(w.start_s for w in t.windows)
    for xs in starts.values():
        xs.sort()
    runs: dict[tuple[int, int], list[int]] = {}
    for i, (e, w) in enumerate(baseline):
        run = bisect.bisect_left(starts.get(e, []), w.start_s)
        runs.setdefault((e, run), []).append(i)
    drop: set[int] = set()
    for idx in runs.values():
        if len(idx) > KEPT_FIRST + KEPT_LAST:
            drop.update(idx[KEPT_FIRST : len(idx) - KEPT_LAST])
    if not drop:
        return baseline
    return tuple(x for i, x in enumerate(baseline) if i not in drop)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def _stats(doc: Mapping[str, Any] | None) -> WindowStats | None:
    if doc is None:
        return None
    values: dict[str, Any] = {}
    for f in fields(WindowStats):
        raw = doc.get(f.name)
        if f.name == "accepted_per_pos":
            values[f.name] = tuple(float(x) for x in (raw or ()))
        elif f.name in ("k", "pods"):
            values[f.name] = int(raw or 0)
        elif f.name == "num_gpu_blocks":
            values[f.name] = None if raw is None else int(raw)
        else:
            values[f.name] = math.nan if raw is None else float(raw)
    return WindowStats(**values)


def _window(doc: Mapping[str, Any]) -> WindowRecord:
    return WindowRecord(
        float(doc["start_s"]),
        float(doc["end_s"]),
        _stats(doc.get("incumbent")),
        _stats(doc.get("canary")),
        str(doc.get("incumbent_arm", "")),
    )


def _trial(doc: Mapping[str, Any]) -> TrialRecord:
    windows: Sequence[Mapping[str, Any]] = doc.get("windows", ())
    return TrialRecord(
        arm=str(doc["arm"]),
        incumbent=str(doc["incumbent"]),
        epoch=int(doc["epoch"]),
        started_s=float(doc["started_s"]),
        outcome=Outcome(doc.get("outcome", "running")),
        reason=str(doc.get("reason", "")),
        windows=tuple(_window(w) for w in windows),
    )
