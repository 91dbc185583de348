"""Arms: the speculative settings a policy chooses between, and their names.

An arm is one static configuration of a deployment: speculation ``off``, one drafter at a
fixed draft length ``k``, or one drafter under an *in-engine adaptive mode* — a rule the
engine itself applies step by step (:class:`AdaptiveMode`):

* ``batch-table``: vLLM's Dynamic SD table ``num_speculative_tokens_per_batch_size``
  (``k`` chosen by the running batch size), named ``<drafter>/sched:<lo>-<hi>=<k>,...``
  (DESIGN.md §5);
* ``verify``: vLLM's ``adaptive_verification`` with its table: ``k`` is the largest draft
  per request, the table gives ``optimal_K`` per batch size, and each step verifies
  ``N × optimal_K`` drafted tokens spread over the requests by predicted acceptance;
  named ``<drafter>/verify:<k>:<lo>-<hi>=<K>,...``;
* ``tiers``: SGLang's ``--speculative-adaptive``: the engine switches between the
  ``candidate_steps`` tiers from its running accept length (strategy ``accept-length``,
  the merged default) or from profiled cost (``throughput_aware``, sglang#28045); named
  ``<drafter>/tiers:<s1>,<s2>,...`` or ``<drafter>/tiers:<s1>,...:throughput_aware``.

An adaptive arm is compared with fixed-``k`` arms like any other, but its value is only
ever its own measurement: no counterfactual from another arm's counters speaks for it.
Arms are named ``off``, ``<drafter>/<k>`` or as above; those names are what the bench
prints, the CLI takes and the trial history stores, so :func:`parse_arm` and
:attr:`Arm.name` round-trip exactly.

Callers: the search policy, the bench, ``spectune sim run --arm`` and the simulator fleet.
Pure: no simulator, no engine, no I/O.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from spectune.errors import SpecError

__all__ = ["OFF", "SGLANG_STRATEGIES", "AdaptiveMode", "Arm", "parse_arm"]

Schedule = tuple[tuple[int, int, int], ...]

_DRAFTER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_RANGE_RE = re.compile(r"^(\d+)-(\d+)=(\d+)$")

#: SGLang's adaptive strategies: ``accept-length`` is the merged rule (sglang#21599: the
#: tier follows the EMA of the accept length, with hysteresis; no strategy flag), and
#: ``throughput_aware`` the cost-profiled one proposed in sglang#28045
#: (``--speculative-adaptive-strategy=throughput_aware``).
SGLANG_STRATEGIES = ("accept-length", "throughput_aware")
_DEFAULT_STRATEGY = SGLANG_STRATEGIES[0]


class AdaptiveMode(enum.Enum):
    """The in-engine adaptive modes an arm can run (module docstring)."""

    BATCH_TABLE = "batch-table"
    VERIFY = "verify"
    TIERS = "tiers"

    @property
    def engine(self) -> str:
        """The engine that has the mode."""
        return "sglang" if self is AdaptiveMode.TIERS else "vllm"

    @property
    def describe(self) -> str:
        """One line for the status and the CLI."""
        return {
            AdaptiveMode.BATCH_TABLE: "vLLM Dynamic SD: k per batch size from the table",
            AdaptiveMode.VERIFY: (
                "vLLM adaptive verification: a verify budget of N x optimal_K per step, "
                "spread by predicted acceptance"
            ),
            AdaptiveMode.TIERS: "SGLang --speculative-adaptive: draft-step tiers chosen online",
        }[self]


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
        ``[lo, hi]`` (``verify``: ``optimal_K`` there); ``None`` for a fixed ``k``.
    verify:
        vLLM ``adaptive_verification``: ``k`` is the most any request drafts, and
        :attr:`schedule` the table of ``optimal_K``.
    tiers:
        SGLang ``--speculative-adaptive``: the ``candidate_steps`` tiers, ascending; ``k``
        is the largest.
    strategy:
        SGLang's adaptive strategy (:data:`SGLANG_STRATEGIES`); only with ``tiers``.
    """

    drafter: str | None
    k: int = 0
    schedule: Schedule | None = None
    verify: bool = False
    tiers: tuple[int, ...] | None = None
    strategy: str | None = None

    def __post_init__(self) -> None:
        if self.drafter is None:
            if self.k != 0 or self.schedule is not None or self.verify or self.tiers:
                raise SpecError(f"arm 'off' takes no draft length (got k={self.k})")
            return
        if not _DRAFTER_RE.match(self.drafter) or self.drafter == "off":
            raise SpecError(
                f"arm: bad drafter name {self.drafter!r}; use letters, digits, '_', '-', '.'"
            )
        if self.tiers is not None:
            self._check_tiers()
            return
        if self.strategy is not None:
            raise SpecError(f"arm {self.drafter}: a strategy needs SGLang tiers")
        if self.schedule is None:
            if self.verify:
                raise SpecError(
                    f"arm {self.drafter}/verify: adaptive verification needs its table of "
                    "optimal_K per batch size"
                )
            if self.k < 1:
                raise SpecError(f"arm {self.drafter}/{self.k}: k must be at least 1")
            return
        _check_schedule(self.drafter, self.schedule)
        top = max(k for _, _, k in self.schedule)
        if self.verify:
            if self.k < top:
                raise SpecError(
                    f"arm {self.drafter}/verify: k={self.k} (the most one request drafts) "
                    f"is below the table's largest optimal_K ({top}); raise k to {top} or more"
                )
        elif self.k != top:
            raise SpecError(
                f"arm {self.drafter}: k={self.k} must equal the schedule's largest k ({top})"
            )

    def _check_tiers(self) -> None:
        tiers = self.tiers or ()
        where = f"arm {self.drafter}/tiers"
        if self.schedule is not None or self.verify:
            raise SpecError(f"{where}: SGLang tiers take no batch-size table")
        if not tiers or any(t < 1 for t in tiers) or list(tiers) != sorted(set(tiers)):
            raise SpecError(
                f"{where}: candidate steps {list(tiers)} must be ascending, distinct and "
                "at least 1, e.g. 1,3,7"
            )
        if self.k != tiers[-1]:
            raise SpecError(f"{where}: k={self.k} must equal the largest tier ({tiers[-1]})")
        if self.strategy is not None and self.strategy not in SGLANG_STRATEGIES:
            raise SpecError(
                f"{where}: unknown strategy {self.strategy!r}; use one of "
                f"{', '.join(SGLANG_STRATEGIES)}"
            )
        if self.strategy == _DEFAULT_STRATEGY:
            object.__setattr__(self, "strategy", None)  # one name per arm

    @classmethod
    def verifying(cls, drafter: str, k: int, table: Schedule) -> Arm:
        """Build an adaptive-verification arm: at most ``k`` per request, ``optimal_K`` table."""
        return cls(drafter, k, tuple(table), verify=True)

    @classmethod
    def tiered(cls, drafter: str, tiers: tuple[int, ...], strategy: str | None = None) -> Arm:
        """Build an SGLang adaptive arm over ``tiers`` (``k`` is the largest)."""
        top = max(tiers) if tiers else 0
        return cls(drafter, top, None, tiers=tuple(tiers), strategy=strategy)

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
    def adaptive(self) -> AdaptiveMode | None:
        """The in-engine adaptive mode this arm runs; ``None`` for ``off`` and a fixed k."""
        if self.tiers is not None:
            return AdaptiveMode.TIERS
        if self.verify:
            return AdaptiveMode.VERIFY
        if self.schedule is not None:
            return AdaptiveMode.BATCH_TABLE
        return None

    @property
    def name(self) -> str:
        """The canonical name: ``off``, ``eagle3/3``, ``eagle3/sched:1-64=3,65-256=0``,
        ``eagle3/verify:8:1-32=5,33-512=3`` or ``eagle3/tiers:1,3,7``."""
        if self.drafter is None:
            return "off"
        if self.tiers is not None:
            suffix = f":{self.strategy}" if self.strategy else ""
            return f"{self.drafter}/tiers:{','.join(map(str, self.tiers))}{suffix}"
        if self.schedule is None:
            return f"{self.drafter}/{self.k}"
        parts = ",".join(f"{lo}-{hi}={k}" for lo, hi, k in self.schedule)
        if self.verify:
            return f"{self.drafter}/verify:{self.k}:{parts}"
        return f"{self.drafter}/sched:{parts}"

    def k_at(self, batch_size: int) -> int:
        """Draft length used at ``batch_size`` running requests.

        A batch size that no schedule range covers uses ``k`` (vLLM falls back to the
        static ``num_speculative_tokens`` outside the table). For ``verify`` it is the
        table's ``optimal_K`` (the mean verified drafts per request); for ``tiers`` the
        largest tier (which tier runs is the engine's online choice).
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
    >>> parse_arm("eagle3/verify:8:1-32=5,33-512=3").adaptive
    <AdaptiveMode.VERIFY: 'verify'>
    >>> parse_arm("eagle/tiers:1,3,7").k
    7

    Raises :class:`~spectune.errors.SpecError` saying what is wrong with a malformed name.
    """
    raw = text.strip()
    if raw == "off":
        return OFF
    usage = (
        "arms are named 'off', '<drafter>/<k>', '<drafter>/sched:<lo>-<hi>=<k>,...', "
        "'<drafter>/verify:<k>:<lo>-<hi>=<K>,...' or '<drafter>/tiers:<s1>,<s2>,...'"
    )
    drafter, sep, rest = raw.partition("/")
    if not sep or not drafter or not rest:
        raise SpecError(f"bad arm {text!r}: {usage}")

    def ranges_of(body: str) -> Schedule:
        ranges: list[tuple[int, int, int]] = []
        for part in body.split(","):
            m = _RANGE_RE.match(part.strip())
            if m is None:
                raise SpecError(f"bad arm {text!r}: schedule entry {part!r} is not <lo>-<hi>=<k>")
            ranges.append((int(m.group(1)), int(m.group(2)), int(m.group(3))))
        return tuple(ranges)

    if rest.startswith("sched:"):
        return Arm.scheduled(drafter, ranges_of(rest[len("sched:") :]))
    if rest.startswith("verify:"):
        k_text, colon, body = rest[len("verify:") :].partition(":")
        if not colon or not k_text.isdigit():
            raise SpecError(f"bad arm {text!r}: write '<drafter>/verify:<k>:<lo>-<hi>=<K>,...'")
        return Arm.verifying(drafter, int(k_text), ranges_of(body))
    if rest.startswith("tiers:"):
        steps, _, strategy = rest[len("tiers:") :].partition(":")
        parts = [p.strip() for p in steps.split(",")]
        if not all(p.isdigit() for p in parts):
            raise SpecError(
                f"bad arm {text!r}: tiers {steps!r} are not whole numbers; write e.g. "
                f"'{drafter}/tiers:1,3,7'"
            )
        return Arm.tiered(drafter, tuple(int(p) for p in parts), strategy or None)
    if not rest.isdigit():
        raise SpecError(f"bad arm {text!r}: draft length {rest!r} is not a whole number; {usage}")
    return Arm(drafter, int(rest))
