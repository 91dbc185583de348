"""The exit codes of the ``spectune`` command, in one place.

The CLI (``spectune.cli``) and the commands that also run on their own (``python -m
spectune.bench.command`` and the like) map every error spectune raises on purpose to one of
these codes through :func:`exit_code`, so a script or a CI job can tell "fix your input"
from "Prometheus is down, try again" without reading the message. ``spectune --help`` lists
them (:data:`EPILOG`). A traceback (Python's exit code 1) means a bug.
"""

from __future__ import annotations

import enum

from spectune.errors import NoDataError, SourceUnavailableError, SpecError, SpecTuneError

__all__ = ["EPILOG", "ExitCode", "exit_code"]


class ExitCode(enum.IntEnum):
    """What the process exit status of ``spectune`` means."""

    #: the command did what it was asked.
    OK = 0
    #: a bug: Python printed a traceback (its own exit status for an uncaught exception).
    BUG = 1
    #: the command line is wrong: an unknown flag, a missing argument (argparse's status).
    USAGE = 2
    #: the input cannot be used as given: a page, a file, a flag's value, a spec, a name.
    BAD_INPUT = 3
    #: the source (Prometheus, a pod, the API server) cannot be reached or refused.
    UNREACHABLE = 4
    #: the source answered, but there was nothing to measure (no samples, no traffic).
    NO_DATA = 5
    #: ``diagnose --fail-on CODE`` found that diagnosis code (a CI gate).
    FINDING = 6
    #: any other error spectune reports on purpose (a rollout stuck, a window cut short).
    FAILED = 7
    #: stopped with Ctrl-C (128 + SIGINT, the shell's convention).
    INTERRUPTED = 130


_MEANING = {
    ExitCode.OK: "success",
    ExitCode.BUG: "a bug (a traceback is printed; please report it)",
    ExitCode.USAGE: "usage error: unknown flag or missing argument",
    ExitCode.BAD_INPUT: "bad input: a page, file, flag value, spec or name cannot be used",
    ExitCode.UNREACHABLE: "source unreachable: Prometheus, a pod or the API server "
    "cannot be reached, or refused",
    ExitCode.NO_DATA: "no data: the source answered, but there is nothing to measure",
    ExitCode.FINDING: "diagnose --fail-on CODE found CODE",
    ExitCode.FAILED: "any other error spectune reports (a rollout stuck, a window cut)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}

EPILOG = "exit codes:\n" + "\n".join(f"  {int(c):<4}{_MEANING[c]}" for c in ExitCode)
"""The ``exit codes:`` section of ``spectune --help``."""


def exit_code(exc: SpecTuneError) -> ExitCode:
    """The exit code of an error spectune raised on purpose.

    >>> from spectune.errors import InputError, UnauthorizedError
    >>> int(exit_code(InputError("bad page"))), int(exit_code(UnauthorizedError("403")))
    (3, 4)
    """
    if isinstance(exc, SpecError):
        return ExitCode.BAD_INPUT
    if isinstance(exc, SourceUnavailableError):
        return ExitCode.UNREACHABLE
    if isinstance(exc, NoDataError):
        return ExitCode.NO_DATA
    return ExitCode.FAILED
