"""A fleet of simulated replicas in virtual time: what the bench, the demo and tests drive.

The :class:`Fleet` owns the traffic stream, the load balancer, the scenario's events and
one engine per replica. It speaks to a driver in the same terms the operator's ports use
on a real cluster:

* :meth:`Fleet.apply` is the actuator — it restarts replicas with a new arm (drain, down
  for ``restart_s``, traffic to the others) and says at once whether the arm can start at
  all (an arm whose KV pool cannot hold one ``max_model_len`` sequence never serves);
* :meth:`Fleet.metrics_text` is a pod's ``/metrics`` page;
* :meth:`Fleet.advance` is the clock;
* :meth:`Fleet.records` are the finished requests, for computing objectives over any span
  (the bench's oracle and efficiency; never shown to a policy).

Replicas that restart get a fresh engine, so their counters reset as a real pod's do, and
their uptime with it: a ``pod_decay`` event's decay counts from the pod's start, so a
replaced pod accepts as well as it did before the decay. A ``drafter_broken`` drafter stays
broken across restarts (the checkpoint is what is broken) until a ``model_version`` event.
Requests that arrive while no replica serves wait at the balancer (as a client retrying)
and count that wait as queue time.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from spectune.errors import SourceUnavailableError, SpecError
from spectune.search.arms import Arm
from spectune.sim.engine import Engine
from spectune.sim.exposition import render_page
from spectune.sim.physics import ArmPhysics, arm_physics, slowed
from spectune.sim.scenario import (
    DrafterBrokenEvent,
    Event,
    LoadEvent,
    ModelVersionEvent,
    PodDecayEvent,
    RouteMixEvent,
    Scenario,
)
from spectune.sim.traffic import Request, Traffic

__all__ = [
    "INITIAL_VERSION",
    "AppliedEvent",
    "ApplyResult",
    "Fleet",
    "FleetTotals",
    "Phase",
    "ReplicaState",
    "RequestRecord",
]

INITIAL_VERSION = "initial"
"""The model version replicas report before the first ``model_version`` event."""


class Phase(enum.Enum):
    """Where a replica is in its life."""

    SERVING = "serving"
    DRAINING = "draining"  # takes no new requests, finishes what it holds, then restarts
    DOWN = "down"  # restarting; serves again at ``ready_at_s``
    FAILED = "failed"  # its arm cannot start; serves nothing until another arm is applied
    PARKED = "parked"  # no pod: takes no traffic until an arm is applied (a canary slot)


@dataclass(frozen=True)
class ReplicaState:
    """A replica as an actuator or a status page sees it."""

    index: int
    phase: Phase
    arm: Arm
    """The arm it runs (serving, draining) or will run (down, failed)."""
    ready_at_s: float | None
    """When a down replica serves again (``None`` while draining or failed, or when serving)."""
    failure: str | None
    """Why the arm could not start (vLLM's start-up message), for a failed replica."""
    num_gpu_blocks: int | None
    """KV blocks of the running engine (``None`` when no engine runs)."""
    started_s: float | None = None
    """When the running engine started, simulated seconds (the pod's start; ``None`` when
    no engine runs)."""


@dataclass(frozen=True)
class ApplyResult:
    """What :meth:`Fleet.apply` did: which replicas restart, and whether the arm can start."""

    arm: Arm
    replicas: tuple[int, ...]
    ok: bool
    failure: str | None
    num_gpu_blocks: int


@dataclass(frozen=True)
class RequestRecord:
    """One finished request. Times are simulated seconds; latencies are in seconds."""

    id: int
    route: str
    replica: int
    arm: str
    arrival_s: float
    finish_s: float
    queue_s: float
    ttft_s: float
    tpot_s: float
    """``decode time / (output tokens − 1)``; NaN for a one-token output."""
    e2e_s: float
    prompt_tokens: int
    output_tokens: int
    finished_reason: str
    preemptions: int
    passes: int
    """Verification passes with drafts (vLLM's ``num_drafts`` for this request)."""
    alpha: float
    """The request's drawn base acceptance rate (``α_req``); 0 when speculation is off."""


@dataclass(frozen=True)
class AppliedEvent:
    """A scenario event as it took effect."""

    at_s: float
    kind: str
    detail: str


@dataclass(frozen=True)
class FleetTotals:
    """Engine counters summed over every replica and every engine they ran (restarts too)."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    preemptions: int
    generation_tokens: int
    prompt_tokens: int

    @property
    def mean_accepted_length(self) -> float | None:
        """vLLM's mean acceptance length ``1 + accepted / drafts`` (``None`` without drafts)."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else None

    @property
    def acceptance_rate(self) -> float | None:
        """``accepted / draft tokens`` (``None`` without drafts)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None


class _Replica:
    __slots__ = (
        "arm",
        "down_until",
        "drain_start",
        "engine",
        "failure",
        "index",
        "park_after",
        "phase",
        "physics",
        "rng",
    )

    def __init__(self, index: int, arm: Arm, physics: ArmPhysics, rng: np.random.Generator):
        self.index = index
        self.arm = arm
        self.physics = physics
        self.rng = rng
        self.engine: Engine | None = None
        self.phase = Phase.DOWN
        self.down_until = 0.0
        self.drain_start = 0.0
        self.failure: str | None = None
        self.park_after = False


class Fleet:
    """Replicas of one scenario serving its traffic in virtual time.

    Parameters
    ----------
    scenario:
        The world.
    seed:
        Seed of every generator (the scenario's ``seed`` when ``None``).
    arms:
        The arm each replica runs at time 0: one arm for all, one per replica, or ``None``
        for the scenario's ``initial``.
    replicas:
        Number of replicas (default: the scenario's ``fleet.replicas``).
    load_scale:
        Multiplies the offered load (``sim serve`` runs one replica with ``1/N`` of it).
    stream:
        Mixed into the seed so that replicas of a served fleet draw different traffic.
    model_name:
        The ``model_name`` label (default: the target's name).
    epoch_s:
        Unix time of simulated time 0, for the pages' ``_created`` samples.
    parked:
        Replicas that start with no pod (slots for canaries, as extra pods on a cluster);
        :meth:`apply` starts them, :meth:`park` returns them.
    start_s:
        Simulated time at which the fleet starts serving: the arrivals before it never
        happened (the engines start empty, as a pod that just came up), the scenario's
        events before it have taken effect, and from it on the requests are the ones a fleet
        started at 0 would get. ``sim serve --clock-epoch`` uses it so that pods started
        at different moments get the same requests at the same moment.
    keep:
        ``keep(index, arrival_s)``: whether this fleet serves arrival ``index`` of its
        stream; the others are another pod's share. ``sim serve --service`` passes
        :meth:`spectune.sim.service.Service.keeps`, so the pods of one service split one
        stream as this class's balancer does, rather than each adding a whole stream.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        seed: int | None = None,
        arms: Arm | Sequence[Arm] | None = None,
        replicas: int | None = None,
        load_scale: float = 1.0,
        stream: int = 0,
        model_name: str | None = None,
        epoch_s: float = 0.0,
        parked: Sequence[int] = (),
        start_s: float = 0.0,
        keep: Callable[[int, float], bool] | None = None,
    ) -> None:
        n = replicas if replicas is not None else scenario.fleet.replicas
        if n < 1:
            raise SpecError("a fleet needs at least one replica")
        if arms is None:
            arm_list = [scenario.initial_arm] * n
        elif isinstance(arms, Arm):
            arm_list = [arms] * n
        else:
            arm_list = list(arms)
            if len(arm_list) != n:
                raise SpecError(f"got {len(arm_list)} arms for {n} replicas")
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else seed
        self.model_name = model_name or scenario.target.name
        self.epoch_s = epoch_s
        self._sglang = scenario.engine == "sglang"
        root = np.random.SeedSequence([self.seed, stream])
        traffic_seed, *replica_seeds = root.spawn(1 + n)
        self._traffic = Traffic(scenario, traffic_seed, load_scale=load_scale)
        self._physics: dict[tuple[Arm, float], ArmPhysics] = {}
        # Each replica slot's speed (hardware.speed_spread): drawn once per slot from a
        # stream of its own, so a pod is as fast under every arm and every seed of traffic.
        spread = scenario.hardware.speed_spread
        self._speed = (
            np.random.default_rng([self.seed, stream, 7]).uniform(1 - spread, 1 + spread, n)
            if spread > 0
            else np.ones(n)
        )
        # Each replica slot's scrape phase (fleet.scrape_offset_s): fixed per slot, as a
        # Prometheus scrape loop keeps each target's offset within its interval.
        lag = scenario.fleet.scrape_offset_s
        self._scrape_offset = (
            np.random.default_rng([self.seed, stream, 11]).uniform(0.0, lag, n)
            if lag > 0
            else np.zeros(n)
        )
        self._replicas = [
            _Replica(i, arm, self._physics_of(arm, i), np.random.default_rng(s))
            for i, (arm, s) in enumerate(zip(arm_list, replica_seeds, strict=True))
        ]
        self._now = 0.0
        self._rr = 0
        self._pending: list[Request] = []
        self._records: list[RequestRecord] = []
        self._records_sorted = True
        self._retired = FleetTotals(0, 0, 0, 0, 0, 0)
        self._version = INITIAL_VERSION
        self._scale: dict[str, float] = {}
        self._broken: set[str] = set()  # drafter_broken drafters, until a model_version
        self._decay: dict[int, list[PodDecayEvent]] = {}  # pod_decay events by replica slot
        self._events = sorted(enumerate(scenario.events), key=lambda pair: (pair[1].at_s, pair[0]))
        self._next_event = 0
        self._applied: list[AppliedEvent] = []
        self._starts: list[tuple[float, int]] = []
        self._route_names = [r.name for r in scenario.routes]
        self._keep = keep
        if start_s < 0 or math.isinf(start_s):
            raise SpecError(f"a fleet starts at a finite time from 0 on, got {start_s}")
        self._skip_to(start_s)
        for r in self._replicas:
            if r.index in parked:
                r.phase = Phase.PARKED
            else:
                self._start(r, start_s)

    # --- the ports ------------------------------------------------------------------

    @property
    def now(self) -> float:
        """Current simulated time, seconds."""
        return self._now

    @property
    def size(self) -> int:
        """Number of replicas."""
        return len(self._replicas)

    @property
    def model_version(self) -> str:
        """The version the replicas report (changed by ``model_version`` events)."""
        return self._version

    @property
    def applied_events(self) -> tuple[AppliedEvent, ...]:
        """Scenario events that have taken effect so far, in order."""
        return tuple(self._applied)

    @property
    def starts(self) -> tuple[tuple[float, int], ...]:
        """``(time, replica)`` of every engine start so far (a pod coming up), in order."""
        return tuple(self._starts)

    def physics(self, arm: Arm) -> ArmPhysics:
        """Cost model, KV pool and start-up verdict of ``arm`` on this scenario's replica."""
        return self._physics_of(arm)

    def apply(self, arm: Arm, replicas: Sequence[int]) -> ApplyResult:
        """Restart ``replicas`` with ``arm``: each drains, is down ``restart_s``, then serves.

        Returns at once whether the arm can start; if it cannot, the replicas still go
        down (their pods restart) and end ``FAILED``, serving nothing. Raises
        :class:`SpecError` for an arm the scenario does not know (unknown drafter, k above
        ``max_k``) or a replica index out of range.
        """
        physics = self._physics_of(arm)
        chosen = tuple(dict.fromkeys(replicas))
        for i in chosen:
            if not 0 <= i < len(self._replicas):
                raise SpecError(f"replica {i} does not exist; the fleet has {len(self._replicas)}")
        restart = self.scenario.target.restart_s
        for i in chosen:
            r = self._replicas[i]
            r.arm = arm
            r.physics = self._physics_of(arm, i)
            r.failure = None
            r.park_after = False
            if r.phase is Phase.PARKED:
                r.phase = Phase.DOWN
                r.down_until = self._now + restart
            elif r.phase is Phase.SERVING:
                r.phase = Phase.DRAINING
                r.drain_start = self._now
                self._check_drained(r)
            elif r.phase in (Phase.DOWN, Phase.FAILED):
                r.phase = Phase.DOWN
                r.down_until = self._now + restart
        return ApplyResult(arm, chosen, physics.failure is None, physics.failure,
                           physics.num_gpu_blocks)  # fmt: skip

    def park(self, replicas: Sequence[int]) -> None:
        """Remove the pods of ``replicas``: serving ones drain first; none restarts."""
        for i in dict.fromkeys(replicas):
            if not 0 <= i < len(self._replicas):
                raise SpecError(f"replica {i} does not exist; the fleet has {len(self._replicas)}")
            r = self._replicas[i]
            if r.phase is Phase.SERVING:
                r.phase = Phase.DRAINING
                r.drain_start = self._now
                r.park_after = True
                self._check_drained(r)
            elif r.phase is Phase.DRAINING:
                r.park_after = True
            elif r.phase in (Phase.DOWN, Phase.FAILED):
                r.engine = None
                r.phase = Phase.PARKED

    def scrape_offset(self, i: int) -> float:
        """Seconds after a window's nominal ends at which replica ``i``'s page is read."""
        return float(self._scrape_offset[i])

    @property
    def max_scrape_offset(self) -> float:
        """The largest :meth:`scrape_offset` of the fleet (0 with the knob off)."""
        return float(self._scrape_offset.max()) if len(self._scrape_offset) else 0.0

    def state(self, i: int) -> ReplicaState:
        """Replica ``i`` as an actuator sees it."""
        r = self._replicas[i]
        return ReplicaState(
            index=i,
            phase=r.phase,
            arm=r.arm if r.engine is None else r.engine.arm,
            ready_at_s=r.down_until if r.phase is Phase.DOWN else None,
            failure=r.failure,
            num_gpu_blocks=None if r.engine is None else r.engine.physics.num_gpu_blocks,
            started_s=None if r.engine is None else r.engine.start_s,
        )

    def states(self) -> tuple[ReplicaState, ...]:
        """Every replica's state."""
        return tuple(self.state(i) for i in range(len(self._replicas)))

    def metrics_text(self, i: int) -> str:
        """Replica ``i``'s ``/metrics`` page now.

        Raises :class:`SourceUnavailableError` while the replica has no engine (restarting
        or failed), as a scrape of a pod that is not ready fails.
        """
        r = self._replicas[i]
        if r.engine is None:
            why = (
                f"failed to start: {r.failure}"
                if r.phase is Phase.FAILED
                else "parked (no pod)"
                if r.phase is Phase.PARKED
                else f"restarting until t={r.down_until:.1f}s"
            )
            raise SourceUnavailableError(f"replica {i} is not serving ({why})")
        return render_page(
            r.engine,
            self.model_name,
            self.epoch_s + r.engine.start_s,
            self._sglang,
            self.scenario.metrics_version,
        )

    def records(self, start_s: float = 0.0, end_s: float = math.inf) -> list[RequestRecord]:
        """Requests that finished in ``[start_s, end_s)``, in finish order."""
        if not self._records_sorted:
            self._records.sort(key=lambda rec: rec.finish_s)
            self._records_sorted = True
        return [rec for rec in self._records if start_s <= rec.finish_s < end_s]

    def totals(self) -> FleetTotals:
        """Engine counters summed over the fleet's whole life."""
        t = self._retired
        for r in self._replicas:
            if r.engine is not None:
                t = _add(t, r.engine)
        return t

    def advance(self, until_s: float) -> None:
        """Move simulated time to ``until_s``, serving traffic and applying events on the way.

        Arrivals and events at exactly ``until_s`` are left for the next call.
        """
        if until_s < self._now:
            raise SpecError(f"cannot go back in time: now {self._now}, asked {until_s}")
        while True:
            t_arrival = self._traffic.peek()
            upcoming = self._upcoming_event()
            t_event = upcoming.at_s if upcoming is not None else math.inf
            t_restart = min(
                (r.down_until for r in self._replicas if r.phase is Phase.DOWN), default=math.inf
            )
            t = min(t_arrival, t_event, t_restart, until_s)
            self._run_engines(t)
            if t >= until_s and t_restart > until_s:
                self._now = until_s
                return
            self._now = t
            if t_restart <= t:
                for r in self._replicas:
                    if r.phase is Phase.DOWN and r.down_until <= t:
                        self._start(r, r.down_until)
                continue
            if upcoming is not None and t_event <= t:
                self._apply_event(upcoming)
                self._next_event += 1
                continue
            req = self._traffic.pop()
            if self._keep is None or self._keep(req.id, req.arrival):
                self._dispatch(req)

    # --- internals ------------------------------------------------------------------

    def _physics_of(self, arm: Arm, index: int | None = None) -> ArmPhysics:
        speed = 1.0 if index is None else float(self._speed[index])
        phys = self._physics.get((arm, speed))
        if phys is None:
            phys = arm_physics(self.scenario, arm)
            if speed != 1.0:
                phys = slowed(phys, speed)
            self._physics[(arm, speed)] = phys
        return phys

    def _run_engines(self, t: float) -> None:
        for r in self._replicas:
            engine = r.engine
            if engine is None:
                continue
            engine.advance(t)
            if engine.finished:
                self._collect(r, engine)
            if r.phase is Phase.DRAINING:
                self._check_drained(r)
        # a replica that came back up before t must catch up to t
        for r in self._replicas:
            if r.phase is Phase.DOWN and r.down_until < t:
                self._start(r, r.down_until)
                if r.engine is not None:
                    r.engine.advance(t)
                    if r.engine.finished:
                        self._collect(r, r.engine)

    def _check_drained(self, r: _Replica) -> None:
        engine = r.engine
        if engine is None or not engine.idle:
            return
        ended = max(r.drain_start, engine.last_finish)
        self._retired = _add(self._retired, engine)
        r.engine = None
        if r.park_after:
            r.phase = Phase.PARKED
            r.park_after = False
            return
        r.phase = Phase.DOWN
        r.down_until = ended + self.scenario.target.restart_s

    def _start(self, r: _Replica, at: float) -> None:
        if r.physics.failure is not None:
            r.engine = None
            r.phase = Phase.FAILED
            r.failure = r.physics.failure
            return
        r.engine = Engine(self.scenario, r.arm, r.physics, r.rng, at)
        self._starts.append((at, r.index))
        r.phase = Phase.SERVING
        r.failure = None
        if self._pending:
            waiting, self._pending = self._pending, []
            for req in waiting:
                self._dispatch(req)

    def inject(self, event: ModelVersionEvent | RouteMixEvent | DrafterBrokenEvent) -> AppliedEvent:
        """Apply a ``model_version``, ``route_mix`` or ``drafter_broken`` event now, whatever
        its ``at_s``.

        Server mode's ``POST /sim/events`` calls this, so a test can change the world of a
        running replica (e.g. an acceptance drop) at a moment it chooses. The event has the
        scenario file's meaning: ``acceptance_scale`` is relative to the file's alphas and
        replaces any earlier scale; it applies to requests admitted from now on.
        """
        self._apply_event(event.model_copy(update={"at_s": self._now}))
        return self._applied[-1]

    def _apply_event(self, ev: object) -> None:
        if isinstance(ev, ModelVersionEvent):
            self._version = ev.version
            self._scale = dict(ev.acceptance_scale)
            scales = ", ".join(f"{k}×{v:g}" for k, v in ev.acceptance_scale.items())
            detail = f"version {ev.version}; acceptance {scales}"
            if self._broken:
                # a new release replaces the broken draft checkpoint
                detail += "; repaired " + ", ".join(sorted(self._broken))
                self._broken.clear()
            self._applied.append(AppliedEvent(ev.at_s, ev.kind, detail))
        elif isinstance(ev, PodDecayEvent):
            self._decay.setdefault(ev.pod, []).append(ev)
            which = ev.drafter if ev.drafter is not None else "every drafter"
            self._applied.append(
                AppliedEvent(
                    ev.at_s,
                    ev.kind,
                    f"pod {ev.pod}: {which} acceptance ×{ev.acceptance_per_hour:g} per hour "
                    f"of uptime (floor {ev.floor:g})",
                )
            )
        elif isinstance(ev, DrafterBrokenEvent):
            self._broken.add(ev.drafter)
            self._applied.append(
                AppliedEvent(ev.at_s, ev.kind, f"{ev.drafter} accepts nothing on every pod")
            )
        elif isinstance(ev, RouteMixEvent):
            self._traffic.set_shares(ev.shares)
            mix = ", ".join(f"{k}={v:g}" for k, v in ev.shares.items())
            self._applied.append(AppliedEvent(ev.at_s, ev.kind, f"route shares {mix}"))
        elif isinstance(ev, LoadEvent):  # the load profile already includes it
            self._applied.append(
                AppliedEvent(ev.at_s, ev.kind, f"{ev.requests_per_s:g} requests/s")
            )

    def _upcoming_event(self) -> Event | None:
        """The scenario's next event not yet applied (None after the last)."""
        if self._next_event < len(self._events):
            return self._events[self._next_event][1]
        return None

    def _skip_to(self, start_s: float) -> None:
        """Draw and drop every arrival before ``start_s``, applying the events before it in
        time order (a route-mix change moves later arrivals' routes, and so the draws)."""
        while True:
            t_arrival = self._traffic.peek()
            nxt = self._upcoming_event()
            t_event = nxt.at_s if nxt is not None else math.inf
            if min(t_arrival, t_event) >= start_s:
                break
            if nxt is not None and t_event <= t_arrival:
                self._apply_event(nxt)
                self._next_event += 1
            else:
                self._traffic.pop()
        self._now = start_s

    def _dispatch(self, req: Request) -> None:
        serving = [r for r in self._replicas if r.phase is Phase.SERVING and r.engine is not None]
        if not serving:
            self._pending.append(req)
            return
        n = len(serving)
        start = self._rr % n
        if self.scenario.fleet.balancer == "round_robin":
            chosen = serving[start]
        else:
            chosen = serving[start]
            best = chosen.engine.outstanding if chosen.engine is not None else 0
            for j in range(1, n):
                cand = serving[(start + j) % n]
                load = cand.engine.outstanding if cand.engine is not None else 0
                if load < best:
                    chosen, best = cand, load
        self._rr += 1
        assert chosen.engine is not None
        chosen.engine.enqueue(req, self._scale_of(chosen, chosen.engine))

    def _scale_of(self, r: _Replica, engine: Engine) -> dict[str, float]:
        """The acceptance scale a request admitted now on replica ``r`` draws with: the
        model version's, times any ``pod_decay`` of the pod and 0 for a broken drafter."""
        drafter = engine.arm.drafter
        if drafter is None or not (self._broken or self._decay):
            return self._scale  # the same object: scenarios without these events draw alike
        factor = 0.0 if drafter in self._broken else 1.0
        now = max(self._now, engine.start_s)
        for ev in self._decay.get(r.index, ()):
            if ev.drafter is None or ev.drafter == drafter:
                factor *= ev.factor(now - max(ev.at_s, engine.start_s))
        if factor == 1.0:
            return self._scale
        return {**self._scale, drafter: self._scale.get(drafter, 1.0) * factor}

    def _collect(self, r: _Replica, engine: Engine) -> None:
        arm = engine.arm.name
        routes = self._route_names
        for q in engine.finished:
            decode = q.finish - q.first_token
            self._records.append(
                RequestRecord(
                    id=q.id,
                    route=routes[q.route],
                    replica=r.index,
                    arm=arm,
                    arrival_s=q.arrival,
                    finish_s=q.finish,
                    queue_s=q.scheduled - q.arrival,
                    ttft_s=q.first_token - q.arrival,
                    tpot_s=decode / (q.generated - 1) if q.generated > 1 else math.nan,
                    e2e_s=q.finish - q.arrival,
                    prompt_tokens=q.prompt,
                    output_tokens=q.generated,
                    finished_reason="length" if q.length_capped else "stop",
                    preemptions=q.preemptions,
                    passes=q.passes,
                    alpha=q.alpha,
                )
            )
        engine.finished.clear()
        self._records_sorted = False


def _add(t: FleetTotals, engine: Engine) -> FleetTotals:
    s = engine.stats
    return FleetTotals(
        drafts=t.drafts + s.drafts,
        draft_tokens=t.draft_tokens + s.draft_tokens,
        accepted_tokens=t.accepted_tokens + s.accepted,
        preemptions=t.preemptions + s.preemptions,
        generation_tokens=t.generation_tokens + s.generation_tokens,
        prompt_tokens=t.prompt_tokens + s.prompt_tokens,
    )
