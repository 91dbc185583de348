"""One bench run: a policy against a scenario in virtual time, scored against the oracle.

``spectune bench`` (``bench/command.py``) and ``benchmarks/bench_all.py`` call
:func:`run_bench`. It computes the oracle first (``bench/oracle.py``, cached), builds the
policy by name (``bench/registry.py``), drives the real controller
(``control/controller.py``) over the simulator body's ports (``bench/adapters.py``) until
the scenario's ``duration_s``, and returns a :class:`BenchResult` whose
:meth:`~BenchResult.to_json` is DESIGN.md §5's object, key for key.

Definitions (phases, objective values, efficiency ratios and guardrail breaches are in
``bench/scoring.py``):

* ``chosen_arm`` of a phase: the arm the policy has promoted into the target by the phase's
  end (the incumbent of the actuator at that time: a rollout in progress counts as its
  target's arm; before any promotion, the scenario's ``initial``). ``chosen_value`` is that
  arm's objective in the phase *from the oracle's static run of it*, so ``efficiency``
  judges the choice, not the noise or the cost of getting there.
* ``oracle_arm`` / ``oracle_value``: the candidate static arm with the best objective in the
  phase (ties: the first in ``off, <drafter>/1..max_k`` order); arms that cannot start are
  skipped.
* ``efficiency``: the smallest phase efficiency (``oracle / chosen`` to minimise,
  ``chosen / oracle`` to maximise).
* ``run_efficiency``: the run's own objective over ``[0, duration_s)`` from its own finished
  requests — trials, restarts and rollouts included — against the whole-run value of the
  best single static arm, as the same ratio.
* ``trials``: configuration changes applied — every canary start (one restart of the canary
  replicas, whether or not the arm can start) and every promotion that changes the target's
  arm. Returning a canary's replicas to the incumbent is not counted (it undoes a trial).
* ``guardrail_breach_s``: see ``bench/scoring.py``.
* ``recoveries`` (beside the contract's object, in the bench's tables): for each
  ``model_version`` event, the seconds until the target stays within 0.95 of the new
  phase's oracle (``bench/scoring.py``).
* ``incidents`` (beside the contract's object, in the bench's tables): for each
  ``drafter_broken`` and ``pod_decay`` event, the seconds until the operator reported it
  (``detected_s``: its first ``DrafterBroken`` or ``AcceptanceDrift`` event for a broken
  drafter, ``PodAcceptanceDecay`` for a decaying pod) and until it recovered
  (``recovered_s``: for a broken drafter, as ``recoveries`` — the target back within 0.95
  of the new phase's oracle; for a decaying pod, a new pod serving in its replica slot, by a
  rollout or by ``podAction: restartPod``); None when it did not by the run's end.
* ``regret`` (beside the contract's object): the time-integrated loss against the phase
  oracles, window by window (``bench/regret.py``).
* ``worse_than_initial_s`` and ``rollbacks`` (beside the contract's object, in the bench's
  tables): seconds served worse than the initial arm after the first promotion, and the
  controller's rollbacks of promoted arms (``bench/scoring.py``).
* ``sim_seconds``: the scenario's ``duration_s``; ``wall_seconds``: the whole command,
  oracle included.

Policies with ``continuous = True`` (``acceptance-threshold``, ``oracle``) move the target
in place: after each promotion the runner puts the controller back into ``Exploring``, so
the policy is asked again every window. The controller otherwise runs as in the operator:
``canaryReplicas`` (default 1) of the fleet's replicas are the canary, ``model_version``
and ``route_mix`` events re-open the search through ``Deployment``.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spectune.bench.adapters import (
    SimActuator,
    SimGroupMetrics,
    SimPods,
    SimStage,
    VirtualClock,
)
from spectune.bench.oracle import ArmRun, Oracle
from spectune.bench.registry import PolicyRequest, check_policy_name, make_policy
from spectune.bench.regret import regret_curve
from spectune.bench.scoring import (
    RequestTable,
    breach_seconds,
    efficiency_ratio,
    guardrail_limits,
    metric_value,
    phase_spans,
    recovery_seconds,
    worse_seconds,
)
from spectune.control.controller import Controller, ControllerConfig, Event
from spectune.control.controller import Phase as LoopPhase
from spectune.control.placement import choose_placement
from spectune.errors import SpecError
from spectune.search.arms import parse_arm
from spectune.search.history import History
from spectune.search.objective import Guardrails, Metric, Objective
from spectune.search.policy import Policy, SearchSpace
from spectune.sim.fleet import Fleet
from spectune.sim.scenario import DrafterBrokenEvent, ModelVersionEvent, PodDecayEvent, Scenario

__all__ = [
    "BenchHooks",
    "BenchResult",
    "Incident",
    "PhaseResult",
    "bench_objective",
    "drive",
    "run_bench",
    "worse_than_initial",
]

#: The controller events that report each incident kind (the first one after it counts).
DETECTED_BY = {
    "drafter_broken": ("DrafterBroken", "AcceptanceDrift"),
    "pod_decay": ("PodAcceptanceDecay",),
}

#: Steps in a row that leave the clock where it was before the runner waits out a poll.
_MAX_STALLS = 3


@dataclass(frozen=True)
class PhaseResult:
    """One phase's row of the bench JSON."""

    start_s: float
    end_s: float
    oracle_arm: str
    oracle_value: float
    chosen_arm: str
    chosen_value: float
    efficiency: float


@dataclass(frozen=True)
class Incident:
    """A scenario event that breaks the drafter, and how the operator met it."""

    at_s: float
    kind: str
    """``drafter_broken`` or ``pod_decay``."""
    what: str
    """The drafter, or the pod (replica slot) and drafter, for tables."""
    detected_s: float | None
    """Seconds from the event to the operator's first report of it; None: never."""
    recovered_s: float | None
    """Seconds from the event until it recovered (module docstring); None: not by the end."""


@dataclass(frozen=True)
class BenchResult:
    """Everything a bench run measured; :meth:`to_json` is the contract's object."""

    scenario: str
    policy: str
    seed: int
    objective: str
    phases: tuple[PhaseResult, ...]
    efficiency: float
    run_efficiency: float
    trials: int
    guardrail_breach_s: float
    sim_seconds: float
    wall_seconds: float
    run_value: float = math.nan
    best_static_arm: str = ""
    best_static_value: float = math.nan
    promotions: tuple[tuple[float, str], ...] = ()
    recoveries: tuple[tuple[float, float | None], ...] = ()
    """``(event time, recovery seconds or None)`` for each ``model_version`` event
    (``bench/scoring.py``); not a field of the contract's object."""
    incidents: tuple[Incident, ...] = ()
    """Time to detect and to recover per ``drafter_broken`` / ``pod_decay`` event; not a
    field of the contract's object."""
    worse_than_initial_s: float = 0.0
    """Seconds served worse than the initial arm after the first promotion
    (``bench/scoring.py``); not a field of the contract's object."""
    rollbacks: int = 0
    """Promoted arms the controller rolled back; not a field of the contract's object."""
    placement: str = ""
    """Where the canaries served (``replace`` or ``beside``); not a field of the contract's
    object."""
    load_ratios: tuple[float, ...] = ()
    """Each trial's canary-to-incumbent load per pod (finished requests per pod per second,
    the median over its windows; ``WindowRecord.load_ratio``); not a field of the contract's
    object."""
    events: tuple[Event, ...] = field(default=(), repr=False)
    regret: tuple[tuple[float, float], ...] = field(default=(), repr=False)
    """``(time, cumulative regret seconds)`` per window (``bench/regret.py``); not a field of
    the contract's object."""

    @property
    def regret_s(self) -> float:
        """The run's time-integrated regret, seconds (NaN when not measured)."""
        return self.regret[-1][1] if self.regret else math.nan

    def to_json(self) -> dict[str, Any]:
        """DESIGN.md §5's object: exactly its keys, NaN as ``null``."""
        return {
            "scenario": self.scenario,
            "policy": self.policy,
            "seed": self.seed,
            "objective": self.objective,
            "phases": [
                {
                    "start_s": _num(p.start_s),
                    "end_s": _num(p.end_s),
                    "oracle_arm": p.oracle_arm,
                    "oracle_value": _sig(p.oracle_value),
                    "chosen_arm": p.chosen_arm,
                    "chosen_value": _sig(p.chosen_value),
                    "efficiency": _fixed(p.efficiency, 4),
                }
                for p in self.phases
            ],
            "efficiency": _fixed(self.efficiency, 4),
            "run_efficiency": _fixed(self.run_efficiency, 4),
            "trials": self.trials,
            "guardrail_breach_s": _num(round(self.guardrail_breach_s, 3)),
            "sim_seconds": _num(self.sim_seconds),
            "wall_seconds": round(self.wall_seconds, 2),
        }


def _num(x: float) -> float | int | None:
    if not math.isfinite(x):
        return None
    return int(x) if float(x).is_integer() else float(x)


def _sig(x: float, digits: int = 6) -> float | None:
    return None if not math.isfinite(x) else float(f"{x:.{digits}g}")


def _fixed(x: float, digits: int) -> float | None:
    return None if not math.isfinite(x) else round(x, digits)


@dataclass
class BenchHooks:
    """Callbacks for a terminal's progress display (all optional)."""

    on_oracle: Callable[[str, bool, int, int], None] | None = None
    """``(arm, was_cached, done, total)`` as each oracle arm becomes available."""
    on_step: Callable[[float, float], None] | None = None
    """``(now_s, end_s)`` after each controller step."""
    on_event: Callable[[Event], None] | None = None
    """Each controller event (trial started, promoted, re-tune...)."""


def bench_objective(scenario: Scenario) -> Objective:
    """The scenario's objective as the controller's :class:`Objective`."""
    metric = Metric.parse(scenario.objective.metric)
    g = scenario.objective.guardrails
    if g is None:
        return Objective(metric, Guardrails())
    return Objective(metric, Guardrails(g.maxTTFTP95Regression, g.maxQueueP95Regression))


def _best(
    runs: dict[str, ArmRun], order: list[str], metric: Metric, start: float, end: float
) -> tuple[str, float]:
    best_arm, best_value = "", math.nan
    for arm in order:
        run = runs[arm]
        if run.failure is not None:
            continue
        v = metric_value(run.requests, metric, start, end)
        if not math.isfinite(v):
            continue
        better = v < best_value if metric.minimise else v > best_value
        if not best_arm or better:
            best_arm, best_value = arm, v
    return best_arm, best_value


def _recoveries(
    scenario: Scenario,
    phases: list[tuple[float, float]],
    phase_best: list[tuple[str, float]],
    served: list[tuple[float, str]],
    oracle: Oracle,
    metric: Metric,
) -> tuple[tuple[float, float | None], ...]:
    """``(event time, seconds until back within 0.95, or None)`` per model change."""
    return tuple(
        (float(ev.at_s), _recovery(float(ev.at_s), phases, phase_best, served, oracle, metric))
        for ev in scenario.events
        if isinstance(ev, ModelVersionEvent) and 0.0 < ev.at_s < float(scenario.duration_s)
    )


def _recovery(
    at_s: float,
    phases: list[tuple[float, float]],
    phase_best: list[tuple[str, float]],
    served: list[tuple[float, str]],
    oracle: Oracle,
    metric: Metric,
) -> float | None:
    """Seconds until the target serves within 0.95 of the oracle of the phase at ``at_s``."""
    p = next(i for i, (a, _) in enumerate(phases) if a == at_s)
    (start, end), best = phases[p], phase_best[p][1]
    efficiency = {
        arm: efficiency_ratio(
            best, metric_value(oracle.run(arm).requests, metric, start, end), metric.minimise
        )
        for arm in {arm for _, arm in served}
    }
    return recovery_seconds(start, end, served, efficiency)


def _incidents(
    scenario: Scenario,
    events: list[Event],
    starts: tuple[tuple[float, int], ...],
    recovery: Callable[[float], float | None],
) -> tuple[Incident, ...]:
    """Time to detect and to recover for each ``drafter_broken`` and ``pod_decay`` event."""
    out = []
    end = float(scenario.duration_s)
    for ev in scenario.events:
        if not isinstance(ev, DrafterBrokenEvent | PodDecayEvent) or not ev.at_s < end:
            continue
        at = float(ev.at_s)
        reports = DETECTED_BY[ev.kind]
        detected = next((e.at_s - at for e in events if e.at_s >= at and e.reason in reports), None)
        if isinstance(ev, DrafterBrokenEvent):
            what = ev.drafter
            recovered = recovery(at)
        else:
            what = f"pod {ev.pod}" + (f" {ev.drafter}" if ev.drafter is not None else "")
            # the decayed pod is replaced: a new engine serves in its slot after the event
            recovered = next((t - at for t, i in starts if i == ev.pod and t > at), None)
        out.append(Incident(at, ev.kind, what, detected, recovered))
    return tuple(out)


def sim_controller(
    scenario: Scenario,
    policy: Policy,
    space: SearchSpace,
    *,
    seed: int,
    window_s: float = 300.0,
    canary_replicas: int = 1,
    controller_config: ControllerConfig | None = None,
    on_event: Callable[[Event], None] | None = None,
    placement: str = "auto",
) -> tuple[Controller, SimStage, VirtualClock]:
    """The tuning loop over a simulated fleet: the bench's and the demo's shared set-up.

    The fleet has the scenario's replicas plus ``canary_replicas`` parked slots, so a canary
    is an extra pod as on a cluster; twice as many with ``placement`` replace (a canary
    that follows another surges before the old one leaves; ``control/placement.py``).
    """
    base = scenario.fleet.replicas
    verdict = choose_placement(placement, base, canary_replicas)
    slots = canary_replicas * (2 if verdict.matched else 1)
    fleet = Fleet(scenario, seed=seed, replicas=base + slots, parked=range(base, base + slots))
    stage = SimStage(
        fleet,
        canary_replicas=canary_replicas,
        end_s=float(scenario.duration_s),
        placement=placement,
    )
    clock = VirtualClock(stage)
    controller = Controller(
        policy=policy,
        actuator=SimActuator(stage),
        metrics=SimGroupMetrics(stage),
        clock=clock,
        space=space,
        objective=bench_objective(scenario),
        config=replace(controller_config or ControllerConfig(), window_s=window_s, seed=seed),
        on_event=on_event,
        pods=SimPods(stage),
    )
    return controller, stage, clock


def drive(
    controller: Controller,
    clock: VirtualClock,
    duration: float,
    *,
    on_step: Callable[[float, float], None] | None = None,
) -> None:
    """Step ``controller`` until ``clock`` reaches ``duration`` seconds.

    A policy with ``continuous = True`` is put back into ``Exploring`` after each
    promotion (module docstring). Steps that leave the clock where it was are not a
    deadlock of virtual time: after ``_MAX_STALLS`` of them the loop waits out a poll.
    """
    continuous = bool(getattr(controller.policy, "continuous", False))

    async def run() -> None:
        stalls = 0
        while clock.now() < duration:
            before = clock.now()
            await controller.step()
            if continuous and controller.state.phase is LoopPhase.MONITORING:
                controller.state = replace(controller.state, phase=LoopPhase.EXPLORING)
            stalls = stalls + 1 if clock.now() <= before else 0
            if stalls >= _MAX_STALLS:
                await clock.sleep(controller.config.poll_s)
                stalls = 0
            if on_step is not None:
                on_step(clock.now(), duration)

    asyncio.run(run())


def worse_than_initial(
    scenario: Scenario,
    served: Sequence[tuple[float, str]],
    runs: Callable[[str], RequestTable],
    window_s: float,
) -> float:
    """``worse_than_initial_s`` of a run that served ``served`` (``(time, arm)`` at time 0
    and at every promotion): ``bench/scoring.py``'s :func:`worse_seconds` from the first
    promotion on, against the scenario's initial arm on its objective; ``runs(arm)`` is
    the oracle's static run of an arm."""
    promotions = served[1:]
    return worse_seconds(
        served,
        promotions[0][0] if promotions else None,
        runs,
        scenario.initial_arm.name,
        bench_objective(scenario).metric,
        phase_spans(scenario),
        window_s,
    )


def run_bench(
    scenario: Scenario,
    policy: str,
    *,
    seed: int | None = None,
    window_s: float = 300.0,
    canary_replicas: int = 1,
    cache_dir: Path | None = None,
    use_cache: bool = True,
    jobs: int | None = None,
    hooks: BenchHooks | None = None,
    controller_config: ControllerConfig | None = None,
    space: SearchSpace | None = None,
    placement: str = "auto",
) -> BenchResult:
    """Run ``policy`` on ``scenario`` and score it (see the module docstring).

    ``controller_config`` tunes the loop (its ``window_s`` and ``seed`` are replaced by
    this function's); the default is the operator's defaults. ``space`` narrows the
    candidate arms (the policy's and the oracle's) to a part of the scenario's, as a
    SpecTuning's drafter list does (the family bench's A/A check uses it).
    """
    wall0 = time.perf_counter()
    hooks = hooks or BenchHooks()
    check_policy_name(policy)
    if not window_s > 0 or math.isinf(window_s):
        raise SpecError(f"--window must be a positive number of seconds, got {window_s}")
    seed = scenario.seed if seed is None else seed
    objective = bench_objective(scenario)
    metric = objective.metric
    duration = float(scenario.duration_s)
    phases = phase_spans(scenario)

    # The oracle: every candidate static arm, whole fleet, same seed and traffic.
    oracle = Oracle(scenario, seed, cache_dir=cache_dir, use_cache=use_cache, jobs=jobs)
    space = space or oracle.space
    order = [a.name for a in space.arms()]
    done = 0

    def oracle_done(arm: str, cached: bool) -> None:
        nonlocal done
        done += 1
        if hooks.on_oracle is not None:
            hooks.on_oracle(arm, cached, done, len(order))

    runs = oracle.runs(order, oracle_done)
    phase_best = [_best(runs, order, metric, a, b) for a, b in phases]
    if not all(arm for arm, _ in phase_best):
        raise SpecError(f"scenario {scenario.name}: no candidate arm can start and serve")
    schedule = tuple((a, b, arm) for (a, b), (arm, _) in zip(phases, phase_best, strict=True))

    # The run: the policy through the controller, over the simulator body's ports.
    request = PolicyRequest(policy, None, space, schedule, seed, scenario)
    chosen_policy = make_policy(policy, request)
    if policy.startswith("static:"):
        scenario.check_arm(parse_arm(policy.partition(":")[2]))

    def on_event(ev: Event) -> None:
        events.append(ev)
        if hooks.on_event is not None:
            hooks.on_event(ev)

    events: list[Event] = []
    controller, stage, clock = sim_controller(
        scenario,
        chosen_policy,
        space,
        seed=seed,
        window_s=window_s,
        canary_replicas=canary_replicas,
        controller_config=controller_config,
        on_event=on_event,
        placement=placement,
    )
    fleet = stage.fleet
    drive(controller, clock, duration, on_step=hooks.on_step)

    # Scores.
    run_table = RequestTable.from_records(fleet.records(0.0, duration))
    rows: list[PhaseResult] = []
    for (start, end), (oracle_arm, oracle_value) in zip(phases, phase_best, strict=True):
        chosen = stage.incumbent_at(end)
        chosen_run = oracle.run(chosen)
        chosen_value = metric_value(chosen_run.requests, metric, start, end)
        eff = efficiency_ratio(oracle_value, chosen_value, metric.minimise)
        rows.append(PhaseResult(start, end, oracle_arm, oracle_value, chosen, chosen_value, eff))
    effs = [r.efficiency for r in rows if math.isfinite(r.efficiency)]
    best_arm, best_value = _best(runs, order, metric, 0.0, duration)
    run_value = metric_value(run_table, metric, 0.0, duration)
    recoveries = _recoveries(scenario, phases, phase_best, stage.served, oracle, metric)
    untuned = oracle.run(scenario.initial_arm.name).requests
    breach = breach_seconds(
        run_table,
        lambda p: (untuned, runs[phase_best[p][0]].requests),
        phases,
        window_s,
        guardrail_limits(scenario),
    )
    worse = worse_than_initial(
        scenario, stage.timeline, lambda arm: oracle.run(arm).requests, window_s
    )
    return BenchResult(
        scenario=scenario.name,
        policy=policy,
        seed=seed,
        objective=metric.value,
        phases=tuple(rows),
        efficiency=min(effs) if effs else math.nan,
        run_efficiency=efficiency_ratio(best_value, run_value, metric.minimise),
        trials=stage.trials,
        guardrail_breach_s=breach,
        sim_seconds=duration,
        wall_seconds=time.perf_counter() - wall0,
        run_value=run_value,
        best_static_arm=best_arm,
        best_static_value=best_value,
        promotions=tuple(stage.timeline[1:]),
        recoveries=recoveries,
        incidents=_incidents(
            scenario,
            events,
            fleet.starts,
            lambda at: _recovery(at, phases, phase_best, stage.served, oracle, metric),
        ),
        worse_than_initial_s=worse,
        rollbacks=sum(1 for e in events if e.reason == "RolledBack"),
        placement=stage.placement.value,
        load_ratios=_load_ratios(controller.history),
        events=tuple(events),
        regret=regret_curve(
            run_table, lambda p: runs[phase_best[p][0]].requests, phases, metric, window_s
        ),
    )


def _load_ratios(history: History) -> tuple[float, ...]:
    """Each trial's median per-pod load ratio over its windows that measured both groups."""
    out = []
    for t in history.trials:
        ratios = [w.load_ratio for w in t.windows if math.isfinite(w.load_ratio)]
        if ratios:
            out.append(statistics.median(ratios))
    return tuple(out)
