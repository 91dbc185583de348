"""The ``inPlace`` strategy: trials patch the target Deployment itself, one at a time.

``spec.search.strategy: inPlace`` is for a deployment that cannot spare a canary (one
replica, or GPUs too scarce for an extra pod). The controller (``control/controller.py``) is
written for canaries, so this module presents the in-place world through the same ports,
and the brain needs no second code path:

* :class:`InPlaceActuator` (the :class:`~spectune.control.ports.Actuator`): "start a canary
  on arm T" patches the target onto T and records the arm to return to; "stop the canary"
  rolls the target back to it; the trial's readiness and failure are the target's own
  rollout (waiting / ready / stuck, ``k8s/rollout.py``), so a stuck rollout
  (ProgressDeadlineExceeded, CrashLoopBackOff, OOMKilled) is rolled back and its arm marked
  infeasible exactly as a stuck canary is.
* :class:`InPlaceMetrics` (the :class:`~spectune.control.ports.GroupMetrics`): during a trial
  every pod of the target runs the trial arm, so no incumbent runs beside it. The window of
  the target is the trial's ("canary") observation, and the incumbent's is the most recent
  window of the incumbent arm at a similar load (:func:`~spectune.search.objective.same_load`
  on the running batch per pod), remembered from before the trial — or, after an operator
  restart, read again from Prometheus at that window's time (the history keeps when every
  window ran). A trial window with no incumbent window at its load is recorded unpaired and
  is not evidence for the model.

The trial lives in two annotations on the target, so a restarted operator finds it:
``spectune.io/trial`` (the arm under trial) and ``spectune.io/incumbent`` (the arm to return
to). Fingerprints work as for canaries: every patch records the fingerprint of what it
applied, so a human edit of the target during a trial pauses tuning and is not rolled back.

The controller asks to stop a trial and then, in the same step, to promote its arm when it
won; rolling back and forward again would restart every pod twice. So :meth:`stop_canary`
only notes the rollback, :meth:`InPlaceActuator.promote` takes it back when it keeps the
trial's arm, and the tuning loop calls :meth:`InPlaceActuator.settle` after each step to
carry out a rollback still owed. A new trial asked for right after a rollback waits for the
rollback's rollout to finish first, so a stuck arm always returns the target to its
incumbent before anything else is tried.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spectune.control.groups import WindowedSource
from spectune.control.ports import Deployment, Group, Placement
from spectune.errors import NoDataError, SourceUnavailableError, SpecTuneError
from spectune.k8s.actuator import KubeActuator
from spectune.k8s.deployments import (
    ANNOTATION_FINGERPRINT,
    arm_from_spec,
    current_spec,
    fingerprint,
    human_edit,
    model_version,
    promote_patch,
)
from spectune.k8s.rollout import Readiness, classify_rollout
from spectune.metrics.observation import Observation
from spectune.search.arms import Arm, parse_arm
from spectune.search.history import History
from spectune.search.objective import same_load

__all__ = [
    "ANNOTATION_INCUMBENT",
    "ANNOTATION_TRIAL",
    "InPlaceActuator",
    "InPlaceMetrics",
]

log = logging.getLogger(__name__)

Obj = dict[str, Any]

ANNOTATION_TRIAL = "spectune.io/trial"
"""On the target during an in-place trial: the arm under trial."""
ANNOTATION_INCUMBENT = "spectune.io/incumbent"
"""On the target during an in-place trial: the arm a rollback returns to."""

_KEEP = 8
"""Observations remembered per arm (the most recent ones are the useful ones)."""


def _notes(target: Mapping[str, Any]) -> Mapping[str, str]:
    meta = target.get("metadata")
    notes = meta.get("annotations") if isinstance(meta, Mapping) else None
    return notes if isinstance(notes, Mapping) else {}


class InPlaceActuator:
    """The in-place strategy over a real API server (see the module docstring).

    Parameters
    ----------
    kube
        The canary actuator of the same SpecTuning: it reads and patches the target (with
        conflict retries) and removes any canary left from the canary strategy.
    """

    def __init__(self, kube: KubeActuator) -> None:
        self._kube = kube
        self._rollback_owed = False

    # -- what the tuning loop needs besides the port ----------------------------------------

    async def read_target(self) -> Obj:
        """The target Deployment as a plain dict."""
        return await self._kube.read_target()

    async def adopt(self, target: Mapping[str, Any]) -> None:
        """Record the target's current setting as the applied one; forget any trial."""
        kube = self._kube
        spec = current_spec(dict(target), kube.container, kube.engine)
        await kube.patch_target(
            lambda _: {
                "metadata": {
                    "annotations": {
                        ANNOTATION_FINGERPRINT: fingerprint(spec),
                        ANNOTATION_TRIAL: None,
                        ANNOTATION_INCUMBENT: None,
                    }
                }
            },
            guarded=False,
        )

    # -- the Actuator port ------------------------------------------------------------------

    def _arm(self, target: Obj) -> Arm:
        k = self._kube
        return arm_from_spec(current_spec(target, k.container, k.engine), k.drafters)

    def _patch_to(self, arm: Arm, trial: str | None, incumbent: str | None) -> Callable[[Obj], Obj]:
        k = self._kube

        def build(target: Obj) -> Obj:
            patch = promote_patch(target, arm, k.drafters, k.container, k.engine)
            patch["metadata"]["annotations"][ANNOTATION_TRIAL] = trial
            patch["metadata"]["annotations"][ANNOTATION_INCUMBENT] = incumbent
            return patch

        return build

    async def deployment(self) -> Deployment:
        """The incumbent (the arm to return to), the trial arm as the "canary", and readiness.

        A trial that waits for a rollback to finish is applied here once the target is back
        on its incumbent and ready.
        """
        k = self._kube
        target = await k.read_target()
        current = self._arm(target)
        state = classify_rollout(target, await k.pods(target))
        notes = _notes(target)
        version = model_version(target, k.container, k.engine)
        trial = notes.get(ANNOTATION_TRIAL)
        if not trial:
            return Deployment(
                incumbent=current,
                canary=None,
                canary_ready=False,
                canary_failure=None,
                rolling=state.readiness is Readiness.WAITING,
                model_version=version,
                placement=Placement.IN_PLACE,
            )
        arm = parse_arm(trial)
        incumbent = parse_arm(notes.get(ANNOTATION_INCUMBENT) or current.name)
        if current.name != arm.name:
            # The trial waits for a rollback to the incumbent to finish: start it now.
            if current.name == incumbent.name and state.readiness is Readiness.READY:
                await k.patch_target(self._patch_to(arm, arm.name, incumbent.name))
            return Deployment(
                incumbent, arm, False, None, False, version, placement=Placement.IN_PLACE
            )
        return Deployment(
            incumbent=incumbent,
            canary=arm,
            canary_ready=state.readiness is Readiness.READY,
            canary_failure=state.reason if state.readiness is Readiness.STUCK else None,
            rolling=False,
            model_version=version,
            placement=Placement.IN_PLACE,
        )

    async def start_canary(self, arm: Arm) -> None:
        """Put the target on ``arm`` for a trial, remembering the incumbent to return to."""
        k = self._kube
        target = await k.read_target()
        notes = _notes(target)
        incumbent = notes.get(ANNOTATION_INCUMBENT) or self._arm(target).name
        if self._rollback_owed:
            # Back to the incumbent first; deployment() starts the trial once it is ready.
            self._rollback_owed = False
            back = parse_arm(incumbent)
            await k.patch_target(self._patch_to(back, arm.name, incumbent))
            return
        await k.patch_target(self._patch_to(arm, arm.name, incumbent))

    async def stop_canary(self) -> None:
        """End the trial: the target returns to its incumbent (at :meth:`settle`)."""
        target = await self._kube.read_target()
        if _notes(target).get(ANNOTATION_TRIAL):
            self._rollback_owed = True

    async def promote(self, arm: Arm) -> None:
        """Roll the target onto ``arm`` and end any trial (no restart when it runs ``arm``)."""
        self._rollback_owed = False
        await self._kube.patch_target(self._patch_to(arm, None, None))

    async def settle(self) -> None:
        """Carry out a rollback the step owes: the target returns to its incumbent.

        A target whose speculative arguments were edited by hand is not rolled back (the
        edit is the user's); only the trial's annotations go.
        """
        if not self._rollback_owed:
            return
        self._rollback_owed = False
        k = self._kube
        target = await k.read_target()
        notes = _notes(target)
        if not notes.get(ANNOTATION_TRIAL):
            return
        if human_edit(target, k.container, k.engine):
            await k.patch_target(
                lambda _: {
                    "metadata": {
                        "annotations": {ANNOTATION_TRIAL: None, ANNOTATION_INCUMBENT: None}
                    }
                },
                guarded=False,
            )
            return
        incumbent = parse_arm(notes.get(ANNOTATION_INCUMBENT) or self._arm(target).name)
        await k.patch_target(self._patch_to(incumbent, None, None))


# -- metrics ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Seen:
    end_s: float
    observation: Observation


PastSource = Callable[[float, float], Awaitable[Observation]]
"""``(window_s, end_s)`` → the target's observation of that past window (Prometheus)."""


class InPlaceMetrics:
    """The controller's GroupMetrics for the in-place strategy (see the module docstring).

    Parameters
    ----------
    source
        The target's pods (Prometheus selector or pod scrape).
    arms
        ``(incumbent, trial)`` arm names as the actuator last saw them; ``trial`` is None
        when no trial runs or its rollout is not ready.
    history
        The controller's history (the times and loads of earlier windows).
    now, sleep
        The operator's clock.
    waits
        Whether ``source`` waits out the window itself (the pod scraper does).
    past
        Reads a past window of the target again (Prometheus), or None (pod scrape: only
        windows seen by this process can be replayed).
    load_shift
        Two windows whose running batch per pod differs by more than this factor are not at
        the same load (the controller's ``load_shift``).
    """

    def __init__(
        self,
        source: WindowedSource,
        arms: Callable[[], tuple[str | None, str | None]],
        history: Callable[[], History],
        now: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        waits: bool,
        past: PastSource | None,
        load_shift: float,
    ) -> None:
        self._source = source
        self._arms = arms
        self._history = history
        self._now = now
        self._sleep = sleep
        self._waits = waits
        self._past = past
        self._shift = load_shift
        self._seen: dict[str, list[_Seen]] = {}
        self._used: dict[str, set[float]] = {}

    def _remember(self, arm: str, obs: Observation) -> None:
        seen = self._seen.setdefault(arm, [])
        seen.append(_Seen(self._now(), obs))
        del seen[:-_KEEP]

    async def observe(self, window_s: float) -> Mapping[Group, Observation]:
        """The target's window, as the incumbent's or (during a trial) as the trial's."""
        if not self._waits:
            await self._sleep(window_s)
        incumbent, trial = self._arms()
        try:
            obs = await self._source.observe(window_s)
        except NoDataError:
            if trial is None:
                raise  # the target alone, with no series: nothing was measured
            return {}
        if trial is None:
            if incumbent is not None:
                self._remember(incumbent, obs)
            return {Group.INCUMBENT: obs}
        self._remember(trial, obs)
        out: dict[Group, Observation] = {Group.CANARY: obs}
        if incumbent is not None:
            ref = await self._reference(incumbent, trial, obs)
            if ref is not None:
                out[Group.INCUMBENT] = ref
            else:
                log.info(
                    "in-place trial %s: no window of the incumbent %s at this load (running "
                    "%s per pod); the window is recorded unpaired",
                    trial,
                    incumbent,
                    obs.running,
                )
        return out

    def _similar(self, a: float | None, b: float | None) -> bool:
        x = math.nan if a is None else a
        y = math.nan if b is None else b
        return same_load(x, y, self._shift)

    async def _reference(self, incumbent: str, trial: str, obs: Observation) -> Observation | None:
        """The incumbent's most recent window at a load like ``obs``'s, fresh ones first.

        A window not yet used by this trial is preferred, so several trial windows are
        compared with several incumbent windows where there are.
        """
        used = self._used.setdefault(trial, set())
        seen = [
            s
            for s in reversed(self._seen.get(incumbent, []))
            if self._similar(s.observation.running, obs.running)
        ]
        if not seen:
            seen = await self._replay(incumbent, obs)
        if not seen:
            return None
        chosen = next((s for s in seen if s.end_s not in used), seen[0])
        used.add(chosen.end_s)
        return chosen.observation

    async def _replay(self, incumbent: str, obs: Observation) -> list[_Seen]:
        """Windows of the incumbent arm from the history, read again from Prometheus."""
        if self._past is None:
            return []
        h = self._history()
        spans: list[tuple[float, float, float]] = []
        for w in h.baseline_windows():
            if w.incumbent is not None and w.incumbent_arm == incumbent:
                spans.append((w.start_s, w.end_s, w.incumbent.running))
        for t in h.in_epoch():
            if t.arm == incumbent:
                spans += [(w.start_s, w.end_s, w.canary.running) for w in t.windows if w.canary]
        spans.sort(key=lambda s: s[1], reverse=True)
        out: list[_Seen] = []
        for start, end, running in spans:
            if not self._similar(running, obs.running) or end <= start:
                continue
            try:
                past = await self._past(end - start, end)
            except (NoDataError, SourceUnavailableError, SpecTuneError) as exc:
                log.info("cannot read the incumbent's window ending %.0f again: %s", end, exc)
                continue
            out.append(_Seen(end, past))
            self._seen.setdefault(incumbent, []).insert(0, out[-1])
            if len(out) >= 2:
                break
        return out
