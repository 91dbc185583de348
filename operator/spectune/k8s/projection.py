"""From the tuning loop's memory to the SpecTuning status a user reads, and back.

The operator's loop (``k8s/tuning.py``) calls :func:`build_status` after every step and
writes the result to the status subresource; on a restart it reads the controller's memory
back with :func:`load_memory`. Pure functions over values: no client, no clock (``now`` is
passed in), so every line of the status is tested without a cluster.

What ``status.history`` holds (the operator's own, versioned): one string, the gzipped
JSON of ``{"version": 2, "history": History.to_json(), "state": ControllerState as JSON,
"original": <arm the target ran before the first promotion>}`` in base64
(:func:`encode_memory`). One string, not an object: ``kubectl describe`` prints every field
of an object as a line, and the memory is hundreds of figures per window; a string is one
line, a few tens of KB at most (the history is bounded: ``History.compacted``), and
``status.trials`` is what a user reads. Read it with
``kubectl get spt NAME -o jsonpath='{.status.history}' | base64 -d | gunzip``.
Version 1 (the object itself, unbounded) is still read, and compacted as it is.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from spectune.api.spec import Engine
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
    SpecTuningStatus,
    Trial,
    TrialOutcome,
)
from spectune.control.controller import ControllerState
from spectune.control.controller import Phase as LoopPhase
from spectune.search.arms import Arm, parse_arm
from spectune.search.history import History, TrialRecord, WindowRecord
from spectune.search.objective import WindowStats
from spectune.search.policy import Decision, Estimate

__all__ = [
    "MEMORY_VERSION",
    "ConditionUpdate",
    "Memory",
    "StatusInputs",
    "acceptance_of",
    "applied_speedup",
    "build_status",
    "decode_memory",
    "drafter_condition",
    "encode_memory",
    "load_memory",
    "merge_conditions",
    "pods_condition",
    "recommendation_of",
    "trials_of",
    "verified_condition",
]

MEMORY_VERSION = 2
"""2: ``status.history`` is :func:`encode_memory`'s string of a bounded history; 1: the
memory as an object, its history unbounded (read, and compacted on load)."""

_PHASES = {
    LoopPhase.BASELINE: Phase.BASELINE,
    LoopPhase.EXPLORING: Phase.EXPLORING,
    LoopPhase.MONITORING: Phase.MONITORING,
    LoopPhase.DRIFTED: Phase.DRIFTED,
    LoopPhase.VERIFYING: Phase.VERIFYING,
}


def api_phase(phase: LoopPhase) -> Phase:
    """The status phase of a controller phase."""
    return _PHASES[phase]


# -- the restart-safe memory ------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """What the loop needs to resume: the history, the controller state, the original arm."""

    history: History
    state: ControllerState
    original: str | None = None
    restarts: Mapping[float, int] = field(default_factory=dict)
    """Restarts of the target each in-place (switchback) trial caused, by the trial's start
    (``TrialRecord.started_s``); a trial absent here ran on a canary."""

    def to_json(self) -> dict[str, Any]:
        """The JSON kept in ``status.history``."""
        state = {k: _finite(v) for k, v in asdict(self.state).items()}
        state["phase"] = self.state.phase.value
        kept = {t.started_s for t in self.history.trials}
        doc: dict[str, Any] = {
            "version": MEMORY_VERSION,
            "history": self.history.to_json(),
            "state": state,
            "original": self.original,
        }
        restarts = [[at, n] for at, n in sorted(self.restarts.items()) if at in kept]
        if restarts:
            doc["restarts"] = restarts
        return doc


def encode_memory(doc: Mapping[str, Any]) -> str:
    """``status.history``: :meth:`Memory.to_json` as compact JSON, gzipped, in base64.

    Deterministic (no timestamp in the gzip header), so an unchanged memory writes the same
    string and the status writer sees nothing new.
    """
    raw = json.dumps(doc, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")


def decode_memory(raw: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """The memory's JSON from ``status.history`` in any version (empty when there is none).

    Raises :class:`ValueError` naming the field when it is neither.
    """
    if not raw:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)  # version 1: the object itself
    try:
        text = raw if raw.lstrip().startswith("{") else gzip.decompress(base64.b64decode(raw))
        doc = json.loads(text)
    except (binascii.Error, OSError, EOFError, ValueError) as exc:
        raise ValueError(
            f"status.history is not the operator's memory (base64 of gzipped JSON): {exc}; "
            "remove the field to start the tuning afresh"
        ) from None
    if not isinstance(doc, dict):
        raise ValueError("status.history does not hold a JSON object")
    return doc


def load_memory(raw: str | Mapping[str, Any] | None) -> Memory:
    """The memory stored by :meth:`Memory.to_json` (in ``status.history``, any version);
    empty for a new SpecTuning. The history comes back compacted (``History.from_json``)."""
    doc = decode_memory(raw)
    if not doc:
        return Memory(History(), ControllerState())
    raw = doc.get("state") or {}
    values: dict[str, Any] = {}
    for f in fields(ControllerState):
        if f.name not in raw:
            continue
        v = raw[f.name]
        if f.name == "phase":
            values[f.name] = LoopPhase(v)
        elif f.name == "decay_since":
            values[f.name] = tuple((str(pod), float(at)) for pod, at in v or ())
        elif f.name in ("model_version", "routes") or f.type == "str | None":
            values[f.name] = None if v is None else str(v)
        elif f.type == "int | None":
            values[f.name] = None if v is None else int(v)
        else:
            values[f.name] = None if v is None else float(v)
    original = doc.get("original")
    restarts = {float(at): int(n) for at, n in doc.get("restarts") or []}
    return Memory(
        History.from_json(doc.get("history") or {}),
        ControllerState(**values),
        None if original is None else str(original),
        restarts,
    )


def _finite(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


# -- pieces of the status ---------------------------------------------------------------------


def _time(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def _num(v: float) -> float | None:
    return v if math.isfinite(v) else None


def acceptance_of(stats: WindowStats | None, window_s: float) -> Acceptance | None:
    """Acceptance over one window of the applied setting; None without drafts."""
    if stats is None or not stats.drafts > 0 or stats.k < 1:
        return None
    per_pos = tuple(min(1.0, max(0.0, a / stats.drafts)) for a in stats.accepted_per_pos)
    accepted = (stats.mean_accepted_length - 1) * stats.drafts
    if stats.draft_tokens > 0 and math.isfinite(accepted):
        # The engine's own rate. Not Σ P(L ≥ i) / k: a window that spans a rollout holds
        # positions of the old k beside passes of the new one.
        rate = accepted / stats.draft_tokens
    elif per_pos:
        rate = sum(per_pos[: stats.k]) / stats.k
    elif math.isfinite(stats.mean_accepted_length):
        rate = (stats.mean_accepted_length - 1) / stats.k
    else:
        return None
    return Acceptance(
        rate=min(1.0, max(0.0, rate)),
        per_position=per_pos[:16],
        mean_accepted_length=_num(stats.mean_accepted_length),
        window=f"{round(window_s)}s",
    )


def _mean(values: Iterable[float]) -> float | None:
    xs = [v for v in values if math.isfinite(v)]
    return sum(xs) / len(xs) if xs else None


def trials_of(
    history: History, restarts: Mapping[float, int] | None = None, time_scale: float = 1.0
) -> tuple[Trial, ...]:
    """The latest trials (at most :data:`MAX_TRIALS_IN_STATUS`), oldest first; ``restarts``
    names the switchback trials (``Memory.restarts``); rates are per pod second under
    ``time_scale`` (pods' seconds per second of the history's clock)."""
    out = []
    for t in history.trials[-MAX_TRIALS_IN_STATUS:]:
        out.append(_trial(t, (restarts or {}).get(t.started_s), time_scale))
    return tuple(out)


def _per_pod_rate(w: WindowRecord, stats: WindowStats | None, time_scale: float = 1.0) -> float:
    """Requests ``stats``' group finished per pod per (pod) second over window ``w`` (NaN
    unknown); the window's span is on the history's clock, ``time_scale`` pods' seconds each."""
    span = (w.end_s - w.start_s) * time_scale
    if stats is None or not stats.pods or not span > 0 or not math.isfinite(stats.requests):
        return math.nan
    return stats.requests / stats.pods / span


def _trial(t: TrialRecord, restarts: int | None = None, time_scale: float = 1.0) -> Trial:
    ws = t.windows
    can = _mean(w.canary.objective for w in ws if w.canary is not None)
    inc = _mean(w.incumbent.objective for w in ws if w.incumbent is not None)
    ratios = [w.load_ratio for w in ws if math.isfinite(w.load_ratio)]
    return Trial(
        arm=t.arm,
        outcome=TrialOutcome(t.outcome.value),
        started_at=_time(t.started_s),
        windows=len(ws),
        incumbent=t.incumbent or None,
        canary_objective=can,
        incumbent_objective=inc,
        canary_load_per_pod=_mean(_per_pod_rate(w, w.canary, time_scale) for w in ws),
        incumbent_load_per_pod=_mean(_per_pod_rate(w, w.incumbent, time_scale) for w in ws),
        canary_batch=_mean(w.canary.running for w in ws if w.canary is not None),
        incumbent_batch=_mean(w.incumbent.running for w in ws if w.incumbent is not None),
        load_ratio=_mean(ratios),
        matched_windows=sum(1 for w in ws if w.matched) if ws else None,
        switchback=True if restarts is not None else None,
        restarts=restarts,
        reason=t.reason[:1024],
    )


def _speedup(ratio: float, minimise: bool) -> float:
    """Speedup from an objective ratio (arm / reference): >1 means the arm is better."""
    if not ratio > 0:
        return math.nan
    return 1.0 / ratio if minimise else ratio


def applied_speedup(decision: Decision | None, applied: Arm, minimise: bool) -> float | None:
    """The applied arm's measured gain on the objective against ``off`` (``SPEEDUP``).

    Read from the decision's estimates, which are objective values of every arm on one
    scale (ratios to the incumbent), and only where both the applied arm and ``off`` were
    measured: a gain shown as the target's own must not be a prediction (the
    recommendation's ``expectedSpeedup`` is that). ``off`` applied is 1 by definition.
    """
    if applied.drafter is None:
        return 1.0
    if decision is None:
        return None
    mine, off = decision.estimates.get(applied.name), decision.estimates.get("off")
    if mine is None or off is None or not (mine.measured and off.measured):
        return None
    if not (mine.value > 0 and off.value > 0):
        return None
    s = _speedup(mine.value / off.value, minimise)
    return s if math.isfinite(s) else None


def recommendation_of(
    decision: Decision | None, incumbent: Arm, minimise: bool
) -> Recommendation | None:
    """The recommendation of a decision: its arm (or the best estimate) against ``off``.

    The policy's estimates are objective ratios to the incumbent; the speedup against
    speculation off is the ratio of ``off``'s estimate to the arm's (for an objective to
    minimise). Without an estimate of ``off``, the incumbent is the reference.
    """
    if decision is None:
        return None
    est = decision.estimates
    arm = decision.arm
    if est:
        best = _best(est, minimise)
        if decision.kind.value != "promote" or arm is None:
            arm = parse_arm(best) if best is not None else arm
    if arm is None:
        return None
    mine: Estimate | None = est.get(arm.name)
    ref = est.get("off")
    ref_value = ref.value if ref is not None else (1.0 if incumbent.drafter is None else None)
    speed = interval = None
    if mine is not None and ref_value is not None and ref_value > 0:
        s = _speedup(mine.value / ref_value, minimise)
        lo = _speedup(mine.high / ref_value, minimise)
        hi = _speedup(mine.low / ref_value, minimise)
        if minimise is False:
            lo, hi = hi, lo
        if math.isfinite(s):
            speed = round(s, 2)
        if math.isfinite(lo) and math.isfinite(hi):
            interval = Interval(low=min(lo, hi), high=max(lo, hi))
    return Recommendation(
        arm=arm.name,
        drafter=arm.drafter or "off",
        k=arm.k,
        expected_speedup=speed,
        interval=interval,
        reason=decision.reason[:1024],
    )


def _best(est: Mapping[str, Estimate], minimise: bool) -> str | None:
    items = [(name, e.value) for name, e in est.items() if math.isfinite(e.value)]
    if not items:
        return None
    pick = min if minimise else max
    return pick(items, key=lambda x: x[1])[0]


# -- conditions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConditionUpdate:
    """One condition as the loop sees it now."""

    type: str
    status: ConditionStatus
    reason: str
    message: str


def verified_condition(state: ControllerState) -> ConditionUpdate | None:
    """The ``Verified`` condition of the latest promotion (None before the first)."""
    if state.verified_status is None:
        return None
    return ConditionUpdate(
        "Verified",
        ConditionStatus(state.verified_status),
        state.verified_reason or "",
        state.verified_message or "",
    )


def drafter_condition(state: ControllerState) -> ConditionUpdate | None:
    """The ``DrafterWorking`` condition: False once a broken drafter made the target fall
    back (None while no drafter was found broken)."""
    if state.drafter_status is None:
        return None
    return ConditionUpdate(
        "DrafterWorking",
        ConditionStatus(state.drafter_status),
        state.drafter_reason or "",
        state.drafter_message or "",
    )


def pods_condition(state: ControllerState) -> ConditionUpdate | None:
    """The ``PodsHoldAcceptance`` condition: False while a pod's acceptance decays with its
    uptime (``POD_ACCEPTANCE_DECAY``), True once none does (None before the first)."""
    if state.pods_status is None:
        return None
    return ConditionUpdate(
        "PodsHoldAcceptance",
        ConditionStatus(state.pods_status),
        state.pods_reason or "",
        state.pods_message or "",
    )


def merge_conditions(
    previous: Sequence[Condition],
    updates: Sequence[ConditionUpdate],
    now: datetime,
    generation: int | None,
) -> tuple[Condition, ...]:
    """Conditions with ``updates`` applied.

    ``lastTransitionTime`` moves only when a condition's status changes (the Kubernetes
    convention); conditions not updated are kept as they are.
    """
    by_type = {c.type: c for c in previous}
    for u in updates:
        old = by_type.get(u.type)
        moved = old is None or old.status is not u.status
        by_type[u.type] = Condition(
            type=u.type,
            status=u.status,
            reason=u.reason,
            message=u.message[:32768],
            last_transition_time=now if moved or old is None else old.last_transition_time,
            observed_generation=generation,
        )
    return tuple(by_type.values())[:16]


# -- the whole status -------------------------------------------------------------------------


@dataclass(frozen=True)
class StatusInputs:
    """Everything :func:`build_status` reads (one step's outcome)."""

    phase: Phase
    generation: int | None
    now: datetime
    conditions: tuple[ConditionUpdate, ...] = ()
    memory: Memory | None = None
    applied: Arm | None = None
    fingerprint: str | None = None
    decision: Decision | None = None
    minimise: bool = True
    acceptance: Acceptance | None = None
    findings: tuple[Finding, ...] | None = None
    recommendation: Recommendation | None = None
    model_version: str | None = None
    routes: str | None = None
    engine: Engine | None = None
    time_scale: float = 1.0
    """Pods' seconds per second of the loop's clock (``SPECTUNE_TIME_SCALE``): the trials'
    rates are shown in the pods' own units."""


def build_status(previous: SpecTuningStatus, x: StatusInputs) -> dict[str, Any]:
    """The status to write, as JSON: the previous status with this step's news.

    A part the step did not learn anything about (no decision, no acceptance) keeps its
    previous value, so a status never goes blank because one window had no data.
    """
    s = previous
    updates: dict[str, Any] = {"phase": x.phase, "observed_generation": x.generation}
    if x.applied is not None and x.fingerprint is not None:
        speedup = applied_speedup(x.decision, x.applied, x.minimise)
        same = s.applied is not None and s.applied.arm == x.applied.name
        if x.decision is None and same and s.applied is not None:
            speedup = s.applied.speedup  # a step that decided nothing keeps the arm's gain
        if speedup is not None:
            speedup = round(speedup, 2)  # SPEEDUP 1.54x: the interval is wider than that
        updates["applied"] = Applied(
            drafter=x.applied.drafter or "off",
            k=x.applied.k,
            arm=x.applied.name,
            adaptive=(f"{mode.value}: {mode.describe}" if (mode := x.applied.adaptive) else None),
            fingerprint=x.fingerprint,
            speedup=speedup,
        )
    rec = x.recommendation
    if rec is None and x.decision is not None and x.applied is not None:
        rec = recommendation_of(x.decision, x.applied, x.minimise)
    if rec is not None:
        updates["recommendation"] = rec
    if x.acceptance is not None:
        # Two decimals for `kubectl get` (ACCEPTANCE 0.62): a window's rate is known to
        # about ±0.01 at the drafts a trial needs; the per-position curve keeps its digits.
        updates["acceptance"] = x.acceptance.model_copy(
            update={"rate": round(x.acceptance.rate, 2)}
        )
    if x.findings is not None:
        updates["diagnosis"] = x.findings[:16]
    if x.memory is not None:
        updates["trials"] = trials_of(x.memory.history, x.memory.restarts, x.time_scale)
        updates["history"] = encode_memory(x.memory.to_json())
    if x.model_version is not None:
        updates["observed_model_version"] = x.model_version
    if x.routes:
        updates["observed_routes"] = x.routes
    updates["conditions"] = merge_conditions(s.conditions, x.conditions, x.now, x.generation)
    new = replace_model(s, updates)
    doc: dict[str, Any] = new.model_dump(mode="json", by_alias=True, exclude_none=True)
    return doc


def replace_model(s: SpecTuningStatus, updates: Mapping[str, Any]) -> SpecTuningStatus:
    """A copy of a status with fields replaced, validated again."""
    return SpecTuningStatus.model_validate({**dict(s), **updates})


def findings_of(raw: Sequence[Mapping[str, Any]]) -> tuple[Finding, ...]:
    """Status findings from ``spectune.diagnose`` findings' JSON."""
    out = []
    for f in raw[:16]:
        evidence = {k: _finite(v) for k, v in dict(f.get("evidence") or {}).items()}
        out.append(
            Finding(
                code=str(f["code"]),
                message=str(f.get("message", ""))[:1024],
                evidence=evidence,
            )
        )
    return tuple(out)
