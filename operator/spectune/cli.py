# PYTHON_ARGCOMPLETE_OK
"""The ``spectune`` command: whatif, diagnose, report, status, completion (and sim, bench, ...).

This is a body in the sense of DESIGN.md §2: it parses arguments, fetches metrics through
the sources, calls the diagnosis, and prints. Every error spectune raises on purpose ends
as one line on stderr and an exit code of :mod:`spectune.exitcodes` (listed in ``spectune
--help``); a traceback means a bug. ``python -m spectune`` and ``kubectl-spectune`` (a
kubectl plugin: ``kubectl spectune status NS/NAME``) run this same :func:`main`. Shell
completion is argcomplete's (``spectune completion bash``).
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
from spectune.diagnose.findings import Code
from spectune.durations import parse_duration
from spectune.errors import InputError, NoDataError, SpecTuneError
from spectune.exitcodes import EPILOG, ExitCode, exit_code
from spectune.metrics import (
    Observation,
    PodScrapeSource,
    PrometheusSource,
    Snapshot,
    observation_from_pages,
    parse_page,
)

__all__ = ["build_parser", "examples", "main"]

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
    start, end = _read_pages(before, names[0]), _read_pages(after, names[1])
    _check_moments(start, end, names)
    return observation_from_pages(start, end, window)


def _counters(page: Snapshot) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every cumulative sample of a page (counters and histograms), by name and labels."""
    cumulative = {
        name
        for name, kind in page.family_types.items()
        if kind in ("counter", "histogram", "summary")
    }
    out = {}
    for name, samples in page.samples.items():
        family = name.removesuffix("_total")
        for suffix in ("_bucket", "_count", "_sum"):
            if family not in cumulative:
                family = name.removesuffix(suffix)
        if family in cumulative:
            out.update({(name, s.labels): s.value for s in samples})
    return out


def _check_moments(
    start: Sequence[Snapshot], end: Sequence[Snapshot], names: tuple[str, str]
) -> None:
    """Refuse two page sets that cannot be a window: the same moment twice, or reversed.

    Counters only grow while an engine runs. Every counter equal on every pod means no
    request was served between the pages (or the same files were given twice): a window
    with no traffic, so nothing to measure. Every counter that moved having gone down, on
    every pod, is what swapped pages look like; a restart of one pod is read as a reset
    (its increase counts from zero), but with no pod left whose counters grew, the pages'
    order, not a restart, is the likely cause, and reading it as a reset would measure the
    earlier page as the window.
    """
    grew = fell = 0
    for a, b in zip(start, end, strict=True):
        ca, cb = _counters(a), _counters(b)
        for key, v in cb.items():
            if key in ca:
                grew += v > ca[key]
                fell += v < ca[key]
    if grew == 0 and fell == 0:
        raise NoDataError(
            f"no traffic in the window: every counter on the {names[1]} pages equals the "
            f"{names[0]} pages (the same pages twice, or an idle engine); save the "
            f"{names[1]} pages after the engine served requests"
        )
    if grew == 0:
        raise InputError(
            f"every counter on the {names[1]} pages is lower than on the {names[0]} pages: "
            f"the pages look swapped; give the earlier pages as {names[0]} (if every pod "
            "restarted in the window, save a new pair after the restart)"
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
        from spectune.terminal import countdown

        console = Console(stderr=True)

        async def wait(seconds: float) -> None:
            await countdown(console, seconds, "scraping the pods again")

        pods = PodScrapeSource(args.scrape, timeout_s=args.timeout, sleep=wait)
        return asyncio.run(pods.observe(window)), None
    if not args.selector:
        raise InputError(
            '--prometheus needs --selector, e.g. --selector \'{namespace="llm",pod=~"llama-.*"}\''
        )

    def prometheus(selector: str) -> PrometheusSource:
        return PrometheusSource(
            args.prometheus,
            selector,
            timeout_s=args.timeout,
            quote_errors=True,
            headers=_headers(args.header or []),
            tls=_tls(args.ca_file, args.insecure_skip_verify),
            cluster=(args.cluster_label, args.cluster) if args.cluster else None,
        )

    source = prometheus(args.selector)

    async def both() -> tuple[Observation, Observation | None]:
        obs = await source.observe(window)
        baseline = None
        if args.baseline_selector:
            baseline = await prometheus(args.baseline_selector).observe(window)
        return obs, baseline

    return asyncio.run(both())


def _headers(given: Sequence[str]) -> dict[str, str]:
    from spectune.metrics.prometheus import check_headers

    headers = {}
    for h in given:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            raise InputError(f"--header {h!r}: write it as 'Name: value', e.g. 'X-Scope-OrgID: t1'")
        headers[name.strip()] = value.strip()
    return check_headers(headers, "--header")


def _tls(ca_file: str | None, insecure: bool) -> Any:
    from spectune.metrics.prometheus import tls_context

    if ca_file and insecure:
        raise InputError("give --ca-file or --insecure-skip-verify, not both")
    pem = None
    if ca_file:
        try:
            pem = Path(ca_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise InputError(f"--ca-file: {ca_file} is not a readable PEM file") from None
    return tls_context(pem, insecure)


def _diagnosis(args: argparse.Namespace) -> Diagnosis:
    obs, baseline = _observations(args)
    return diagnose(obs, baseline, current_k=args.k, draft_cost=args.draft_cost)


def _fail_on(given: Sequence[str]) -> set[Code]:
    codes = set()
    for raw in given:
        for name in filter(None, (n.strip().upper() for n in raw.split(","))):
            try:
                codes.add(Code(name))
            except ValueError:
                valid = ", ".join(c.value for c in Code)
                raise InputError(
                    f"--fail-on: {name} is not a diagnosis code; codes: {valid}"
                ) from None
    return codes


def _cmd_diagnose(args: argparse.Namespace) -> int:
    gate = _fail_on(args.fail_on or [])
    d = _diagnosis(args)
    if args.json:
        print(json.dumps(d.to_json(), indent=None))
    else:
        from spectune.terminal import render_diagnosis

        render_diagnosis(Console(), d)
    found = sorted({f.code.value for f in d.findings} & {c.value for c in gate})
    if found:
        print(
            f"spectune: --fail-on: found {', '.join(found)} (exit {int(ExitCode.FINDING)})",
            file=sys.stderr,
        )
        return ExitCode.FINDING
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
    c = p.add_argument_group("connecting to Prometheus")
    c.add_argument(
        "--header",
        action="append",
        metavar="'NAME: VALUE'",
        help="an extra HTTP header for every query, e.g. 'X-Scope-OrgID: tenant-a' (repeat)",
    )
    c.add_argument("--ca-file", metavar="PEM", help="CA bundle that signed Prometheus' certificate")
    c.add_argument(
        "--insecure-skip-verify",
        action="store_true",
        help="do not check Prometheus' TLS certificate (encrypted, but not authenticated)",
    )
    c.add_argument(
        "--cluster",
        metavar="VALUE",
        help='add CLUSTER_LABEL="VALUE" to every query (a Thanos or Mimir of many clusters)',
    )
    c.add_argument(
        "--cluster-label", default="cluster", metavar="NAME", help="the cluster label (cluster)"
    )
    p.add_argument("--window", help="window length (e.g. 60s, 10m); required for live sources")
    p.add_argument("--timeout", type=float, default=10.0, help="per-request timeout in seconds")
    p.add_argument("--k", type=int, help="the draft length, when the metrics cannot tell it")
    p.add_argument(
        "--draft-cost", type=float, help="assumed draft cost c when there is no baseline"
    )


def examples(*lines: str) -> str:
    """The ``examples:`` section of a subcommand's help (one command a line)."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


HELP_FORMAT = argparse.RawDescriptionHelpFormatter
"""Keeps the descriptions' and the examples' line breaks."""


def _cmd_completion(args: argparse.Namespace) -> int:
    from argcomplete.shell_integration import shellcode

    sys.stdout.write(shellcode(["spectune", "kubectl-spectune"], shell=args.shell))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="spectune",
        description="Tune speculative decoding for LLM serving deployments.",
        epilog=examples(
            "spectune demo",
            "spectune diagnose --example",
            "spectune status llm/llama-70b -w",
        )
        + "\n\n"
        + EPILOG,
        formatter_class=HELP_FORMAT,
    )
    parser.add_argument("--version", action="version", version=f"spectune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    w = sub.add_parser(
        "whatif",
        help="expected tokens and speedup per k for an acceptance and a draft cost",
        description=(
            "Predict the expected tokens per verification pass and the speedup of each draft "
            "length k, for a flat per-token acceptance a and a draft step cost c (in target "
            "steps). No metrics needed."
        ),
        epilog=examples(
            "spectune whatif --acceptance 0.7 --draft-cost 0.15",
            "spectune whatif --acceptance 0.55 --draft-cost 0.05 --max-k 12 --json",
        ),
        formatter_class=HELP_FORMAT,
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
        "diagnose",
        help="why speculation is or is not paying, from pages, pods or Prometheus",
        description=(
            "Read a window of serving-engine metrics (saved /metrics pages, live pods, or "
            "Prometheus), measure the acceptance curve and the draft cost, predict the "
            "speedup of every k, and say what to change. With --fail-on CODE the exit status "
            f"is {int(ExitCode.FINDING)} when that diagnosis code is found (a CI gate)."
        ),
        epilog=examples(
            "spectune diagnose --example",
            "spectune diagnose --before a0.prom --after a1.prom --window 10m",
            "spectune diagnose --scrape http://10.0.0.7:8000/metrics --window 60s",
            "spectune diagnose --prometheus http://prometheus:9090 "
            "--selector '{namespace=\"llm\"}' --window 10m --fail-on LOW_ACCEPTANCE",
        )
        + f"\n\ndiagnosis codes (for --fail-on): {', '.join(c.value for c in Code)}",
        formatter_class=HELP_FORMAT,
    )
    _add_inputs(d)
    d.add_argument("--json", action="store_true", help="print JSON")
    d.add_argument(
        "--fail-on",
        action="append",
        metavar="CODE",
        help=f"exit {int(ExitCode.FINDING)} when the diagnosis finds CODE, e.g. K_PAST_PEAK "
        "(repeat, or comma-separate)",
    ).completer = lambda **_: [c.value for c in Code]  # type: ignore[attr-defined]
    d.set_defaults(func=_cmd_diagnose)

    r = sub.add_parser(
        "report",
        help="write PNG plots and an HTML page of a diagnosis",
        description=(
            "Diagnose as `spectune diagnose` does (same inputs), and write the acceptance "
            "curve, the predicted speedup per k and an HTML page to a directory."
        ),
        epilog=examples(
            "spectune report --example --out report/",
            "spectune report --before a0.prom --after a1.prom --window 10m --out report/",
        ),
        formatter_class=HELP_FORMAT,
    )
    _add_inputs(r)
    r.add_argument("--out", required=True, help="output directory")
    r.set_defaults(func=_cmd_report)

    comp = sub.add_parser(
        "completion",
        help="print the shell completion script (bash or zsh)",
        description=(
            "Print a script that makes the shell complete spectune's (and kubectl-spectune's) "
            "commands, flags and diagnosis codes. Load it in the shell's start-up file."
        ),
        epilog=examples(
            'eval "$(spectune completion bash)"   # in ~/.bashrc',
            'eval "$(spectune completion zsh)"    # in ~/.zshrc',
        ),
        formatter_class=HELP_FORMAT,
    )
    comp.add_argument("shell", choices=("bash", "zsh"), help="the shell")
    comp.set_defaults(func=_cmd_completion)

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
        "spectune.playground",
        "spectune.status_command",
    ):
        try:
            command = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        command.register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit code (:class:`~spectune.exitcodes.ExitCode`)."""
    parser = build_parser()
    if argv is None:
        import argcomplete

        argcomplete.autocomplete(parser)  # returns at once unless the shell is completing
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except SpecTuneError as exc:
        print(f"spectune: error: {exc}", file=sys.stderr)
        return int(exit_code(exc))
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError:  # e.g. piped into `head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
