"""The ``inPlace`` strategy: a switchback on the target Deployment itself, one trial at a time.

``spec.search.strategy: inPlace`` is for a deployment that cannot spare a canary (one
replica, or GPUs too scarce for an extra pod), and it is the one-replica way to tune at full
load: a canary beside one replica halves the load each pod carries, and the speculation
payoff depends on exactly that batch. The controller (``control/controller.py``) is written
for canaries, so this module presents the in-place world through the same ports, and the
brain needs no second code path:

* :class:`InPlaceActuator` (the :class:`~spectune.control.ports.Actuator`): "start a canary
  on arm B" patches the target onto B and records the incumbent A to return to; "stop the
  canary" rolls the target back to A; the trial's readiness and failure are the target's own
  rollout (waiting / ready / stuck, ``k8s/rollout.py``), so a stuck rollout
  (ProgressDeadlineExceeded, CrashLoopBackOff, OOMKilled) is rolled back and its arm marked
  infeasible exactly as a stuck canary is.
* :class:`SwitchbackMetrics` (the :class:`~spectune.control.ports.GroupMetrics`): during a
  trial every pod of the target runs one arm at a time, so the two arms are measured one
  after the other on the same pods. One window of the controller is one A/B pair: a stretch
  of B (the trial arm, the "canary" observation), then the target is switched back to A (a
  restart) and a stretch of A (the "incumbent" observation), each ``window`` long and each
  after a wash-out. The next pair switches to B again, so the target runs A/B/A/B, and a
  trial's every judged window compares B with the A stretch next to it, in the same traffic
  period, at the same per-pod load (one window apart), instead of with a remembered window
  of A at a similar load. A pair ends on A, so a trial that ends there costs no rollback.
  B always runs first in its pair: a load that trends within a trial makes A's stretch the
  later one in every pair alike. A move beyond ±15 % between the two stretches shows in the
  window's per-pod load ratio (``WindowRecord.matched``), and such a pair is not judged as
  a matched one; a slower trend inside that band is what pairing one window apart accepts.

Why a wash-out (``search.switchback.washout``): a pod that just became Ready is not yet the
pod that serves at steady state. Its running batch starts empty and fills in about one
request's time in the system (Little's law: L = λW is reached after ~W), its prefix cache is
empty until the shared prefixes (system prompts, earlier turns) are seen again, kernels for
batch shapes not captured at start-up are compiled on first use, and Prometheus first
scrapes the new pod up to a scrape interval late (``Observation.covered``). All of that is a
duration fixed by the traffic and the engine, not a share of the window, so it is a duration
of its own; the stretch measured after it has the full window.

The cost, stated in ``docs/operating.md``: two restarts per A/B pair (into B, back into A),
each a rollout of the target plus a wash-out not measured, and each rollout of a one-replica
Deployment needs room for a surge pod (``maxSurge: 1``), or it is an outage
(``maxUnavailable: 1``). Each restart calls ``on_restart`` (the tuning loop counts them per
trial in the status and posts a ``Switchback`` event).

The trial lives in annotations on the target, so a restarted operator finds it:
``spectune.io/trial`` (the arm under trial), ``spectune.io/incumbent`` (the arm to return
to) and ``spectune.io/switchback`` (``incumbent`` while the switchback holds the target on A
for a pair's second stretch: the trial is under way, not waiting for a rollback).
Fingerprints work as for canaries: every patch records the fingerprint of what it applied,
so a human edit of the target during a trial pauses tuning and is not rolled back.

The controller asks to stop a trial and then, in the same step, to promote its arm when it
won; rolling back and forward again would restart every pod twice. So :meth:`stop_canary`
only notes the rollback, :meth:`InPlaceActuator.promote` takes it back when it keeps the
trial's arm, and the tuning loop calls :meth:`InPlaceActuator.settle` after each step to
carry out a rollback still owed. A new trial asked for right after a rollback waits for the
rollback's rollout to finish first, so a stuck arm always returns the target to its
incumbent before anything else is tried.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from spectune.control.groups import WindowedSource
from spectune.control.ports import Deployment, Group, Placement
from spectune.errors import NoDataError
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

__all__ = [
    "ANNOTATION_INCUMBENT",
    "ANNOTATION_STRETCH",
    "ANNOTATION_TRIAL",
    "InPlaceActuator",
    "Stretch",
    "SwitchbackMetrics",
]

log = logging.getLogger(__name__)

Obj = dict[str, Any]

ANNOTATION_TRIAL = "spectune.io/trial"
"""On the target during an in-place trial: the arm under trial."""
ANNOTATION_INCUMBENT = "spectune.io/incumbent"
"""On the target during an in-place trial: the arm a rollback returns to."""
ANNOTATION_STRETCH = "spectune.io/switchback"
"""On the target while a switchback holds it on the incumbent for a pair's A stretch."""


class Stretch(enum.Enum):
    """Which arm a switchback stretch runs: B (the trial's) or A (the incumbent's)."""

    TRIAL = "trial"
    INCUMBENT = "incumbent"


RestartSink = Callable[[str, str, Stretch], None]
"""``(trial arm, arm restarted onto, stretch)``: called for every restart of the target that a
trial causes (into B, back into A, the rollback of a trial that ends on B)."""


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
    on_restart
        Told of every restart of the target a trial causes (the tuning loop counts them).
    """

    def __init__(self, kube: KubeActuator, on_restart: RestartSink | None = None) -> None:
        self._kube = kube
        self._rollback_owed = False
        self.on_restart = on_restart

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
                        ANNOTATION_STRETCH: None,
                    }
                }
            },
            guarded=False,
        )

    # -- the Actuator port ------------------------------------------------------------------

    def _arm(self, target: Obj) -> Arm:
        k = self._kube
        return arm_from_spec(current_spec(target, k.container, k.engine), k.drafters)

    def _patch_to(
        self, arm: Arm, trial: str | None, incumbent: str | None, stretch: Stretch | None = None
    ) -> Callable[[Obj], Obj]:
        k = self._kube

        def build(target: Obj) -> Obj:
            patch = promote_patch(target, arm, k.drafters, k.container, k.engine)
            notes = patch["metadata"]["annotations"]
            notes[ANNOTATION_TRIAL] = trial
            notes[ANNOTATION_INCUMBENT] = incumbent
            notes[ANNOTATION_STRETCH] = stretch.value if stretch is Stretch.INCUMBENT else None
            return patch

        return build

    async def _apply(
        self,
        target: Obj,
        arm: Arm,
        trial: str,
        incumbent: str,
        stretch: Stretch,
        keep: bool = True,
    ) -> None:
        """Patch the target onto ``arm`` for trial ``trial`` (``keep``: the trial goes on,
        else its annotations go), and tell ``on_restart`` when that restarts the pods."""
        moved = self._arm(target).name != arm.name
        if keep:
            build = self._patch_to(arm, trial, incumbent, stretch)
        else:
            build = self._patch_to(arm, None, None)
        await self._kube.patch_target(build)
        if moved and self.on_restart is not None:
            self.on_restart(trial, arm.name, stretch)

    async def deployment(self) -> Deployment:
        """The incumbent (the arm to return to), the trial arm as the "canary", and readiness.

        A trial that waits for a rollback to finish is applied here once the target is back
        on its incumbent and ready. A target on its incumbent for a switchback's A stretch
        is a trial under way: its arm is reported ready (it served its B stretch), and
        :class:`SwitchbackMetrics` switches it onto B for the next pair.
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
            if current.name == incumbent.name and notes.get(ANNOTATION_STRETCH):
                # Between two pairs of the switchback (or in an A stretch cut short).
                return Deployment(
                    incumbent, arm, True, None, False, version, placement=Placement.IN_PLACE
                )
            # The trial waits for a rollback to the incumbent to finish: start it now.
            if current.name == incumbent.name and state.readiness is Readiness.READY:
                await self._apply(target, arm, arm.name, incumbent.name, Stretch.TRIAL)
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
            trial = notes.get(ANNOTATION_TRIAL)
            if trial and self._arm(target).name != back.name and self.on_restart is not None:
                self.on_restart(trial, back.name, Stretch.INCUMBENT)
            await k.patch_target(self._patch_to(back, arm.name, incumbent))
            return
        await self._apply(target, arm, arm.name, incumbent, Stretch.TRIAL)

    async def switch(self, stretch: Stretch) -> bool:
        """Put the target on the running trial's arm (B) or its incumbent (A) for the next
        stretch of the switchback; True when that restarts the pods (False: already there,
        or no trial runs)."""
        target = await self._kube.read_target()
        notes = _notes(target)
        trial = notes.get(ANNOTATION_TRIAL)
        if not trial:
            return False
        incumbent = notes.get(ANNOTATION_INCUMBENT) or self._arm(target).name
        arm = parse_arm(trial if stretch is Stretch.TRIAL else incumbent)
        moved = self._arm(target).name != arm.name
        held = notes.get(ANNOTATION_STRETCH) == Stretch.INCUMBENT.value
        if moved or held != (stretch is Stretch.INCUMBENT):
            await self._apply(target, arm, trial, incumbent, stretch)
        return moved

    async def rollout(self) -> Readiness:
        """The target's rollout now: waiting, ready or stuck."""
        k = self._kube
        target = await k.read_target()
        return classify_rollout(target, await k.pods(target)).readiness

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
        edit is the user's); only the trial's annotations go. A switchback that ended on
        its A stretch is there already: nothing restarts.
        """
        if not self._rollback_owed:
            return
        self._rollback_owed = False
        k = self._kube
        target = await k.read_target()
        notes = _notes(target)
        trial = notes.get(ANNOTATION_TRIAL)
        if not trial:
            return
        if human_edit(target, k.container, k.engine):
            await k.patch_target(
                lambda _: {
                    "metadata": {
                        "annotations": {
                            ANNOTATION_TRIAL: None,
                            ANNOTATION_INCUMBENT: None,
                            ANNOTATION_STRETCH: None,
                        }
                    }
                },
                guarded=False,
            )
            return
        incumbent = parse_arm(notes.get(ANNOTATION_INCUMBENT) or self._arm(target).name)
        await self._apply(target, incumbent, trial, incumbent.name, Stretch.INCUMBENT, keep=False)


# -- metrics ------------------------------------------------------------------------------------


class SwitchbackMetrics:
    """The controller's GroupMetrics for the in-place strategy (see the module docstring).

    Outside a trial a window is the target's, as the incumbent's. During a trial one window
    is one A/B pair: the target on the trial arm (switched there first if a pair before left
    it on the incumbent), a wash-out, a window of it (the "canary" observation); then the
    target back on the incumbent, a wash-out, a window of it (the "incumbent" observation).
    A stretch whose rollout does not become ready within ``ready_timeout_s`` (or is stuck)
    ends the pair with what was measured; the next step's readiness check of the target
    says why.

    Parameters
    ----------
    source
        The target's pods (Prometheus selector or pod scrape).
    actuator
        Switches the target between the two arms and reads its rollout.
    arms
        ``(incumbent, trial)`` arm names as the actuator last saw them; ``trial`` is None
        when no trial runs or its rollout is not ready.
    sleep
        The operator's sleep (the tuning loop's cuts a window short on a spec change).
    waits
        Whether ``source`` waits out the window itself (the pod scraper does).
    washout_s
        Seconds after a stretch's arm is Ready before its window starts.
    poll_s, ready_timeout_s
        How often to look at a restart's rollout, and for how long at most.
    """

    def __init__(
        self,
        source: WindowedSource,
        actuator: InPlaceActuator,
        arms: Callable[[], tuple[str | None, str | None]],
        sleep: Callable[[float], Awaitable[None]],
        waits: bool,
        washout_s: float,
        poll_s: float,
        ready_timeout_s: float,
    ) -> None:
        self._source = source
        self._actuator = actuator
        self._arms = arms
        self._sleep = sleep
        self._waits = waits
        self._washout_s = washout_s
        self._poll_s = poll_s
        self._ready_timeout_s = ready_timeout_s

    async def _window(self, window_s: float) -> Observation:
        if not self._waits:
            await self._sleep(window_s)
        return await self._source.observe(window_s)

    async def observe(self, window_s: float) -> Mapping[Group, Observation]:
        """The target's window alone, or (during a trial) one A/B pair of windows."""
        incumbent, trial = self._arms()
        if trial is None:
            obs = await self._window(window_s)  # no series: nothing was measured (raises)
            return {Group.INCUMBENT: obs}
        out: dict[Group, Observation] = {}
        b = await self._stretch(Stretch.TRIAL, window_s)
        if b is None:
            return out
        out[Group.CANARY] = b
        if incumbent is None:
            return out
        a = await self._stretch(Stretch.INCUMBENT, window_s)
        if a is not None:
            out[Group.INCUMBENT] = a
        else:
            log.info("switchback %s: no window of the incumbent %s; unpaired", trial, incumbent)
        return out

    async def _stretch(self, stretch: Stretch, window_s: float) -> Observation | None:
        """One stretch: switch (a restart, when the target runs the other arm), wait for the
        rollout, wash out, measure. None when the rollout did not finish or nothing was
        measured."""
        if await self._actuator.switch(stretch) and not await self._ready():
            return None
        await self._sleep(self._washout_s)
        try:
            return await self._window(window_s)
        except NoDataError as exc:
            log.info("switchback %s stretch: no data (%s)", stretch.value, exc)
            return None

    async def _ready(self) -> bool:
        waited = 0.0
        while waited <= self._ready_timeout_s:
            readiness = await self._actuator.rollout()
            if readiness is Readiness.READY:
                return True
            if readiness is Readiness.STUCK:
                return False
            await self._sleep(self._poll_s)
            waited += self._poll_s
        return False
