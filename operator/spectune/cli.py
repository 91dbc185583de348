"""The ``spectune`` command: whatif, diagnose, report (and, as they land, sim, bench, demo, run).

This is a body in the sense of DESIGN.md §2: it parses arguments, fetches metrics through
the sources, calls the diagnosis, and prints. Every error spectune raises on purpose ends
as one line on stderr and exit code 2; a traceback means a bug.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console

from spectune import __version__
from spectune.core import flat_survival, predict_speedup
from spectune.diagnose import Diagnosis, PredictionRow, diagnose
from spectune.durations import parse_duration
from spectune.errors import InputError, SpecTuneError
from spectune.metrics import (
    Observation,
    PodScrapeSource,
    PrometheusSource,
    Snapshot,
    observation_from_pages,
    parse_page,
)

__all__ = ["build_parser", "main"]

EXAMPLE_DEFAULT = "vllm-eagle3-k7"
#: Bundled examples and the page set of the same traffic without speculation, if any.
EXAMPLE_BASELINES = {
    "vllm-eagle3-k7": "vllm-off",
    "vllm-ngram-k4-low": "vllm-off",
}


# -- whatif -------------------------------------------------------------------------------


def _cmd_whatif(args: argparse.Namespace) -> int:
    a, c, max_k = args.acceptance, args.draft_cost, args.max_k
    if not 0.0 <= a < 1.0:
        raise InputError(f"--acceptance must be in [0, 1), got {a:g}")
    if c < 0:
        raise InputError(f"--draft-cost must be ≥ 0, got {c:g}")
    if not 1 <= max_k <= 64:
        raise InputError(f"--max-k must be between 1 and 64, got {max_k}")
    table = predict_speedup(flat_survival(a, max_k), c)
    rows = [
        PredictionRow(int(k), float(e), float(s))
        for k, e, s in zip(table.k, table.expected_tokens, table.speedup, strict=True)
    ]
    if args.json:
        doc = {
            "acceptance": a,
            "draft_cost": c,
            "rows": [
                {
                    "k": r.k,
                    "expected_tokens": round(r.expected_tokens, 6),
                    "speedup": round(r.speedup or 0, 6),
                }
                for r in rows
                if r.k >= 1
            ],
            "best_k": int(table.best_k),
        }
        print(json.dumps(doc))
        return 0
    from spectune.terminal import render_whatif

    render_whatif(Console(), a, c, rows, int(table.best_k))
    return 0


# -- diagnose / report ----------------------------------------------------------------------


def _read_pages(paths: Sequence[str], flag: str) -> list[Snapshot]:
    pages = []
    for i, raw in enumerate(paths):
        path = Path(raw)
        if not path.is_file():
            raise InputError(f"{flag}: {raw} is not a readable file")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise InputError(
                f"{flag}: {raw} is not a text file; save the raw /metrics page"
            ) from None
        # Pods pair by position: the i-th --before page and the i-th --after page.
        pages.append(parse_page(text, pod=f"pod-{i}"))
    return pages


def _pair(
    before: Sequence[str] | None,
    after: Sequence[str] | None,
    window: float | None,
    names: tuple[str, str],
) -> Observation:
    if not after:
        raise InputError(
            f"give {names[1]} pages (and {names[0]} pages from the start of the window, or "
            f"none to read each page since its engine started)"
        )
    if not before:
        # One page per pod: every counter counts since the engine started, so the window is
        # the engine's life. Enough for acceptance; rates per second need --window.
        obs = observation_from_pages([], _read_pages(after, names[1]), window)
        note = (
            f"no {names[0]} pages: each {names[1]} page is read since its engine started "
            "(counters from zero), so the window is the engines' whole life"
        )
        return replace(obs, notes=(note, *obs.notes))
    if len(before) != len(after):
        raise InputError(
            f"{names[0]} has {len(before)} page(s) but {names[1]} has {len(after)}; give one "
            "page per pod at each moment, in the same pod order"
        )
    return observation_from_pages(
        _read_pages(before, names[0]), _read_pages(after, names[1]), window
    )


def _example_pages(name: str) -> tuple[list[str], list[str]]:
    root = resources.files("spectune") / "examples" / "pages"
    available = sorted(p.name for p in root.iterdir() if p.is_dir())
    if name not in available:
        raise InputError(f"no bundled example {name!r}; examples: {', '.join(available)}")
    base = Path(str(root / name))
    before = sorted(str(p) for p in (base / "before").glob("*.prom"))
    after = sorted(str(p) for p in (base / "after").glob("*.prom"))
    return before, after


def _observations(args: argparse.Namespace) -> tuple[Observation, Observation | None]:
    """Resolve the diagnose/report inputs into (observation, baseline)."""
    window = parse_duration(args.window, "--window") if args.window else None
    modes = [
        bool(args.before or args.after),
        bool(args.scrape),
        bool(args.prometheus),
        args.example is not None,
    ]
    if sum(modes) != 1:
        raise InputError(
            "give exactly one input: --before/--after pages, --scrape URL..., --prometheus URL "
            "--selector ..., or --example [NAME]"
        )
    if args.example is not None:
        before, after = _example_pages(args.example)
        obs = _pair(before, after, window or 600.0, ("--before", "--after"))
        baseline = None
        if args.example in EXAMPLE_BASELINES:
            b_before, b_after = _example_pages(EXAMPLE_BASELINES[args.example])
            baseline = _pair(
                b_before, b_after, window or 600.0, ("--baseline-before", "--baseline-after")
            )
        return obs, baseline
    if args.before or args.after:
        obs = _pair(args.before, args.after, window, ("--before", "--after"))
        baseline = None
        if args.baseline_before or args.baseline_after:
            baseline = _pair(
                args.baseline_before,
                args.baseline_after,
                window,
                ("--baseline-before", "--baseline-after"),
            )
        return obs, baseline
    if window is None:
        raise InputError("--window is required with --scrape and --prometheus (e.g. --window 60s)")
    if args.scrape:
        return asyncio.run(
            PodScrapeSource(args.scrape, timeout_s=args.timeout).observe(window)
        ), None
    if not args.selector:
        raise InputError(
            '--prometheus needs --selector, e.g. --selector \'{namespace="llm",pod=~"llama-.*"}\''
        )
    source = PrometheusSource(
        args.prometheus, args.selector, timeout_s=args.timeout, quote_errors=True
    )

    async def both() -> tuple[Observation, Observation | None]:
        obs = await source.observe(window)
        baseline = None
        if args.baseline_selector:
            base = PrometheusSource(
                args.prometheus, args.baseline_selector, timeout_s=args.timeout, quote_errors=True
            )
            baseline = await base.observe(window)
        return obs, baseline

    return asyncio.run(both())


def _diagnosis(args: argparse.Namespace) -> Diagnosis:
    obs, baseline = _observations(args)
    return diagnose(obs, baseline, current_k=args.k, draft_cost=args.draft_cost)


def _cmd_diagnose(args: argparse.Namespace) -> int:
    d = _diagnosis(args)
    if args.json:
        print(json.dumps(d.to_json(), indent=None))
        return 0
    from spectune.terminal import render_diagnosis

    render_diagnosis(Console(), d)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from spectune.report import write_report

    d = _diagnosis(args)
    paths = write_report(d, Path(args.out))
    for p in paths:
        print(p)
    return 0


def _add_inputs(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("inputs (pick one)")
    g.add_argument(
        "--before", nargs="+", metavar="FILE", help="pages at the start of the window, one per pod"
    )
    g.add_argument(
        "--after", nargs="+", metavar="FILE", help="pages at the end of the window, same pod order"
    )
    g.add_argument(
        "--baseline-before",
        nargs="+",
        metavar="FILE",
        help="start pages of the same traffic without speculation",
    )
    g.add_argument(
        "--baseline-after",
        nargs="+",
        metavar="FILE",
        help="end pages of the same traffic without speculation",
    )
    g.add_argument("--scrape", nargs="+", metavar="URL", help="live pods' /metrics URLs")
    g.add_argument("--prometheus", metavar="URL", help="Prometheus base URL")
    g.add_argument("--selector", help="label matchers of the pods, e.g. '{namespace=\"llm\"}'")
    g.add_argument(
        "--baseline-selector", help="label matchers of pods of the same traffic without speculation"
    )
    g.add_argument(
        "--example",
        nargs="?",
        const=EXAMPLE_DEFAULT,
        metavar="NAME",
        help=f"a bundled example page set (default {EXAMPLE_DEFAULT})",
    )
    p.add_argument("--window", help="window length (e.g. 60s, 10m); required for live sources")
    p.add_argument("--timeout", type=float, default=10.0, help="per-request timeout in seconds")
    p.add_argument("--k", type=int, help="the draft length, when the metrics cannot tell it")
    p.add_argument(
        "--draft-cost", type=float, help="assumed draft cost c when there is no baseline"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="spectune", description="Tune speculative decoding for LLM serving deployments."
    )
    parser.add_argument("--version", action="version", version=f"spectune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    w = sub.add_parser(
        "whatif", help="expected tokens and speedup per k for an acceptance and a draft cost"
    )
    w.add_argument(
        "--acceptance", type=float, required=True, help="per-token acceptance a, in [0, 1)"
    )
    w.add_argument(
        "--draft-cost", type=float, required=True, help="draft step cost c in target steps"
    )
    w.add_argument("--max-k", type=int, default=8, help="largest draft length to show (default 8)")
    w.add_argument("--json", action="store_true", help="print JSON")
    w.set_defaults(func=_cmd_whatif)

    d = sub.add_parser(
        "diagnose", help="why speculation is or is not paying, from pages, pods or Prometheus"
    )
    _add_inputs(d)
    d.add_argument("--json", action="store_true", help="print JSON")
    d.set_defaults(func=_cmd_diagnose)

    r = sub.add_parser("report", help="write PNG plots and an HTML page of a diagnosis")
    _add_inputs(r)
    r.add_argument("--out", required=True, help="output directory")
    r.set_defaults(func=_cmd_report)

    _register_optional(sub)
    return parser


def _register_optional(sub: Any) -> None:
    """Subcommands that live with their own layers (the CRD, the simulator, the bench)."""
    for module in (
        "spectune.api.command",
        "spectune.sim.command",
        "spectune.bench.command",
        "spectune.run",
        "spectune.demo",
    ):
        try:
            command = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        command.register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except SpecTuneError as exc:
        print(f"spectune: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. piped into `head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
