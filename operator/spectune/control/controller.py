"""The tuning loop: observe, record, decide, apply, watch — once, for every body.

The operator's daemon and the bench's harness both build a :class:`Controller` over their
ports and call :meth:`Controller.step` until they stop. A step does one thing (one window
observed, one arm applied, or one wait) and returns, so a body can persist the history and
the state between steps; a controller rebuilt from those continues where the old one left
off without repeating a finished trial.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from spectune.control.ports import (
    Actuator,
    Clock,
    Deployment,
    Group,
    GroupMetrics,
    Placement,
    Pods,
)
from spectune.core import wilson_interval
from spectune.diagnose import Finding, drafter_broken, pod_decay
from spectune.errors import WindowCutError
from spectune.metrics.observation import Observation
from spectune.search.arms import OFF, Arm, parse_arm
from spectune.search.history import History, Outcome, TrialRecord, WindowRecord
from spectune.search.objective import (
    Objective,
    WindowStats,
    same_load,
    saturated,
    window_stats,
)
from spectune.search.policy import (
    ASSUMED_DRAFT_COST,
    Decision,
    DecisionKind,
    Policy,
    SearchSpace,
    TuningContext,
)
from spectune.search.verify import Reference, per_pod_rate, reference_windows, regression

__all__ = ["Controller", "ControllerConfig", "ControllerState", "Event", "Phase", "PodAction"]


#: Fewest finished requests in each of two windows for their loads to be compared (the
#: rates' Poisson noise is then within about ±15 %, far inside the load-shift factor).
MIN_LOAD_REQUESTS = 50

#: Least share of a trial's first window that the canary's counters must span for the window
#: to count. A canary that just became ready is first scraped up to a scrape interval (or,
#: with file-based discovery, a refresh) later, and Prometheus has nothing of it before:
#: a window it saw a tenth of holds a tenth of the requests, stretched to look whole, and
#: one short window can promote an arm by luck. Such a window is measured again, once.
MIN_COVERED = 0.5


class Phase(enum.Enum):
    """The SpecTuning phases (DESIGN.md §3)."""

    BASELINE = "Baseline"
    EXPLORING = "Exploring"
    MONITORING = "Monitoring"
    DRIFTED = "Drifted"
    VERIFYING = "Verifying"
    """Shown, never stepped: a promoted arm is on trial on the target
    (:attr:`ControllerState.shown_phase`); the loop runs its own phase meanwhile."""


class DriftAction(enum.Enum):
    """What a confirmed acceptance drift does."""

    ALERT = "alert"
    RETUNE = "retune"


class PodAction(enum.Enum):
    """What a confirmed per-pod acceptance decay does."""

    ALERT = "alert"
    RESTART_POD = "restartPod"


@dataclass(frozen=True)
class ControllerConfig:
    """Timing and thresholds of the loop (SpecTuning ``search`` and ``retune``)."""

    window_s: float = 300.0
    """Length of one measurement window, seconds."""
    poll_s: float = 15.0
    """How often to look again while waiting for a rollout."""
    ready_timeout_s: float = 1800.0
    """A canary not ready after this long is marked infeasible."""
    max_trials: int = 12
    min_drafts: int = 20000
    """Fewest tokens a drafted trial's canary drafts before the trial is judged."""
    epsilon: float = 0.02
    delta: float = 0.05
    drift_threshold: float = 0.15
    """Relative drop of first-position acceptance that counts as drift."""
    drift_for_s: float = 1800.0
    """...sustained this long."""
    drift_action: DriftAction = DriftAction.RETUNE
    pod_action: PodAction = PodAction.ALERT
    """What a pod whose acceptance decayed with its uptime, for ``drift_for_s``, gets."""
    min_ready_pods: int = 1
    """Ready pods of the target that must keep serving while a decayed one restarts."""
    retune_every_s: float | None = None
    load_shift: float = 1.6
    """A sustained change of the running batch by this factor re-opens the search."""
    retune_on_model_change: bool = True
    """A model-version change re-opens the search; False only records the new version."""
    shared_traffic: bool = True
    """Trials run on canary pods beside the incumbent (the service's load is both groups);
    False for in-place trials (a switchback), whose incumbent figures are the window of the
    same pods on the incumbent next to the trial's."""
    assumed_draft_cost: float = ASSUMED_DRAFT_COST
    """Draft cost c the policy assumes until one is measured (``SPECTUNE_DRAFT_COST``)."""
    verify_windows: int = 2
    """Windows of the target on a newly promoted arm compared with its predecessor's
    before the promotion counts as verified (``search.verifyWindows``; 0: never verify)."""
    seed: int = 0
    time_scale: float = 1.0
    """Pods' seconds per second of this controller's clock (``SPECTUNE_TIME_SCALE`` against a
    time-scaled simulator; 1 in production). Only what the controller reports is converted,
    so rates read in the pods' own units; its decisions compare loads as ratios, which the
    scale does not change."""

    def in_pod_units(self, rate: float) -> float:
        """A rate per controller second in the pods' own units (per pod second)."""
        return rate / self.time_scale

    def in_pod_seconds(self, seconds: float) -> float:
        """A duration on this controller's clock in the pods' own seconds (as the spec's
        windows and ``drift.for`` are given)."""
        return seconds * self.time_scale


@dataclass(frozen=True)
class ControllerState:
    """What the loop remembers besides the history (stored with it in the status)."""

    phase: Phase = Phase.BASELINE
    model_version: str | None = None
    routes: str | None = None
    reference_acceptance: float | None = None
    reference_running: float | None = None
    drift_since_s: float | None = None
    shift_since_s: float | None = None
    converged_at_s: float | None = None
    trial_started_s: float | None = None
    floor_arm: str | None = None
    """The setting the target ran when tuning began: no arm found below it is kept."""
    verify_arm: str | None = None
    """The arm promoted and being verified on the target (None: nothing to verify)."""
    verify_predecessor: str | None = None
    """What the target ran before it: the setting a failed verification restores."""
    verify_since_s: float | None = None
    """When the promotion under verification was applied."""
    verify_seen: int | None = None
    """Windows of the promoted arm on the target so far."""
    verify_judged: int | None = None
    """...of which had a reference at a comparable load."""
    verified_status: str | None = None
    """The ``Verified`` condition: ``True``, ``False`` or ``Unknown`` (None: none yet)."""
    verified_reason: str | None = None
    verified_message: str | None = None
    drafter_status: str | None = None
    """The ``DrafterWorking`` condition: ``False`` after a broken drafter made the target fall
    back (None: no drafter found broken)."""
    drafter_reason: str | None = None
    drafter_message: str | None = None
    decay_since: tuple[tuple[str, float], ...] = ()
    """Each pod whose acceptance is below its younger peers' (``pod_decay``), worst first,
    with since when it was found in every window."""
    decay_reported: str | None = None
    """The decayed pod the ``PodAcceptanceDecay`` event was posted for (once per pod)."""
    pod_restart_s: float | None = None
    """When a decayed pod was last deleted (``podAction: restartPod``)."""
    pods_status: str | None = None
    """The ``PodsHoldAcceptance`` condition: ``False`` while a pod decays, ``True`` after."""
    pods_reason: str | None = None
    pods_message: str | None = None

    @property
    def shown_phase(self) -> Phase:
        """The phase a user sees: ``Verifying`` while a promoted arm is verified, else the
        loop's own."""
        return Phase.VERIFYING if self.verify_arm is not None else self.phase


@dataclass(frozen=True)
class Event:
    """Something a user should see (a Kubernetes Event, a line in the demo)."""

    at_s: float
    reason: str
    message: str


class _FellBack(Exception):
    """The target fell back from a broken drafter: the step ends there."""


@dataclass
class Controller:
    """One SpecTuning's tuning loop over ports."""

    policy: Policy
    actuator: Actuator
    metrics: GroupMetrics
    clock: Clock
    space: SearchSpace
    objective: Objective
    config: ControllerConfig = field(default_factory=ControllerConfig)
    history: History = field(default_factory=History)
    state: ControllerState = field(default_factory=ControllerState)
    on_event: Callable[[Event], None] | None = None
    last_decision: Decision | None = None
    hold_trials: bool = False
    """Set by the body while its metric source is failing: no new trial starts until a
    window has been read again (the incumbent alone)."""
    pods: Pods | None = None
    """The target's pods, where the body can delete one (``podAction: restartPod``)."""
    seen: Mapping[Group, Observation] = field(default_factory=dict)
    """Each group's observation of the latest window (its per-pod counts)."""

    # -- helpers --------------------------------------------------------------------------

    def _event(self, reason: str, message: str) -> None:
        if self.on_event is not None:
            self.on_event(Event(self.clock.now(), reason, message))

    def _context(self, dep: Deployment) -> TuningContext:
        return TuningContext(
            space=self.space,
            objective=self.objective,
            incumbent=dep.incumbent,
            canary_beside=dep.placement is Placement.BESIDE,
            now_s=self.clock.now(),
            max_trials=self.config.max_trials,
            min_drafts=self.config.min_drafts,
            epsilon=self.config.epsilon,
            delta=self.config.delta,
            seed=self.config.seed,
            assumed_draft_cost=self.config.assumed_draft_cost,
        )

    def _running(self) -> TrialRecord | None:
        trials = self.history.in_epoch()
        if trials and trials[-1].outcome is Outcome.RUNNING:
            return trials[-1]
        return None

    async def _observe(
        self,
    ) -> tuple[float, float, dict[Group, WindowStats], dict[Group, float | None]]:
        """One window: its start and end, each group's figures, and the share of it each
        group's counters span (``Observation.covered``; None when the source read it
        whole). The end is when the source answered, not when the figures were computed."""
        start = self.clock.now()
        groups = await self.metrics.observe(self.config.window_s)
        self.seen = dict(groups)
        end = self.clock.now()
        if not self.config.shared_traffic:
            # An in-place trial window is a switchback pair (k8s/inplace.py): each arm ran
            # window_s, one after the other, with a restart and a wash-out between. The
            # record spans window_s, so its loads (requests per second) read per stretch.
            start = max(start, end - self.config.window_s)
        stats = {g: window_stats(o, self.objective) for g, o in groups.items()}
        return start, end, stats, {g: o.covered for g, o in groups.items()}

    async def _trial_window(
        self, running: TrialRecord
    ) -> tuple[float, float, dict[Group, WindowStats]]:
        """A window of a running trial (start, end, figures); its first is measured again,
        once, when the canary's counters span less than :data:`MIN_COVERED` of it."""
        start, end, stats, covered = await self._observe()
        seen = covered.get(Group.CANARY)
        if not running.windows and seen is not None and seen < MIN_COVERED:
            self._event(
                "WindowRepeated",
                f"{running.arm}: the canary's metrics cover {seen:.0%} of the trial's first "
                "window (Prometheus first scraped it late); measuring the window again",
            )
            start, end, stats, _ = await self._observe()
        return start, end, stats

    # -- re-triggers ------------------------------------------------------------------------

    async def _retrigger(self, dep: Deployment) -> bool:
        """Open a new epoch when the model or the routes changed; True if it did."""
        st = self.state
        if st.model_version is None:
            self.state = replace(st, model_version=dep.model_version, routes=dep.routes)
            return False
        why = None
        if dep.model_version != st.model_version:
            change = f"model version changed {st.model_version} → {dep.model_version}"
            if not self.config.retune_on_model_change:
                self.state = replace(st, model_version=dep.model_version)
                self._event(
                    "ModelChange", f"{change}; retune.onModelChange is false: not re-tuning"
                )
                return False
            why = change
        elif dep.routes and st.routes and dep.routes != st.routes:
            why = "traffic routes changed"
        if why is None:
            return False
        await self._retune(why)
        self.state = replace(self.state, model_version=dep.model_version, routes=dep.routes)
        return True

    async def _retune(self, why: str, load_moved: bool = False) -> None:
        running = self._running()
        if running is not None:
            self.history = self.history.update_last(running.ended(Outcome.ABORTED, why))
            await self.actuator.stop_canary()
        self.history = self.history.new_epoch(load_moved)
        if not load_moved and self.state.verify_arm is not None:
            # The model or the traffic changed: the predecessor's windows no longer say
            # what the target would serve, so the verification cannot finish.
            self._end_verification(
                "Unknown",
                "SearchReopened",
                f"{self.state.verify_arm} was not verified: the search re-opened ({why})",
            )
        # After a load move the incumbent's acceptance is known and its new cost is what
        # the trials measure against it, window by window: no incumbent-only window first.
        self.state = replace(
            self.state,
            phase=Phase.EXPLORING if load_moved else Phase.BASELINE,
            drift_since_s=None,
            shift_since_s=None,
            trial_started_s=None,
        )
        self._event("Retune", f"re-opening the search: {why}")

    # -- the step -----------------------------------------------------------------------------

    async def step(self) -> None:
        """Do one thing: observe a window, apply an arm, or wait for a rollout."""
        dep = await self.actuator.deployment()
        if self.state.floor_arm is None:
            self.state = replace(self.state, floor_arm=dep.incumbent.name)
        if await self._retrigger(dep):
            return
        failed = self._failed_to_start(dep)
        if failed is not None:
            await self._roll_back(dep, failed, "PromotionFailedToStart", infeasible=True)
            return
        if dep.scaled_externally is not None:
            await self._scaled_externally(dep.scaled_externally)
            return
        if dep.rolling:
            await self.clock.sleep(self.config.poll_s)
            return
        phase = self.state.phase
        try:
            if phase is Phase.BASELINE:
                await self._baseline_window(dep)
                self.state = replace(self.state, phase=Phase.EXPLORING)
            elif phase is Phase.EXPLORING:
                await self._explore(dep)
            else:
                await self._monitor(dep)
        except WindowCutError:
            # The model changed mid-window: nothing of the window was recorded, and the
            # next step's re-trigger check opens the new epoch.
            return
        except _FellBack:
            return

    async def _scaled_externally(self, what: str) -> None:
        """Someone else changed the target's replica count during a trial: never fight it.

        The trial's pairing held the target at N−c; a count written by a person, a GitOps
        sync or an autoscaler is theirs to keep. The trial ends (its windows so far stay
        evidence), the canary goes without restoring the old count, and the search goes on
        from the next step at the new size.
        """
        running = self._running()
        if running is not None:
            outcome = Outcome.MEASURED if running.windows else Outcome.ABORTED
            self._end_running(outcome, f"the target was scaled by someone else: {what}")
        await self.actuator.stop_canary()
        self.state = replace(self.state, trial_started_s=None)
        self._event("ScaledExternally", f"{what}; the trial ended and the new count is kept")

    async def _baseline_window(self, dep: Deployment) -> WindowRecord:
        """One window of the incumbent alone, recorded with the arm it ran."""
        start, end, stats, _ = await self._observe()
        w = WindowRecord(start, end, stats.get(Group.INCUMBENT), None, dep.incumbent.name)
        self.history = self.history.add_baseline(w)
        await self._fall_back_if_broken(dep, w.incumbent)
        return w

    async def _explore(self, dep: Deployment) -> None:
        running = self._running()
        if running is None and (self.hold_trials or self._stale() or self._unseen(dep)):
            # The metric source just failed, or a long rollout (a promotion under load)
            # left the evidence older than a window, or an arm promoted while the search
            # goes on has not yet run alone: look at the incumbent before choosing (the
            # load may have moved); a failure here starts nothing.
            w = await self._baseline_window(dep)
            if not await self._verify(dep, w):
                await self._load_moved(w)
            return
        if running is not None:
            if dep.canary_failure:
                self._end_running(Outcome.INFEASIBLE, dep.canary_failure)
                await self.actuator.stop_canary()
                self._event("TrialInfeasible", f"{running.arm}: {dep.canary_failure}")
            elif not dep.canary_ready or (
                dep.canary is not None and dep.canary.name != running.arm
            ):
                started = self.state.trial_started_s or self.clock.now()
                if self.clock.now() - started > self.config.ready_timeout_s:
                    why = (
                        "canary never became ready in "
                        f"{self.config.in_pod_seconds(self.config.ready_timeout_s):g}s"
                    )
                    self._end_running(Outcome.INFEASIBLE, why)
                    await self.actuator.stop_canary()
                    self._event("TrialInfeasible", f"{running.arm}: {why}")
                else:
                    await self.clock.sleep(self.config.poll_s)
                return
            else:
                start, end, stats = await self._trial_window(running)
                w = WindowRecord(
                    start,
                    end,
                    stats.get(Group.INCUMBENT),
                    stats.get(Group.CANARY),
                    dep.incumbent.name,
                )
                self.history = self.history.update_last(running.with_window(w))
                await self._fall_back_if_broken(dep, w.incumbent)
                if await self._verify(dep, w) or await self._below_floor(dep, running, w):
                    return
                moved = self._load_move(w)
                if moved is not None:
                    await self._promote_then_retune(dep, moved)
                    return
        decision = self.policy.decide(self._context(dep), self.history)
        self.last_decision = decision
        await self._act(decision, dep)

    def _unseen(self, dep: Deployment) -> bool:
        """Whether the incumbent was promoted mid-search and has not run alone since.

        Trials run on canary pods added beside the target's, so every trial window sees
        less load per pod than the target carries alone. One window of the promoted arm
        alone is its only look at that load: there it may saturate where the trials did
        not (a load that leaves each of n + 1 pods below capacity raises each of n pods'
        utilisation by (n + 1)/n, past capacity when it was within that of it), and the
        load move that shows is caught before the next trial is chosen.
        """
        trials = self.history.in_epoch()
        if not trials or trials[-1].incumbent == dep.incumbent.name:
            return False
        last = trials[-1]
        since = max((w.end_s for w in last.windows), default=last.started_s)
        if any(
            w.incumbent_arm == dep.incumbent.name and w.start_s >= since
            for w in self.history.baseline_windows()
        ):
            return False
        return not self._foreseen(dep.incumbent.name)

    def _foreseen(self, arm: str) -> bool:
        """Whether the load the promoted ``arm`` carries alone is one already seen to be safe.

        Its canary windows give its batch at the trial's load per pod; Little's law scales
        that to the target's (the service's finished requests over the target's pods). The
        window alone can be spared when that batch is no larger than the one the epoch's
        last window alone carried (or the same load, :func:`same_load`), the arm never
        saturated on the canary, and its KV pool holds at least as many blocks per running
        request as that window's arm had: nothing the window would show is unseen. That
        holds when the last window alone was saturated too: what the window could show is
        a batch grown past the load-move factor, and an arm that runs no larger a batch in
        as large a pool cannot grow one past a saturated arm's. Sparing it matters: the
        window alone costs a whole window of the search's time, and after a promotion over
        a queueing incumbent that is time the refinement's trial needs.
        """
        alone = [w.incumbent for w in self.history.baseline_windows() if w.incumbent]
        base = alone[-1] if alone else None
        if base is None or not base.num_gpu_blocks:
            return False
        if math.isnan(base.running):
            return False
        windows = [
            w for t in self.history.in_epoch() if t.arm == arm for w in t.windows if w.canary
        ]
        if not windows:
            return False
        for w in windows:
            can, inc = w.canary, w.incumbent
            if can is None or inc is None or saturated(can) or not can.num_gpu_blocks:
                return False
            if not can.requests > 0 or not can.pods or math.isnan(can.running):
                return False
            scale = 1.0
            if self.config.shared_traffic and inc.pods:
                scale = ((can.requests + inc.requests) / inc.pods) / (can.requests / can.pods)
            batch = can.running * scale
            if batch > base.running and not same_load(base.running, batch, self.config.load_shift):
                return False
            if can.num_gpu_blocks * max(base.running, 1.0) < base.num_gpu_blocks * batch:
                return False
        return True

    def _stale(self) -> bool:
        """Whether the epoch's last window ended more than a window ago (False if none)."""
        ends = [w.end_s for w in self.history.baseline_windows()]
        ends += [w.end_s for t in self.history.in_epoch() for w in t.windows]
        return bool(ends) and self.clock.now() - max(ends) > 2 * self.config.window_s

    async def _promote_then_retune(self, dep: Deployment, why: str) -> None:
        """Re-open the search after a load move, first promoting a clear winner.

        The trial's last window compared canary and incumbent on the same traffic, so it
        holds whatever the load did: if the policy would promote on it, that happens
        before the new epoch (whose first trials then start from the better arm).
        """
        d = self.policy.decide(self._context(dep), self.history)
        if d.kind is DecisionKind.PROMOTE and d.arm is not None and d.arm != dep.incumbent:
            self._end_running(
                Outcome.MEASURED, f"{d.arm.name} promoted before the load move re-opened it", d
            )
            await self.actuator.stop_canary()
            await self.actuator.promote(d.arm)
            self.history = self.history.promoted(d.arm.name)
            self._event("Promoted", f"{d.arm.name} (before re-opening the search): {d.reason}")
            self._begin_verification(d.arm, dep.incumbent)
        await self._retune(why, load_moved=True)

    async def _load_moved(self, w: WindowRecord) -> bool:
        """Re-open the search (a new load epoch) if :meth:`_load_move` says so; True if so."""
        why = self._load_move(w)
        if why is not None:
            await self._retune(why, load_moved=True)
        return why is not None

    def _load_move(self, w: WindowRecord) -> str | None:
        """While exploring: why the search should re-open — the offered load moved since the
        epoch began — or None.

        Draft costs depend on the batch size, so evidence from another load misleads; a new
        epoch keeps only what is load-independent. The load is the whole service's finished
        requests per second (:func:`_load`): a canary is an extra pod that takes its own
        share, so one pod's batch would move with every trial even at constant traffic.
        Small batches count too: a step may be memory-bound, but each new request's prefill
        stalls the decodes around it, so per-token latency follows the request rate.
        """
        windows = [b for b in self.history.baseline_windows() if b.incumbent]
        windows += [x for t in self.history.in_epoch() for x in t.windows if x.incumbent]
        windows.sort(key=lambda x: x.start_s)
        if len(windows) < 2 or w.incumbent is None:
            return None
        first, previous = windows[0], windows[-2]
        shared = self.config.shared_traffic
        (before, b0), (now, b1) = _load(first, shared), _load(w, shared)
        # Sustained: this window and the one before both moved the same way (completions
        # are bursty under saturation; one window is not a new load) — or this one moved
        # by the factor squared, which no burst does.
        factor = self.config.load_shift
        moves = [_moved(first, x, factor, shared) for x in (previous, w)]
        large = _moved(first, w, factor * factor, shared) != 0
        sustained = len(windows) >= 3 and moves[0] != 0 and moves[0] == moves[1]
        if not (large or sustained):
            return None
        before, now = self.config.in_pod_units(before), self.config.in_pod_units(now)
        return (
            f"offered load moved from {before:.2f} to {now:.2f} requests/s (running batch "
            f"{b0:.1f} → {b1:.1f} per pod) while exploring"
        )

    def _end_running(self, outcome: Outcome, reason: str, d: Decision | None = None) -> None:
        """End the running trial; with the decision that ends it, its reason opens with what
        the trial measured (:meth:`_trial_finding`), so each trial's reason describes it."""
        running = self._running()
        if running is not None:
            if d is not None:
                reason = f"{self._trial_finding(running, d)}; {reason}"
            self.history = self.history.update_last(running.ended(outcome, reason))

    def _trial_finding(self, t: TrialRecord, d: Decision) -> str:
        """What trial ``t`` measured: its arm against its incumbent on the objective.

        The deciding policy's estimates when it has measured the arm (ratios to the
        incumbent on one scale, with their 95 % interval), else the mean of the trial's own
        paired windows; a trial with no window says so.
        """
        metric = self.objective.metric.value
        n = len(t.windows)
        over = f"over {n} window{'s' if n != 1 else ''}"
        est, inc = d.estimates.get(t.arm), d.estimates.get(t.incumbent)
        if est is not None and est.measured and inc is not None and inc.value > 0:
            return (
                f"{t.arm} measured at {est.value / inc.value:.2f}× the incumbent "
                f"{t.incumbent}'s {metric} [{est.low / inc.value:.2f}, "
                f"{est.high / inc.value:.2f}] {over}"
            )
        pairs = [
            w.canary.objective / w.incumbent.objective
            for w in t.windows
            if w.canary is not None
            and w.incumbent is not None
            and w.incumbent.objective > 0
            and math.isfinite(w.canary.objective / w.incumbent.objective)
        ]
        if not pairs:
            return f"{t.arm}: no window measured against {t.incumbent}"
        ratio = sum(pairs) / len(pairs)
        return f"{t.arm} measured at {ratio:.2f}× the incumbent {t.incumbent}'s {metric} {over}"

    async def _act(self, d: Decision, dep: Deployment) -> None:
        running = self._running()
        if running is not None and d.end_running is not None:
            self._end_running(d.end_running, d.reason, d)
            if d.end_running is Outcome.ABORTED:
                self._event("TrialAborted", f"{running.arm}: {d.reason}")
            running = None
        if d.kind is DecisionKind.TRIAL and d.arm is not None:
            if running is not None and running.arm == d.arm.name:
                return  # keep measuring the same trial next step
            if running is not None:
                self._end_running(Outcome.MEASURED, f"the next arm, {d.arm.name}, chosen", d)
            trial = TrialRecord(
                arm=d.arm.name,
                incumbent=dep.incumbent.name,
                epoch=self.history.epoch,
                started_s=self.clock.now(),
            )
            self.history = self.history.add_trial(trial)
            self.state = replace(self.state, trial_started_s=self.clock.now())
            await self.actuator.start_canary(d.arm)
            self._event("TrialStarted", f"{d.arm.name} on the canary: {d.reason}")
        elif d.kind is DecisionKind.PROMOTE and d.arm is not None and not d.final:
            # Promote a clear winner and keep searching against it.
            if running is not None:
                self._end_running(Outcome.MEASURED, f"{d.arm.name} promoted; the search goes on", d)
            await self.actuator.stop_canary()
            if d.arm.name != dep.incumbent.name:
                await self.actuator.promote(d.arm)
                self.history = self.history.promoted(d.arm.name)
                self._event("Promoted", f"{d.arm.name} (search continues): {d.reason}")
                self._begin_verification(d.arm, dep.incumbent)
        elif d.kind is DecisionKind.PROMOTE and d.arm is not None:
            if running is not None:
                self._end_running(Outcome.MEASURED, f"the search ended on {d.arm.name}", d)
            await self.actuator.stop_canary()
            if d.arm.name != dep.incumbent.name:
                await self.actuator.promote(d.arm)
            # The search may end on the arm it already promoted while searching: that is
            # its answer already, and nothing is patched, so nothing more is recorded.
            confirmed = self.history.promotions[-1:] == ((self.history.epoch, d.arm.name),)
            if not confirmed:
                self.history = self.history.promoted(d.arm.name)
            self.state = replace(
                self.state,
                phase=Phase.MONITORING,
                converged_at_s=self.clock.now(),
                reference_acceptance=None,
                reference_running=None,
                drift_since_s=None,
                shift_since_s=None,
            )
            if confirmed:
                self._event("Converged", f"{d.arm.name} kept: {d.reason}")
            elif d.arm.name == dep.incumbent.name:
                # Nothing is patched: the target already runs it (the search kept its
                # incumbent), so "Promoted" would announce a change that did not happen.
                self._event("Converged", f"{d.arm.name} kept (the target runs it): {d.reason}")
            else:
                self._event("Promoted", f"{d.arm.name}: {d.reason}")
            if d.arm.name != dep.incumbent.name:
                self._begin_verification(d.arm, dep.incumbent)
        else:
            w = await self._baseline_window(dep)
            if not await self._verify(dep, w):
                await self._load_moved(w)

    # -- a broken drafter ---------------------------------------------------------------------

    async def _fall_back_if_broken(self, dep: Deployment, s: WindowStats | None) -> None:
        """Put the target back on the last good setting at once when its drafter is broken.

        A drafter whose first token (almost) never lands (``diagnose.drafter_broken``: the
        Wilson upper bound of P(L≥1) below 3 % at 99 %) makes every pass pay for a draft
        and a longer verification and emit the one token the target would emit alone: it
        is slower than ``off`` on every load, so waiting for drift's ``for`` or a search
        only prolongs the loss. As a guardrail would, the target goes back to the last
        promoted setting with another drafter (or the floor, or ``off``) in this step; every
        arm of the broken drafter is marked infeasible for the model version (a new version
        may fix it), and the ``DrafterWorking`` condition says why, with the numbers.
        Raises :class:`_FellBack` so the step ends there.
        """
        arm = dep.incumbent
        if arm.drafter is None or s is None or s.k < 1 or not s.drafts > 0:
            return
        first = s.accepted_per_pos[0] if s.accepted_per_pos else None
        length = s.mean_accepted_length
        accepted = (length - 1) * s.drafts if math.isfinite(length) else None
        finding = drafter_broken(s.drafts, first, accepted)
        if finding is None:
            return
        back = self._last_good(arm)
        running = self._running()
        if running is not None:
            outcome = Outcome.MEASURED if running.windows else Outcome.ABORTED
            self._end_running(outcome, f"the target's drafter {arm.drafter} is broken")
            await self.actuator.stop_canary()
        await self.actuator.promote(back)
        history = self.history.promoted(back.name)
        why = f"{finding.message}; fell back to {back.name}"
        for a in self.space.arms():
            if a.drafter == arm.drafter:
                history = history.failed(a.name, True, f"drafter {arm.drafter} broken")
        if arm.name not in {a.name for a in self.space.arms()}:
            history = history.failed(arm.name, True, f"drafter {arm.drafter} broken")
        self.history = history
        if self.state.verify_arm is not None:
            self._end_verification("False", "DrafterBroken", why)
        phase = self.state.phase
        monitoring = phase in (Phase.MONITORING, Phase.DRIFTED)
        self.state = replace(
            self.state,
            phase=Phase.MONITORING if monitoring else phase,
            converged_at_s=self.clock.now() if monitoring else self.state.converged_at_s,
            reference_acceptance=None,
            reference_running=None,
            drift_since_s=None,
            shift_since_s=None,
            trial_started_s=None,
            drafter_status="False",
            drafter_reason="DrafterBroken",
            drafter_message=f"{arm.name}: {why}"[:1024],
        )
        self._event("DrafterBroken", f"{arm.name}: {why}")
        raise _FellBack

    def _last_good(self, broken: Arm) -> Arm:
        """The setting to fall back to from ``broken``'s drafter: the latest promoted arm of
        another drafter that has not failed since, else the floor if it has another drafter,
        else ``off``."""
        gone = {arm for _, arm, _, _ in self.history.failures}
        names = [a for _, a in reversed(self.history.promotions)]
        if self.state.floor_arm is not None:
            names.append(self.state.floor_arm)
        for name in names:
            arm = parse_arm(name)
            if arm.drafter != broken.drafter and name not in gone:
                return arm
        return OFF

    # -- verification -------------------------------------------------------------------------

    def _begin_verification(self, arm: Arm, predecessor: Arm) -> None:
        """Put a promoted arm on trial on the target (see :meth:`_verify`)."""
        n = self.config.verify_windows
        if n <= 0 or arm.name == predecessor.name:
            return
        self.state = replace(
            self.state,
            verify_arm=arm.name,
            verify_predecessor=predecessor.name,
            verify_since_s=self.clock.now(),
            verify_seen=0,
            verify_judged=0,
            verified_status="Unknown",
            verified_reason="Verifying",
            verified_message=(
                f"{arm.name} promoted over {predecessor.name}: comparing the target's next "
                f"{n} window(s) with {predecessor.name}'s before it"
            ),
        )

    def _end_verification(self, status: str, reason: str, message: str) -> None:
        self.state = replace(
            self.state,
            verify_arm=None,
            verify_predecessor=None,
            verify_since_s=None,
            verify_seen=None,
            verify_judged=None,
            verified_status=status,
            verified_reason=reason,
            verified_message=message,
        )

    async def _verify(self, dep: Deployment, w: WindowRecord) -> bool:
        """Judge a window of a promoted arm on the target; True if it was rolled back.

        A trial measured the arm on canary pods, beside the target and at their share of
        the traffic; this is the first look at what users get. The target's window (alone,
        or beside the next trial's canary) is compared with the predecessor's last windows
        on the target before the promotion, and with the setting the run started on (the
        floor), at a comparable load per pod (``search/verify.py``: beyond the load-shift
        band the window is not judged, never adjusted). Worse with confidence on the
        objective or a guardrail than either: the target goes back to the predecessor (or
        the floor) at once, the arm is marked failing at this load so no policy picks it
        again in this epoch, and the search goes on. ``verify_windows`` windows without
        that: verified (``Verified=True``), or ``Unknown`` when none was comparable.
        """
        st = self.state
        arm, since = st.verify_arm, st.verify_since_s
        if arm is None or since is None or w.incumbent is None or w.incumbent_arm != arm:
            return False
        target = Reference(w.incumbent, per_pod_rate(w), w.canary is not None, w.end_s)
        backs = [("RegressedAfterPromotion", st.verify_predecessor)]
        if st.floor_arm is not None and st.floor_arm not in (st.verify_predecessor, arm):
            backs.append(("BelowInitialSetting", st.floor_arm))
        judged = False
        for reason, back in backs:
            if back is None:
                continue
            refs = reference_windows(self.history, back, since)
            verdict = regression(
                target, refs, self.objective, self.config.load_shift, self.config.verify_windows
            )
            judged = judged or verdict.judged
            if verdict.why is not None:
                rate, ref = (
                    self.config.in_pod_units(r) for r in (target.rate, verdict.reference_rate)
                )
                why = (
                    f"{arm} on the target, {rate:.2f} requests/s per pod, against "
                    f"{back} before it at {ref:.2f}: {verdict.why}"
                )
                await self._roll_back(dep, why, reason, infeasible=False, to=back)
                return True
        seen = (st.verify_seen or 0) + 1
        n_judged = (st.verify_judged or 0) + int(judged)
        if seen < self.config.verify_windows:
            self.state = replace(self.state, verify_seen=seen, verify_judged=n_judged)
            return False
        if n_judged:
            self._end_verification(
                "True",
                "HeldAfterPromotion",
                f"{arm} held against {st.verify_predecessor} over {n_judged} of {seen} window(s) "
                "on the target at a comparable load",
            )
            self._event("Verified", self.state.verified_message or "")
        else:
            self._end_verification(
                "Unknown",
                "LoadNotComparable",
                f"{arm} could not be compared with {st.verify_predecessor}: none of its {seen} "
                f"window(s) on the target ran at a load within {self.config.load_shift:g}x of "
                "the reference windows",
            )
        return False

    def _failed_to_start(self, dep: Deployment) -> str | None:
        """Why the arm under verification cannot start on the target, or None: the
        actuator found its rollout stuck (a crash loop, an out-of-memory, the progress
        deadline passed), or it has rolled for longer than the readiness timeout."""
        st = self.state
        if st.verify_arm is None or st.verify_since_s is None:
            return None
        if dep.target_failure is not None:
            return f"{st.verify_arm} cannot start on the target: {dep.target_failure}"
        waited = self.clock.now() - st.verify_since_s
        if dep.rolling and waited > self.config.ready_timeout_s:
            return (
                f"{st.verify_arm} did not become ready on the target in "
                f"{self.config.in_pod_seconds(self.config.ready_timeout_s):g}s"
            )
        return None

    async def _below_floor(self, dep: Deployment, running: TrialRecord, w: WindowRecord) -> bool:
        """Roll the target back to the floor when a trial of the floor beside it shows the
        target's arm worse with confidence; True if it did.

        The floor is kept by the verification after each promotion, at the load of that
        moment (:meth:`_verify`). The load moves afterwards, and an arm's payoff with it
        (draft costs grow with the batch), so an arm that held against the floor may fall
        below it later. A window in which the floor ran on the canary beside the target at
        a matched load per pod (``WindowRecord.matched``) is the cleanest evidence there
        is: the same traffic, the same time, the same load. There the target is judged
        against the canary by the verification's own test (``search/verify.py``:
        disjoint 95 % intervals on the objective, or a guardrail beyond its tolerance):
        worse with confidence, it is not kept, whatever the policy would conclude.
        """
        floor = self.state.floor_arm
        if floor is None or running.arm != floor or dep.incumbent.name == floor:
            return False
        if w.canary is None or w.incumbent is None or not w.matched:
            return False
        target = Reference(w.incumbent, per_pod_rate(w), True, w.end_s)
        verdict = regression(
            target,
            [Reference(w.canary, per_pod_rate(w, w.canary), True, w.end_s)],
            self.objective,
            self.config.load_shift,
            1,
            where="on the canary",
        )
        if verdict.why is None:
            return False
        why = (
            f"{dep.incumbent.name} on the target beside {floor}, the initial setting, on the "
            f"canary at a matched load: {verdict.why}"
        )
        await self._roll_back(
            dep, why, "BelowInitialSetting", infeasible=False, to=floor, arm=dep.incumbent.name
        )
        return True

    async def _roll_back(
        self,
        dep: Deployment,
        why: str,
        reason: str,
        infeasible: bool,
        to: str | None = None,
        arm: str | None = None,
    ) -> None:
        """Put the target back on ``to`` (the predecessor by default), mark ``arm`` (the
        verified arm by default) failing (``infeasible``: on every load), and go on
        searching."""
        st = self.state
        arm = arm or st.verify_arm
        back = to or st.verify_predecessor
        if arm is None or back is None:
            return
        running = self._running()
        if running is not None:
            # Its incumbent leaves: the trial's pairing ends here.
            outcome = Outcome.MEASURED if running.windows else Outcome.ABORTED
            self._end_running(outcome, f"the target was rolled back to {back}")
            await self.actuator.stop_canary()
        await self.actuator.promote(parse_arm(back))
        self.history = self.history.promoted(back).failed(arm, infeasible, why)
        phase = st.phase
        if phase in (Phase.MONITORING, Phase.DRIFTED):
            phase = Phase.EXPLORING
        message = f"rolled back to {back}: {why}"
        self._end_verification("False", reason, message)
        self.state = replace(self.state, phase=phase, trial_started_s=None)
        self._event("RolledBack", message)

    # -- monitoring ---------------------------------------------------------------------------

    async def _monitor(self, dep: Deployment) -> None:
        """One window on the promoted setting: verify it, then watch for what re-opens tuning.

        A promotion is verified first (:meth:`_verify`); the first window that counts
        drafts sets the acceptance reference. After that, in order: a pod decaying with
        its uptime, the scheduled re-measure, a drift of the acceptance below the
        reference (:meth:`_watch_drift`) and a sustained move of the offered load
        (:meth:`_watch_load`).
        """
        w = await self._baseline_window(dep)
        if await self._verify(dep, w):
            return
        now = self.clock.now()
        inc = w.incumbent
        if inc is None:
            return
        st = self.state
        p1 = _first_position(inc)
        reference = st.reference_acceptance
        if reference is None or not math.isfinite(reference) or st.reference_running is None:
            # The first full window on the promoted setting that counts drafts is the
            # reference. One without (a pod just started: the metric source has no rate
            # of its counters yet) is not: a NaN reference would switch drift detection
            # off for good.
            if math.isfinite(p1):
                self.state = replace(st, reference_acceptance=p1, reference_running=inc.running)
            return
        cfg = self.config
        await self._pod_decay(dep, w)
        st = self.state
        converged = st.converged_at_s
        if cfg.retune_every_s and converged is not None and now - converged >= cfg.retune_every_s:
            every = cfg.in_pod_seconds(cfg.retune_every_s)
            await self._retune(f"scheduled re-measure every {every:g}s")
            return
        drifted, retuned = await self._watch_drift(st, w, inc, p1, now)
        if not retuned:
            await self._watch_load(st, dep, w, inc, now, drifted)

    async def _watch_drift(
        self, st: ControllerState, w: WindowRecord, inc: WindowStats, p1: float, now: float
    ) -> tuple[bool, bool]:
        """Whether the acceptance drifted in window ``w``, and whether tuning was re-opened.

        Drift: the first-position acceptance fell below the reference by the threshold,
        with confidence (the Wilson upper bound is below the line), for ``drift_for_s``.
        The bound, not the point estimate: a window's P(L ≥ 1) over a few thousand drafts
        moves by a percent or two by chance, and a threshold crossed by noise would
        re-tune a healthy setting. The duration keeps a burst of unusual requests from
        counting as a change of the traffic. ``st`` is the state as the window found it.
        """
        cfg = self.config
        drifted = False
        if st.reference_acceptance is not None and not math.isnan(st.reference_acceptance):
            line = st.reference_acceptance * (1 - cfg.drift_threshold)
            upper = _first_position_upper(inc)
            drifted = not math.isnan(upper) and upper < line
        if drifted:
            since = st.drift_since_s if st.drift_since_s is not None else w.start_s
            self.state = replace(self.state, drift_since_s=since)
            if now - since >= cfg.drift_for_s and st.phase is not Phase.DRIFTED:
                msg = (
                    f"acceptance P(L≥1) {p1:.3f} is more than {cfg.drift_threshold:.0%} below "
                    f"{st.reference_acceptance:.3f} for {cfg.in_pod_seconds(now - since):.0f}s"
                )
                self._event("AcceptanceDrift", msg)
                if cfg.drift_action is DriftAction.RETUNE:
                    await self._retune(msg)
                    return drifted, True
                self.state = replace(self.state, phase=Phase.DRIFTED)
        else:
            self.state = replace(self.state, drift_since_s=None)
            if st.phase is Phase.DRIFTED:
                self.state = replace(self.state, phase=Phase.MONITORING)
        return drifted, False

    async def _watch_load(
        self,
        st: ControllerState,
        dep: Deployment,
        w: WindowRecord,
        inc: WindowStats,
        now: float,
        drifted: bool,
    ) -> None:
        """Re-open tuning when the offered load moved, for long enough, from the reference.

        A sustained change of the offered load moves the optimum (DESIGN.md §1.4): draft
        costs grow with the batch. The request rate, not the batch: a batch that grows at
        the same rate is the service slowing down (an acceptance drop, a smaller KV pool),
        not more traffic. A per-batch-size table adapts k inside the engine: a load move
        needs no re-tune. ``st`` is the state as the window found it.
        """
        cfg = self.config
        scheduled = dep.incumbent.schedule is not None
        ref_w = self._reference_window()
        if drifted or ref_w is None or scheduled:
            # While drifted, fewer tokens per pass keep every request in the batch for more
            # passes: that move is the drift's, judged over drift.for.
            self.state = replace(self.state, shift_since_s=None)
            return
        shared = self.config.shared_traffic
        if _moved(ref_w, w, cfg.load_shift, shared) == 0:
            self.state = replace(self.state, shift_since_s=None)
            return
        since = st.shift_since_s if st.shift_since_s is not None else w.start_s
        self.state = replace(self.state, shift_since_s=since)
        # Sustained for two windows — or at once when it moved by the factor squared, or the
        # pods saturated (requests queue for many steps): no burst does that, and every
        # window then costs users.
        full = saturated(inc)
        large = _moved(ref_w, w, cfg.load_shift**2, shared) != 0
        if now - since >= 2 * cfg.window_s or full or large:
            (before, b0), (rate, b1) = _load(ref_w, shared), _load(w, shared)
            before, rate = cfg.in_pod_units(before), cfg.in_pod_units(rate)
            why = (
                f"offered load moved from {before:.2f} to {rate:.2f} requests/s (running "
                f"batch {b0:.1f} → {b1:.1f} per pod)"
            )
            if full:
                why += f"; requests queue (p95 {inc.queue_p95:.1f}s): saturated"
            await self._retune(why, load_moved=True)

    async def _pod_decay(self, dep: Deployment, w: WindowRecord) -> None:
        """Report, and with ``podAction: restartPod`` restart, a pod decaying with its uptime.

        ``diagnose.pod_decay`` compares each pod of the target with the pods started after
        it on the same arm and traffic, so a change of the traffic or the model, which
        moves every pod, is not it. The worst such pod must be found in every window for
        ``drift_for_s`` before it counts: one pod's window draws on the few long requests it
        served, so its drafts are correlated and a single window's binomial bound is
        optimistic; a decay with uptime persists, a bad mix of requests does not.

        A restart is a pod's replacement, which starts at the level its younger peers hold
        (vLLM #41838, SGLang #28771: a restart resets the acceptance). It costs the capacity
        of one pod until the new one is Ready, so it happens only when it is safe: never
        while a trial or a verification runs (their windows would mix the restart in), at
        most one pod per two windows (the second shows the replacement back, or not),
        and only while ``min_ready_pods`` other pods stay Ready to carry the traffic.
        """
        st, cfg, now = self.state, self.config, self.clock.now()
        obs = self.seen.get(Group.INCUMBENT)
        found = pod_decay(obs) if obs is not None else ()
        if not found:
            if st.decay_since or st.pods_status == "False":
                self.state = replace(
                    st,
                    decay_since=(),
                    pods_status="True",
                    pods_reason="AcceptanceEven",
                    pods_message="no pod's acceptance is below that of the pods started after it",
                )
            return
        # Each pod keeps its own clock: where several pods decay (they all age), the worst
        # of them changes from window to window, and one clock for "the worst" would start
        # over at each change and never reach drift.for.
        before = dict(st.decay_since)
        clocks = tuple((str(f.evidence["pod"]), before.get(str(f.evidence["pod"]), w.start_s))
                       for f in found)  # fmt: skip
        self.state = replace(st, decay_since=clocks)
        lasting = [
            (f, since) for f, (_, since) in zip(found, clocks, strict=True)
            if now - since >= cfg.drift_for_s
        ]  # fmt: skip
        if not lasting:
            return
        f, since = lasting[0]
        pod = str(f.evidence["pod"])
        lasted = f"{f.message}, for {cfg.in_pod_seconds(now - since):.0f}s"
        self.state = replace(
            self.state,
            pods_status="False",
            pods_reason="PodAcceptanceDecay",
            pods_message=lasted[:1024],
        )
        if st.decay_reported != pod:
            self.state = replace(self.state, decay_reported=pod)
            self._event("PodAcceptanceDecay", lasted)
        if cfg.pod_action is PodAction.RESTART_POD:
            await self._restart_pod(dep, pod, f)

    async def _restart_pod(self, dep: Deployment, pod: str, f: Finding) -> None:
        """Evict the decayed ``pod`` when every condition of :meth:`_pod_decay` holds and no
        PodDisruptionBudget refuses it (then the restart is held, as for a trial, and tried
        again on a later window)."""
        st, cfg, now = self.state, self.config, self.clock.now()
        held: str | None = None
        if self.pods is None:
            held = "this body cannot delete pods"
        elif self._running() is not None or dep.canary is not None:
            held = "a trial runs"
        elif st.verify_arm is not None:
            held = f"{st.verify_arm} is being verified"
        elif st.pod_restart_s is not None and now - st.pod_restart_s < 2 * cfg.window_s:
            # The window after a deletion holds the replacement's start; the one after it
            # is the first to show whether the replacement is back at its peers' level.
            ago = cfg.in_pod_seconds(now - st.pod_restart_s)
            held = f"a pod was restarted {ago:.0f}s ago, under two windows"
        if held is None and self.pods is not None:
            ready = list(await self.pods.ready())
            others = len([p for p in ready if p != pod])
            if pod not in ready:
                held = f"{pod} is not Ready"
            elif others < cfg.min_ready_pods:
                held = (
                    f"only {others} other Ready pod(s), fewer than retune.drift.minReadyPods "
                    f"{cfg.min_ready_pods}"
                )
        if held is not None:
            self.state = replace(
                self.state,
                pods_message=f"{st.pods_message or f.message}; restart held: {held}"[:1024],
            )
            return
        assert self.pods is not None
        refused = await self.pods.evict(pod)
        if refused is not None:
            self.state = replace(
                self.state,
                pods_message=f"{st.pods_message or f.message}; restart held: {refused}"[:1024],
            )
            return
        p1, peers = f.evidence.get("p_len_ge_1"), f.evidence.get("peers_p_len_ge_1")
        self.state = replace(
            self.state,
            pod_restart_s=now,
            decay_since=tuple(c for c in self.state.decay_since if c[0] != pod),
            pods_message=f"restarted {pod}: {f.message}"[:1024],
        )
        self._event(
            "PodRestarted",
            f"evicted pod {pod} (P(L≥1) {_share(p1)} against {_share(peers)} on the pods started "
            "after it) so that a fresh pod replaces it (retune.drift.podAction: restartPod)",
        )

    def _reference_window(self) -> WindowRecord | None:
        """The first window on the promoted setting (the monitoring reference), or None."""
        converged = self.state.converged_at_s
        if converged is None or self.state.reference_running is None:
            return None
        after = [
            w
            for w in self.history.baseline_windows()
            if w.start_s >= converged and w.incumbent is not None
        ]
        return min(after, key=lambda w: w.start_s) if after else None

    async def run(self, until_s: float) -> None:
        """Step until the clock reaches ``until_s``."""
        while self.clock.now() < until_s:
            await self.step()


def _moved(first: WindowRecord, w: WindowRecord, factor: float, shared: bool) -> int:
    """+1 or −1 when ``w``'s offered load is above or below ``first``'s beyond ``factor``.

    Small batches are not exempt: prefills stall decodes in proportion to the request rate
    whatever the batch (each arriving request's prefill takes a step's time from every
    running decode, so a rate several times over can raise the mean per-token latency by
    a tenth even while the batch stays under a handful), and a ramp caught early is an
    arm promoted before the load peaks.
    """
    (a, ba), (b, bb) = _load(first, shared), _load(w, shared)
    if math.isnan(ba) or math.isnan(bb):
        return 0
    # A rate from a few requests is mostly Poisson noise (±30 % at ten): judge none.
    spans = [x.end_s - x.start_s for x in (first, w)]
    if min(r * t for r, t in zip((a, b), spans, strict=True)) < MIN_LOAD_REQUESTS:
        return 0
    # A saturated service finishes requests at the same rate while its batch (and queue)
    # balloons: a batch growth by the factor squared counts too (a trial's canary, one
    # more pod, shifts the batch per pod by far less). Only growth: a batch that shrinks
    # at a steady rate is a warm-up or a KV pool that got smaller, not less traffic.
    if min(ba, bb) > 0 and bb > ba and not same_load(ba, bb, factor * factor):
        return 1
    # Rates by their ratio alone (same_load's absolute slack is in requests per pod).
    if math.isnan(a) or math.isnan(b) or min(a, b) <= 0 or max(a, b) / min(a, b) <= factor:
        return 0
    return 1 if b > a else -1


def _load(w: WindowRecord, shared: bool) -> tuple[float, float]:
    """(finished requests per second, running batch per pod) of the service in a window.

    ``shared``: the canary serves alongside the incumbent, so the service is both groups.
    Otherwise (in-place trials) the window's trial figures are the whole service and its
    incumbent figures an earlier window of the same pods: the trial side alone counts.
    """
    span = w.end_s - w.start_s
    if shared:
        groups = [s for s in (w.incumbent, w.canary) if s is not None]
        own = w.incumbent
    else:
        own = w.canary or w.incumbent
        groups = [own] if own is not None else []
    if span <= 0 or own is None:
        return math.nan, math.nan
    return sum(s.requests for s in groups) / span, own.running


def _share(value: object) -> str:
    """An acceptance from a finding's evidence as its message writes it (three decimals)."""
    return f"{value:.3f}" if isinstance(value, int | float) else "unknown"


def _first_position(s: WindowStats) -> float:
    if s.drafts > 0 and s.accepted_per_pos:
        return s.accepted_per_pos[0] / s.drafts
    return math.nan


def _first_position_upper(s: WindowStats) -> float:
    if s.drafts > 0 and s.accepted_per_pos:
        return wilson_interval(s.accepted_per_pos[0], s.drafts).high
    return math.nan
