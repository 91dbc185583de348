"""One SpecTuning's life in the operator: the controller loop, the modes, and the status.

``handlers.py`` runs :meth:`TuningLoop.run` as the SpecTuning's kopf daemon and
:func:`cleanup` from its delete handler; everything else about the operator's behaviour is
here, in plain asyncio over the Kubernetes client, so the kopf layer stays a few lines.

Each turn of the loop re-reads the (live) spec and does one thing:

* an invalid or unsupported spec: ``Ready=False, reason=InvalidSpec`` naming the field, and
  wait for the spec to change;
* a second SpecTuning on a Deployment that already has one: ``Ready=False,
  reason=TargetConflict``, nothing touched (the oldest SpecTuning keeps the target);
* ``suspend: true``: canaries removed, the target left as it is, phase ``Suspended``;
* ``mode: recommend``: observe the target's pods for one window, diagnose, write a
  recommendation (nothing is patched, no canary is created);
* ``mode: auto``: one :meth:`~spectune.control.controller.Controller.step`, then the status;
* the target Deployment missing: canaries removed, a running trial aborted, phase
  ``Degraded`` with ``Ready=False, reason=TargetMissing`` and a Warning event; tuning goes on
  when it exists again (the search re-opens if it came back on another setting).

Strategies: ``canary`` (``k8s/actuator.py``) clones the target per trial; ``inPlace``
(``k8s/inplace.py``) runs a switchback on the target itself, one trial at a time: the target
alternates between the trial arm and the incumbent, and each trial window is an A/B pair
(restarts counted per trial in the status, a ``Switchback`` event each). Metrics come from
Prometheus (authenticated from ``authSecretRef`` when set) or from the pods' own metrics
pages (``metrics.scrape``), see ``k8s/sources.py``. A ``retune.trafficMix`` query turns
route changes into a re-opened search (``k8s/routes.py``), with a ``RouteChange`` event.

Metrics outages (DESIGN.md, issue E item 6): while the source fails the current setting is
held, no trial is judged (the failed window is never recorded) and the condition
``MetricsAvailable=False`` says why; after ``SPECTUNE_METRICS_FAILURES`` consecutive failed
windows during a trial, the trial ends (aborted) and its canary is removed, so all traffic
returns to the incumbent.

A human edit of the target's speculative arguments (its fingerprint annotation no longer
matches) pauses tuning with a condition and an event; nothing is overwritten. Deleting the
``spectune.io/fingerprint`` annotation adopts the edited setting and resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from spectune.api.convert import to_controller_config, to_objective, to_search_space
from spectune.api.names import GROUP, PLURAL, VERSION
from spectune.api.spec import Engine, Mode, SpecTuningSpec, Strategy, parse_spec
from spectune.api.status import (
    ConditionStatus,
    Phase,
    Recommendation,
    SpecTuningStatus,
    parse_status,
)
from spectune.control.controller import Controller, Event
from spectune.control.groups import PairedSources, WindowedSource
from spectune.control.ports import Deployment, Group, GroupMetrics, Placement
from spectune.diagnose import diagnose
from spectune.durations import parse_duration
from spectune.errors import (
    InputError,
    NoDataError,
    QueryRejectedError,
    SourceUnavailableError,
    SpecError,
    SpecTuneError,
    UnauthorizedError,
)
from spectune.k8s.actuator import (
    CONFLICT_BACKOFF_S,
    FIELD_MANAGER,
    ForbiddenError,
    HumanEditError,
    KubeActuator,
    NotOwnedError,
    TargetMissingError,
    api_error,
)
from spectune.k8s.deployments import (
    ANNOTATION_FINGERPRINT,
    DrafterArgs,
    arm_from_spec,
    canary_name,
    current_spec,
    fingerprint,
    human_edit,
    managing_controller,
    model_version,
    remote_code_refusal,
    spec_config_for,
)
from spectune.k8s.inplace import ANNOTATION_TRIAL, InPlaceActuator, Stretch, SwitchbackMetrics
from spectune.k8s.placement import Hold, scaling_of
from spectune.k8s.pods import PodStarts, TargetPods
from spectune.k8s.projection import (
    ConditionUpdate,
    Memory,
    StatusInputs,
    acceptance_of,
    api_phase,
    build_status,
    drafter_condition,
    findings_of,
    load_memory,
    pods_condition,
    verified_condition,
)
from spectune.k8s.routes import RouteWatch, describe_move, encode_mix
from spectune.k8s.series import canary_selector, target_selector
from spectune.k8s.sources import (
    AuthSecretError,
    PodsScrapeSource,
    check_url_allowed,
    prometheus_headers,
    prometheus_tls,
)
from spectune.k8s.telemetry import OperatorMetrics
from spectune.metrics.observation import Observation
from spectune.metrics.prometheus import PrometheusSource
from spectune.search.arms import Arm, parse_arm
from spectune.search.history import Outcome
from spectune.search.objective import window_stats
from spectune.search.spectune_policy import SpectunePolicy
from spectune.settings import Settings

__all__ = [
    "Claims",
    "CleanupReport",
    "EventSink",
    "MetricsOutageError",
    "TuningLoop",
    "WallClock",
    "check_remote_code",
    "check_supported",
    "cleanup",
    "detect_engine",
    "scaled_to_zero",
]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
EventSink = Callable[[str, str, str], None]
"""``(type, reason, message)``: posts a Kubernetes Event on the SpecTuning."""
Claims = Callable[[str], Iterable[tuple[str, str]]]
"""``(creationTimestamp, name)`` of every SpecTuning of the namespace that names a Deployment
and is not being deleted; the oldest one tunes it."""

_WARNINGS = frozenset(
    {
        "TrialAborted",
        "TrialInfeasible",
        "AcceptanceDrift",
        "HumanEdit",
        "RolledBack",
        "DrafterBroken",
        "PodAcceptanceDecay",
    }
)
_FORBIDDEN_RETRY_S = 5.0
"""Seconds (at least ``SPECTUNE_POLL_SECONDS``) before a forbidden call is tried again."""


class WallClock:
    """The controller's clock: epoch seconds (they survive a restart) and asyncio sleeps."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """Sleep (cancelled with the daemon)."""
        await asyncio.sleep(seconds)


class MetricsOutageError(SourceUnavailableError):
    """The metric source failed for a window (the tuning loop holds the setting).

    ``reason`` is the ``MetricsAvailable`` condition's: ``SourceUnavailable`` (unreachable,
    5xx, timeouts, garbage), ``Unauthorized`` (HTTP 401/403), ``QueryRejected`` (HTTP 400
    ``bad_data`` on a query spectune built), ``NoData`` (the source answered, without the
    target's series) or ``BadMetrics`` (the pods' numbers cannot be read, e.g. a NaN
    counter). Every one holds the setting; none is an invalid spec.
    """

    def __init__(self, message: str, reason: str = "SourceUnavailable") -> None:
        super().__init__(message)
        self.reason = reason


def _outage_reason(exc: SpecTuneError) -> str:
    if isinstance(exc, UnauthorizedError):
        return "Unauthorized"
    if isinstance(exc, QueryRejectedError):
        return "QueryRejected"
    if isinstance(exc, NoDataError):
        return "NoData"
    if isinstance(exc, InputError):
        return "BadMetrics"
    return "SourceUnavailable"


class _RecordingMetrics:
    """GroupMetrics that remembers the last observations, and which arm each group ran in
    them, and names metric failures.

    ``running`` answers what the actuator last saw run (the controller reads it at the start
    of every step, before the window it observes).
    """

    def __init__(
        self,
        inner: GroupMetrics,
        running: Callable[[], Deployment | None],
        on_resets: Callable[[Group, tuple[str, ...]], None] | None = None,
    ) -> None:
        self._inner = inner
        self._running = running
        self._on_resets = on_resets
        self.last: Mapping[Group, Observation] = {}
        self.ran: Mapping[Group, Arm | None] = {}

    async def observe(self, window_s: float) -> Mapping[Group, Observation]:
        dep = self._running()
        try:
            out = await self._inner.observe(window_s)
        except (SourceUnavailableError, NoDataError, InputError) as exc:
            # A window the source could not give (or gave in numbers that cannot be read)
            # is never judged and never ends the SpecTuning: the loop holds and counts it.
            raise MetricsOutageError(str(exc), _outage_reason(exc)) from None
        if self._on_resets is not None:
            for group, obs in out.items():
                if obs.resets:
                    self._on_resets(group, obs.resets)
        self.last = out
        self.ran = {} if dep is None else {Group.INCUMBENT: dep.incumbent, Group.CANARY: dep.canary}
        return out

    def of(self, arm: Arm | None) -> Observation | None:
        """The latest window of the group that ran ``arm``; None if no group did.

        Right after a promotion the target runs the arm that was on the canary, and the
        latest window's incumbent group still ran its predecessor: its acceptance and
        findings are not the applied arm's (and off's window has none at all).
        """
        for group, ran in self.ran.items():
            if arm is not None and ran == arm and group in self.last:
                return self.last[group]
        return None


class _SpecChangedError(SpecTuneError):
    """The spec changed (e.g. ``suspend: true``) while a step was under way: do not act on it."""


class _WindowCutError(SpecTuneError):
    """A window was cut short: the spec or the target's model changed while it ran."""


class _TrackingActuator:
    """The strategy's actuator, remembering what it last saw (the canary's pods need it).

    ``stale`` says whether the live spec moved on since this actuator was built: a step
    takes a whole window, and a canary started or a promotion made after the user asked for
    ``suspend: true`` (or any other spec change) would act on a spec that no longer holds.
    Removing canaries is always allowed.

    With a :class:`~spectune.k8s.routes.RouteWatch`, the Deployment it reports carries the
    routes fingerprint of the traffic mix (``reference`` is the one the search runs on).
    """

    def __init__(
        self,
        inner: KubeActuator | InPlaceActuator,
        stale: Callable[[], bool] = lambda: False,
        routes: RouteWatch | None = None,
        reference: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.inner = inner
        self.last: Deployment | None = None
        self._stale = stale
        self._routes = routes
        self._reference = reference

    def _check(self, what: str) -> None:
        if self._stale():
            raise _SpecChangedError(f"the spec changed during the step; not doing: {what}")

    async def deployment(self) -> Deployment:
        dep = await self.inner.deployment()
        if self._routes is not None:
            dep = replace(dep, routes=await self._routes.routes(self._reference()))
        self.last = dep
        return dep

    async def settle(self) -> None:
        """Finish what the step left owed (an in-place rollback, a restore under way)."""
        await self.inner.settle()

    async def restored(self, timeout_s: float) -> bool:
        """After a stop: wait (at most ``timeout_s``) until the target is back at its own
        replica count and no canary is leaving (placement ``replace``); True once so."""
        await self.inner.settle()
        if isinstance(self.inner, KubeActuator):
            return await self.inner.restored(timeout_s)
        return True

    async def start_canary(self, arm: Arm) -> None:
        self._check(f"start a canary on {arm.name}")
        await self.inner.start_canary(arm)

    async def stop_canary(self) -> None:
        await self.inner.stop_canary()

    async def promote(self, arm: Arm) -> None:
        self._check(f"promote {arm.name}")
        await self.inner.promote(arm)


# -- pure helpers -------------------------------------------------------------------------------


def check_supported(spec: SpecTuningSpec) -> None:
    """Raise :class:`SpecError` naming a field this operator does not implement.

    Every field of this API version is implemented; the cross-field rules live in
    :func:`~spectune.api.spec.parse_spec`. Kept as the one place a future field that a
    release cannot honour yet is refused.
    """
    del spec


def detect_engine(spec: SpecTuningSpec, target: Obj) -> Engine:
    """``spec.engine``, else SGLang when the container's command line names it, else vLLM."""
    if spec.engine is not None:
        return spec.engine
    pod = target.get("spec", {}).get("template", {}).get("spec", {})
    for c in pod.get("containers") or []:
        if spec.target_ref.container is not None and c.get("name") != spec.target_ref.container:
            continue
        words = [str(w) for w in (c.get("command") or []) + (c.get("args") or [])]
        words.append(str(c.get("image", "")))
        if any("sglang" in w for w in words):
            return Engine.SGLANG
        break
    return Engine.VLLM


def drafters_of(spec: SpecTuningSpec, allow: Sequence[str] = ()) -> dict[str, DrafterArgs]:
    """The spec's drafters as the Deployment builders take them.

    ``allow`` is the operator's drafter-model allow-list (``SPECTUNE_DRAFTER_MODEL_ALLOW_LIST``,
    ``fnmatch`` patterns). Each drafter records whether its model may run on a target started
    with ``--trust-remote-code`` (:func:`~spectune.k8s.deployments.remote_code_refusal`): only
    when ``spec.trustRemoteCode.allowedDrafterModels`` lists it AND ``allow`` matches it. The
    SpecTuning's list is its author's opt-in and can only narrow the operator's, which is the
    authority: an author who may create SpecTunings cannot make a canary run code from a
    repository the operator's administrator did not allow.
    """
    listed = set(spec.trust_remote_code.allowed_drafter_models) if spec.trust_remote_code else set()
    return {
        d.name: DrafterArgs(
            d.name,
            d.method.value,
            d.model,
            d.prompt_lookup_min,
            d.prompt_lookup_max,
            None if d.model is None else _remote_code_refused(d.model, listed, allow),
        )
        for d in spec.drafters
    }


def _remote_code_refused(model: str, listed: set[str], allow: Sequence[str]) -> str | None:
    """Why ``model`` may not run with ``--trust-remote-code`` (None: it may)."""
    author = model in listed
    operator = any(fnmatch.fnmatchcase(model, pattern) for pattern in allow)
    if author and operator:
        return None
    missing = []
    if not author:
        missing.append("spec.trustRemoteCode.allowedDrafterModels does not list it")
    if not operator:
        missing.append(
            "the operator's allow-list does not match it (SPECTUNE_DRAFTER_MODEL_ALLOW_LIST, "
            "chart value operator.drafterModelAllowList; its administrator sets it)"
        )
    return " and ".join(missing)


def check_remote_code(
    spec: SpecTuningSpec, target: Obj, engine: Engine, allow: Sequence[str]
) -> None:
    """Refuse a spec whose drafter models may not run with the target's --trust-remote-code.

    Raises :class:`SpecError` naming every such drafter and the fix, before any canary.
    """
    container = spec.target_ref.container
    refusals = [
        why
        for d in drafters_of(spec, allow).values()
        if (why := remote_code_refusal(target, container, engine.value, d))
    ]
    if refusals:
        raise SpecError("; ".join(refusals))


def scaled_to_zero(target: Obj) -> bool:
    """Whether the target Deployment asks for no pod (``spec.replicas: 0``).

    A Deployment scaled to zero (KEDA's ``minReplicaCount: 0`` when idle, or by hand) serves
    no request: a window measures nothing, and a canary started beside it would be the only
    pod serving, with no incumbent under the same traffic to compare with. So no trial
    starts and a running one ends; spectune never scales a target up itself (the count is
    the autoscaler's). An absent ``replicas`` defaults to 1, as the API server's does.
    """
    replicas = (target.get("spec") or {}).get("replicas", 1)
    return replicas is not None and int(replicas) == 0


def _load_matched(dep: Deployment) -> ConditionUpdate:
    """``LoadMatched``: True (reason ``Replace``) when a canary takes the place of target
    pods, so both groups serve the same per-pod load; else False with the reason."""
    if dep.placement is Placement.REPLACE:
        return _cond("LoadMatched", True, "Replace", dep.placement_message or "replace")
    return _cond(
        "LoadMatched",
        False,
        dep.placement_reason or "Beside",
        dep.placement_message or "the canary runs beside the target",
    )


def _seed(uid: str) -> int:
    return int(hashlib.sha256(uid.encode()).hexdigest()[:8], 16)


def _cond(type_: str, ok: bool, reason: str, message: str) -> ConditionUpdate:
    status = ConditionStatus.TRUE if ok else ConditionStatus.FALSE
    return ConditionUpdate(type_, status, reason, message)


def _now() -> datetime:
    return datetime.now(tz=UTC)


# -- the loop ---------------------------------------------------------------------------------


@dataclass
class _Built:
    """The controller and its collaborators for one generation of the spec."""

    generation: int | None
    spec: SpecTuningSpec
    engine: Engine
    controller: Controller
    actuator: _TrackingActuator
    metrics: _RecordingMetrics
    original: str | None


class TuningLoop:
    """The daemon of one SpecTuning (see the module docstring).

    Parameters
    ----------
    api
        The operator's ``kubernetes.client.ApiClient`` (from kopf's memo).
    body
        The SpecTuning, as kopf's live view: re-read on every turn.
    settings, clock, telemetry
        The operator's settings, clock and metrics (from kopf's memo).
    emit
        Posts a Kubernetes Event on the SpecTuning.
    claims
        The SpecTunings of the namespace that name a Deployment (the operator's kopf index);
        without it every turn lists them through the API.
    """

    def __init__(
        self,
        api: k8s.ApiClient,
        body: Mapping[str, Any],
        settings: Settings,
        clock: WallClock,
        telemetry: OperatorMetrics | None,
        emit: EventSink,
        claims: Claims | None = None,
    ) -> None:
        self._api = api
        self._claims = claims
        self._body = body
        self._settings = settings
        self._clock = clock
        self._telemetry = telemetry
        self._emit = emit
        self._custom = k8s.CustomObjectsApi(api)
        meta = body["metadata"]
        self._ns: str = meta["namespace"]
        self._name: str = meta["name"]
        self._status = _safe_status(body)
        self._server_status = self._status
        """The status as the API server holds it (last read or written)."""
        self._server_doc: dict[str, Any] | None = None
        """The document last written (a write equal to it has nothing new)."""
        self._rv: str | None = meta.get("resourceVersion")
        """The SpecTuning's resourceVersion as last read or written: the write precondition."""
        self._unwritten: list[StatusInputs] = []
        self._written_at: float | None = None
        self._built: _Built | None = None
        self._failures = 0
        self._paused = False
        self._adoption: tuple[Recommendation, object] | None = None
        """After an adopted hand edit: the recommendation that says so, shown until the
        controller decides anew (the decision it held at the adoption)."""
        self._canary_sources: dict[str, WindowedSource] = {}
        self._denied: str | None = None
        self._missing: str | None = None
        """While the target is missing: the arm it ran before ("" when unknown)."""
        self._rebuild = False
        self._owed: _TrackingActuator | None = None
        """A restore not finished when the loop stopped tuning: reconciled at every look."""
        self._restarts: dict[float, int] = {}
        """Restarts of the target each in-place (switchback) trial caused, by its start."""

    # -- plumbing -----------------------------------------------------------------------------

    @property
    def _generation(self) -> int | None:
        gen = self._body["metadata"].get("generation")
        return int(gen) if gen is not None else None

    def _spt(self) -> Obj:
        meta = self._body["metadata"]
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SpecTuning",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
        }

    async def _write(self, inputs: StatusInputs) -> None:
        """Write the status built from ``inputs`` over the last one written.

        Writes are guarded and rate-limited:

        * optimistic concurrency: the patch carries the resourceVersion the loop last read or
          wrote, so the API server refuses it (HTTP 409) if anyone wrote the SpecTuning in
          between. The loop then reads it again and re-merges what it owns — every input
          since its last successful write, over the fresh status — and writes again, up to
          :data:`~spectune.k8s.actuator.CONFLICT_BACKOFF_S` tries with growing waits. What the
          loop owns (the phase, the conditions it sets, applied, recommendation, acceptance,
          diagnosis, trials, history) is its own to write; everything else, conditions of
          other types included, comes from the fresh read, so another writer's field is
          never lost;
        * a write with nothing new (the same document as the last one written: a paused,
          suspended or waiting loop looking again) is never sent;
        * otherwise at most one write per ``SPECTUNE_STATUS_INTERVAL_SECONDS``, except when
          the phase, a condition's status or reason, the applied arm or a trial's outcome
          changes (:meth:`_urgent`), which is written at once. A
          write held back is folded into the next one and sent at the next look (a poll
          while waiting, or while a window runs), so nothing is lost, only later.
        """
        self._unwritten.append(replace(inputs, time_scale=self._settings.time_scale))
        doc = self._fold()
        self._status = parse_status(doc)
        self._report(inputs.phase)
        if doc == self._server_doc:
            self._unwritten.clear()
            return
        if self._urgent(self._status) or self._interval_passed():
            await self._send()

    def _fold(self) -> dict[str, Any]:
        """The status the loop means: its inputs since the last write, over the server's."""
        status = self._server_status
        doc: dict[str, Any] = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        for x in self._unwritten:
            doc = build_status(status, x)
            status = parse_status(doc)
        return doc

    def _urgent(self, new: SpecTuningStatus) -> bool:
        """Whether ``new`` tells something a user waits for: not held back by the rate limit.

        The phase, a condition's status or reason, the arm the target runs, and a trial
        started or ended change a few times per window at most; what changes on every look
        (figures, messages, window counts) is what the limit holds back.
        """
        old = self._server_status

        def key(s: SpecTuningStatus) -> tuple[object, ...]:
            return (
                s.phase,
                frozenset((c.type, c.status.value, c.reason) for c in s.conditions),
                s.applied.arm if s.applied is not None else None,
                tuple((t.arm, t.outcome) for t in s.trials),
            )

        return key(new) != key(old)

    def _interval_passed(self) -> bool:
        last = self._written_at
        return last is None or self._clock.now() - last >= self._settings.status_interval_s

    async def _flush(self) -> None:
        """Send a write held back by the rate limit, once its interval has passed."""
        if self._unwritten and self._interval_passed():
            await self._send()

    async def _send(self) -> None:
        for wait in CONFLICT_BACKOFF_S:
            await asyncio.sleep(wait)
            if self._rv is None:
                await self._reread()
            doc = self._fold()
            try:
                res = await asyncio.to_thread(
                    self._custom.patch_namespaced_custom_object_status,
                    GROUP,
                    VERSION,
                    self._ns,
                    PLURAL,
                    self._name,
                    {"metadata": {"resourceVersion": self._rv}, "status": doc},
                    field_manager=FIELD_MANAGER,
                )
            except ApiException as exc:
                if exc.status == 404:
                    self._unwritten.clear()
                    return  # deleted meanwhile
                if exc.status == 409:
                    await self._reread()  # someone else wrote: merge over what they wrote
                    continue
                raise api_error(exc, f"write the status of {self._ns}/{self._name}") from None
            meta = res.get("metadata") if isinstance(res, dict) else None
            self._rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
            self._server_status = parse_status(doc)
            self._server_doc = doc
            self._status = self._server_status
            self._unwritten.clear()
            self._written_at = self._clock.now()
            return
        raise SourceUnavailableError(
            f"the status of {self._ns}/{self._name} kept conflicting (HTTP 409) "
            f"{len(CONFLICT_BACKOFF_S)} times in a row over {sum(CONFLICT_BACKOFF_S):.1f} s; "
            "will retry"
        )

    async def _reread(self) -> None:
        """The SpecTuning's status and resourceVersion afresh from the API server."""
        try:
            obj = await asyncio.to_thread(
                self._custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                self._ns,
                PLURAL,
                self._name,
            )
        except ApiException as exc:
            raise api_error(exc, f"read {self._ns}/{self._name}") from None
        fresh = obj if isinstance(obj, dict) else {}
        self._rv = (fresh.get("metadata") or {}).get("resourceVersion")
        self._server_status = _safe_status(fresh)
        self._server_doc = None
        self._status = parse_status(self._fold())

    def _report(self, phase: Phase) -> None:
        t = self._telemetry
        if t is None:
            return
        ns, name, s = self._ns, self._name, self._status
        t.set_phase(ns, name, phase)
        t.trials.labels(ns, name).set(len(s.trials))
        if s.applied is not None:
            t.applied_k.labels(ns, name).set(s.applied.k)
        if s.acceptance is not None:
            t.acceptance.labels(ns, name).set(s.acceptance.rate)
        if s.recommendation is not None and s.recommendation.expected_speedup is not None:
            t.speedup.labels(ns, name).set(s.recommendation.expected_speedup)
        b = self._built
        if b is not None:
            ref = b.controller.state.reference_acceptance
            if ref is not None and math.isfinite(ref) and ref > 0:
                t.baseline_acceptance.labels(ns, name).set(ref)
                acc = s.acceptance
                if acc is not None and acc.per_position:
                    t.drift_ratio.labels(ns, name).set(acc.per_position[0] / ref)

    def _event(self, e: Event) -> None:
        kind = "Warning" if e.reason in _WARNINGS else "Normal"
        self._emit(kind, e.reason, e.message)
        if e.reason == "TrialStarted" and self._telemetry is not None:
            self._telemetry.trials_started.labels(self._ns, self._name).inc()

    async def _wait(self) -> None:
        await self._clock.sleep(self._settings.poll_s)
        await self._reconcile_owed()
        await self._flush()

    async def _restore(self, actuator: _TrackingActuator) -> None:
        """After a stop, before the loop stops tuning (suspend, a stand-down, a pause, an
        outage): the target back at N and the canary gone, waited for at most
        ``SPECTUNE_CLEANUP_TIMEOUT_SECONDS``. What is left then (a pod that cannot start) is
        carried on at every later look, so nothing stays at N−c without a trial."""
        if not await actuator.restored(self._settings.cleanup_timeout_s):
            self._owed = actuator

    async def _reconcile_owed(self) -> None:
        owed = self._owed
        if owed is None:
            return
        try:
            if await owed.restored(0.0):
                self._owed = None
        except SpecTuneError as exc:  # a passing API error: looked at again next time
            log.info("%s/%s: restoring the target: %s", self._ns, self._name, exc)

    # -- the turn -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Turn until cancelled (kopf cancels the daemon when the SpecTuning goes)."""
        while True:
            await self.turn()

    async def turn(self) -> None:
        """One turn (see the module docstring).

        A call the operator's RBAC does not allow (HTTP 403) is reported in the condition
        ``Ready=False, reason=Forbidden`` and a Warning event naming the permission; the loop
        looks again after a pause (the process never exits over it).
        """
        try:
            await self._turn()
        except ForbiddenError as exc:
            await self._forbidden(str(exc))
        else:
            self._denied = None

    async def _forbidden(self, message: str) -> None:
        if self._denied != message:
            self._denied = message
            self._emit("Warning", "Forbidden", message)
        log.warning("%s/%s: %s", self._ns, self._name, message)
        # When even the status cannot be written, the event and the log say it.
        with contextlib.suppress(ForbiddenError):
            await self._write(
                StatusInputs(
                    phase=self._status.phase or Phase.BASELINE,
                    generation=self._generation,
                    now=_now(),
                    memory=self._memory(),
                    conditions=(_cond("Ready", False, "Forbidden", message),),
                )
            )
        await self._clock.sleep(max(self._settings.poll_s, _FORBIDDEN_RETRY_S))

    async def _turn(self) -> None:
        gen = self._generation
        try:
            spec = parse_spec(self._body)
            check_supported(spec)
        except SpecError as exc:
            memory = await self._stand_down(f"the spec became invalid: {exc}")
            self._built = None
            await self._invalid(str(exc), gen, memory)
            return
        if await self._conflict(spec):
            return
        try:
            if spec.suspend:
                await self._suspend(spec)
                return
            if spec.mode is Mode.RECOMMEND:
                await self._recommend(spec)
                return
            await self._auto(spec)
        except TargetMissingError as exc:
            await self._target_missing(spec, str(exc))
        except ForbiddenError:
            raise
        except HumanEditError as exc:  # an edit that landed during the step: nothing written
            log.info("%s/%s: %s", self._ns, self._name, exc)
            if self._built is not None:
                await self._pause(self._built, await self._built.actuator.inner.read_target())
        except NotOwnedError as exc:
            await self._not_owned(str(exc))
        except AuthSecretError as exc:  # the user may create the Secret: look again later
            memory = await self._stand_down("the Prometheus credentials cannot be used")
            self._built = None
            await self._secret_missing(str(exc), memory)
        except SpecError as exc:  # e.g. the target runs a drafter the spec does not list
            memory = await self._stand_down(f"the spec cannot be honoured: {exc}")
            self._built = None
            await self._invalid(str(exc), gen, memory)
        else:
            if self._missing is not None:
                self._missing = None
                self._emit("Normal", "TargetFound", f"Deployment {spec.target_ref.name} exists")

    async def _target_missing(self, spec: SpecTuningSpec, message: str) -> None:
        """The target is gone: remove the canaries, end a trial, say so, look again later."""
        name = spec.target_ref.name
        bare = KubeActuator(self._api, self._spt(), name, None, "vllm", {})
        await bare.stop_canary()
        b = self._built
        if b is not None:
            c = b.controller
            running = c._running()
            if running is not None:
                c.history = c.history.update_last(
                    running.ended(Outcome.ABORTED, f"the target Deployment {name} was deleted")
                )
            self._rebuild = True
        if self._missing is None:
            before = b.actuator.last if b is not None else None
            self._missing = before.incumbent.name if before is not None else ""
            self._emit(
                "Warning",
                "TargetMissing",
                f"Deployment {self._ns}/{name} not found: canaries removed, tuning waits for it",
            )
        await self._write(
            StatusInputs(
                phase=Phase.DEGRADED,
                generation=self._generation,
                now=_now(),
                memory=self._memory(),
                conditions=(
                    _cond(
                        "Ready",
                        False,
                        "TargetMissing",
                        f"{message}. The canaries were removed and no trial runs; tuning "
                        f"goes on when Deployment {name} exists again (or fix "
                        "spec.targetRef.name)",
                    ),
                ),
            )
        )
        await self._wait()

    async def _stand_down(self, why: str) -> Memory | None:
        """Before the loop stops tuning for a reason of its own (an invalid spec, unusable
        credentials): end a running trial and remove its canary (an in-place trial: the
        target back to its incumbent), so no arm serves live traffic unjudged.

        Without a built loop (the spec never parsed, a restart), the canaries are found by
        the SpecTuning's label and removed; a trial in the status then resumes once the
        loop can run again. Returns the memory to write (None without a built loop).
        """
        b = self._built
        if b is None:
            raw = self._body.get("spec") or {}
            name = str((raw.get("targetRef") or {}).get("name", ""))
            bare = _TrackingActuator(KubeActuator(self._api, self._spt(), name, None, "vllm", {}))
            await bare.stop_canary()
            await self._restore(bare)
            return None
        c = b.controller
        running = c._running()
        await b.actuator.stop_canary()
        await self._restore(b.actuator)
        if running is not None:
            c.history = c.history.update_last(running.ended(Outcome.ABORTED, why[:300]))
            self._emit("Warning", "TrialAborted", f"{running.arm}: {why[:300]}; canary removed")
        return self._memory()

    async def _not_owned(self, message: str) -> None:
        """A canary's name is taken by a Deployment that is not ours: say so, touch nothing."""
        self._emit("Warning", "NameTaken", message)
        await self._write(
            StatusInputs(
                phase=self._status.phase or Phase.BASELINE,
                generation=self._generation,
                now=_now(),
                memory=self._memory(),
                conditions=(_cond("Ready", False, "NameTaken", message),),
            )
        )
        await self._wait()

    async def _secret_missing(self, message: str, memory: Memory | None) -> None:
        await self._write(
            StatusInputs(
                phase=self._status.phase or Phase.BASELINE,
                generation=self._generation,
                now=_now(),
                memory=memory,
                conditions=(
                    _cond("Ready", False, "AuthSecretMissing", message),
                    _cond("MetricsAvailable", False, "AuthSecretMissing", message),
                ),
            )
        )
        await self._clock.sleep(max(self._settings.poll_s, _FORBIDDEN_RETRY_S))

    async def _invalid(self, message: str, gen: int | None, memory: Memory | None = None) -> None:
        await self._write(
            StatusInputs(
                phase=Phase.FAILED,
                generation=gen,
                now=_now(),
                memory=memory,
                conditions=(_cond("Ready", False, "InvalidSpec", message),),
            )
        )
        while self._generation == gen:
            await self._wait()

    async def _claimants(self, target_name: str) -> list[tuple[str, str]]:
        """``(creationTimestamp, name)`` of the live SpecTunings that name ``target_name``."""
        if self._claims is not None:
            return list(self._claims(target_name))
        try:
            res = await asyncio.to_thread(
                self._custom.list_namespaced_custom_object, GROUP, VERSION, self._ns, PLURAL
            )
        except ApiException as exc:
            raise api_error(exc, "list SpecTunings") from None
        same = []
        items: list[Obj] = res.get("items", []) if isinstance(res, dict) else []
        for item in items:
            meta = item.get("metadata", {})
            target = (item.get("spec") or {}).get("targetRef", {}).get("name")
            if target == target_name and not meta.get("deletionTimestamp"):
                same.append((str(meta.get("creationTimestamp", "")), str(meta.get("name"))))
        return same

    async def _conflict(self, spec: SpecTuningSpec) -> bool:
        same = await self._claimants(spec.target_ref.name)
        if not same or min(same)[1] == self._name:
            return False
        owner = min(same)[1]
        await self._write(
            StatusInputs(
                phase=Phase.FAILED,
                generation=self._generation,
                now=_now(),
                conditions=(
                    _cond(
                        "Ready",
                        False,
                        "TargetConflict",
                        f"Deployment {spec.target_ref.name} is already tuned by SpecTuning "
                        f"{owner}; delete one of them (this one does nothing meanwhile)",
                    ),
                ),
            )
        )
        await self._wait()
        return True

    async def _suspend(self, spec: SpecTuningSpec) -> None:
        actuator = self._built.actuator if self._built is not None else None
        if actuator is None:
            bare = KubeActuator(self._api, self._spt(), spec.target_ref.name, None, "vllm", {})
            await bare.stop_canary()
            target = await bare.read_target()
            actuator = _TrackingActuator(self._strategy(spec, detect_engine(spec, target)))
        await actuator.stop_canary()
        await self._restore(actuator)
        running = self._built.controller._running() if self._built is not None else None
        if self._built is not None and running is not None:
            c = self._built.controller
            c.history = c.history.update_last(running.ended(Outcome.ABORTED, "suspended"))
        await self._write(
            StatusInputs(
                phase=Phase.SUSPENDED,
                generation=self._generation,
                now=_now(),
                memory=self._memory(),
                conditions=(
                    _cond(
                        "Ready",
                        True,
                        "Suspended",
                        "suspend: true; canaries removed, the target is left as it is (at "
                        "its own replica count)",
                    ),
                ),
            )
        )
        await self._wait()

    def _memory(self) -> Memory | None:
        b = self._built
        if b is None:
            return None
        return Memory(b.controller.history, b.controller.state, b.original, self._restarts)

    # -- auto mode ------------------------------------------------------------------------------

    def _strategy(self, spec: SpecTuningSpec, engine: Engine) -> KubeActuator | InPlaceActuator:
        """The actuator of ``spec.search.strategy`` for the target."""
        kube = KubeActuator(
            self._api,
            self._spt(),
            spec.target_ref.name,
            spec.target_ref.container,
            engine.value,
            drafters_of(spec, self._settings.drafter_model_allow_list),
            spec.search.canary_replicas,
            spec.search.placement,
        )
        if spec.search.strategy is Strategy.IN_PLACE:
            return InPlaceActuator(kube)
        return kube

    async def _sources(
        self, spec: SpecTuningSpec, actuator: _TrackingActuator
    ) -> tuple[WindowedSource, Callable[[], WindowedSource | None], bool, PrometheusSource | None]:
        """The target's source, the canary's (per trial), whether they wait, and Prometheus."""
        s = self._settings
        name = spec.target_ref.name
        scrape = spec.metrics.scrape
        if scrape is not None:
            kube = KubeActuator(self._api, self._spt(), name, None, "vllm", {})
            target = PodsScrapeSource(
                kube.target_pods,
                scrape,
                f"Deployment {name}",
                self._clock.sleep,
                max_bytes=s.scrape_max_bytes,
            )

            def scraped_canary() -> WindowedSource | None:
                dep = actuator.last
                if dep is None or dep.canary is None:
                    return None
                return PodsScrapeSource(
                    kube.canary_pods,
                    scrape,
                    f"canary {dep.canary.name}",
                    self._clock.sleep,
                    max_bytes=s.scrape_max_bytes,
                )

            return target, scraped_canary, True, None
        prom = spec.metrics.prometheus
        assert prom is not None  # parse_spec: exactly one of prometheus or scrape
        if s.prometheus_url is None:  # the operator's own override is trusted as it is
            check_url_allowed(str(prom.url), s.prometheus_url_allowlist)
        url = s.prometheus_url or str(prom.url)
        auth = await prometheus_headers(self._api, self._ns, prom.auth_secret_ref, url)
        # parse_spec refused an extra Authorization: the Secret's is the only one.
        headers = {**{h.name: h.value for h in prom.headers}, **auth}
        tls = await prometheus_tls(self._api, self._ns, prom.tls)
        cluster = (prom.cluster_label, prom.cluster) if prom.cluster is not None else None
        user = prom.selector

        def source(selector: str) -> PrometheusSource:
            return PrometheusSource(url, selector, headers=headers, tls=tls, cluster=cluster)

        incumbent = source(target_selector(self._ns, name, user))

        def canary() -> WindowedSource | None:
            dep = actuator.last
            if dep is None or dep.canary is None:
                return None
            cname = canary_name(name, dep.canary)
            if cname not in self._canary_sources:
                self._canary_sources[cname] = source(canary_selector(self._ns, cname, user))
            return self._canary_sources[cname]

        return incumbent, canary, False, incumbent

    def _counter_reset(self, group: Group, pods: tuple[str, ...]) -> None:
        """Say that a window's counters went back on some pods (a restart within it)."""
        whose = "the canary's" if group is Group.CANARY else "the target's"
        self._emit(
            "Normal",
            "CounterReset",
            f"{whose} pod(s) {', '.join(pods)} restarted within the window (counters went "
            "back): their increases count from zero after the restart, as Prometheus' "
            "increase() does",
        )

    def _route_change(
        self, distance: float, old: Mapping[str, float], new: Mapping[str, float]
    ) -> None:
        self._emit(
            "Normal",
            "RouteChange",
            f"the traffic mix moved by {distance:.2f} (total variation), beyond the threshold: "
            f"{describe_move(old, new)}; the search re-opens (onRouteChange)",
        )

    async def _build(self, spec: SpecTuningSpec) -> _Built:
        s = self._settings
        meta = self._body["metadata"]
        first = KubeActuator(self._api, self._spt(), spec.target_ref.name, None, "vllm", {})
        target = await first.read_target()
        engine = detect_engine(spec, target)
        check_remote_code(spec, target, engine, s.drafter_model_allow_list)
        drafters = drafters_of(spec)
        inner = self._strategy(spec, engine)
        if isinstance(inner, InPlaceActuator):
            await first.stop_canary()  # canaries of an earlier canary strategy
        elif ANNOTATION_TRIAL in (target.get("metadata", {}).get("annotations") or {}):
            # An in-place trial left by an earlier inPlace strategy: back to its incumbent.
            stray = InPlaceActuator(inner)
            await stray.stop_canary()
            await stray.settle()
        built_for = self._generation
        prior = self._built.controller if self._built is not None else None
        cfg = to_controller_config(spec, seed=_seed(str(meta.get("uid", self._name))))
        every = cfg.retune_every_s
        cfg = replace(
            cfg,
            window_s=s.scaled(cfg.window_s),
            drift_for_s=s.scaled(cfg.drift_for_s),
            retune_every_s=s.scaled(every) if every is not None else None,
            poll_s=s.poll_s,
            ready_timeout_s=s.scaled(s.ready_timeout_s),
            assumed_draft_cost=s.draft_cost,
            time_scale=s.time_scale,
        )
        if prior is not None:
            memory = Memory(
                prior.history, prior.state, self._built.original if self._built else None
            )
        else:
            memory = load_memory(self._status.history)
            self._restarts = dict(memory.restarts)
        holder: list[Controller] = []
        mix = spec.retune.traffic_mix
        routes = None
        prom_source: PrometheusSource | None = None
        actuator = _TrackingActuator(
            inner,
            lambda: self._generation != built_for,
            None,
            lambda: holder[0].state.routes if holder else None,
        )
        incumbent, canary, waits, prom_source = await self._sources(spec, actuator)
        container = spec.target_ref.container

        async def window_sleep(seconds: float) -> None:
            """Wait out a window, looking every poll for a reason to stop waiting.

            A changed spec (``suspend: true``, a new search), a new model version of the
            target, or its replica count changed by someone else while a trial held it
            (placement ``replace``) makes the rest of the window worthless: the window is
            dropped and the next step acts on the change within a poll, not a window later.
            """
            end = self._clock.now() + seconds
            while (left := end - self._clock.now()) > 0:
                await self._clock.sleep(min(left, cfg.poll_s))
                await self._flush()  # a status write the rate limit held back
                if left <= cfg.poll_s:
                    return
                if self._generation != built_for:
                    raise _WindowCutError("the spec changed during the window")
                known = holder[0].state.model_version if holder else None
                if known is not None:
                    try:
                        target = await first.read_target()
                    except TargetMissingError:
                        raise  # the turn reports it (phase Degraded) at once
                    except SpecTuneError:
                        continue  # a passing API error: the step reads the target anyway
                    live = model_version(target, container, engine.value)
                    if live != known:
                        raise _WindowCutError(f"the model version changed to {live}")
                    if scaling_of(target).hold is Hold.EXTERNAL:
                        # Someone else changed the count a trial held: the window no longer
                        # pairs the loads it started with, and the next step ends the trial
                        # (ScaledExternally) instead of judging it on this window.
                        raise _WindowCutError("the target was scaled by someone else")

        if mix is not None and spec.retune.on_route_change and prom_source is not None:
            routes = RouteWatch(prom_source.query, mix.query, mix.threshold, self._route_change)
            actuator._routes = routes
        inner_metrics: GroupMetrics
        if isinstance(inner, InPlaceActuator):

            def arms() -> tuple[str | None, str | None]:
                dep = actuator.last
                if dep is None:
                    return None, None
                trial = dep.canary.name if dep.canary is not None and dep.canary_ready else None
                return dep.incumbent.name, trial

            def restarted(trial: str, to: str, stretch: Stretch) -> None:
                running = holder[0]._running() if holder else None
                count = ""
                if running is not None and running.arm == trial:
                    n = self._restarts.get(running.started_s, 0) + 1
                    self._restarts[running.started_s] = n
                    count = f" (restart {n} of this trial)"
                side = "B, the trial arm" if stretch is Stretch.TRIAL else "A, the incumbent"
                self._emit(
                    "Normal",
                    "Switchback",
                    f"switchback of {trial}: the target restarts onto {to} ({side}){count}",
                )

            inner.on_restart = restarted
            inner_metrics = SwitchbackMetrics(
                incumbent,
                inner,
                arms,
                window_sleep,
                waits,
                s.scaled(parse_duration(spec.search.switchback.washout, "washout")),
                cfg.poll_s,
                cfg.ready_timeout_s,
            )
        else:
            inner_metrics = PairedSources(incumbent, canary, window_sleep, waits=waits)
        bare = KubeActuator(self._api, self._spt(), spec.target_ref.name, None, "vllm", {})
        pods = TargetPods(self._api, self._ns, bare.target_pods)
        inner_metrics = PodStarts(inner_metrics, pods.started)
        metrics = _RecordingMetrics(inner_metrics, lambda: actuator.last, self._counter_reset)
        controller = Controller(
            policy=SpectunePolicy(),
            actuator=actuator,
            metrics=metrics,
            clock=self._clock,
            space=to_search_space(spec, engine),
            objective=to_objective(spec),
            config=cfg,
            history=memory.history,
            state=memory.state,
            on_event=self._event,
            pods=pods,
        )
        holder.append(controller)
        original = memory.original
        if original is None:
            original = arm_from_spec(
                current_spec(target, spec.target_ref.container, engine.value), drafters
            ).name
        built = _Built(self._generation, spec, engine, controller, actuator, metrics, original)
        self._rebuild = False
        await self._resume_canary(built, restarted=prior is None)
        return built

    async def _resume_canary(self, b: _Built, restarted: bool = False) -> None:
        """After a restart: no canary without a running trial, and the running trial's canary.

        A loop that starts (``restarted``) and finds the target held at N−c by the running
        trial (placement ``replace``) restores N, removes the canary and ends the trial,
        aborted: whatever the last process did in between (a window it measured and never
        recorded, a restore it began) is not known, and the count is the owner's to have
        back first. The search goes on from the next step.
        """
        running = b.controller._running()
        kube = b.actuator.inner
        if restarted and running is not None and isinstance(kube, KubeActuator):
            hold = scaling_of(await kube.read_target()).hold
            if hold is not Hold.NONE:
                why = "the tuning loop restarted while the trial held the target's replicas; " + (
                    "the count someone else set is kept"
                    if hold is Hold.EXTERNAL
                    else "they were restored"
                )
                c = b.controller
                c.history = c.history.update_last(running.ended(Outcome.ABORTED, why))
                c.state = replace(c.state, trial_started_s=None)
                self._emit("Warning", "TrialAborted", f"{running.arm}: {why}; canary removed")
                await b.actuator.stop_canary()
                await self._restore(b.actuator)
                return
        dep = await b.actuator.deployment()
        if running is None and (dep.canary is not None or dep.rolling):
            await b.actuator.stop_canary()
            await self._restore(b.actuator)
        elif running is not None and (dep.canary is None or dep.canary.name != running.arm):
            await b.actuator.start_canary(parse_arm(running.arm))

    async def _auto(self, spec: SpecTuningSpec) -> None:
        gen = self._generation
        if self._built is None or self._built.generation != gen or self._rebuild:
            self._built = await self._build(spec)
        b = self._built
        kube = b.actuator.inner
        target = await kube.read_target()
        container, engine = spec.target_ref.container, b.engine.value
        owner = managing_controller(target)
        if owner is not None and not spec.target_ref.allow_managed:
            await self._managed(b, target, owner)
            return
        if scaled_to_zero(target):
            await self._scaled_to_zero(b, target)
            return
        annotations = target.get("metadata", {}).get("annotations") or {}
        if ANNOTATION_FINGERPRINT not in annotations:
            await kube.adopt(target)
            self._paused = False
            await self._adopted(b, spec, target)
        elif human_edit(target, container, engine):
            await self._pause(b, target)
            return
        self._paused = False
        c = b.controller
        if self._missing is not None:  # the target is back (said now, not after a window)
            was = self._missing
            self._missing = None
            self._emit("Normal", "TargetFound", f"Deployment {spec.target_ref.name} exists")
            now_arm = arm_from_spec(current_spec(target, container, engine), drafters_of(spec))
            if was and now_arm.name != was:
                # On another setting, the search starts over.
                await c._retune(
                    f"the target Deployment came back running {now_arm.name}, not {was}"
                )
        if self._routes_unset(b):
            watch = b.actuator._routes
            assert watch is not None
            mix = await watch.measure()
            if mix:
                c.state = replace(c.state, routes=encode_mix(mix))
        conditions = [_cond("Ready", True, "Tuning", "tuning runs")]
        phase = api_phase(b.controller.state.shown_phase)
        if self._status.phase is not phase:
            # Say where the loop stands before a step that may take a whole window, and what
            # the target runs (the incumbent), so the first window's status is not blank.
            seen = b.actuator.last
            incumbent = seen.incumbent if seen is not None else None
            await self._write(
                StatusInputs(
                    phase=phase,
                    generation=gen,
                    now=_now(),
                    conditions=tuple(conditions),
                    memory=self._memory(),
                    applied=incumbent,
                    fingerprint=self._fingerprint(spec, incumbent),
                    recommendation=self._adoption_note(c),
                )
            )
        b.controller.hold_trials = self._failures > 0  # outage: never start a trial
        try:
            try:
                await b.controller.step()
            finally:
                await b.actuator.settle()
            self._failures = 0
            conditions.append(
                _cond(
                    "MetricsAvailable",
                    True,
                    "MetricsAnswer",
                    "the metric source answered for the latest window",
                )
            )
        except MetricsOutageError as exc:
            conditions.append(await self._outage(b, str(exc), exc.reason))
        except (_SpecChangedError, _WindowCutError) as exc:
            log.info("%s/%s: %s", self._ns, self._name, exc)
            return  # the next turn acts on it (suspend, mode, search, a new model ...)
        dep = b.actuator.last
        applied = dep.incumbent if dep is not None else None
        if dep is not None and dep.placement is not Placement.IN_PLACE:
            conditions.append(_load_matched(dep))
        verified = verified_condition(c.state)
        if verified is not None:
            conditions.append(verified)
        for cond in (drafter_condition(c.state), pods_condition(c.state)):
            if cond is not None:
                conditions.append(cond)
        await self._write(
            StatusInputs(
                phase=api_phase(c.state.shown_phase),
                generation=gen,
                now=_now(),
                conditions=tuple(conditions),
                memory=Memory(c.history, c.state, b.original, self._restarts),
                applied=applied,
                fingerprint=self._fingerprint(spec, applied),
                decision=c.last_decision,
                recommendation=self._adoption_note(c),
                minimise=c.objective.metric.minimise,
                acceptance=self._acceptance(b, applied),
                findings=self._findings(b, applied),
                model_version=dep.model_version if dep is not None else None,
                routes=dep.routes if dep is not None else None,
                engine=b.engine,
            )
        )

    async def _adopted(self, b: _Built, spec: SpecTuningSpec, target: Obj) -> None:
        """After the fingerprint annotation was removed to adopt a hand edit: say so, and
        search again from the adopted setting.

        The edit is the user's decision, so the adopted arm becomes the incumbent and the
        floor (the setting the search must not leave the target below) and the search
        re-opens from it; the search's earlier evidence was gathered against the arm the
        user replaced. An event and the recommendation say so until the search decides
        anew. Adopting the arm spectune applied (the annotation removed, nothing edited), or a
        target that was missing and is back (that is ``TargetFound``), is no adopted edit.
        """
        applied = self._status.applied
        if self._missing is not None:
            return  # a Deployment created anew: TargetFound re-opens it if its setting differs
        container, engine = spec.target_ref.container, b.engine.value
        now_arm = arm_from_spec(current_spec(target, container, engine), drafters_of(spec))
        if applied is None or applied.arm == now_arm.name:
            return
        why = (
            f"the hand-edited setting {now_arm.name} was adopted "
            f"(spectune had applied {applied.arm})"
        )
        self._emit("Normal", "EditAdopted", f"{why}; the search re-opens from it")
        c = b.controller
        held = c.last_decision
        c.state = replace(c.state, floor_arm=None)  # the next step floors at the adopted arm
        await c._retune(why)
        rec = Recommendation(
            arm=now_arm.name,
            drafter=now_arm.drafter or "off",
            k=now_arm.k,
            reason=f"{why}; searching again from it",
        )
        self._adoption = (rec, held)

    def _adoption_note(self, c: Controller) -> Recommendation | None:
        """The adoption's recommendation while the controller has not decided since."""
        if self._adoption is None:
            return None
        rec, held = self._adoption
        if c.last_decision is not held:
            self._adoption = None
            return None
        return rec

    @staticmethod
    def _fingerprint(spec: SpecTuningSpec, applied: Arm | None) -> str | None:
        """The fingerprint of the arm in ``status.applied`` (as spectune renders it)."""
        if applied is None:
            return None
        return fingerprint(spec_config_for(applied, drafters_of(spec)))

    def _routes_unset(self, b: _Built) -> bool:
        """Whether a traffic mix is watched but the search has no reference mix yet.

        The controller records the routes when a search first starts; a SpecTuning that
        gained ``trafficMix`` later (or a reference lost to a failed query) gets it here.
        """
        st = b.controller.state
        return b.actuator._routes is not None and st.model_version is not None and not st.routes

    async def _outage(self, b: _Built, why: str, kind: str) -> ConditionUpdate:
        self._failures += 1
        if self._telemetry is not None:
            self._telemetry.source_errors.labels(self._ns, self._name).inc()
        c = b.controller
        running = c._running()
        n = self._settings.metrics_failures
        message = f"holding the current setting: {why} ({self._failures} window(s) in a row)"
        if running is not None and self._failures >= n:
            reason = f"metrics unavailable for {self._failures} consecutive windows"
            c.history = c.history.update_last(running.ended(Outcome.ABORTED, reason))
            await b.actuator.stop_canary()
            await self._restore(b.actuator)
            where = (
                "the target returned to the incumbent"
                if isinstance(b.actuator.inner, InPlaceActuator)
                else "canary removed"
            )
            self._emit("Warning", "TrialAborted", f"{running.arm}: {reason}; {where}")
            message += f"; trial {running.arm} ended and {where}"
        else:
            await self._clock.sleep(min(self._settings.poll_s, c.config.window_s))
        return _cond("MetricsAvailable", False, kind, message)

    async def _pause(self, b: _Built, target: Obj) -> None:
        await self._hold(
            b,
            "HumanEdit",
            "the target was edited by hand",
            f"the speculative arguments of Deployment {target['metadata']['name']} were "
            "edited by hand; tuning paused, nothing overwritten",
            "the target's speculative arguments differ from what spectune applied; "
            "tuning is paused and nothing is overwritten. Restore them, or remove "
            f"the {ANNOTATION_FINGERPRINT} annotation to adopt the edit and resume",
        )

    async def _managed(self, b: _Built, target: Obj, owner: str) -> None:
        name = target["metadata"]["name"]
        await self._hold(
            b,
            "ManagedTarget",
            f"the target is owned by {owner}",
            f"Deployment {name} is owned by {owner}, which would revert spectune's patches; "
            "nothing is patched",
            f"Deployment {name} is owned by the controller {owner} (its ownerReference), "
            "which reconciles it from its own object and would revert or fight every "
            "patch of the engine's arguments; nothing is patched. Tune the object that "
            "controller reads, or set spec.targetRef.allowManaged: true if it leaves the "
            "container's arguments alone",
        )

    async def _scaled_to_zero(self, b: _Built, target: Obj) -> None:
        name = target["metadata"]["name"]
        await self._hold(
            b,
            "ScaledToZero",
            "the target was scaled to zero",
            f"Deployment {name} was scaled to zero replicas; tuning waits for it to scale up",
            f"Deployment {name} has 0 replicas (an autoscaler such as KEDA scaled it to zero, "
            "or someone did): no pod serves, so there is nothing to measure and no incumbent "
            "to compare a canary with. Tuning waits, with nothing patched; it resumes when "
            "the target has replicas again",
        )

    async def _hold(self, b: _Built, reason: str, trial_why: str, event: str, message: str) -> None:
        """Stop tuning without touching the target's setting: the running trial ends, its
        canary goes and the replica count is restored (once), then ``Ready=False`` with
        ``reason`` until the cause is gone (a HumanEdit, a ManagedTarget)."""
        if not self._paused:
            self._paused = True
            c = b.controller
            running = c._running()
            if running is not None:
                c.history = c.history.update_last(running.ended(Outcome.ABORTED, trial_why))
            await b.actuator.stop_canary()
            # An in-place trial: the edit is kept, not rolled back; a replaced canary: the
            # target's replica count back first (only the count is written, never the edit).
            await self._restore(b.actuator)
            self._emit("Warning", reason, event)
        await self._write(
            StatusInputs(
                phase=api_phase(b.controller.state.shown_phase),
                generation=self._generation,
                now=_now(),
                memory=self._memory(),
                conditions=(_cond("Ready", False, reason, message),),
            )
        )
        await self._wait()

    def _acceptance(self, b: _Built, applied: Arm | None) -> Any:
        obs = b.metrics.of(applied)
        if obs is None:
            return None
        cfg = b.controller.config
        return acceptance_of(  # the window in the pods' own seconds, as the spec gives it
            window_stats(obs, b.controller.objective),
            (obs.window_s or cfg.window_s) * cfg.time_scale,
        )

    def _findings(self, b: _Built, applied: Arm | None) -> Any:
        obs = b.metrics.of(applied)
        if obs is None or applied is None or applied.drafter is None or not obs.speculating:
            return None
        try:
            d = diagnose(obs, current_k=applied.k, draft_cost=self._settings.draft_cost)
        except SpecTuneError:
            return None
        return findings_of([f.to_json() for f in d.findings])

    # -- recommend mode -------------------------------------------------------------------------

    async def _recommend(self, spec: SpecTuningSpec) -> None:
        s = self._settings
        kube = KubeActuator(self._api, self._spt(), spec.target_ref.name, None, "vllm", {})
        target = await kube.read_target()
        engine = detect_engine(spec, target)
        container = spec.target_ref.container
        source, _, waits, _ = await self._sources(spec, _TrackingActuator(kube))
        window = s.scaled(parse_window(spec))
        gen = self._generation
        running = current_spec(target, container, engine.value)
        arm = arm_from_spec(running, drafters_of(spec))
        if self._status.phase is None or self._status.phase is Phase.FAILED:
            await self._write(
                StatusInputs(
                    phase=Phase.BASELINE,
                    generation=gen,
                    now=_now(),
                    conditions=(
                        _cond(
                            "Ready",
                            True,
                            "Observing",
                            "recommend mode: observing the target; nothing is patched",
                        ),
                    ),
                    model_version=model_version(target, container, engine.value),
                    applied=arm,
                    fingerprint=fingerprint(running),
                )
            )
        if not waits:
            await self._clock.sleep(window)
        try:
            obs = await source.observe(window)
        except NoDataError as exc:
            await self._write(
                StatusInputs(
                    phase=self._status.phase or Phase.BASELINE,
                    generation=gen,
                    now=_now(),
                    conditions=(_cond("MetricsAvailable", False, "NoData", str(exc)),),
                )
            )
            return
        except (SourceUnavailableError, InputError) as exc:
            if self._telemetry is not None:
                self._telemetry.source_errors.labels(self._ns, self._name).inc()
            reason = _outage_reason(exc)
            await self._write(
                StatusInputs(
                    phase=self._status.phase or Phase.BASELINE,
                    generation=gen,
                    now=_now(),
                    conditions=(_cond("MetricsAvailable", False, reason, str(exc)),),
                )
            )
            return
        objective = to_objective(spec)
        stats = window_stats(obs, objective)
        findings = None
        rec: Recommendation
        c = s.draft_cost
        if obs.speculating and arm.drafter is not None:
            try:
                d = diagnose(obs, current_k=arm.k, draft_cost=c)
            except SpecTuneError as exc:
                d = None
                why = str(exc)
            if d is not None:
                findings = findings_of([f.to_json() for f in d.findings])
            if d is not None and d.best_k is not None:
                best = max(1, d.best_k)
                row = d.prediction[best] if best < len(d.prediction) else None
                rec = Recommendation(
                    arm=Arm(arm.drafter, best).name,
                    drafter=arm.drafter,
                    k=best,
                    expected_speedup=row.speedup if row is not None else None,
                    reason=(
                        f"predicted from the acceptance measured on {arm.name} over "
                        f"{window * s.time_scale:.0f}s, assuming draft cost c = {c:g} "
                        "(SPECTUNE_DRAFT_COST); "
                        "recommend mode runs no trials"
                    )[:1024],
                )
            else:
                rec = Recommendation(
                    arm=arm.name,
                    drafter=arm.drafter,
                    k=arm.k,
                    reason=f"keep {arm.name}: the window cannot predict better "
                    f"({why if d is None else 'draft cost unknown'})"[:1024],
                )
        else:
            rec = Recommendation(
                arm=arm.name,
                drafter=arm.drafter or "off",
                k=arm.k,
                reason=(
                    "the target runs without speculation, and recommend mode runs no trials, "
                    "so no drafter's acceptance can be measured; set mode: auto to measure "
                    "the drafters on a canary"
                ),
            )
        await self._write(
            StatusInputs(
                phase=Phase.CONVERGED,
                generation=gen,
                now=_now(),
                conditions=(
                    _cond("Ready", True, "Recommending", "recommend mode: nothing is patched"),
                    _cond(
                        "MetricsAvailable",
                        True,
                        "MetricsAnswer",
                        "the metric source answered for the latest window",
                    ),
                ),
                recommendation=rec,
                acceptance=acceptance_of(stats, window),
                findings=findings,
                model_version=model_version(target, container, engine.value),
                applied=arm,
                fingerprint=fingerprint(running),
            )
        )


def parse_window(spec: SpecTuningSpec) -> float:
    """``spec.search.window`` in seconds."""
    from spectune.durations import parse_duration

    return parse_duration(spec.search.window, "spec.search.window")


def _safe_status(body: Mapping[str, Any]) -> SpecTuningStatus:
    try:
        return parse_status(dict(body))
    except SpecError:
        log.warning("ignoring an unreadable status; starting from an empty one")
        return SpecTuningStatus()


@dataclass(frozen=True)
class CleanupReport:
    """What :func:`cleanup` did, what it left on purpose, and what failed (to retry)."""

    done: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    """Left as it is on purpose (a hand edit is never overwritten)."""
    failed: tuple[str, ...] = ()
    """Not done because a call failed; trying again may do it."""

    def __str__(self) -> str:
        parts = list(self.done) + list(self.left)
        parts += [f"NOT DONE: {f}" for f in self.failed]
        return "; ".join(parts) or "nothing to do"


async def cleanup(
    api: k8s.ApiClient, body: Mapping[str, Any], allow: Sequence[str] = ()
) -> CleanupReport:
    """On deletion: remove the canaries; restore the original setting when asked.

    The target otherwise stays on the last promoted setting: an in-place trial under way is
    rolled back to it. An invalid spec still gets its canaries removed (they are found by
    label and ownership). Every step is tried even when an earlier one failed, and a failure
    is reported, not raised, so the delete handler can say what remains and let the
    SpecTuning go (``handlers.py``). A hand-edited target is never written: neither the
    in-place rollback nor ``restoreOnDelete`` overwrites an edit, paused or new.
    """
    meta = body["metadata"]
    spt = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SpecTuning",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
    }
    done: list[str] = []
    left: list[str] = []
    failed: list[str] = []

    def report() -> CleanupReport:
        return CleanupReport(tuple(done), tuple(left), tuple(failed))

    raw_spec = body.get("spec") or {}
    target_name = str((raw_spec.get("targetRef") or {}).get("name", ""))
    bare = KubeActuator(api, spt, target_name, None, "vllm", {})
    try:
        await bare.stop_canary()
        if await bare.restored():
            done.append("canaries removed")
        else:
            # A trial held the target at N−c: it is back at N, and its canary leaves once
            # the target's pods are Ready (the delete handler looks again every poll).
            failed.append(
                "the target is going back to its own replica count; its canary leaves once "
                "the target's pods are Ready"
            )
    except SpecTuneError as exc:
        failed.append(
            f"removing the canaries ({exc}); they are owned by the SpecTuning, so Kubernetes' "
            "garbage collector deletes them with it"
        )
    try:
        spec = parse_spec(raw_spec)
    except SpecError:
        left.append("the spec is invalid, the target is untouched")
        return report()
    try:
        target = await bare.read_target()
    except TargetMissingError:
        left.append("the target is gone")
        return report()
    except SpecTuneError as exc:
        failed.append(f"reading the target ({exc}), so it was neither rolled back nor restored")
        return report()
    engine = detect_engine(spec, target)
    kube = KubeActuator(
        api,
        spt,
        spec.target_ref.name,
        spec.target_ref.container,
        engine.value,
        drafters_of(spec, allow),
    )
    try:
        if ANNOTATION_TRIAL in (target.get("metadata", {}).get("annotations") or {}):
            in_place = InPlaceActuator(kube)
            await in_place.stop_canary()
            await in_place.settle()
            target = await bare.read_target()
            done.append("the in-place trial rolled back")
        if not spec.restore_on_delete or spec.mode is Mode.RECOMMEND:
            left.append("the target stays on its current setting")
            return report()
        memory = load_memory(_safe_status(body).history)
        if memory.original is None:
            left.append("no original setting recorded, the target is untouched")
            return report()
        current = arm_from_spec(
            current_spec(target, spec.target_ref.container, engine.value), drafters_of(spec)
        )
        if current.name == memory.original:
            left.append(f"the target already runs the original {memory.original}")
            return report()
        await kube.promote(parse_arm(memory.original))
        done.append(f"the target restored to its original {memory.original}")
    except HumanEditError as exc:
        left.append(f"the target is left as it is: {exc}")
    except ForbiddenError as exc:  # the RBAC may be fixed: worth another try
        failed.append(f"the rollback or restore of Deployment {spec.target_ref.name} ({exc})")
    except SpecError as exc:  # nothing another try would change
        left.append(f"the target is left as it is: {exc}")
    except SpecTuneError as exc:
        what = "restoring the original setting" if spec.restore_on_delete else "the rollback"
        failed.append(f"{what} of Deployment {spec.target_ref.name} ({exc})")
    return report()
