"""Baseline policies: what spectune's own policy is measured against on the bench.

``spectune bench`` (``bench/registry.py``) builds these by name and drives them through the
same controller and ports as ``spectune``'s policy, so a comparison is between decisions,
not between harnesses. Each one is the simplest honest version of a strategy people use:

``static:<arm>``
    Promotes ``<arm>`` at its first decision and never changes it (an untuned deployment,
    or a hand-picked setting).
``grid``
    Katib's grid: every arm of the search space (the incumbent's own arm included) on the
    canary for one window each, in the space's order, then the best measured arm is
    promoted. It ignores ``max_trials``: the grid is the grid.
``egreedy``
    ε-greedy (ε = :data:`EPSILON`) over the non-incumbent arms, one canary window per pull;
    after ``max_trials`` pulls the best measured arm (the incumbent counts as 1.0) is
    promoted.
``ucb1``
    UCB1 (Auer et al. 2002) with the same pulls, budget and promotion; every arm is pulled
    once, in the space's order, before the confidence bonus ranks them.
``acceptance-threshold``
    Holds the incumbent's per-token acceptance rate between :data:`ACCEPTANCE_LOW` and
    :data:`ACCEPTANCE_HIGH` by promoting ``k+1`` / ``k-1`` in place (``off`` below k = 1).
    It never looks at latency, which is why it fails when the batch grows and acceptance
    stays flat (vLLM #26504).
``oracle``
    Given the best static arm of each scenario phase by the bench, promotes it as soon as
    it sees that phase.

Rewards of the model-free bandits are paired: in a trial window the canary's objective is
divided by the incumbent's in the same window (``incumbent / canary`` for a metric to
minimise, ``canary / incumbent`` to maximise), so > 1 means better than the incumbent and
load swings cancel. When the incumbent has no replica of its own (a one-replica fleet) the
incumbent's mean over the epoch's baseline windows stands in. A window with fewer than
``ctx.min_requests`` canary requests is no evidence; a trial gets at most
:data:`MAX_WINDOWS_PER_TRIAL` windows to produce one.

Like every policy (``search/policy.py``) these keep no state: each decision is rebuilt from
the history. Randomness comes from a generator seeded with ``(ctx.seed, epoch, pulls)``.
Policies with ``continuous = True`` want to be asked again after a promotion (they move
the target in place); the bench re-opens the controller's search for them.

Pure: no simulator, no I/O.

References
----------
.. [1] P. Auer, N. Cesa-Bianchi, P. Fischer, "Finite-time analysis of the multiarmed bandit
       problem", Machine Learning 47, 2002.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from spectune.search.arms import OFF, Arm, parse_arm
from spectune.search.history import History, Outcome, TrialRecord, WindowRecord
from spectune.search.policy import Decision, DecisionKind, TuningContext

__all__ = [
    "ACCEPTANCE_HIGH",
    "ACCEPTANCE_LOW",
    "EPSILON",
    "MAX_WINDOWS_PER_TRIAL",
    "AcceptanceThresholdPolicy",
    "EpsilonGreedyPolicy",
    "GridPolicy",
    "OraclePolicy",
    "StaticPolicy",
    "UCB1Policy",
    "paired_ratios",
]

#: A trial whose windows still hold too few canary requests is given up after this many.
MAX_WINDOWS_PER_TRIAL = 3
#: ε-greedy's exploration probability.
EPSILON = 0.2
#: acceptance-threshold: below this per-token acceptance rate, k goes down.
ACCEPTANCE_LOW = 0.5
#: ...and above this one, k goes up.
ACCEPTANCE_HIGH = 0.7
#: acceptance-threshold's draft length when it switches speculation on from ``off``.
START_K = 3
#: Fewest draft passes in a window for acceptance-threshold to trust the rate.
MIN_DRAFTS = 50


# --- evidence shared by the bandits -------------------------------------------------------


def _running(history: History) -> TrialRecord | None:
    trials = history.in_epoch()
    if trials and trials[-1].outcome is Outcome.RUNNING:
        return trials[-1]
    return None


def _incumbent_reference(history: History) -> float | None:
    """Mean incumbent objective over the epoch's baseline windows (one-replica fleets)."""
    values = [
        w.incumbent.objective
        for w in history.baseline_windows()
        if w.incumbent is not None and _finite_positive(w.incumbent.objective)
    ]
    return float(np.mean(values)) if values else None


def _finite_positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def window_ratio(
    w: WindowRecord, minimise: bool, min_requests: float, reference: float | None
) -> float | None:
    """The canary's paired objective ratio in one window (> 1: better), or None."""
    can = w.canary
    if can is None or can.requests < min_requests or not _finite_positive(can.objective):
        return None
    inc_value = reference
    if w.incumbent is not None and _finite_positive(w.incumbent.objective):
        inc_value = w.incumbent.objective
    if inc_value is None:
        return None
    return inc_value / can.objective if minimise else can.objective / inc_value


def paired_ratios(ctx: TuningContext, history: History) -> dict[str, list[float]]:
    """Every valid paired ratio of this epoch, by canary arm, in the order measured."""
    minimise = ctx.objective.metric.minimise
    reference = _incumbent_reference(history)
    out: dict[str, list[float]] = {}
    for t in history.in_epoch():
        for w in t.windows:
            r = window_ratio(w, minimise, ctx.min_requests, reference)
            if r is not None:
                out.setdefault(t.arm, []).append(r)
    return out


def _infeasible(history: History) -> set[str]:
    return {t.arm for t in history.in_epoch() if t.outcome is Outcome.INFEASIBLE}


def _trial_done(ctx: TuningContext, history: History, t: TrialRecord) -> bool:
    """Whether the running trial has its evidence (or has had its chances)."""
    if not t.windows:
        return False
    minimise = ctx.objective.metric.minimise
    reference = _incumbent_reference(history)
    valid = any(window_ratio(w, minimise, ctx.min_requests, reference) for w in t.windows)
    return valid or len(t.windows) >= MAX_WINDOWS_PER_TRIAL


def _best(ratios: dict[str, list[float]], order: Sequence[Arm], incumbent: Arm) -> Arm:
    """The arm with the best mean ratio; the incumbent stands at 1.0 unless measured."""
    best, best_value = incumbent, 1.0
    if incumbent.name in ratios:
        best_value = float(np.mean(ratios[incumbent.name]))
    for arm in order:
        values = ratios.get(arm.name)
        if values and float(np.mean(values)) > best_value:
            best, best_value = arm, float(np.mean(values))
    return best


def _promote(arm: Arm, running: TrialRecord | None, why: str) -> Decision:
    return Decision(
        DecisionKind.PROMOTE,
        arm,
        why,
        end_running=Outcome.MEASURED if running is not None else None,
    )


def _pull(arm: Arm, running: TrialRecord | None, why: str) -> Decision:
    """Run ``arm`` on the canary: keep the running trial if it is the same arm."""
    same = running is not None and running.arm == arm.name
    end = Outcome.MEASURED if running is not None and not same else None
    return Decision(DecisionKind.TRIAL, arm, why, end_running=end)


def _space_arms(ctx: TuningContext) -> list[Arm]:
    return ctx.space.arms()


# --- static -------------------------------------------------------------------------------


@dataclass
class StaticPolicy:
    """``static:<arm>``: promote one arm and keep it."""

    arm: Arm
    name: str = field(init=False)
    continuous: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self.name = f"static:{self.arm.name}"

    def decide(self, ctx: TuningContext, history: History) -> Decision:
        """Promote the arm (a no-op when it already runs)."""
        return _promote(self.arm, _running(history), f"static policy: always {self.arm.name}")


# --- grid ---------------------------------------------------------------------------------


@dataclass
class GridPolicy:
    """Katib's grid: every arm for one window, then the best measured."""

    name: str = "grid"
    continuous: ClassVar[bool] = False

    def decide(self, ctx: TuningContext, history: History) -> Decision:
        """Next untried arm, or the best measured once all were tried."""
        running = _running(history)
        if running is not None and not _trial_done(ctx, history, running):
            return _pull(parse_arm(running.arm), running, f"{running.arm}: too few requests")
        tried = {t.arm for t in history.in_epoch()}
        arms = _space_arms(ctx)
        for arm in arms:
            if arm.name not in tried:
                left = sum(1 for a in arms if a.name not in tried)
                return _pull(arm, running, f"grid: {left} of {len(arms)} arms left to try")
        best = _best(paired_ratios(ctx, history), arms, ctx.incumbent)
        return _promote(best, running, f"grid: {best.name} measured best of {len(arms)} arms")


# --- the bandits --------------------------------------------------------------------------


def _pulls(history: History) -> int:
    """Canary windows observed this epoch (one pull each)."""
    return sum(len(t.windows) for t in history.in_epoch())


def _candidates(ctx: TuningContext, history: History) -> list[Arm]:
    bad = _infeasible(history)
    return [a for a in _space_arms(ctx) if a.name != ctx.incumbent.name and a.name not in bad]


def _rng(ctx: TuningContext, history: History) -> np.random.Generator:
    return np.random.default_rng([ctx.seed, history.epoch, _pulls(history)])


@dataclass
class EpsilonGreedyPolicy:
    """ε-greedy over canary pulls, then the best measured arm."""

    name: str = "egreedy"
    epsilon: float = EPSILON
    continuous: ClassVar[bool] = False

    def decide(self, ctx: TuningContext, history: History) -> Decision:
        """Explore with probability ε, else pull the best mean; promote at the budget."""
        running = _running(history)
        if running is not None and not _trial_done(ctx, history, running):
            return _pull(parse_arm(running.arm), running, f"{running.arm}: too few requests")
        ratios = paired_ratios(ctx, history)
        candidates = _candidates(ctx, history)
        pulls = _pulls(history)
        if pulls >= ctx.max_trials or not candidates:
            best = _best(ratios, candidates, ctx.incumbent)
            return _promote(best, running, f"egreedy: budget of {ctx.max_trials} pulls spent")
        rng = _rng(ctx, history)
        explore = rng.random() < self.epsilon
        measured = [a for a in candidates if a.name in ratios]
        if explore or not measured:
            arm = candidates[int(rng.integers(len(candidates)))]
            return _pull(arm, running, f"egreedy: explore {arm.name}")
        arm = max(measured, key=lambda a: float(np.mean(ratios[a.name])))
        return _pull(arm, running, f"egreedy: exploit {arm.name}")


@dataclass
class UCB1Policy:
    """UCB1 over canary pulls, then the best measured arm."""

    name: str = "ucb1"
    continuous: ClassVar[bool] = False

    def decide(self, ctx: TuningContext, history: History) -> Decision:
        """Pull each arm once, then the highest upper confidence bound; promote at budget."""
        running = _running(history)
        if running is not None and not _trial_done(ctx, history, running):
            return _pull(parse_arm(running.arm), running, f"{running.arm}: too few requests")
        ratios = paired_ratios(ctx, history)
        candidates = _candidates(ctx, history)
        pulls = _pulls(history)
        if pulls >= ctx.max_trials or not candidates:
            best = _best(ratios, candidates, ctx.incumbent)
            return _promote(best, running, f"ucb1: budget of {ctx.max_trials} pulls spent")
        for arm in candidates:
            if arm.name not in ratios:
                return _pull(arm, running, f"ucb1: first pull of {arm.name}")
        total = sum(len(v) for v in ratios.values())

        def bound(a: Arm) -> float:
            # Rewards in [0, 1]: the paired ratio, clipped to [0, 2], halved.
            values = np.clip(np.asarray(ratios[a.name]), 0.0, 2.0) / 2.0
            return float(values.mean()) + math.sqrt(2.0 * math.log(total) / values.size)

        arm = max(candidates, key=bound)
        return _pull(arm, running, f"ucb1: {arm.name} has the highest bound")


# --- acceptance-threshold -----------------------------------------------------------------


def _acceptance_rate(history: History, ctx: TuningContext) -> float | None:
    """The incumbent's per-token acceptance rate in a window that ended just now."""
    windows = history.baseline_windows()
    if not windows:
        return None
    w = windows[-1]
    inc = w.incumbent
    # A window that did not end now was measured before the last promotion's rollout.
    if inc is None or abs(w.end_s - ctx.now_s) > 1e-6:
        return None
    k = ctx.incumbent.k
    if k < 1:
        return None
    if inc.accepted_per_pos and inc.drafts >= MIN_DRAFTS:
        if inc.k and inc.k != k:
            return None  # pages from replicas on another draft length
        return float(sum(inc.accepted_per_pos)) / (inc.drafts * len(inc.accepted_per_pos))
    if inc.drafts >= MIN_DRAFTS or (math.isfinite(inc.mean_accepted_length) and inc.drafts == 0):
        mal = inc.mean_accepted_length
        if math.isfinite(mal) and mal > 1.0:
            return (mal - 1.0) / k
    return None


@dataclass
class AcceptanceThresholdPolicy:
    """Hold acceptance in a band by moving ``k`` in place (the controller #26504 breaks)."""

    name: str = "acceptance-threshold"
    low: float = ACCEPTANCE_LOW
    high: float = ACCEPTANCE_HIGH
    continuous: ClassVar[bool] = True

    def decide(self, ctx: TuningContext, history: History) -> Decision:
        """``k+1`` above the band, ``k-1`` (or off) below it, else hold."""
        running = _running(history)
        if running is not None:
            return Decision(
                DecisionKind.HOLD,
                None,
                "acceptance-threshold runs no canary",
                end_running=Outcome.ABORTED,
            )
        inc = ctx.incumbent
        if inc.is_off or inc.drafter is None:
            if any(e == history.epoch for e, _ in history.promotions) or not ctx.space.drafters:
                return Decision(DecisionKind.HOLD, None, "acceptance-threshold: speculation off")
            d = ctx.space.drafters[0]
            arm = Arm(d.name, min(START_K, d.max_k))
            return _promote(arm, None, f"acceptance-threshold: start {arm.name}")
        rate = _acceptance_rate(history, ctx)
        if rate is None:
            return Decision(DecisionKind.HOLD, None, "acceptance-threshold: measuring")
        max_k = ctx.space.drafter(inc.drafter).max_k
        if rate > self.high and inc.k < max_k:
            arm = Arm(inc.drafter, inc.k + 1)
            why = f"acceptance {rate:.2f} above {self.high:.2f}: k up to {arm.k}"
            return _promote(arm, None, why)
        if rate < self.low:
            arm = Arm(inc.drafter, inc.k - 1) if inc.k > 1 else OFF
            why = f"acceptance {rate:.2f} below {self.low:.2f}: down to {arm.name}"
            return _promote(arm, None, why)
        return Decision(DecisionKind.HOLD, None, f"acceptance {rate:.2f} within the band")


# --- oracle -------------------------------------------------------------------------------


@dataclass
class OraclePolicy:
    """Promote each phase's best static arm (given by the bench) when the phase begins."""

    phases: tuple[tuple[float, float, str], ...]
    """``(start_s, end_s, arm)`` per scenario phase, in order."""
    name: str = "oracle"
    continuous: ClassVar[bool] = True

    def arm_at(self, t: float) -> Arm | None:
        """The oracle arm of the phase holding ``t`` (the last phase after the end)."""
        if not self.phases:
            return None
        for start, end, arm in self.phases:
            if start <= t < end:
                return parse_arm(arm)
        return parse_arm(self.phases[-1][2] if t >= self.phases[-1][1] else self.phases[0][2])

    def decide(self, ctx: TuningContext, history: History) -> Decision:
        """Promote this phase's oracle arm if it is not the incumbent, else hold."""
        running = _running(history)
        arm = self.arm_at(ctx.now_s)
        if arm is None or arm.name == ctx.incumbent.name:
            end = Outcome.ABORTED if running is not None else None
            return Decision(DecisionKind.HOLD, None, "oracle: phase arm runs", end_running=end)
        return _promote(arm, running, f"oracle: {arm.name} is this phase's best static arm")
