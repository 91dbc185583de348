"""The Policy port: given the search space and the history, what to do next.

Every policy — ours (``search/spectune_policy.py``) and the bench's baselines (grid,
ε-greedy, UCB1, acceptance-threshold, static, oracle) — answers the same question with a
:class:`Decision`, so the controller and the bench treat them alike. A policy keeps no
state between calls: the history is its memory.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from spectune.search.arms import OFF, Arm
from spectune.search.history import History, Outcome
from spectune.search.objective import Objective

__all__ = [
    "ASSUMED_DRAFT_COST",
    "Decision",
    "DecisionKind",
    "DrafterSpec",
    "Estimate",
    "Policy",
    "SearchSpace",
    "TuningContext",
]


@dataclass(frozen=True)
class DrafterSpec:
    """One candidate drafter: its name, vLLM method and largest draft length."""

    name: str
    method: str
    max_k: int


@dataclass(frozen=True)
class SearchSpace:
    """The candidate arms: ``off`` (unless disabled) and every drafter at ``1..max_k``."""

    drafters: tuple[DrafterSpec, ...]
    allow_off: bool = True
    per_position: bool = True
    """Whether the engine exports per-position acceptance (vLLM yes, SGLang no)."""
    schedules: bool = False
    """Whether a per-batch-size draft-length table may be promoted (vLLM Dynamic SD)."""
    adaptive: tuple[Arm, ...] = ()
    """In-engine adaptive arms the user listed (``search/arms.py``): candidates like any
    other, but never predicted from another arm's counters; each needs its own trial."""

    def arms(self) -> list[Arm]:
        """Every candidate arm, ``off`` first, the listed adaptive arms last."""
        out = [OFF] if self.allow_off else []
        for d in self.drafters:
            out += [Arm(d.name, k) for k in range(1, d.max_k + 1)]
        return out + list(self.adaptive)

    def drafter(self, name: str) -> DrafterSpec:
        """The drafter called ``name``."""
        for d in self.drafters:
            if d.name == name:
                return d
        raise KeyError(name)


#: Draft cost (target-step units) assumed before one is measured: the default of
#: ``SPECTUNE_DRAFT_COST`` (``settings.py``), which ``mode: recommend`` and the status
#: diagnosis assume too.
ASSUMED_DRAFT_COST = 0.1


@dataclass(frozen=True)
class TuningContext:
    """What a policy knows besides the history."""

    space: SearchSpace
    objective: Objective
    incumbent: Arm
    now_s: float
    max_trials: int = 12
    epsilon: float = 0.02
    """Stop when the chosen arm is within ε (relative) of the best..."""
    delta: float = 0.05
    """...with probability at least 1 − δ."""
    seed: int = 0
    min_requests: int = 30
    """Fewest finished canary requests for a window to count as evidence."""
    min_drafts: int = 0
    """Fewest tokens a drafted arm's canary must have drafted over its trial's windows
    before the trial is judged (SpecTuning ``search.minDrafts``); not counted where the
    engine exports no draft-token counter."""
    canary_beside: bool = False
    """Whether trial canaries serve beside the target's pods rather than in their place:
    then the target's own pods carry the canary's share of the load once a trial ends."""
    assumed_draft_cost: float = ASSUMED_DRAFT_COST
    """Draft cost c assumed until one is measured (it only chooses the search's first
    trial; every later decision rests on measured costs)."""


class DecisionKind(enum.Enum):
    """What the controller should do."""

    TRIAL = "trial"  # run (or keep running) the arm on the canary for another window
    PROMOTE = "promote"  # roll the target onto the arm; the search of this epoch is over
    HOLD = "hold"  # keep everything as it is for a window


@dataclass(frozen=True)
class Estimate:
    """A policy's belief about one arm's objective value, for status and the demo."""

    value: float
    low: float
    high: float
    measured: bool


@dataclass(frozen=True)
class Decision:
    """The next step, why, and what to do with the trial that is running."""

    kind: DecisionKind
    arm: Arm | None
    reason: str
    end_running: Outcome | None = None
    """How to close the running trial before acting (None: leave it running)."""
    estimates: Mapping[str, Estimate] = field(default_factory=dict)
    final: bool = True
    """For PROMOTE: whether the search of this epoch is over (False: promote and go on)."""


class Policy(Protocol):
    """Chooses the next arm from the history alone."""

    name: str

    def decide(self, ctx: TuningContext, history: History) -> Decision:
        """The next step."""
        ...
