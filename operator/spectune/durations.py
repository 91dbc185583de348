"""Durations as users write them (``90s``, ``10m``, ``168h``), parsed in one place.

The CLI's ``--window`` and, later, the SpecTuning's ``window``/``every`` fields use it.
"""

from __future__ import annotations

import re

from spectune.errors import InputError

__all__ = ["format_duration", "parse_duration"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(text: str | float | int, field: str = "duration") -> float:
    """Seconds in ``text``: a number of seconds or Go-style parts such as ``1h30m``.

    Raises :class:`~spectune.errors.InputError` naming ``field`` on anything else or a
    value that is not positive.
    """
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        raw = text.strip()
        try:
            seconds = float(raw)
        except ValueError:
            pos, seconds = 0, 0.0
            for m in _PART.finditer(raw):
                if m.start() != pos:
                    break
                seconds += float(m.group(1)) * _UNITS[m.group(2)]
                pos = m.end()
            if pos != len(raw) or not raw:
                raise InputError(
                    f"{field}: {text!r} is not a duration; write e.g. 90s, 10m, 1h30m or seconds"
                ) from None
    if not seconds > 0:
        raise InputError(f"{field}: must be positive, got {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """A short human form: ``600`` → ``10m``, ``90`` → ``90s``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"
