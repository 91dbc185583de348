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
* ``mode: auto``: one :meth:`~spectune.control.controller.Controller.step`, then the status.

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
import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping
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
from spectune.control.groups import PairedSources
from spectune.control.ports import Deployment, Group
from spectune.diagnose import diagnose
from spectune.errors import NoDataError, SourceUnavailableError, SpecError, SpecTuneError
from spectune.k8s.actuator import ForbiddenError, KubeActuator, api_error
from spectune.k8s.deployments import (
    ANNOTATION_FINGERPRINT,
    DrafterArgs,
    arm_from_spec,
    canary_name,
    current_spec,
    fingerprint,
    human_edit,
    model_version,
)
from spectune.k8s.projection import (
    ConditionUpdate,
    Memory,
    StatusInputs,
    acceptance_of,
    api_phase,
    build_status,
    findings_of,
    load_memory,
)
from spectune.k8s.series import canary_selector, target_selector
from spectune.k8s.telemetry import OperatorMetrics
from spectune.metrics.observation import Observation
from spectune.metrics.prometheus import PrometheusSource
from spectune.search.arms import Arm, parse_arm
from spectune.search.history import Outcome
from spectune.search.objective import window_stats
from spectune.search.spectune_policy import SpectunePolicy
from spectune.settings import Settings

__all__ = [
    "EventSink",
    "MetricsOutageError",
    "TuningLoop",
    "WallClock",
    "check_supported",
    "cleanup",
    "detect_engine",
]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
EventSink = Callable[[str, str, str], None]
"""``(type, reason, message)``: posts a Kubernetes Event on the SpecTuning."""

_WARNINGS = frozenset({"TrialAborted", "TrialInfeasible", "AcceptanceDrift", "HumanEdit"})
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
    """The metric source failed for a window (the tuning loop holds the setting)."""


class _RecordingMetrics:
    """GroupMetrics that remembers the last observations and names metric failures."""

    def __init__(self, inner: PairedSources) -> None:
        self._inner = inner
        self.last: Mapping[Group, Observation] = {}

    async def observe(self, window_s: float) -> Mapping[Group, Observation]:
        try:
            out = await self._inner.observe(window_s)
        except SourceUnavailableError as exc:
            raise MetricsOutageError(str(exc)) from None
        self.last = out
        return out


class _SpecChangedError(SpecTuneError):
    """The spec changed (e.g. ``suspend: true``) while a step was under way: do not act on it."""


class _TrackingActuator:
    """The KubeActuator, remembering what it last saw (the canary's pods' selector needs it).

    ``stale`` says whether the live spec moved on since this actuator was built: a step
    takes a whole window, and a canary started or a promotion made after the user asked for
    ``suspend: true`` (or any other spec change) would act on a spec that no longer holds.
    Removing canaries is always allowed.
    """

    def __init__(self, inner: KubeActuator, stale: Callable[[], bool] = lambda: False) -> None:
        self.inner = inner
        self.last: Deployment | None = None
        self._stale = stale

    def _check(self, what: str) -> None:
        if self._stale():
            raise _SpecChangedError(f"the spec changed during the step; not doing: {what}")

    async def deployment(self) -> Deployment:
        self.last = await self.inner.deployment()
        return self.last

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
    """Raise :class:`SpecError` naming a field this operator does not implement yet."""
    if spec.search.strategy is Strategy.IN_PLACE:
        raise SpecError(
            "spec.search.strategy: inPlace is not implemented by this operator release; use canary"
        )
    if spec.metrics.prometheus is None:
        raise SpecError(
            "spec.metrics.scrape: direct pod scraping is not implemented by this operator "
            "release; set spec.metrics.prometheus"
        )
    if spec.metrics.prometheus.auth_secret_ref is not None:
        raise SpecError(
            "spec.metrics.prometheus.authSecretRef: Prometheus authentication is not "
            "implemented by this operator release"
        )


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


def drafters_of(spec: SpecTuningSpec) -> dict[str, DrafterArgs]:
    """The spec's drafters as the Deployment builders take them."""
    return {
        d.name: DrafterArgs(
            d.name, d.method.value, d.model, d.prompt_lookup_min, d.prompt_lookup_max
        )
        for d in spec.drafters
    }


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
    """

    def __init__(
        self,
        api: k8s.ApiClient,
        body: Mapping[str, Any],
        settings: Settings,
        clock: WallClock,
        telemetry: OperatorMetrics | None,
        emit: EventSink,
    ) -> None:
        self._api = api
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
        self._built: _Built | None = None
        self._failures = 0
        self._paused = False
        self._canary_sources: dict[str, PrometheusSource] = {}
        self._denied: str | None = None

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
        doc = build_status(self._status, inputs)
        try:
            await asyncio.to_thread(
                self._custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                self._ns,
                PLURAL,
                self._name,
                {"status": doc},
            )
        except ApiException as exc:
            if exc.status == 404:
                return  # deleted meanwhile
            raise api_error(exc, f"write the status of {self._ns}/{self._name}") from None
        self._status = parse_status(doc)
        self._report(inputs.phase)

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
            spec = parse_spec(self._body["spec"])
            check_supported(spec)
        except SpecError as exc:
            await self._invalid(str(exc), gen)
            return
        if await self._conflict(spec):
            return
        if spec.suspend:
            await self._suspend(spec)
            return
        if spec.mode is Mode.RECOMMEND:
            await self._recommend(spec)
            return
        try:
            await self._auto(spec)
        except ForbiddenError:
            raise
        except SpecError as exc:  # e.g. the target runs a drafter the spec does not list
            self._built = None
            await self._invalid(str(exc), gen)

    async def _invalid(self, message: str, gen: int | None) -> None:
        await self._write(
            StatusInputs(
                phase=Phase.FAILED,
                generation=gen,
                now=_now(),
                conditions=(_cond("Ready", False, "InvalidSpec", message),),
            )
        )
        while self._generation == gen:
            await self._wait()

    async def _conflict(self, spec: SpecTuningSpec) -> bool:
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
            if target == spec.target_ref.name and not meta.get("deletionTimestamp"):
                same.append((str(meta.get("creationTimestamp", "")), str(meta.get("name"))))
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
            actuator = _TrackingActuator(
                KubeActuator(self._api, self._spt(), spec.target_ref.name, None, "vllm", {})
            )
        await actuator.stop_canary()
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
                        "suspend: true; canaries removed, the target is left as it is",
                    ),
                ),
            )
        )
        await self._wait()

    def _memory(self) -> Memory | None:
        b = self._built
        if b is None:
            return None
        return Memory(b.controller.history, b.controller.state, b.original)

    # -- auto mode ------------------------------------------------------------------------------

    async def _build(self, spec: SpecTuningSpec) -> _Built:
        s = self._settings
        meta = self._body["metadata"]
        first = KubeActuator(self._api, self._spt(), spec.target_ref.name, None, "vllm", {})
        target = await first.read_target()
        engine = detect_engine(spec, target)
        drafters = drafters_of(spec)
        kube = KubeActuator(
            self._api,
            self._spt(),
            spec.target_ref.name,
            spec.target_ref.container,
            engine.value,
            drafters,
            spec.search.canary_replicas,
        )
        built_for = self._generation
        actuator = _TrackingActuator(kube, lambda: self._generation != built_for)
        prom = spec.metrics.prometheus
        assert prom is not None  # check_supported
        url = s.prometheus_url or str(prom.url)
        user = prom.selector
        incumbent = PrometheusSource(url, target_selector(self._ns, spec.target_ref.name, user))

        def canary() -> PrometheusSource | None:
            dep = actuator.last
            if dep is None or dep.canary is None:
                return None
            name = canary_name(spec.target_ref.name, dep.canary)
            if name not in self._canary_sources:
                self._canary_sources[name] = PrometheusSource(
                    url, canary_selector(self._ns, name, user)
                )
            return self._canary_sources[name]

        metrics = _RecordingMetrics(
            PairedSources(incumbent, canary, self._clock.sleep, waits=False)
        )
        cfg = to_controller_config(spec, seed=_seed(str(meta.get("uid", self._name))))
        every = cfg.retune_every_s
        cfg = replace(
            cfg,
            window_s=s.scaled(cfg.window_s),
            drift_for_s=s.scaled(cfg.drift_for_s),
            retune_every_s=s.scaled(every) if every is not None else None,
            poll_s=s.poll_s,
            ready_timeout_s=s.scaled(s.ready_timeout_s),
        )
        if self._built is not None:
            memory = Memory(
                self._built.controller.history,
                self._built.controller.state,
                self._built.original,
            )
        else:
            memory = load_memory(self._status.history)
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
        )
        original = memory.original
        if original is None:
            original = arm_from_spec(
                current_spec(target, spec.target_ref.container, engine.value), drafters
            ).name
        built = _Built(self._generation, spec, engine, controller, actuator, metrics, original)
        await self._resume_canary(built)
        return built

    async def _resume_canary(self, b: _Built) -> None:
        """After a restart: no canary without a running trial, and the running trial's canary."""
        running = b.controller._running()
        dep = await b.actuator.deployment()
        if running is None and dep.canary is not None:
            await b.actuator.stop_canary()
        elif running is not None and (dep.canary is None or dep.canary.name != running.arm):
            await b.actuator.start_canary(parse_arm(running.arm))

    async def _auto(self, spec: SpecTuningSpec) -> None:
        gen = self._generation
        if self._built is None or self._built.generation != gen:
            self._built = await self._build(spec)
        b = self._built
        kube = b.actuator.inner
        target = await kube.read_target()
        container, engine = spec.target_ref.container, b.engine.value
        annotations = target.get("metadata", {}).get("annotations") or {}
        if ANNOTATION_FINGERPRINT not in annotations:
            await kube.adopt(target)
            self._paused = False
        elif human_edit(target, container, engine):
            await self._pause(b, target)
            return
        self._paused = False
        conditions = [_cond("Ready", True, "Tuning", "tuning runs")]
        phase = api_phase(b.controller.state.phase)
        if self._status.phase is not phase:
            # Say where the loop stands before a step that may take a whole window.
            await self._write(
                StatusInputs(
                    phase=phase,
                    generation=gen,
                    now=_now(),
                    conditions=tuple(conditions),
                    memory=self._memory(),
                )
            )
        try:
            await b.controller.step()
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
            conditions.append(await self._outage(b, str(exc)))
        except _SpecChangedError as exc:
            log.info("%s/%s: %s", self._ns, self._name, exc)
            return  # the next turn reads the new spec (suspend, mode, search ...)
        c = b.controller
        dep = b.actuator.last
        applied = dep.incumbent if dep is not None else None
        await self._write(
            StatusInputs(
                phase=api_phase(c.state.phase),
                generation=gen,
                now=_now(),
                conditions=tuple(conditions),
                memory=Memory(c.history, c.state, b.original),
                applied=applied,
                fingerprint=(
                    fingerprint(current_spec(target, container, engine))
                    if applied is not None
                    else None
                ),
                decision=c.last_decision,
                minimise=c.objective.metric.minimise,
                acceptance=self._acceptance(b),
                findings=self._findings(b, applied),
                model_version=dep.model_version if dep is not None else None,
                routes=dep.routes if dep is not None else None,
                engine=b.engine,
            )
        )

    async def _outage(self, b: _Built, why: str) -> ConditionUpdate:
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
            self._emit("Warning", "TrialAborted", f"{running.arm}: {reason}; canary removed")
            message += f"; trial {running.arm} ended and its canary removed"
        else:
            await self._clock.sleep(min(self._settings.poll_s, c.config.window_s))
        return _cond("MetricsAvailable", False, "SourceUnavailable", message)

    async def _pause(self, b: _Built, target: Obj) -> None:
        if not self._paused:
            self._paused = True
            c = b.controller
            running = c._running()
            if running is not None:
                c.history = c.history.update_last(
                    running.ended(Outcome.ABORTED, "the target was edited by hand")
                )
            await b.actuator.stop_canary()
            self._emit(
                "Warning",
                "HumanEdit",
                f"the speculative arguments of Deployment {target['metadata']['name']} were "
                "edited by hand; tuning paused, nothing overwritten",
            )
        await self._write(
            StatusInputs(
                phase=api_phase(b.controller.state.phase),
                generation=self._generation,
                now=_now(),
                memory=self._memory(),
                conditions=(
                    _cond(
                        "Ready",
                        False,
                        "HumanEdit",
                        "the target's speculative arguments differ from what spectune applied; "
                        "tuning is paused and nothing is overwritten. Restore them, or remove "
                        f"the {ANNOTATION_FINGERPRINT} annotation to adopt the edit and resume",
                    ),
                ),
            )
        )
        await self._wait()

    def _acceptance(self, b: _Built) -> Any:
        obs = b.metrics.last.get(Group.INCUMBENT)
        if obs is None:
            return None
        return acceptance_of(
            window_stats(obs, b.controller.objective), obs.window_s or b.controller.config.window_s
        )

    def _findings(self, b: _Built, applied: Arm | None) -> Any:
        obs = b.metrics.last.get(Group.INCUMBENT)
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
        prom = spec.metrics.prometheus
        assert prom is not None
        url = s.prometheus_url or str(prom.url)
        kube = KubeActuator(self._api, self._spt(), spec.target_ref.name, None, "vllm", {})
        target = await kube.read_target()
        engine = detect_engine(spec, target)
        container = spec.target_ref.container
        source = PrometheusSource(
            url, target_selector(self._ns, spec.target_ref.name, prom.selector)
        )
        window = s.scaled(parse_window(spec))
        gen = self._generation
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
                )
            )
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
        except SourceUnavailableError as exc:
            if self._telemetry is not None:
                self._telemetry.source_errors.labels(self._ns, self._name).inc()
            await self._write(
                StatusInputs(
                    phase=self._status.phase or Phase.BASELINE,
                    generation=gen,
                    now=_now(),
                    conditions=(_cond("MetricsAvailable", False, "SourceUnavailable", str(exc)),),
                )
            )
            return
        arm = arm_from_spec(current_spec(target, container, engine.value), drafters_of(spec))
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
                        f"{window:.0f}s, assuming draft cost c = {c:g} (SPECTUNE_DRAFT_COST); "
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
                fingerprint=fingerprint(current_spec(target, container, engine.value)),
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


async def cleanup(api: k8s.ApiClient, body: Mapping[str, Any]) -> str:
    """On deletion: remove the canaries; restore the original setting when asked.

    Returns what was done, for the log. The target otherwise stays on the last promoted
    setting. An invalid spec still gets its canaries removed (they are found by label).
    """
    meta = body["metadata"]
    spt = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SpecTuning",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
    }
    raw_spec = body.get("spec") or {}
    target_name = str((raw_spec.get("targetRef") or {}).get("name", ""))
    bare = KubeActuator(api, spt, target_name, None, "vllm", {})
    await bare.stop_canary()
    try:
        spec = parse_spec(raw_spec)
    except SpecError:
        return "canaries removed (the spec is invalid, the target is untouched)"
    if not spec.restore_on_delete or spec.mode is Mode.RECOMMEND:
        return "canaries removed; the target stays on its current setting"
    memory = load_memory(_safe_status(body).history)
    if memory.original is None:
        return "canaries removed; no original setting recorded, the target is untouched"
    try:
        target = await bare.read_target()
    except SourceUnavailableError:
        return "canaries removed; the target is gone"
    engine = detect_engine(spec, target)
    kube = KubeActuator(
        api, spt, spec.target_ref.name, spec.target_ref.container, engine.value, drafters_of(spec)
    )
    current = arm_from_spec(
        current_spec(target, spec.target_ref.container, engine.value), drafters_of(spec)
    )
    if current.name == memory.original:
        return f"canaries removed; the target already runs the original {memory.original}"
    await kube.promote(parse_arm(memory.original))
    return f"canaries removed; the target restored to its original {memory.original}"
