"""The simulator body's ports: a simulated fleet behind the controller's Actuator, GroupMetrics
and Clock (``control/ports.py``).

The bench's runner builds one :class:`SimStage` over a :class:`~spectune.sim.Fleet` and
hands the controller its three faces. The brain sees only what a cluster would show it:

* :class:`SimActuator` starts the canary on extra replicas (the fleet's last
  ``canary_replicas``, parked while no canary runs, as a canary Deployment's pods are extra
  pods on a cluster) with a restart, and promotes with a rolling update of the target's
  replicas as Kubernetes' default strategy runs it for fewer than four replicas (maxSurge
  1, maxUnavailable 0): a new pod first, on the GPU the stopped canary frees, then one old
  pod at a time drains and its GPU takes the next new pod; the last old pod's GPU becomes
  the canary's slot. The service never has fewer than its replicas serving, and
  exploration costs what it costs on a cluster. Stopping a canary drains and parks it.
  Scenario ``model_version`` events appear in ``Deployment.model_version``, ``route_mix``
  events in ``Deployment.routes`` (a fingerprint of the route shares).
* :class:`SimGroupMetrics` scrapes every serving replica's ``/metrics`` text at the start
  and the end of a window, parses it with :func:`~spectune.metrics.parse_page`, and builds
  one :class:`~spectune.metrics.Observation` per group with
  :func:`~spectune.metrics.observation_from_pages` — the path a real pod takes. Pods are
  named ``replica-<i>-<generation>`` (a restart is a new pod, as in Kubernetes), and a
  draining replica is not scraped (its pod is terminating). Each pod's counts carry its
  engine's start, as the operator's ``k8s/pods.py`` gives them the pod's ``startTime``:
  what per-pod decay compares pods by.
* :class:`SimPods` is the Pods port (``retune.drift.podAction: restartPod``): deleting a
  target pod restarts its replica on the arm it runs (a ReplicaSet replaces the pod).
* :class:`VirtualClock` is simulated time: sleeping advances the fleet.

:class:`SimStage` is the one place simulated time moves, so the rollout progresses whoever
advances the clock. It never advances past ``end_s``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from spectune.control.placement import choose_placement
from spectune.control.ports import Deployment, Group, Placement
from spectune.errors import SpecError, WindowCutError
from spectune.metrics import Observation, Snapshot, observation_from_pages, parse_page
from spectune.search.arms import Arm
from spectune.sim.fleet import Fleet, Phase, ReplicaState
from spectune.sim.scenario import ModelVersionEvent, RouteMixEvent

__all__ = ["SimActuator", "SimGroupMetrics", "SimPods", "SimStage", "VirtualClock"]

#: While a rolled replica drains (its end time is unknown), time moves in steps this long.
DRAIN_POLL_S = 1.0


class SimStage:
    """A fleet plus the canary and rollout state an actuator keeps on a cluster.

    Attributes
    ----------
    incumbent
        The arm the target runs or is rolling to.
    trials
        Configuration changes applied: each canary start and each promotion that changes
        the target (a promotion that cannot start counts too: a pod was restarted for it).
    timeline
        ``(time, arm)`` at time 0 and at every promotion that changed the target.
    served
        ``(time, arm)`` at time 0 and whenever a rollout ended: from then on every pod of
        the target runs ``arm``.
    """

    def __init__(
        self,
        fleet: Fleet,
        *,
        canary_replicas: int = 1,
        end_s: float,
        placement: str = "auto",
    ) -> None:
        n = fleet.size
        spare = n - fleet.scenario.fleet.replicas
        if placement not in ("auto", "replace", "beside"):
            raise SpecError(f"placement must be auto, replace or beside, got {placement!r}")
        verdict = choose_placement(placement, fleet.scenario.fleet.replicas, canary_replicas)
        replace_ok = verdict.matched
        wanted_slots = 2 * canary_replicas if replace_ok else canary_replicas
        if not 1 <= canary_replicas < n or spare != wanted_slots:
            raise SpecError(
                f"canary replicas must be within 1..{n - 1} and the fleet's last "
                f"{wanted_slots} replicas parked slots for them (build it with "
                f"sim_controller, which adds them): it has {spare}"
            )
        self.fleet = fleet
        self.end_s = end_s
        self.placement = verdict.placement
        self.placement_reason = verdict.reason
        self.placement_message = verdict.message
        self.canary_idx = tuple(range(n - spare, n - spare + canary_replicas))
        # Replace: a second set of slots, so a trial that follows another surges its new
        # canary before the old one leaves (the target stays at N−c in between).
        self._spare = tuple(range(n - spare + canary_replicas, n))
        self._old: tuple[int, ...] = ()
        self._displaced: tuple[int, ...] = ()
        self._restoring: tuple[int, ...] = ()
        self._promote_after: Arm | None = None
        self.incumbent: Arm = fleet.scenario.initial_arm
        self.canary_arm: Arm | None = None
        self.canary_failure: str | None = None
        self.promotion_failure: str | None = None
        self.trials = 0
        self.timeline: list[tuple[float, str]] = [(0.0, self.incumbent.name)]
        self.served: list[tuple[float, str]] = [(0.0, self.incumbent.name)]
        self._configured: list[Arm] = [s.arm for s in fleet.states()]
        self._generation = [0] * n
        self._queue: list[int] = []
        self._current: int | None = None
        self._retire: int | None = None
        self._model_events = [e for e in fleet.scenario.events if isinstance(e, ModelVersionEvent)]
        self._route_events = sorted(
            (e for e in fleet.scenario.events if isinstance(e, RouteMixEvent)),
            key=lambda e: e.at_s,
        )

    # --- replicas -----------------------------------------------------------------------

    @property
    def now(self) -> float:
        """Simulated seconds."""
        return self.fleet.now

    def pod(self, i: int) -> str:
        """Replica ``i``'s current pod name."""
        return f"replica-{i}-{self._generation[i]}"

    def role(self, i: int) -> Group | None:
        """Which group replica ``i`` belongs to now (None: a canary pod on its way out,
        whose endpoints a cluster has already removed)."""
        if i in self._old or (i in self.canary_idx and self._restoring):
            return None
        if self.canary_arm is not None and i in self.canary_idx:
            return Group.CANARY
        return Group.INCUMBENT

    def _apply(self, arm: Arm, replicas: Sequence[int]) -> str | None:
        if not replicas:
            return None
        result = self.fleet.apply(arm, replicas)
        for i in replicas:
            self._configured[i] = arm
            self._generation[i] += 1
        return result.failure

    def restart(self, i: int) -> None:
        """Replace replica ``i``'s pod with a new one on the arm it is configured with."""
        self._apply(self._configured[i], [i])

    # --- canary -------------------------------------------------------------------------

    def start_canary(self, arm: Arm) -> None:
        """Restart the canary replicas on ``arm``.

        Replace placement: a canary that serves another arm keeps serving until the new
        one is ready on the other slots (surge), so the target stays at N−c between trials.
        """
        self.fleet.scenario.check_arm(arm)
        surge = self.placement is Placement.REPLACE and (
            self._restoring or (self.canary_arm is not None and self._serving(self.canary_idx))
        )
        if surge:
            self._old = (*self._old, *self.canary_idx)
            self.canary_idx, self._spare = self._spare, self.canary_idx
        self.canary_arm = arm
        self.trials += 1
        self.canary_failure = self._apply(arm, self.canary_idx)

    def stop_canary(self) -> None:
        """End the canary: its pods go away (drain, then park), as a deleted Deployment's.

        Replace placement: the target's displaced replicas come back first (new pods, on
        the incumbent); the canary serves until they do (:meth:`_place`).
        """
        if self.canary_arm is None:
            return
        self.canary_arm = None
        self.canary_failure = None
        if not self._displaced:
            self.fleet.park(self.canary_idx)
            return
        if self._old:
            # A switch was under way: its new canary goes now, the old one still serves.
            self.fleet.park(self.canary_idx)
            self.canary_idx, self._spare, self._old = self._old, self.canary_idx, ()
        self._restoring, self._displaced = self._displaced, ()
        self._apply(self.incumbent, self._restoring)

    def _serving(self, replicas: Sequence[int], arm: Arm | None = None) -> bool:
        states = [self.fleet.state(i) for i in replicas]
        return all(st.phase is Phase.SERVING and (arm is None or st.arm == arm) for st in states)

    def _target_replicas(self) -> list[int]:
        """The target's replicas (every one not a canary slot)."""
        slots = {*self.canary_idx, *self._spare, *self._old}
        return [i for i in range(self.fleet.size) if i not in slots]

    def _place(self) -> None:
        """Move replace placement on (what the operator's actuator reconciles each turn).

        A restored target serving again lets the leaving canary go; a new canary serving
        lets the one before it go; once the canary serves and the target is whole (no
        rollout, nothing restoring), c of the target's replicas leave, so N pods serve.
        """
        if self.placement is not Placement.REPLACE:
            return
        if self._restoring:
            back = [self.fleet.state(i).phase for i in self._restoring]
            if any(p not in (Phase.SERVING, Phase.FAILED) for p in back):
                return
            self._restoring = ()
            if self.canary_arm is None:
                self.fleet.park(self.canary_idx)
            if self._promote_after is not None:
                arm, self._promote_after = self._promote_after, None
                self.promote(arm)
        canary = self.canary_arm
        serving = canary is not None and self._serving(self.canary_idx, canary)
        if self._old and (canary is None or serving):
            # Nothing needs the old canary any more: no trial, or the new one serves.
            self.fleet.park(self._old)
            self._spare, self._old = self._old, ()
        if serving and not self._displaced and not self.rolling:
            target = self._target_replicas()
            self._displaced = tuple(target[-len(self.canary_idx) :])
            self.fleet.park(self._displaced)

    # --- promotion ----------------------------------------------------------------------

    def promote(self, arm: Arm) -> None:
        """Start a rolling update of the target onto ``arm``.

        Replace placement: while the target's displaced replicas come back, the rollout
        waits for them, so it rolls the target at N (``rolling`` is True meanwhile).
        """
        self.fleet.scenario.check_arm(arm)
        if self._restoring:
            self._promote_after = arm
            return
        if arm == self.incumbent:
            # Back to what the target serves (a rollback of a promotion that could not
            # start): the failed new pod goes, the old ones never stopped.
            self.promotion_failure = None
            return
        failure = self.fleet.physics(arm).failure
        self.trials += 1
        if failure is not None:
            # The first new pod crash-loops; Kubernetes keeps the old ones serving.
            self.promotion_failure = f"{arm.name}: {failure}"
            return
        self.promotion_failure = None
        self.incumbent = arm
        self.timeline.append((self.now, arm.name))
        old = [i for i in self._target_replicas() if self._configured[i] != arm]
        # Surge onto the canary's slot first; each old pod's GPU then takes the next new
        # pod (a restart of that replica: it drains, is down restart_s, serves the arm);
        # the last old pod is only retired, and its slot is the canary's from then on.
        # (A canary still running keeps its slot: then each old pod restarts in place.)
        surge = bool(old) and self.canary_arm is None
        self._queue = [self.canary_idx[0], *old[:-1]] if surge else old
        self._retire = old[-1] if surge else None
        self._current = None
        if not old:
            self.served.append((self.now, arm.name))  # every pod already runs it
        self._roll()

    @property
    def rolling(self) -> bool:
        """Whether a rollout (or, replace placement, the target's return to N) is in
        progress."""
        return (
            self._current is not None
            or bool(self._queue)
            or bool(self._restoring)
            or self._promote_after is not None
        )

    def _roll(self) -> None:
        """Move the rollout on: the next replica once the current one serves the target."""
        while True:
            if self._current is not None:
                st = self.fleet.state(self._current)
                done = (st.phase is Phase.SERVING and st.arm == self.incumbent) or (
                    st.phase is Phase.FAILED
                )
                if not done:
                    return
                self._current = None
                if not self._queue:
                    self.served.append((self.now, self.incumbent.name))
            if not self._queue:
                if self._retire is not None:
                    self.fleet.park([self._retire])
                    self.canary_idx = (*self.canary_idx[1:], self._retire)
                    self._retire = None
                return
            self._current = self._queue.pop(0)
            self._apply(self.incumbent, [self._current])

    # --- time ---------------------------------------------------------------------------

    def advance_to(self, t: float) -> None:
        """Move simulated time to ``min(t, end_s)``, moving the rollout along the way."""
        t = min(t, self.end_s)
        self._roll()
        self._place()
        while self.fleet.now < t:
            step_to = t
            if self._current is not None:
                st = self.fleet.state(self._current)
                if st.phase is Phase.DOWN and st.ready_at_s is not None:
                    step_to = min(t, max(st.ready_at_s, self.fleet.now))
                else:
                    step_to = min(t, self.fleet.now + DRAIN_POLL_S)
            self.fleet.advance(step_to)
            self._roll()
            self._place()

    # --- what the actuator reports ----------------------------------------------------------

    def routes(self) -> str:
        """A fingerprint of the route shares now in effect."""
        shares = {r.name: r.share for r in self.fleet.scenario.routes}
        applied = sum(1 for e in self.fleet.applied_events if e.kind == "route_mix")
        for ev in self._route_events[:applied]:
            shares.update(ev.shares)
        total = sum(shares.values()) or 1.0
        return ",".join(f"{k}={v / total:.4g}" for k, v in sorted(shares.items()))

    def deployment(self) -> Deployment:
        """What runs now."""
        self._roll()
        self._place()
        ready = False
        failure = self.canary_failure
        if self.canary_arm is not None:
            states = [self.fleet.state(i) for i in self.canary_idx]
            ready = all(s.phase is Phase.SERVING and s.arm == self.canary_arm for s in states)
            if failure is None:
                failure = next((s.failure for s in states if s.failure is not None), None)
            if self.placement is Placement.REPLACE:
                # The first window starts when the target serves at N−c, the canary alone
                # in the place of the pods that left.
                gone = [self.fleet.state(i).phase for i in (*self._displaced, *self._old)]
                ready = ready and bool(self._displaced) and not self._old and not self._restoring
                ready = ready and all(p is Phase.PARKED for p in gone)
        return Deployment(
            incumbent=self.incumbent,
            canary=self.canary_arm,
            canary_ready=ready and failure is None,
            canary_failure=failure,
            rolling=self.rolling,
            model_version=self.fleet.model_version,
            routes=self.routes(),
            target_failure=self.promotion_failure,
            placement=self.placement,
            placement_reason=self.placement_reason,
            placement_message=self.placement_message,
        )

    def next_model_change(self, after_s: float) -> float | None:
        """When the next ``model_version`` event after ``after_s`` takes effect, or None."""
        times = [e.at_s for e in self._model_events if e.at_s > after_s]
        return min(times) if times else None

    def incumbent_at(self, t: float) -> str:
        """The target's arm (as promoted) at simulated time ``t``."""
        arm = self.timeline[0][1]
        for at, name in self.timeline:
            if at <= t:
                arm = name
        return arm


class SimActuator:
    """The Actuator port over a :class:`SimStage`."""

    def __init__(self, stage: SimStage) -> None:
        self.stage = stage

    async def deployment(self) -> Deployment:
        """What runs now."""
        return self.stage.deployment()

    async def start_canary(self, arm: Arm) -> None:
        """Restart the canary replicas on ``arm``."""
        self.stage.start_canary(arm)

    async def stop_canary(self) -> None:
        """Remove the canary."""
        self.stage.stop_canary()

    async def promote(self, arm: Arm) -> None:
        """Roll the target onto ``arm``."""
        self.stage.promote(arm)


class VirtualClock:
    """The Clock port: simulated seconds; sleeping advances the fleet."""

    def __init__(self, stage: SimStage) -> None:
        self.stage = stage

    def now(self) -> float:
        """Simulated seconds."""
        return self.stage.now

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of simulated time pass."""
        self.stage.advance_to(self.stage.now + max(0.0, seconds))


class SimGroupMetrics:
    """The GroupMetrics port: replicas' exposition text at a window's ends, parsed."""

    def __init__(self, stage: SimStage) -> None:
        self.stage = stage

    def _pages(self, at_s: float | None = None) -> dict[str, tuple[Group, Snapshot]]:
        """Every serving pod's page, by pod name with its group.

        ``at_s``: read each pod at ``at_s`` plus its scrape offset (``fleet.scrape_offset_s``),
        moving the clock from one pod's scrape to the next; None: all of them now.
        """
        stage = self.stage
        fleet = stage.fleet
        order = list(range(fleet.size))
        if at_s is not None:
            order.sort(key=fleet.scrape_offset)
        out: dict[str, tuple[Group, Snapshot]] = {}
        for i in order:
            if at_s is not None:
                stage.advance_to(at_s + fleet.scrape_offset(i))
            st = fleet.state(i)
            role = stage.role(i)
            if st.phase is not Phase.SERVING or role is None:
                continue
            pod = stage.pod(i)
            out[pod] = (role, parse_page(fleet.metrics_text(i), pod))
        return out

    def _failed(self) -> dict[Group, dict[str, str]]:
        out: dict[Group, dict[str, str]] = {}
        states: Sequence[ReplicaState] = self.stage.fleet.states()
        for st in states:
            role = self.stage.role(st.index)
            if st.phase is Phase.FAILED and st.failure is not None and role is not None:
                out.setdefault(role, {})[self.stage.pod(st.index)] = st.failure
        return out

    async def observe(self, window_s: float) -> Mapping[Group, Observation]:
        """Scrape, wait out the window, scrape again; one Observation per group.

        A window that a ``model_version`` event falls into is cut there, as the operator
        cuts one when the target's model version changes: :class:`WindowCutError`. So is
        one that the end of the scenario cuts short: the operator never reads a window
        shorter than its length, and nothing may be decided on one (a trial started on it
        would count as a restart the run never measures).
        """
        start = self.stage.now
        lag = self.stage.fleet.max_scrape_offset
        if start + window_s + lag > self.stage.end_s:
            self.stage.advance_to(self.stage.end_s)
            raise WindowCutError(
                f"the scenario ends at {self.stage.end_s:.0f}s, {self.stage.end_s - start:.0f}s "
                f"into a {window_s:.0f}s window: the window is dropped"
            )
        # Scrape offsets: each pod is read at its own phase after the window's nominal ends,
        # so its counters span exactly window_s, shifted by up to the offset.
        staggered = lag > 0
        before = self._pages(start if staggered else None)
        version = self.stage.fleet.model_version
        cut = self.stage.next_model_change(start)
        if cut is not None and cut < start + window_s:
            # Events at exactly the time reached are applied by the next advance; the
            # operator sees a change within a poll, here within a simulated second.
            self.stage.advance_to(cut + 1.0)
            if self.stage.fleet.model_version != version:
                raise WindowCutError(
                    f"model version changed to {self.stage.fleet.model_version} at "
                    f"{cut:.0f}s, mid-window: the window is dropped"
                )
        self.stage.advance_to(start + window_s)
        after = self._pages(start + window_s if staggered else None)
        elapsed = window_s if staggered else self.stage.now - start
        failed = self._failed()
        out: dict[Group, Observation] = {}
        for group in (Group.INCUMBENT, Group.CANARY):
            ends = {pod: snap for pod, (g, snap) in after.items() if g is group}
            if not ends:
                continue
            starts = [snap for pod, (g, snap) in before.items() if g is group and pod in ends]
            obs = observation_from_pages(
                starts, list(ends.values()), window_s=elapsed, failed_pods=failed.get(group)
            )
            out[group] = self._with_starts(obs)
        return out

    def _with_starts(self, obs: Observation) -> Observation:
        """``obs`` with each pod's start where its page had none (the pod's start time)."""
        if not any(c.started_s is None for c in obs.per_pod.values()):
            return obs
        fleet = self.stage.fleet
        started = {self.stage.pod(i): fleet.state(i).started_s for i in range(fleet.size)}
        per_pod = {
            name: c if c.started_s is not None else replace(c, started_s=started.get(name))
            for name, c in obs.per_pod.items()
        }
        return replace(obs, per_pod=per_pod)


class SimPods:
    """The Pods port: the target's serving pods, and deleting one (its replica restarts)."""

    def __init__(self, stage: SimStage) -> None:
        self.stage = stage

    async def ready(self) -> Sequence[str]:
        """The target's pods that serve now."""
        stage = self.stage
        return [
            stage.pod(i)
            for i in range(stage.fleet.size)
            if stage.role(i) is Group.INCUMBENT and stage.fleet.state(i).phase is Phase.SERVING
        ]

    async def evict(self, pod: str) -> str | None:
        """Restart the replica that runs ``pod`` on its arm; an unknown pod is no error (the
        simulator has no disruption budget)."""
        stage = self.stage
        for i in range(stage.fleet.size):
            if stage.pod(i) == pod and stage.fleet.state(i).phase is Phase.SERVING:
                stage.restart(i)
                return None
        return None
