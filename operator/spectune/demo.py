"""``spectune demo``: the tuning brain against a simulated fleet, in virtual time, on screen.

The README's first command. It runs exactly what the operator runs (the controller and
the spectune policy over the Actuator/GroupMetrics/Clock ports) against the simulator body,
shows the search live (phase, the arm on the canary, measured against predicted), then the
decision trail, the final setting and its gain over the initial setting and over ``off``,
and writes the report plots for the chosen drafter and ``search.png``, every arm as the
last decision saw it beside static runs (the README's picture). No cluster, no GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["demo_command", "register"]

DEFAULT_SCENARIO = "chat-eagle3.yaml"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``spectune demo`` (imports stay inside the command: start-up cost matters)."""
    p = subparsers.add_parser(
        "demo",
        help="tune a simulated vLLM fleet in virtual time and show every decision",
        description=(
            "Run the operator's tuning brain against a simulated fleet in virtual time: the "
            "search live, the decision trail, the final setting and its gain, and the report "
            "plots. No cluster, no GPU."
        ),
        epilog=(
            "examples:\n"
            "  spectune demo\n"
            "  spectune demo --scenario examples/scenarios/summarize-ngram.yaml --json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenario", help=f"scenario file (default: the bundled {DEFAULT_SCENARIO})")
    p.add_argument("--seed", type=int, help="seed (default: the scenario's)")
    p.add_argument("--window", type=float, default=300.0, help="window seconds (default 300)")
    p.add_argument(
        "--out", default="spectune-demo", help="report directory (default ./spectune-demo)"
    )
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=demo_command)


def _scenario_path(given: str | None) -> Path:
    if given:
        return Path(given)
    return Path(str(resources.files("spectune") / "examples" / "scenarios" / DEFAULT_SCENARIO))


def demo_command(ns: argparse.Namespace) -> int:
    """Run the demo; return the exit code."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from spectune.bench.oracle import Oracle, search_space
    from spectune.bench.runner import sim_controller
    from spectune.bench.scoring import RequestTable, metric_value, phase_spans
    from spectune.control.controller import Event
    from spectune.k8s.projection import applied_speedup
    from spectune.search.arms import OFF
    from spectune.search.spectune_policy import SpectunePolicy
    from spectune.sim.scenario import load_scenario

    console = Console(stderr=ns.json)
    scenario = load_scenario(_scenario_path(ns.scenario))
    seed = scenario.seed if ns.seed is None else ns.seed
    duration = float(scenario.duration_s)
    space = search_space(scenario)
    events: list[Event] = []
    controller, stage, clock = sim_controller(
        scenario, SpectunePolicy(), space, seed=seed, window_s=ns.window, on_event=events.append
    )
    metric = controller.objective.metric

    def table() -> Table:
        t = Table(title=f"spectune demo — {scenario.name} ({metric.value})", title_justify="left")
        for col in ("t (sim s)", "phase", "target", "canary", "last decision"):
            t.add_column(col)
        dep_canary = stage.canary_arm.name if stage.canary_arm else "—"
        d = controller.last_decision
        why = d.reason if d is not None else "measuring the baseline"
        t.add_row(
            f"{clock.now():.0f}/{duration:.0f}",
            controller.state.phase.value,
            stage.incumbent.name,
            dep_canary,
            why[:110],
        )
        for ev in events[-6:]:
            t.add_row(f"{ev.at_s:.0f}", ev.reason, "", "", ev.message[:110])
        return t

    async def drive(live: Live | None) -> None:
        while clock.now() < duration:
            await controller.step()
            if live is not None:
                live.update(table())

    if console.is_terminal and not ns.json:
        with Live(table(), console=console, refresh_per_second=8) as live:
            asyncio.run(drive(live))
    else:
        asyncio.run(drive(None))

    # What the choice is worth: static runs of each arm on the same simulated traffic, over
    # the last phase (after the scenario's last event), from the simulated requests.
    start = phase_spans(scenario)[-1][0]
    oracle = Oracle(scenario, seed)
    final, initial = stage.incumbent, scenario.initial_arm

    def value(arm_name: str) -> float:
        run = oracle.run(arm_name)
        if run.failure is not None:
            return math.nan
        return metric_value(run.requests, metric, start, duration)

    curve: list[str] = []  # the report's curve: every k of the chosen drafter, run at once
    if final.drafter:
        max_k = next(d.max_k for d in scenario.drafters if d.name == final.drafter)
        curve = [f"{final.drafter}/{k}" for k in range(1, max_k + 1)]
        oracle.runs(curve)
    values = {name: value(name) for name in dict.fromkeys((final.name, initial.name, OFF.name))}
    run_value = metric_value(
        RequestTable.from_records(stage.fleet.records(start, duration)), metric, start, duration
    )

    def gain(over: str) -> float:
        a, b = values[final.name], values[over]
        return b / a if metric.minimise else a / b

    # The gain the operator would show as SPEEDUP for this run, from the same function and the
    # same last decision (the search's own measurements), so the demo and a cluster agree.
    speedup = applied_speedup(controller.last_decision, final, metric.minimise)

    outcome: dict[str, Any] = {
        "scenario": scenario.name,
        "seed": seed,
        "objective": metric.value,
        "final_arm": final.name,
        "initial_arm": initial.name,
        "trials": stage.trials,
        "phase": controller.state.phase.value,
        "unfinished_trial": stage.canary_arm.name if stage.canary_arm else None,
        "speedup": None if speedup is None else round(speedup, 2),
        "values": {k: _round(v) for k, v in values.items()},
        "gain_over_initial": _round(gain(initial.name)),
        "gain_over_off": _round(gain(OFF.name)),
        "this_run_last_phase_value": _round(run_value),
        "decisions": [
            {"at_s": round(e.at_s), "reason": e.reason, "message": e.message} for e in events
        ],
    }
    choice = _choice(scenario, final, metric, value, outcome["speedup"], controller.config.epsilon)
    report = _write_plots(scenario, seed, choice, Path(ns.out)) if final.drafter else []
    if controller.last_decision is not None and controller.last_decision.estimates:
        ran = set(values) | set(curve)  # what the demo ran statically anyway
        png, points = _search_plot(controller.last_decision, final, metric, ran, value, ns.out)
        report.insert(0, png)
        outcome["search"] = [
            {
                "arm": p.name,
                "value": _round(p.value),
                "low": _round(p.low),
                "high": _round(p.high),
                "measured": p.measured,
                "static_run": _round(p.truth),
            }
            for p in points
        ]
    outcome["report"] = [str(p) for p in report]
    if ns.json:
        print(json.dumps(outcome))
        return 0
    trail = Table(title="Decision trail", title_justify="left")
    for col in ("t (sim s)", "event", "why"):
        trail.add_column(col)
    for e in events:
        trail.add_row(f"{e.at_s:.0f}", e.reason, e.message)
    console.print(trail)
    unit = "s" if metric.minimise else ""
    shown = (
        f"SPEEDUP {outcome['speedup']:.2f}× on {metric.value} over off, as the search measured "
        "it (what `kubectl get spt` would show). "
        if outcome["speedup"] is not None
        else ""
    )
    console.print(
        f"[bold]Final setting: {final.name}[/bold] after {stage.trials} configuration changes. "
        + shown
        + f"Checked by static runs of each arm on the same traffic, {metric.value} over the "
        "last phase: "
        + ", ".join(f"{k} {v:.4g}{unit}" for k, v in values.items())
        + f". Gain: {outcome['gain_over_initial']:.2f}× over the initial {initial.name}, "
        f"{outcome['gain_over_off']:.2f}× over off."
    )
    if stage.canary_arm is not None:
        # The scenario's end cuts the last window short; nothing is decided on it.
        console.print(
            f"The scenario ended during the trial of {stage.canary_arm.name} on the canary, "
            f"before its window was complete: the target keeps {final.name}, the best arm "
            "measured so far."
        )
    if final.drafter:
        console.print(f"Report for {final.drafter}: {report[-1]}")
    if report:
        console.print(f"Every arm as the search's last decision saw it: {report[0]}")
    return 0


def _search_plot(
    decision: Any, final: Any, metric: Any, ran: set[str], value: Callable[[str], float], out: str
) -> tuple[Path, list[Any]]:
    """``search.png``: the last decision's estimate of every arm against the static runs;
    returns its path and the points drawn (``ArmPoint``), which the JSON outcome lists.

    The estimates are ratios to the incumbent on the objective; a static run's is its
    value over the incumbent's, over the last phase, for the arms in ``ran`` (those the
    demo simulated anyway): simulating every arm of the space for the picture would take
    minutes.
    """
    from spectune.report import ArmPoint, search_plot
    from spectune.search.arms import parse_arm

    # The estimates are relative to the incumbent of that decision (its own is exactly 1):
    # the final arm, unless the decision was the promotion to it.
    est = decision.estimates
    incumbent = next(
        (n for n in [final.name, *est] if n in est and est[n].measured and est[n].value == 1.0),
        final.name,
    )
    ref = value(incumbent) if incumbent in ran else math.nan

    def order(name: str) -> tuple[str, int]:
        arm = parse_arm(name)
        return (arm.drafter or "", arm.k)

    points = []
    for name in sorted(est, key=order):
        e = est[name]
        truth = value(name) / ref if name in ran and ref > 0 else math.nan  # NaN > 0 is False
        points.append(ArmPoint(name, e.value, e.low, e.high, e.measured, truth))
    path = Path(out) / "search.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    return search_plot(points, metric.value, metric.minimise, incumbent, path), points


def _round(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 6)


def _choice(
    scenario: Any,
    final: Any,
    metric: Any,
    value: Callable[[str], float],
    speedup: float | None,
    tolerance: float,
) -> Any:
    """What the search chose, with its drafter's objective gain over off at every k.

    ``value`` is the objective over the last phase from the oracle's static run of an arm
    (the numbers the final line prints), so the report's curve and the trail agree;
    ``speedup`` is the search's own measured gain (``SPEEDUP``), ``tolerance`` its epsilon.
    """
    from spectune.report import Choice
    from spectune.search.arms import OFF

    off = value(OFF.name)

    def gain(arm: str) -> float:
        v = value(arm)
        return off / v if metric.minimise else v / off

    max_k = next(d.max_k for d in scenario.drafters if d.name == final.drafter)
    fixed = final.schedule is None
    return Choice(
        arm=final.name,
        k=final.k if fixed else None,
        objective=metric.value,
        gain_over_off=gain(final.name),
        measured_gain_by_k={k: gain(f"{final.drafter}/{k}") for k in range(1, max_k + 1)},
        source="static runs of each arm on the demo's traffic, over its last phase",
        speedup=speedup,
        tolerance=tolerance,
    )


def _write_plots(scenario: Any, seed: int, choice: Any, out: Path) -> list[Path]:
    """Diagnose the chosen drafter against off on the same traffic and write the report.

    The drafter runs at its largest k, so the per-position curve and the predicted speedup
    cover every k it may use (per-token means); ``choice`` (:func:`_choice`) puts the
    search's arm and its objective first, and the chosen arm is diagnosed too, so the
    findings (and what they say to do) are of the setting chosen (``spectune.report``).
    """
    from spectune.diagnose import diagnose
    from spectune.metrics import observation_from_pages, parse_page
    from spectune.report import write_report
    from spectune.search.arms import OFF
    from spectune.sim.fleet import Fleet

    def observe(a: Any) -> Any:
        fleet = Fleet(scenario, seed=seed, arms=a)
        fleet.advance(300.0)
        before = [parse_page(fleet.metrics_text(i), f"pod-{i}") for i in range(fleet.size)]
        fleet.advance(900.0)
        after = [parse_page(fleet.metrics_text(i), f"pod-{i}") for i in range(fleet.size)]
        return observation_from_pages(before, after, 600.0)

    from spectune.search.arms import Arm, parse_arm

    arm = parse_arm(choice.arm)
    widest = Arm(arm.drafter, next(d.max_k for d in scenario.drafters if d.name == arm.drafter))
    off = observe(OFF)
    wide = diagnose(observe(widest), off)
    chosen = diagnose(observe(arm), off) if arm != widest else wide
    return write_report(wide, out, choice, chosen)
