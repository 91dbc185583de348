"""``spectune sim run``, ``sim serve`` and ``sim sample``: the simulator's command line.

The top-level CLI (``spectune.cli``) calls :func:`register` to add the ``sim`` commands to
its parser; ``python3 -m spectune.sim.command`` runs them on their own. Errors the user can
fix (a bad scenario, arm or flag) print one line on stderr and exit 3
(``spectune.exitcodes``), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.errors import SpecError, SpecTuneError
from spectune.exitcodes import exit_code
from spectune.search.arms import parse_arm

if TYPE_CHECKING:
    from spectune.sim.fleet import Fleet

# The simulator's modules (numpy, scipy.special) load only when a sim command runs, so that
# registering the subcommands costs `spectune --help` nothing.

__all__ = ["main", "register", "run_command", "sample_command", "serve_command"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``sim`` with its ``run``, ``serve`` and ``sample`` sub-commands to a CLI's sub-parsers.

    Each sub-command sets ``func`` to a callable taking the parsed namespace and returning
    the exit code.
    """
    sim = subparsers.add_parser(
        "sim",
        help="simulated vLLM/SGLang replicas (no cluster, no GPU)",
        description="Run or serve the simulator on a scenario file.",
        epilog=(
            "examples:\n"
            "  spectune sim run --scenario examples/scenarios/chat-eagle3.yaml --arm"
            " eagle3/3 --json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sim_sub = sim.add_subparsers(dest="sim_command", metavar="{run,serve,sample}", required=True)

    run = sim_sub.add_parser(
        "run",
        help="run one static arm on the scenario's fleet and print the figures",
        description="Run one static arm on the whole fleet in virtual time.",
        epilog=(
            "examples:\n"
            "  spectune sim run --scenario examples/scenarios/chat-eagle3.yaml --arm"
            " eagle3/3 --json\n"
            "  spectune sim run --scenario examples/scenarios/chat-eagle3.yaml --arm off"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--scenario", required=True, metavar="FILE", help="scenario YAML file")
    run.add_argument("--arm", required=True, help="off, <drafter>/<k> or <drafter>/sched:...")
    run.add_argument(
        "--duration", type=float, metavar="S", help="simulated seconds (default: the file's)"
    )
    run.add_argument("--seed", type=int, metavar="N", help="seed (default: the file's)")
    run.add_argument(
        "--metrics-out", metavar="FILE", help="write replica 0's final /metrics page here"
    )
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.set_defaults(func=run_command)

    serve = sim_sub.add_parser(
        "serve",
        help="serve one simulated replica's /metrics in (scaled) real time",
        description=(
            "Serve one replica of the scenario on loopback, configured by the vLLM arguments "
            "after '--' (e.g. --speculative-config '{...}')."
        ),
        epilog=(
            "examples:\n"
            "  spectune sim serve --scenario examples/scenarios/chat-eagle3.yaml --port"
            ' 8000 -- --speculative-config \'{"method": "eagle3", "num_speculative_tokens": 3}\''
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--scenario", required=True, metavar="FILE", help="scenario YAML file")
    serve.add_argument("--port", type=int, required=True, metavar="P")
    serve.add_argument("--host", default="127.0.0.1", help="loopback address (default 127.0.0.1)")
    serve.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="simulated seconds per wall second (default 1)",
    )
    serve.add_argument("--replica-index", type=int, default=0, metavar="I")
    serve.add_argument("--replicas", type=int, default=1, metavar="N")
    serve.add_argument("--seed", type=int, metavar="N", help="seed (default: the file's)")
    serve.add_argument(
        "--clock-epoch",
        type=float,
        metavar="UNIX_TIME",
        help=(
            "the wall-clock moment of simulated time 0 (default: now). Pods given the same "
            "epoch and seed serve the same requests at the same moment whenever each started, "
            "as pods behind one Service do; a pod starts empty at the epoch's scaled age"
        ),
    )
    serve.add_argument(
        "--service",
        metavar="DIR",
        help=(
            "a directory shared by the pods of one service (needs --clock-epoch): each pod "
            "registers there and serves only its round-robin share of the service's one "
            "arrival stream, so adding a pod splits the offered load instead of adding to it"
        ),
    )
    serve.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then the vLLM arguments")
    serve.set_defaults(func=serve_command)

    sample = sim_sub.add_parser(
        "sample",
        help="draw scenario files from a family of priors",
        description=(
            "Draw checked scenario files from a family file (benchmarks/families/*.yaml); the "
            "same family, seed and count write the same files. Each world's regime tags and "
            "the draws rejected before it go to DIR/index.yaml."
        ),
        epilog=(
            "examples:\n"
            "  spectune sim sample --family benchmarks/families/realistic.yaml --seed 1"
            " --count 5 --out worlds/"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sample.add_argument("--family", required=True, metavar="FILE", help="family YAML file")
    sample.add_argument("--seed", type=int, required=True, metavar="N")
    sample.add_argument("--count", type=int, default=1, metavar="M", help="worlds (default 1)")
    sample.add_argument("--out", required=True, metavar="DIR", help="folder for the files")
    sample.set_defaults(func=sample_command)


# --- sim run ----------------------------------------------------------------------------


def run_command(ns: argparse.Namespace) -> int:
    """``sim run``: simulate, then print the figures (JSON or a table)."""
    from spectune.sim.fleet import Fleet
    from spectune.sim.scenario import load_scenario
    from spectune.sim.summary import summarise

    scenario = load_scenario(Path(ns.scenario))
    arm = parse_arm(ns.arm)
    scenario.check_arm(arm)
    duration = float(ns.duration) if ns.duration is not None else scenario.duration_s
    if not duration > 0 or math.isinf(duration):
        raise SpecError(f"--duration must be a positive number of seconds, got {ns.duration}")
    wall0 = time.perf_counter()
    fleet = Fleet(scenario, seed=ns.seed, arms=arm)
    failed = [s for s in fleet.states() if s.failure is not None]
    if failed:
        raise SpecError(f"arm {arm} cannot start on {scenario.name}: {failed[0].failure}")
    _advance_with_progress(fleet, duration, show=sys.stderr.isatty() and not ns.json)
    wall = time.perf_counter() - wall0
    summary = summarise(fleet.records(), duration)
    totals = fleet.totals()
    state = fleet.state(0)
    out: dict[str, Any] = {
        "scenario": scenario.name,
        "arm": arm.name,
        "seed": fleet.seed,
        "requests": summary.requests,
        "tpot_p50": summary.tpot_p50,
        "tpot_p95": summary.tpot_p95,
        "ttft_p95": summary.ttft_p95,
        "e2e_p95": summary.e2e_p95,
        "queue_p95": summary.queue_p95,
        "output_tokens_per_s": summary.output_tokens_per_s,
        "num_gpu_blocks": state.num_gpu_blocks,
        "preemptions": totals.preemptions,
        "mean_accepted_length": totals.mean_accepted_length,
        "acceptance_rate": totals.acceptance_rate,
        "sim_seconds": duration,
        "wall_seconds": round(wall, 3),
    }
    out = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}
    if ns.metrics_out:
        try:
            Path(ns.metrics_out).write_text(fleet.metrics_text(0), encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"--metrics-out {ns.metrics_out}: {exc.strerror}") from None
    if ns.json:
        print(json.dumps(out))
    else:
        _print_table(out)
    return 0


def _advance_with_progress(fleet: Fleet, duration: float, *, show: bool) -> None:
    chunks = 100
    if not show:
        fleet.advance(duration)
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("simulating"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("sim", total=duration)
        for i in range(1, chunks + 1):
            fleet.advance(duration * i / chunks)
            progress.update(task, completed=fleet.now)


def _print_table(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{out['scenario']} · arm {out['arm']} · seed {out['seed']}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in out.items():
        if key in {"scenario", "arm", "seed"}:
            continue
        if value is None:
            shown = "—"
        elif isinstance(value, float):
            shown = f"{value:.4g}"
        else:
            shown = str(value)
        table.add_row(key, shown)
    Console().print(table)


# --- sim serve --------------------------------------------------------------------------


def serve_command(ns: argparse.Namespace) -> int:
    """``sim serve``: one replica in scaled real time until SIGTERM/SIGINT."""
    from spectune.sim.fleet import Fleet
    from spectune.sim.scenario import load_scenario
    from spectune.sim.server import SimServer, arm_from_vllm_args, model_name_from_vllm_args
    from spectune.sim.service import LEAD_WALL_S, Service

    scenario = load_scenario(Path(ns.scenario))
    vllm_args = list(ns.vllm_args)
    if vllm_args and vllm_args[0] == "--":
        vllm_args = vllm_args[1:]
    if ns.replicas < 1 or not 0 <= ns.replica_index < ns.replicas:
        raise SpecError(
            f"--replica-index {ns.replica_index} must be within 0..{ns.replicas - 1} "
            "(--replicas N, N >= 1)"
        )
    arm = arm_from_vllm_args(scenario, vllm_args)
    now = time.time()
    start_s = 0.0
    if ns.clock_epoch is not None:
        if not math.isfinite(ns.clock_epoch) or ns.clock_epoch > now:
            raise SpecError(
                f"--clock-epoch {ns.clock_epoch:g} must be a Unix time that has passed "
                f"(now {now:.0f})"
            )
        start_s = max(0.0, (now - ns.clock_epoch) * ns.time_scale)
    service: Service | None = None
    if ns.service is not None:
        # Pods split one stream only if they agree on its clock and on which stream it is.
        if ns.clock_epoch is None:
            raise SpecError("--service needs --clock-epoch: the pods of a service share a clock")
        if ns.replicas != 1:
            raise SpecError(
                "--service splits the stream among the pods that join it; leave out --replicas"
            )
        service = Service(Path(ns.service))
    fleet = Fleet(
        scenario,
        seed=ns.seed,
        arms=arm,
        replicas=1,
        load_scale=1.0 / ns.replicas,
        stream=ns.replica_index,
        model_name=model_name_from_vllm_args(vllm_args),
        epoch_s=now - start_s,
        start_s=start_s,
        keep=None if service is None else service.keeps,
    )
    state = fleet.state(0)
    if state.failure is not None:
        # What a vLLM pod does when its KV pool cannot hold one sequence: die at start-up.
        print(f"ValueError: {state.failure}", file=sys.stderr)
        return 1
    server = SimServer(fleet, time_scale=ns.time_scale, host=ns.host, port=ns.port, service=service)
    lead_s = LEAD_WALL_S * ns.time_scale
    if service is not None:
        service.join(f"{ns.host}:{server.port}", server.sim_now() + lead_s)

    def on_signal(*_: object) -> None:
        if service is None or server.stopping:
            server.stop()
            return
        # Announce the leave ahead, and serve this pod's share until then, so that each
        # arrival of the service is served once while the others take over.
        until = server.sim_now() + lead_s
        service.leave(until)
        server.stop(at_s=until)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(
        f"spectune sim serve: {scenario.name} replica {ns.replica_index}/{ns.replicas}, "
        f"arm {arm}, {state.num_gpu_blocks} KV blocks, on http://{ns.host}:{server.port}"
        + (f", one pod of service {ns.service}" if service is not None else ""),
        file=sys.stderr,
        flush=True,
    )
    server.serve_forever()
    return 0


# --- sim sample -------------------------------------------------------------------------


def sample_command(ns: argparse.Namespace) -> int:
    """``spectune sim sample``: write the family's worlds for one seed, report rejections."""
    from spectune.sim.sampler import load_family, sample_worlds, write_worlds

    family = load_family(ns.family)
    sampling = sample_worlds(family, ns.seed, ns.count)
    paths = write_worlds(sampling, ns.out)
    rejected = sampling.rejections
    print(f"wrote {len(paths)} worlds of family {family.name} (seed {ns.seed}) to {ns.out}")
    if rejected:
        print(f"{len(rejected)} draws rejected and drawn again:")
        for line in rejected:
            print(f"  {line}")
    return 0


# --- standalone entry point ----------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sim run`` / ``sim serve`` without the top-level CLI (``python3 -m``)."""
    parser = argparse.ArgumentParser(prog="spectune")
    register(parser.add_subparsers(dest="command", required=True))
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] != "sim":
        args = ["sim", *args]
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
