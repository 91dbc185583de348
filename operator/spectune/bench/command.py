"""``spectune bench``: run a policy against a scenario and print DESIGN.md §5's JSON.

The top-level CLI (``spectune.cli``) calls :func:`register` to add ``bench`` to its parser;
``python -m spectune.bench.command`` runs it on its own (:func:`main`). :func:`register`
imports nothing heavy (the CLI's start-up time matters): the simulator, the controller and
rich are imported when the command runs. Errors the user can fix (a bad scenario file, an
unknown policy, a bad flag) print one line on stderr and exit 3 (``spectune.exitcodes``), never a
traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.errors import SpecError, SpecTuneError
from spectune.exitcodes import exit_code

if TYPE_CHECKING:
    from spectune.bench.runner import BenchResult

__all__ = ["bench_command", "main", "register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bench`` to a CLI's sub-parsers; it sets ``func`` to :func:`bench_command`."""
    p = subparsers.add_parser(
        "bench",
        help="score a tuning policy against a simulated scenario and its oracle",
        description=(
            "Run a policy against a scenario in virtual time through the operator's ports, "
            "and compare its choices with the best static arm of each phase."
        ),
        epilog=(
            "examples:\n"
            "  spectune bench --scenario examples/scenarios/load-ramp.yaml --policy"
            " spectune --json\n"
            "  spectune bench --scenario examples/scenarios/chat-eagle3.yaml --policy"
            " static:eagle3/3"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenario", required=True, metavar="FILE", help="scenario YAML file")
    p.add_argument(
        "--policy",
        required=True,
        metavar="NAME",
        help="spectune, static:<arm>, grid, egreedy, ucb1, acceptance-threshold or oracle",
    )
    p.add_argument("--seed", type=int, metavar="N", help="seed (default: the file's)")
    p.add_argument(
        "--window",
        type=float,
        default=300.0,
        metavar="S",
        help="measurement window of the controller, seconds (default 300)",
    )
    p.add_argument(
        "--canary-replicas", type=int, default=1, metavar="N", help="canary replicas (default 1)"
    )
    p.add_argument(
        "--placement",
        choices=("auto", "replace", "beside"),
        default="auto",
        help="where trial canaries serve, as search.placement (default auto: in the place of "
        "as many target replicas where it can, else beside them)",
    )
    p.add_argument(
        "--jobs", type=int, metavar="N", help="processes for the oracle (default: CPU count)"
    )
    p.add_argument(
        "--pod-action",
        choices=("alert", "restartPod"),
        default="alert",
        help="what a pod whose acceptance decays with its uptime gets, as "
        "retune.drift.podAction (default alert)",
    )
    p.add_argument("--no-cache", action="store_true", help="recompute the oracle, keep nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=bench_command)


def bench_command(ns: argparse.Namespace) -> int:
    """Run the bench and print the result (JSON, or a progress display and a table)."""
    from spectune.bench.registry import check_policy_name
    from spectune.bench.runner import BenchHooks, run_bench
    from spectune.control.controller import ControllerConfig, PodAction
    from spectune.sim.scenario import load_scenario

    scenario = load_scenario(Path(ns.scenario))
    check_policy_name(ns.policy)
    if ns.jobs is not None and ns.jobs < 1:
        raise SpecError(f"--jobs must be at least 1, got {ns.jobs}")
    show = not ns.json and sys.stderr.isatty()
    kwargs: dict[str, Any] = {
        "seed": ns.seed,
        "window_s": ns.window,
        "canary_replicas": ns.canary_replicas,
        "placement": ns.placement,
        "use_cache": not ns.no_cache,
        "jobs": ns.jobs,
        "controller_config": ControllerConfig(pod_action=PodAction(ns.pod_action)),
    }
    if not show:
        result = run_bench(scenario, ns.policy, **kwargs)
    else:
        from rich.console import Console
        from rich.markup import escape
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            arms = 1 + sum(d.max_k for d in scenario.drafters)
            oracle_task = progress.add_task("oracle arms", total=arms)
            run_task = progress.add_task(
                f"{ns.policy} (sim s)", total=float(scenario.duration_s), start=False
            )

            def on_oracle(arm: str, cached: bool, done: int, total: int) -> None:
                progress.update(oracle_task, completed=done, total=total)

            def on_step(now: float, end: float) -> None:
                progress.start_task(run_task)
                progress.update(run_task, completed=now, total=end)

            def on_event(ev: Any) -> None:
                line = escape(f"{ev.reason}: {ev.message}")
                progress.console.print(f"[dim]{ev.at_s:8.0f}s[/dim] {line}", highlight=False)

            result = run_bench(
                scenario,
                ns.policy,
                hooks=BenchHooks(on_oracle=on_oracle, on_step=on_step, on_event=on_event),
                **kwargs,
            )
    if ns.json:
        print(json.dumps(result.to_json()))
    else:
        _print_summary(result)
    return 0


def _fmt(x: float | None, spec: str = ".4g") -> str:
    return "—" if x is None else format(x, spec)


def _print_summary(result: BenchResult) -> None:
    from rich.console import Console
    from rich.table import Table

    from spectune.bench.scoring import RECOVERY_EFFICIENCY

    doc = result.to_json()
    console = Console()
    phases = Table(
        title=f"{doc['scenario']} · policy {doc['policy']} · seed {doc['seed']} · "
        f"objective {doc['objective']}"
    )
    for col in ("phase (s)", "oracle arm", "oracle", "chosen arm", "chosen", "efficiency"):
        phases.add_column(col, justify="left" if "arm" in col or "phase" in col else "right")
    for p in doc["phases"]:
        phases.add_row(
            f"{p['start_s']}–{p['end_s']}",
            p["oracle_arm"],
            _fmt(p["oracle_value"]),
            p["chosen_arm"],
            _fmt(p["chosen_value"]),
            _fmt(p["efficiency"], ".3f"),
        )
    console.print(phases)
    totals = Table(show_header=False)
    totals.add_column("figure")
    totals.add_column("value", justify="right")
    totals.add_row("efficiency (worst phase)", _fmt(doc["efficiency"], ".3f"))
    totals.add_row(
        "run efficiency",
        f"{_fmt(doc['run_efficiency'], '.3f')}  (run {_fmt(result.run_value)} vs "
        f"{result.best_static_arm} {_fmt(result.best_static_value)})",
    )
    totals.add_row("trials (restarts)", str(doc["trials"]))
    ratios = ", ".join(f"{x:.2f}" for x in result.load_ratios) or "—"
    totals.add_row(
        "canary placement · trial load per pod vs target", f"{result.placement} · {ratios}"
    )
    totals.add_row("guardrail breach", f"{doc['guardrail_breach_s']} s")
    promoted = ", ".join(f"{arm} @{t:.0f}s" for t, arm in result.promotions) or "none"
    totals.add_row("promotions", promoted)
    totals.add_row("rollbacks", str(result.rollbacks))
    totals.add_row("served worse than initial", f"{result.worse_than_initial_s:.0f} s")
    for at, took in result.recoveries:
        totals.add_row(
            f"model change @{at:.0f}s: back within {RECOVERY_EFFICIENCY:g} of the oracle",
            "not by the phase's end" if took is None else f"after {took:.0f} s",
        )
    for inc in result.incidents:
        detected = "never" if inc.detected_s is None else f"after {inc.detected_s:.0f} s"
        recovered = (
            "not by the end" if inc.recovered_s is None else f"after {inc.recovered_s:.0f} s"
        )
        totals.add_row(
            f"{inc.kind} {inc.what} @{inc.at_s:.0f}s: reported · recovered",
            f"{detected} · {recovered}",
        )
    totals.add_row("simulated", f"{doc['sim_seconds']} s")
    totals.add_row("wall", f"{doc['wall_seconds']} s")
    console.print(totals)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``bench`` without the top-level CLI (``python -m spectune.bench.command``)."""
    parser = argparse.ArgumentParser(prog="spectune")
    register(parser.add_subparsers(dest="command", required=True))
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "bench":
        args = ["bench", *args]
    ns = parser.parse_args(args)
    try:
        code: int = ns.func(ns)
    except SpecTuneError as exc:
        print(f"spectune: error: {exc}", file=sys.stderr)
        return int(exit_code(exc))
    except BrokenPipeError:
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
