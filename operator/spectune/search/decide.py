r"""spectune-v2: one decision rule on one performance model (issue [J]).

Every call rebuilds, from the history alone, the posterior of every arm's objective at the
target's own load (``search/perf.py``) and then applies one rule. With ``D_a`` the log
objective of arm ``a`` minus the incumbent's (negated for a metric to maximise, so lower is
better), ``ε`` and ``δ`` the SpecTuning's tolerance and risk, and the *leader* the measured
arm (or the incumbent) with the lowest posterior mean ``D``:

* **Promote** the leader when the model gives ``P(D_leader < −ε) ≥ 1−δ`` *and* an always-valid
  test on its measured paired windows does not show it worse (:func:`worse_with_confidence`:
  a normal-mixture confidence sequence, valid at every window however often it is read).
  The model decides; the data can veto.
* **Stop** when ``P(D_leader ≤ min_a D_a + ε) ≥ 1−δ`` over every arm still allowed (no arm
  can beat the leader by more than ε), or when the trial budget is spent. The search then
  ends on the leader if it passes the promotion test, otherwise on the incumbent: a
  restart is never bought for a difference the evidence cannot tell from zero.
* **Otherwise try** the arm with the largest expected improvement over the leader
  ``E[max(0, D_leader − D_a)]`` among the arms whose chance of beating it by ε is at least δ
  (the arms that can still change the answer; Russo's top-two rule in spirit). A restart is
  worth buying only for such an arm; the running arm needs none, so it is extended while it
  is still a challenger, up to :data:`MAX_WINDOWS_PER_TRIAL`.

Kept from ``spectune-v1`` as rules of safety, not of search (each is its own function with
its justification there): the per-window guardrails on TTFT and queue time
(``spectune_policy.guardrail_breach``, a trial is closed at once), the evidence a trial must
hold before it is judged (``min_requests``, ``min_drafts``), arms that failed on the target
or could not start are never proposed again (``verify.failing_arms``), and a drafter that
cannot start is dropped with all its ``k``.

Load changes are covariates: the prediction is made at the latest window's load per pod,
whatever load the arms were measured at.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from spectune.search.arms import Arm, parse_arm
from spectune.search.history import History, Outcome, TrialRecord, WindowRecord
from spectune.search.objective import WindowStats
from spectune.search.perf import Prediction, predict
from spectune.search.policy import Decision, DecisionKind, Estimate, TuningContext
from spectune.search.spectune_policy import (
    MAX_WINDOWS_PER_TRIAL,
    METHOD_ACCEPTANCE,
    UNKNOWN_METHOD_ACCEPTANCE,
    close_trial,
    trial_evidence,
)
from spectune.search.verify import failing_arms

__all__ = ["ModelPolicy", "target_load", "try_first", "worse_with_confidence"]

#: An arm already tried this often in an epoch is not restarted again.
MAX_TRIALS_PER_ARM = 2
#: Mixing parameter ρ of the normal-mixture confidence sequence (in units of one window's
#: variance): the boundary is tightest around ρ windows, and one window is the scale at
#: which a veto matters (Howard et al. 2021, eq. 14).
MIXTURE_RHO = 1.0
#: Posterior draws per decision.
DRAWS = 2000


def target_load(history: History, beside: bool) -> float:
    """Output tokens per second per pod that the target will carry: the latest window's
    service throughput over the pods that serve once the trial ends (the incumbent's and,
    where the canary took their place, the canary's)."""
    windows = [w for t in history.in_epoch() for w in t.windows]
    windows += list(history.baseline_windows())
    for w in sorted(windows, key=lambda w: w.end_s, reverse=True):
        groups = [s for s in (w.incumbent, w.canary) if s is not None and s.pods]
        tokens = math.fsum(s.tokens_per_s for s in groups if math.isfinite(s.tokens_per_s))
        pods = (w.incumbent.pods if w.incumbent is not None else 0) if beside and w.incumbent else 0
        pods = pods or sum(s.pods for s in groups)
        if pods and tokens > 0:
            return tokens / pods
    return math.nan


def _paired(w: WindowRecord) -> tuple[float, float] | None:
    """A matched window's log objective difference (canary − incumbent) and its spread."""
    can, inc = w.canary, w.incumbent
    if can is None or inc is None or not w.matched:
        return None
    if not (can.objective > 0 and inc.objective > 0):
        return None
    d = math.log(can.objective) - math.log(inc.objective)
    return d, math.hypot(_spread(can), _spread(inc))


def _spread(s: WindowStats) -> float:
    lo, hi = s.objective_low, s.objective_high
    if math.isfinite(lo) and math.isfinite(hi) and lo > 0 and hi > lo:
        return max((math.log(hi) - math.log(lo)) / 3.92, 0.02)
    return 0.05


def worse_with_confidence(
    trials: Sequence[TrialRecord], arm: str, incumbent: str, minimise: bool, delta: float
) -> bool:
    """Whether the matched windows of ``arm`` against ``incumbent`` show it worse at level δ,
    by a test that stays valid however often it is read.

    Each window's paired log difference, standardised by its sampling spread, is one draw
    of mean μ (μ ≤ 0: not worse). Under μ ≤ 0 the standardised sum stays below the
    normal-mixture boundary :math:`\\sqrt{(n+\\rho)(\\log((n+\\rho)/\\rho) + 2\\log(1/\\delta))}`
    at every n with probability at least 1 − δ (Robbins' mixture martingale; Howard et al.
    2021), so crossing it at any window is evidence against "not worse" at level δ.
    """
    total, n = 0.0, 0
    for t in trials:
        if t.arm != arm or t.incumbent != incumbent:
            continue
        for w in t.windows:
            p = _paired(w)
            if p is not None:
                d, spread = p
                total += (d if minimise else -d) / spread
                n += 1
    if n == 0:
        return False
    boundary = math.sqrt(
        (n + MIXTURE_RHO) * (math.log((n + MIXTURE_RHO) / MIXTURE_RHO) + 2 * math.log(1 / delta))
    )
    return total > boundary


def _candidates(ctx: TuningContext, history: History) -> list[Arm]:
    """The arms still allowed this epoch (not failed on the target, not aborted by a
    guardrail, no drafter that could not start)."""
    epoch = history.in_epoch()
    gone = set(failing_arms(history))
    gone |= {t.arm for t in epoch if t.outcome is Outcome.ABORTED}
    dead = {parse_arm(t.arm).drafter for t in epoch if t.outcome is Outcome.INFEASIBLE}
    dead |= {parse_arm(a).drafter for _, a, infeasible, _ in history.failures if infeasible}
    out = [
        a for a in ctx.space.arms() if a.name not in gone and (a.is_off or a.drafter not in dead)
    ]
    if ctx.incumbent not in out:
        out.append(ctx.incumbent)
    return out


def try_first(lead_gain: float, challenger_gain: float) -> bool:
    """Whether to try the best challenger before promoting a leader that beats the incumbent.

    Promoting now earns the leader's gain ``g`` at once, but the promotion's rollout and
    verification (about ``V`` windows) delay the challenger's trial, whose expected further
    gain is ``h``; trying it first delays ``g`` by the trial's ``W`` windows and then
    promotes the better of the two with one rollout. Over the next ``V + W`` windows the
    first earns ``g·(V + W)`` and the second ``(g + h)·V``: try first when ``h·V > g·W``.
    A trial and a verification both take about two windows (``W ≈ V``), so: when the
    challenger's expected gain over the leader exceeds the leader's over the incumbent.
    """
    return challenger_gain > lead_gain


def _priors(ctx: TuningContext) -> dict[str, tuple[float, float]]:
    return {
        d.name: METHOD_ACCEPTANCE.get(d.method, UNKNOWN_METHOD_ACCEPTANCE)
        for d in ctx.space.drafters
    }


class ModelPolicy:
    """The ``spectune-v2`` policy (see the module docstring)."""

    name = "spectune-v2"

    def decide(self, ctx: TuningContext, history: History) -> Decision:
        """The next step, rebuilt from the history alone."""
        epoch = history.in_epoch()
        running = epoch[-1] if epoch and epoch[-1].outcome is Outcome.RUNNING else None
        if running is not None and running.windows:
            verdict = close_trial(ctx, running)
            if verdict is not None and verdict[0] is Outcome.ABORTED:
                history = history.update_last(running.ended(*verdict))
                return self._next(ctx, history, None, f"guardrail: {verdict[1]}", Outcome.ABORTED)
            if verdict is None:
                return Decision(
                    DecisionKind.TRIAL,
                    parse_arm(running.arm),
                    f"{running.arm}: {self._short(ctx, running)}",
                )
        return self._next(ctx, history, running if running and running.windows else None, "", None)

    # -- a running trial -------------------------------------------------------------------

    @staticmethod
    def _short(ctx: TuningContext, t: TrialRecord) -> str:
        requests, drafted = trial_evidence(t)
        seen = f"{requests:.0f} canary requests"
        if not math.isnan(drafted):
            seen += f" and {drafted:.0f} drafted tokens (minDrafts {ctx.min_drafts})"
        return f"too little evidence so far ({seen}); measuring another window"

    # -- the rule --------------------------------------------------------------------------

    def _next(
        self,
        ctx: TuningContext,
        history: History,
        running: TrialRecord | None,
        note: str,
        end: Outcome | None,
    ) -> Decision:
        arms = _candidates(ctx, history)
        load = target_load(history, ctx.canary_beside)
        if not math.isfinite(load):
            return Decision(
                DecisionKind.HOLD, None, note or "measuring the target's load first", end
            )
        n_trials, _, n_alone = history.recorded()  # compaction-proof: the same draws
        rng = np.random.default_rng([ctx.seed, n_trials, n_alone])
        metric = ctx.objective.metric
        pred = predict(
            history, arms, metric, load, _priors(ctx), ctx.assumed_draft_cost, rng, DRAWS
        )
        d = pred.loss - pred.column(ctx.incumbent)[:, None]
        allowed = [pred.arms.index(a) for a in arms]
        means = d.mean(axis=0)
        here = [j for j in allowed if pred.arms[j].name in pred.measured]
        leader = min([*here, pred.arms.index(ctx.incumbent)], key=lambda j: means[j])
        lead = pred.arms[leader]
        estimates = _estimates(pred, ctx)
        superior, said = self._superior(ctx, history, pred, d, leader)
        end_running = Outcome.MEASURED if running is not None else end
        prefix = f"{note}; " if note else ""
        p_stop = float(np.mean(d[:, leader] <= d[:, allowed].min(axis=1) + ctx.epsilon))
        challengers = self._challengers(ctx, history, d, pred.arms, leader, allowed, running)
        spent = len(history.in_epoch()) >= ctx.max_trials and not (
            running and challengers and challengers[0][0] == pred.arms.index(parse_arm(running.arm))
        )
        if p_stop >= 1 - ctx.delta or not challengers or spent:
            if p_stop >= 1 - ctx.delta:
                why = f"P(no arm beats {lead.name} by {ctx.epsilon:.0%}) = {p_stop:.2f}"
            elif spent:
                why = f"trial budget spent ({ctx.max_trials})"
            else:
                why = f"no arm beats {lead.name} by {ctx.epsilon:.0%} with probability {ctx.delta}"
            final = lead if superior else ctx.incumbent
            if final != ctx.incumbent:
                why += f"; {said}"
            else:
                why += f"; keeping {ctx.incumbent.name}" + (f" ({said})" if lead != final else "")
            return Decision(DecisionKind.PROMOTE, final, prefix + why, end_running, estimates)
        lead_gain = -float(np.mean(d[:, leader]))
        if superior and not try_first(lead_gain, challengers[0][1]):
            why = f"{prefix}{said}; the search goes on"
            return Decision(DecisionKind.PROMOTE, lead, why, end_running, estimates, final=False)
        pick, gain = challengers[0]
        if superior:
            prefix += f"{said}, but trying first: "
        arm = pred.arms[pick]
        keep = running is not None and running.arm == arm.name
        why = (
            f"{arm.name}: expected gain over {lead.name} {gain:.1%} at {load:.0f} tokens/s per pod"
        )
        return Decision(
            DecisionKind.TRIAL, arm, prefix + why, None if keep else end_running, estimates
        )

    def _superior(
        self, ctx: TuningContext, history: History, pred: Prediction, d: np.ndarray, leader: int
    ) -> tuple[bool, str]:
        """The promotion test for the leader (module docstring), with its numbers."""
        arm = pred.arms[leader]
        if arm == ctx.incumbent:
            return False, f"{arm.name} leads"
        p = float(np.mean(d[:, leader] < -ctx.epsilon))
        gain = -float(np.median(d[:, leader]))
        said = (
            f"{arm.name} {gain:+.1%} vs {ctx.incumbent.name} at {pred.load:.0f} tokens/s per "
            f"pod, P(better by {ctx.epsilon:.0%}) = {p:.2f}"
        )
        if p < 1 - ctx.delta:
            return False, said
        if worse_with_confidence(
            history.in_epoch(),
            arm.name,
            ctx.incumbent.name,
            ctx.objective.metric.minimise,
            ctx.delta,
        ):
            return False, f"{said}, but its matched windows show it worse (sequential test)"
        return True, said

    def _challengers(
        self,
        ctx: TuningContext,
        history: History,
        d: np.ndarray,
        names: tuple[Arm, ...],
        leader: int,
        allowed: list[int],
        running: TrialRecord | None,
    ) -> list[tuple[int, float]]:
        """Arms that can still beat the leader by ε with probability δ, by expected gain."""
        tried: dict[str, int] = {}
        for t in history.in_epoch():
            tried[t.arm] = tried.get(t.arm, 0) + 1
        out = []
        for j in allowed:
            arm = names[j]
            if j == leader or arm == ctx.incumbent:
                continue
            extend = running is not None and running.arm == arm.name
            if running is not None and extend and len(running.windows) >= MAX_WINDOWS_PER_TRIAL:
                continue
            if not extend and tried.get(arm.name, 0) >= MAX_TRIALS_PER_ARM:
                continue
            if float(np.mean(d[:, j] < d[:, leader] - ctx.epsilon)) < ctx.delta:
                continue
            out.append((j, float(np.mean(np.maximum(d[:, leader] - d[:, j], 0.0)))))
        return sorted(out, key=lambda x: -x[1])


def _estimates(pred: Prediction, ctx: TuningContext) -> dict[str, Estimate]:
    sign = 1.0 if ctx.objective.metric.minimise else -1.0
    out = {}
    for j, arm in enumerate(pred.arms):
        v = np.exp(sign * pred.loss[:, j])
        lo, mid, hi = np.quantile(v, [0.025, 0.5, 0.975])
        out[arm.name] = Estimate(float(mid), float(lo), float(hi), arm.name in pred.measured)
    return out
