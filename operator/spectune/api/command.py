"""``spectune crd``: print (or write) the SpecTuning CRD generated from the models.

The top-level CLI (``spectune.cli``) calls :func:`register` to add the command; ``python -m
spectune.api.command`` runs it on its own. This module imports only the standard library at
import time (the models and YAML load when the command runs), so registering it costs the
CLI's start-up nothing. After changing ``api/spec.py`` or ``api/status.py``, run
``spectune crd --out crds/spectune.io_spectunings.yaml`` (a golden test checks it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["crd_command", "main", "register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``crd`` to a CLI's sub-parsers; it sets ``func`` to :func:`crd_command`."""
    crd = subparsers.add_parser(
        "crd",
        help="print the SpecTuning CustomResourceDefinition (YAML)",
        description=(
            "Print the SpecTuning CRD generated from spectune's API models, "
            "or write it to a file with --out."
        ),
        epilog=(
            "examples:\n"
            "  spectune crd | kubectl apply -f -\n"
            "  spectune crd --out crds/spectune.io_spectunings.yaml"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    crd.add_argument(
        "--out", metavar="FILE", help="write the YAML to FILE instead of standard output"
    )
    crd.set_defaults(func=crd_command)


def crd_command(args: argparse.Namespace) -> int:
    """Render the CRD to ``args.out`` or standard output; return the exit code."""
    from spectune.api.crd import render_crd

    text = render_crd()
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crd`` as a program (``python -m spectune.api.command crd --out FILE``)."""
    parser = argparse.ArgumentParser(prog="spectune")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
