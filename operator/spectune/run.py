"""``spectune run``: start the operator (kopf) with the settings read from the environment.

The top-level CLI calls :func:`register` to add the command; ``python -m spectune.run``
runs it on its own. The settings (``spectune/settings.py``) are read once, here; kopf and
the handlers load only when the command runs, so registering it costs the CLI nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "main", "register", "run_command"]

#: ``--log-level`` choices, least to most severe.
LOG_LEVELS = ("debug", "info", "warning", "error")
#: ``--log-format`` choices: kopf's formats.
LOG_FORMATS = ("full", "plain", "json")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``run`` to a CLI's sub-parsers; it sets ``func`` to :func:`run_command`."""
    run = subparsers.add_parser(
        "run",
        help="run the spectune operator (watches SpecTunings)",
        description=(
            "Run the operator. Settings come from the environment: SPECTUNE_NAMESPACES, "
            "SPECTUNE_PROMETHEUS_URL, SPECTUNE_LIVENESS_PORT, SPECTUNE_METRICS_PORT, "
            "SPECTUNE_POLL_SECONDS, SPECTUNE_METRICS_FAILURES, SPECTUNE_TIME_SCALE, "
            "SPECTUNE_READY_TIMEOUT_SECONDS, SPECTUNE_DRAFT_COST, SPECTUNE_PEERING, "
            "SPECTUNE_PEERING_PRIORITY, SPECTUNE_PEERING_LIFETIME_SECONDS (see spectune.settings)."
        ),
        epilog=("examples:\n  SPECTUNE_NAMESPACES=llm spectune run\n  spectune run --verbose"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--verbose", action="store_true", help="log kopf's debug messages")
    run.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="the least severe messages logged (default: info; --verbose means debug)",
    )
    run.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="full",
        help=(
            "full: timestamped text; plain: the message only; json: one JSON object a line, "
            "with the object it concerns (default: full)"
        ),
    )
    run.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    """Read the settings and run the operator until it is stopped."""
    from spectune.handlers import run_operator
    from spectune.settings import Settings

    level = "debug" if args.verbose else str(args.log_level)
    run_operator(Settings.from_env(), log_level=level, log_format=str(args.log_format))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``spectune run`` as a program (``python -m spectune.run``)."""
    from spectune.errors import SpecTuneError
    from spectune.exitcodes import exit_code

    parser = argparse.ArgumentParser(prog="spectune")
    register(parser.add_subparsers(dest="command", required=True))
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "run":
        args = ["run", *args]
    ns = parser.parse_args(args)
    try:
        return int(ns.func(ns))
    except SpecTuneError as exc:
        print(f"spectune: error: {exc}", file=sys.stderr)
        return int(exit_code(exc))


if __name__ == "__main__":
    sys.exit(main())
