"""The trial history: everything measured, in the order it happened.

The history is the policy's only memory (STYLE.md, "Algorithms that survive a restart"):
the controller appends to it, the operator stores it in the SpecTuning status, and the
policy rebuilds every estimate from it on each decision. So a restarted controller that
reloads the history reaches the same decision without repeating a finished trial.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from spectune.search.objective import WindowStats

__all__ = ["MATCHED_LOAD_BAND", "History", "Outcome", "TrialRecord", "WindowRecord"]

#: Largest relative difference of per-pod load (finished requests per pod per second)
#: between canary and incumbent for a window to be read as a matched pair. The payoff of
#: speculation depends on the batch each pod runs: a canary at a different load per pod is
#: measured at another point of the cost curve. ±15 % is the Poisson noise of a rate from
#: about 50 requests per pod (1/√50 ≈ 0.14), the fewest a judged window holds.
MATCHED_LOAD_BAND = 0.15


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
        """The history with one more incumbent-only window."""
        return replace(self, baseline=(*self.baseline, (self.epoch, w)))

    def new_epoch(self, load_moved: bool = False) -> History:
        """The history at the start of a re-tune (``load_moved``: only the load changed)."""
        loads = (*self.load_epochs, self.epoch + 1) if load_moved else self.load_epochs
        return replace(self, epoch=self.epoch + 1, load_epochs=loads)

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
        return cls(trials, baseline, int(doc.get("epoch", 0)), promotions, loads, failures)


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
