"""Arms: the speculative settings a policy chooses between, and their names.

An arm is one static configuration of a deployment: speculation ``off``, one drafter at a
fixed draft length ``k``, or one drafter with a per-batch-size schedule of ``k`` (vLLM's
``num_speculative_tokens_per_batch_size``). Arms are named as DESIGN.md §5 says —
``off``, ``<drafter>/<k>``, ``<drafter>/sched:<lo>-<hi>=<k>,...`` — and those names are
what the bench prints, the CLI takes and the trial history stores, so :func:`parse_arm`
and :attr:`Arm.name` round-trip exactly.

Callers: the search policy, the bench, ``spectune sim run --arm`` and the simulator fleet.
Pure: no simulator, no engine, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from spectune.errors import SpecError

__all__ = ["OFF", "Arm", "parse_arm"]

Schedule = tuple[tuple[int, int, int], ...]

_DRAFTER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_RANGE_RE = re.compile(r"^(\d+)-(\d+)=(\d+)$")


@dataclass(frozen=True)
class Arm:
    """One speculative setting.

    Attributes
    ----------
    drafter:
        The drafter's name as the scenario or SpecTuning lists it; ``None`` means off.
    k:
        Draft length (``num_speculative_tokens``); 0 when off. For a schedule arm it is
        the largest ``k`` of the schedule, which is what vLLM needs as
        ``num_speculative_tokens``.
    schedule:
        ``((lo, hi, k), ...)``: draft length ``k`` while the batch size is within
        ``[lo, hi]``; ``None`` for a fixed ``k``.
    """

    drafter: str | None
    k: int = 0
    schedule: Schedule | None = None

    def __post_init__(self) -> None:
        if self.drafter is None:
            if self.k != 0 or self.schedule is not None:
                raise SpecError(f"arm 'off' takes no draft length (got k={self.k})")
            return
        if not _DRAFTER_RE.match(self.drafter) or self.drafter == "off":
            raise SpecError(
                f"arm: bad drafter name {self.drafter!r}; use letters, digits, '_', '-', '.'"
            )
        if self.schedule is None:
            if self.k < 1:
                raise SpecError(f"arm {self.drafter}/{self.k}: k must be at least 1")
            return
        _check_schedule(self.drafter, self.schedule)
        top = max(k for _, _, k in self.schedule)
        if self.k != top:
            raise SpecError(
                f"arm {self.drafter}: k={self.k} must equal the schedule's largest k ({top})"
            )

    @classmethod
    def scheduled(cls, drafter: str, schedule: Schedule) -> Arm:
        """Build a schedule arm; ``k`` is the schedule's largest draft length."""
        _check_schedule(drafter, schedule)
        return cls(drafter, max(k for _, _, k in schedule), tuple(schedule))

    @property
    def is_off(self) -> bool:
        """Whether this arm runs without speculation."""
        return self.drafter is None

    @property
    def name(self) -> str:
        """The canonical name: ``off``, ``eagle3/3`` or ``eagle3/sched:1-64=3,65-256=0``."""
        if self.drafter is None:
            return "off"
        if self.schedule is None:
            return f"{self.drafter}/{self.k}"
        parts = ",".join(f"{lo}-{hi}={k}" for lo, hi, k in self.schedule)
        return f"{self.drafter}/sched:{parts}"

    def k_at(self, batch_size: int) -> int:
        """Draft length used at ``batch_size`` running requests.

        A batch size that no schedule range covers uses ``k`` (vLLM falls back to the
        static ``num_speculative_tokens`` outside the table).
        """
        if self.schedule is None:
            return self.k
        for lo, hi, k in self.schedule:
            if lo <= batch_size <= hi:
                return k
        return self.k

    def __str__(self) -> str:
        return self.name


OFF = Arm(None)


def _check_schedule(drafter: str, schedule: Schedule) -> None:
    if not schedule:
        raise SpecError(f"arm {drafter}/sched: the schedule is empty")
    previous_hi = 0
    for lo, hi, k in schedule:
        where = f"arm {drafter}/sched: range {lo}-{hi}={k}"
        if lo < 1 or hi < lo:
            raise SpecError(f"{where}: needs 1 <= lo <= hi")
        if k < 0:
            raise SpecError(f"{where}: k must be 0 or more")
        if lo <= previous_hi:
            raise SpecError(f"{where}: ranges must be sorted and must not overlap")
        previous_hi = hi
    if max(k for _, _, k in schedule) < 1:
        raise SpecError(f"arm {drafter}/sched: every k is 0; use the arm 'off' instead")


def parse_arm(text: str) -> Arm:
    """Parse an arm name (DESIGN.md §5) into an :class:`Arm`.

    >>> parse_arm("eagle3/3")
    Arm(drafter='eagle3', k=3, schedule=None)
    >>> parse_arm("eagle3/sched:1-64=3,65-512=0").name
    'eagle3/sched:1-64=3,65-512=0'
    >>> parse_arm("off").is_off
    True

    Raises :class:`~spectune.errors.SpecError` saying what is wrong with a malformed name.
    """
    raw = text.strip()
    if raw == "off":
        return OFF
    usage = "arms are named 'off', '<drafter>/<k>' or '<drafter>/sched:<lo>-<hi>=<k>,...'"
    drafter, sep, rest = raw.partition("/")
    if not sep or not drafter or not rest:
        raise SpecError(f"bad arm {text!r}: {usage}")
    if rest.startswith("sched:"):
        ranges: list[tuple[int, int, int]] = []
        for part in rest[len("sched:") :].split(","):
            m = _RANGE_RE.match(part.strip())
            if m is None:
                raise SpecError(f"bad arm {text!r}: schedule entry {part!r} is not <lo>-<hi>=<k>")
            ranges.append((int(m.group(1)), int(m.group(2)), int(m.group(3))))
        return Arm.scheduled(drafter, tuple(ranges))
    if not rest.isdigit():
        raise SpecError(f"bad arm {text!r}: draft length {rest!r} is not a whole number; {usage}")
    return Arm(drafter, int(rest))
