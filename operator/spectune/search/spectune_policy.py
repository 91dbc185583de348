r"""spectune's policy: model-based best-arm identification with a Bayesian challenger.

Each decision rebuilds beliefs about every arm from the history (``search/model.py``): arms
that were measured on the canary carry their paired, windowed objective ratio to the
incumbent; the rest carry the model's prediction from the acceptance curves and draft costs
measured so far. Then:

1. **Required evidence.** The model cannot speak about a drafter whose acceptance it has
   never seen, nor about costs before it knows what ``off`` does on this traffic, so such a
   drafter is tried once at its largest ``k`` (which gives the curve for every smaller
   ``k``) and ``off`` once — unless an earlier epoch's draft costs already pin ``off``
   down, or a second draft length of the incumbent's drafter gives them: after a load
   move the k the move favours, otherwise a shorter k that the incumbent's counters put
   ahead at the draft cost assumed until one is measured (:func:`_second_length`).
2. **Leader.** The arm with the best posterior mean. An unmeasured leader is tried (we never
   promote on a prediction alone).
3. **Stop.** With posterior samples (:func:`posterior_draws`: a prediction read from a
   measured arm is drawn together with it), the probability that the leader is within ε of the
   best arm; at :math:`\ge 1-\delta` the search ends. It ends on the leader only when the
   leader is ahead of the incumbent with probability :math:`\ge 1-\delta`; otherwise the
   incumbent stays (:func:`_not_ahead`: an arm whose lead is noise is within ε of the best
   too, and would be promoted half the time). The same holds when the search ends because
   no challenger is left or the trial budget is spent.
4. **Challenger.** Otherwise, among the arms that beat the leader by more than ε with
   probability at least δ, the one with the largest expected improvement is tried next —
   a top-two rule in the spirit of Russo (2016), which spends trials on the arms that can
   still change the answer instead of on every arm (UCB1/ε-greedy have no model and must
   visit arms to learn them; BanditSpec, Hou et al. 2025, is UCB-style over a small set).
   An arm whose chance of beating the leader by ε is below δ is not worth a restart, so
   when no challenger reaches δ the leader is promoted. A leader that beats the incumbent
   by ε with confidence is promoted at once and the search goes on against it — unless an
   untried arm that the model reads off the measured ones beats the leader by ε with
   confidence, by at least as much as the leader beats the incumbent: that arm is tried
   first, which saves a rollout (:func:`_sure_refinement`). When the incumbent saturates
   alone (or, on an objective that counts the queue, queues longer alone than beside the
   canary) and the leader has a KV pool as large, being faster per token with that
   confidence suffices, unless the trials show it behind with confidence (the target's
   load widens the lead, :func:`_amplified`); such a leader is promoted at once, never
   held back for a refinement (the incumbent's queue costs users every minute it stays);
   and while a load move that
   re-opened the search goes on, beating it at all suffices for a leader that drafts less
   than the incumbent as the load rises, or more as it falls (:func:`_load_favours`).
   The arm on the canary is extended by another window (no restart) while it is in the
   race — unless it leads and a challenger beats it with confidence — or while a load move
   that goes on favours it and it is not behind the incumbent with confidence, up to
   three windows;
   an arm is restarted at most twice per epoch. A drafter never measured is priced with a
   wide prior below ``off`` (:data:`UNEXPLORED_GAIN`, from the published range of
   speedups).

A trial is judged once its canary has finished ``min_requests`` requests and, for a drafted
arm, drafted ``min_drafts`` tokens (``search.minDrafts``; not counted where the engine exports
no draft-token counter), or after :data:`MAX_WINDOWS_PER_TRIAL` windows, whichever is first.
Guardrails close a trial within its first window when the canary's TTFT p95 or queue-time
p95 is worse than the incumbent's beyond the tolerance with confidence (the canary's lower
bound above the incumbent's upper bound); the arm is never proposed again this epoch. In a
trial's first window a balancer's catch-up burst large enough to be the canary's tail is
set aside: the canary is judged on the quantile that is its p95 without the burst
(:func:`burst_excluded_quantile`), and a trial none of whose windows could be judged so
never ends measured (nor promoted). An arm that cannot start excludes its drafter (its
memory, not its ``k``, is the problem).

References
----------
.. [1] D. Russo, "Simple Bayesian algorithms for best arm identification", COLT 2016.
.. [2] Y. Hou et al., "BanditSpec: Adaptive speculative decoding via bandit algorithms",
       ICML 2025.
.. [3] X. Liu et al., "TurboSpec / SmartSpec: goodput-optimised speculative decoding",
       2024–2025 (cost of verification growing with batch size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta as beta_dist

from spectune.core import predict_speedup, tail_ratio
from spectune.search.arms import OFF, Arm, parse_arm
from spectune.search.history import (
    MATCHED_LOAD_BAND,
    History,
    Outcome,
    TrialRecord,
    WindowRecord,
)
from spectune.search.model import MODEL_PRIOR, ArmBelief, Beliefs, build_beliefs
from spectune.search.objective import (
    SMALL_BATCH_CHANGE,
    Guardrails,
    Metric,
    WindowStats,
    saturated,
)
from spectune.search.policy import Decision, DecisionKind, DrafterSpec, Estimate, TuningContext
from spectune.search.schedule import epoch_batch, learned_schedule

__all__ = [
    "SpectunePolicy",
    "acceptance_rules_out",
    "burst_excluded_quantile",
    "burst_share",
    "catch_up_burst",
    "close_trial",
    "guardrail_breach",
    "guardrail_judgement",
    "judged_windows",
    "load_cost",
    "posterior_draws",
    "trial_evidence",
    "unexplored_prior",
]

#: An arm already tried this often in an epoch is not restarted again as a challenger.
MAX_TRIALS_PER_ARM = 2
#: Degrees of freedom of the error of an arm seen only in warm-up windows
#: (:func:`posterior_draws`). In the A/A check (``benchmarks/family.py --aa``) one twin's
#: first window in eight lies beyond twice its spread, four times a normal's share, and
#: nearly all on the canary's side: a t with 3 degrees of freedom puts 7 % beyond it.
WARM_UP_DOF = 3
#: Spread of one paired window's log ratio of mean per-token latency between identical arms.
#: A mean over thousands of tokens still moves with the batch each pod happened to run
#: (step time grows with the batch, and the balancer sets each pod's batch window by
#: window): in the A/A check on the ``tune`` worlds (``benchmarks/family.py --aa``) the
#: twin's per-token ratios have a median of ±1 %, but one window in ten lies beyond ±4 % and
#: one in twenty beyond ±7 %, a normal spread of 0.035.
TOKEN_WINDOW_SPREAD = 0.035
#: At most this many windows for one trial (the policy extends a trial up to it).
MAX_WINDOWS_PER_TRIAL = 3
#: Prior of a drafter never measured, relative to ``off``: published serving results range
#: from 3.2× lower latency than no speculation (SmartSpec; prompt lookup and EAGLE report
#: 2–3× as well) to 1.4× higher (vLLM's blog, a draft model at high QPS), a log range from
#: −1.16 to +0.34 (reference/anchors.md). Its middle, −0.41 (0.66× off's latency), is the
#: prior mean, and ±2σ covers the range at σ = 0.375. Centred on ``off`` rather than on the
#: incumbent: once a drafter beats ``off``, an unseen one is still as likely as before to
#: beat it too.
UNEXPLORED_GAIN = 0.41
UNEXPLORED_SPREAD = 0.375
#: Prior of a never-measured drafter's first-position acceptance α, by method: a Beta(a, b)
#: per method family, with a per-position decay of :data:`PRIOR_DECAY`
#: (:func:`unexplored_prior`). Sources: reference/anchors-2026.md's method table from the
#: vLLM docs rates n-gram and suffix "low to medium" gain at low QPS where EAGLE, MTP and
#: PARD are "high" and a draft model "high"; "Performance or Illusion?" (arXiv 2601.11580)
#: finds n-gram best only on code editing (copying), EAGLE-3 best all round;
#: reference/anchors.md: EAGLE-2 3.05–4.26× at batch 1, HedgeSpec's generalist EAGLE at
#: 5.69 mean accepted tokens. So n-gram/suffix: mean 0.4 and wide (Beta(2, 3): its 95th
#: percentile, 0.75, is copy-heavy traffic, where it wins); draft models 0.67 (Beta(6, 3));
#: trained heads 0.75 (Beta(7.5, 2.5)); an unknown method Beta(2, 2).
METHOD_ACCEPTANCE: dict[str, tuple[float, float]] = {
    "ngram": (2.0, 3.0), "n_gram": (2.0, 3.0), "suffix": (2.0, 3.0),
    "draft_model": (6.0, 3.0), "parallel_draft_model": (6.0, 3.0),
    "eagle": (7.5, 2.5), "eagle3": (7.5, 2.5), "mtp": (7.5, 2.5), "medusa": (7.5, 2.5),
    "mlp": (7.5, 2.5),
}  # fmt: skip
UNKNOWN_METHOD_ACCEPTANCE = (2.0, 2.0)
PRIOR_DECAY = 0.95
#: Loads within this factor are one regime when learning a per-batch-size table (the
#: controller's default load-shift factor).
LOAD_FACTOR = 1.6
#: Posterior samples for the stopping rule and the challenger.
SAMPLES = 4000
#: Share of a canary's first-window requests from the balancer's catch-up burst at which
#: the burst fills half of the 5 % tail a p95 reads (:func:`catch_up_burst`).
CATCH_UP_SHARE = 0.025
#: Quantiles a guardrail reads in a first window whose catch-up burst is set aside
#: (:func:`burst_excluded_quantile`), highest first; the window's figures carry each one's
#: lower bound.
BURST_QUANTILES = (0.95, 0.90, 0.80, 0.70, 0.50)
#: Fewest canary requests left once a burst is set aside for the window to be judged on them
#: (the order-statistic interval of a quantile of fewer is wider than any tolerance).
MIN_JUDGED_REQUESTS = 20
#: Seconds added to a tolerance so that a p95 near zero (no queueing) cannot "regress" on
#: noise: the resolution of vLLM's smallest latency buckets.
ABSOLUTE_SLACK_S = 0.01


def catch_up_burst(can: WindowStats, inc: WindowStats) -> bool:
    """Whether a canary's first window holds a catch-up burst large enough to be its tail.

    A least-outstanding balancer (Envoy's least-request, the vLLM router) sends a pod that
    just became ready every new request until its outstanding count matches the other
    pods' — about their running batch, per canary pod. Those requests arrive within
    seconds and prefill together, so their TTFT and queue time are the window's slowest:
    once they are :data:`CATCH_UP_SHARE` of the canary's requests they fill half of its
    5 % tail, and its p95 says how the burst went, not how the arm serves. (Under a random
    balancer, as kube-proxy's, there is no burst and the p90 is merely a milder reading.)
    """
    return burst_share(can, inc) >= CATCH_UP_SHARE


def burst_share(can: WindowStats, inc: WindowStats) -> float:
    """The catch-up burst's share of a canary's first-window requests (0 when unknown):
    about the incumbent's running batch per canary pod (:func:`catch_up_burst`)."""
    if not can.requests > 0 or math.isnan(inc.running):
        return 0.0
    return inc.running * max(can.pods, 1) / can.requests


def trial_evidence(t: TrialRecord) -> tuple[float, float]:
    """A trial's canary requests and drafted tokens over its windows (the tokens NaN where
    the engine exports no draft-token counter, which no minimum can then hold back)."""
    canaries = [w.canary for w in t.windows if w.canary is not None]
    drafted = [c.draft_tokens for c in canaries if not math.isnan(c.draft_tokens)]
    return (
        math.fsum(c.requests for c in canaries),
        math.fsum(drafted) if drafted else math.nan,
    )


def burst_excluded_quantile(can: WindowStats, inc: WindowStats) -> float | None:
    """The quantile of a canary's first window that is its p95 without the catch-up burst,
    read as the highest of :data:`BURST_QUANTILES` at or below it; None when too few
    requests are left to judge (:data:`MIN_JUDGED_REQUESTS`).

    The burst is the canary's first requests up to its share of outstanding requests
    (:func:`burst_share`: about the incumbent's running batch per canary pod). They are
    taken to be its slowest: then the p95 of the other ``n − B`` requests is the quantile
    ``0.95 · (1 − B/n)`` of all ``n``, and a lower quantile reads lower still, so the
    canary is given the benefit of every doubt the burst raises and is still judged. Below
    :data:`CATCH_UP_SHARE` nothing is set aside (the p95 as it is).
    """
    share = burst_share(can, inc)
    if share < CATCH_UP_SHARE:
        return 0.95
    if can.requests * (1 - share) < MIN_JUDGED_REQUESTS:
        return None
    q = 0.95 * (1 - share)
    return next((r for r in BURST_QUANTILES if r <= q + 1e-12), None)


def _low(s: WindowStats, label: str, q: float) -> float:
    """The lower 95 % bound of ``s``'s TTFT or queue-time quantile ``q`` (NaN if unknown)."""
    name = "ttft" if label == "TTFT" else "queue"
    return float(getattr(s, f"{name}_p{round(q * 100)}_low"))


def _unjudged(t: TrialRecord) -> str:
    """What a trial's record says when its first window had a catch-up burst set aside, or
    could not be judged on guardrails at all (:func:`burst_excluded_quantile`); empty
    otherwise."""
    first = t.windows[0] if t.windows else None
    if first is None or first.canary is None or first.incumbent is None:
        return ""
    share = burst_share(first.canary, first.incumbent)
    q = burst_excluded_quantile(first.canary, first.incumbent)
    if q == 0.95:
        return ""
    if q is None:
        return (
            f"guardrails not judged in the first window: the balancer's catch-up burst was "
            f"about {share:.0%} of its requests, too few were left"
        )
    return (
        f"guardrails judged on the p{round(q * 100)} in the first window: the balancer's "
        f"catch-up burst, about {share:.0%} of its requests, set aside"
    )


def guardrail_judgement(
    can: WindowStats, inc: WindowStats, g: Guardrails, first: bool = False
) -> tuple[bool, str | None]:
    """Whether the window could be judged on guardrails, and why the canary breaks one
    against the incumbent (None: it does not).

    ``first``: the trial's first window. A catch-up burst there (:func:`catch_up_burst`)
    is set aside, never left unjudged: the canary is judged on the quantile that is its p95
    without the burst (:func:`burst_excluded_quantile`) against the incumbent's p95. A
    saturated service runs hundreds of requests per pod, and the queue that built up while
    the canary started is sent to it at once: a burst that can be a large share of the
    window's requests, whose waits say how long the pod took to start, not how the arm
    serves. Without its burst, that window still says how the arm serves the rest. Only a
    window the burst nearly fills is not judged.
    """
    q = burst_excluded_quantile(can, inc) if first else 0.95
    if q is None:
        return False, None
    checks = (
        ("TTFT", g.max_ttft_p95_regression, inc.ttft_p95_high, can.ttft_p95, inc.ttft_p95),
        ("queue", g.max_queue_p95_regression, inc.queue_p95_high, can.queue_p95, inc.queue_p95),
    )
    for label, tol, inc_high, can_v, inc_v in checks:
        can_low = _low(can, label, q)
        if tol is None or math.isnan(can_low) or math.isnan(inc_high):
            continue
        line = inc_high * (1 + tol) + ABSOLUTE_SLACK_S
        if can_low <= line:
            continue
        if q < 0.95:
            return True, (
                f"{label} p{round(q * 100)} at least {can_low:.3f}s with the balancer's "
                f"catch-up burst of the first window set aside (p95 {can_v:.3f}s) vs "
                f"incumbent p95 {inc_v:.3f}s: beyond +{tol:.0%} with confidence"
            )
        return True, (
            f"{label} p95 {can_v:.3f}s vs incumbent {inc_v:.3f}s: beyond +{tol:.0%} with confidence"
        )
    return True, None


def guardrail_breach(
    can: WindowStats, inc: WindowStats, g: Guardrails, first: bool = False
) -> str | None:
    """Why the canary breaks a guardrail against the incumbent in this window, or None
    (:func:`guardrail_judgement`)."""
    return guardrail_judgement(can, inc, g, first)[1]


def judged_windows(t: TrialRecord, g: Guardrails) -> int:
    """How many of a trial's windows were judged on guardrails (both sides measured, and
    not a first window its catch-up burst nearly fills)."""
    n = 0
    for i, w in enumerate(t.windows):
        if w.canary is not None and w.incumbent is not None:
            n += guardrail_judgement(w.canary, w.incumbent, g, i == 0)[0]
    return n


def close_trial(ctx: TuningContext, t: TrialRecord) -> tuple[Outcome, str] | None:
    """How a running trial ends after its latest window, or None while it needs another.

    ABORTED at once on a guardrail breach in the latest window (:func:`guardrail_breach`);
    otherwise None while it holds fewer than ``min_requests`` canary requests or, for a
    drafted arm, ``min_drafts`` drafted tokens, or no window judged on its guardrails, up
    to :data:`MAX_WINDOWS_PER_TRIAL`; then ABORTED if still no window could be judged (a
    trial never ends measured, so never in a promotion, unjudged), else MEASURED.
    """
    last = t.windows[-1]
    if last.canary is not None and last.incumbent is not None:
        guards = ctx.objective.guardrails
        why = guardrail_breach(last.canary, last.incumbent, guards, len(t.windows) == 1)
        if why is not None:
            return Outcome.ABORTED, why
    requests, drafted = trial_evidence(t)
    short = requests < ctx.min_requests or (
        parse_arm(t.arm).drafter is not None and drafted < ctx.min_drafts
    )
    unjudged = judged_windows(t, ctx.objective.guardrails) == 0
    if (short or unjudged) and len(t.windows) < MAX_WINDOWS_PER_TRIAL:
        return None
    if unjudged:
        return Outcome.ABORTED, (
            f"no window of its {len(t.windows)} could be judged on guardrails (the "
            "balancer's catch-up burst filled them)"
        )
    return Outcome.MEASURED, f"{len(t.windows)} window(s), {requests:.0f} canary requests"


def _best_ratio(alpha: float, decay: float, cost: float, max_k: int) -> tuple[int, float]:
    """The k ≤ ``max_k`` with the lowest per-token latency relative to ``off`` for a
    geometric acceptance curve (α, decay) at draft cost ``cost`` per drafted position, and
    that ratio ``(1 + c·k) / E(k)``."""
    best, ratio, e, surv = 1, math.inf, 1.0, 1.0
    for k in range(1, max_k + 1):
        surv *= alpha * decay ** (k - 1)
        e += surv
        r = (1 + cost * k) / e
        if r < ratio:
            best, ratio = k, r
    return best, ratio


def load_cost(beliefs: Beliefs, ctx: TuningContext) -> float:
    """What a drafted position costs at this load, relative to a plain step: the lowest
    draft cost measured at it (``Beliefs.costs``: verification of ``b(k+1)`` tokens grows
    with the batch, so a cost measured here carries the load), else the cost assumed until
    one is measured."""
    costs = [c for c in beliefs.costs.values() if math.isfinite(c)]
    return min(costs) if costs else ctx.assumed_draft_cost


def unexplored_prior(
    spec: DrafterSpec, beliefs: Beliefs, ctx: TuningContext
) -> tuple[Arm, float, float]:
    """The arm to try first of a drafter whose acceptance was never measured, and its prior
    log objective ratio to the incumbent (mean, spread).

    The method's acceptance prior (:data:`METHOD_ACCEPTANCE`) is priced by the model at
    this load (:func:`load_cost`), relative to ``off``'s belief: for each of nine quantiles
    of α, the best k's latency ratio ``(1 + c·k)/E(k)``. The prior's mean is the median's
    log ratio and its spread puts the 5th percentile of α's best case at −1.645 spreads:
    the challenger rule (P(beats the leader by ε) ≥ δ) then tries the drafter only when
    the model gives it a real chance at this load — a poor n-gram at a load where each
    drafted position costs half a step has none, a trained head at light load a large one.
    The arm tried is the largest k: one window of its counters prices every shorter k, and
    :func:`acceptance_rules_out` ends the trial after that window when they leave no chance
    (the largest k costs users most exactly where drafting is dear, for one window).
    """
    a, b = METHOD_ACCEPTANCE.get(spec.method, UNKNOWN_METHOD_ACCEPTANCE)
    cost = load_cost(beliefs, ctx)
    off = beliefs.arms.get(OFF.name)
    base = off.loss if off is not None else 0.0
    logs = []
    for q in (0.05, 0.5, 0.95):
        alpha = float(beta_dist.ppf(q, a, b))
        logs.append(_best_ratio(alpha, PRIOR_DECAY, cost, spec.max_k))
    median = math.log(logs[1][1])
    best = math.log(logs[2][1])
    spread = max((median - best) / 1.645, MODEL_PRIOR)
    return Arm(spec.name, spec.max_k), base + median, spread


def acceptance_rules_out(ctx: TuningContext, history: History, running: TrialRecord) -> str | None:
    """Why the running trial of a drafter first measured in it should end now, or None.

    One window of its counters prices every k up to the trial's (the survival curve): with
    the draft cost at this load (:func:`load_cost`) the model's best k of that curve,
    relative to ``off``, either still has a chance (probability δ, at the model's own
    error :data:`~spectune.search.model.MODEL_PRIOR`) of beating the leader by ε, or not;
    if not, the trial's further windows could only cost users and change nothing.
    """
    arm = parse_arm(running.arm)
    d = arm.drafter
    if d is None or arm.adaptive is not None:
        return None
    earlier = [t for t in history.trials if t is not running and t.epoch in
               history.acceptance_epochs()]  # fmt: skip
    if any(parse_arm(t.arm).drafter == d and t.windows for t in earlier):
        return None
    if ctx.incumbent.drafter == d:
        return None
    minimise = ctx.objective.metric.minimise
    beliefs = build_beliefs(ctx.space, history, ctx.incumbent, minimise, ctx.min_requests)
    surv = beliefs.survival.get(d)
    off = beliefs.arms.get(OFF.name)
    leader = _leader(beliefs, measured_only=True)
    if surv is None or len(surv) == 0 or off is None or leader is None:
        return None
    if leader.name == running.arm:
        return None  # its own window already puts it ahead: nothing to rule out
    cost = load_cost(beliefs, ctx)
    e, best = 1.0, math.inf
    for k in range(1, len(surv) + 1):
        e += float(np.clip(surv[k - 1], 0.0, 1.0))
        best = min(best, (1 + cost * k) / e)
    loss = off.loss + math.log(best)
    line = beliefs.arms[leader.name].loss - math.log(1 + ctx.epsilon)
    chance = 0.5 * math.erfc((loss - line) / MODEL_PRIOR / math.sqrt(2))
    if chance >= ctx.delta:
        return None
    return (
        f"its measured acceptance (P(L≥1) = {float(surv[0]):.2f}) at this load's draft cost "
        f"c = {cost:.2f} puts its best k at {math.exp(loss):.2f}× the incumbent's "
        f"{ctx.objective.metric.value}: P(beats {leader.name} by {ctx.epsilon:.0%}) = "
        f"{chance:.3f}; ending the trial"
    )


class SpectunePolicy:
    """The ``spectune`` policy (see the module docstring)."""

    name = "spectune"

    def decide(self, ctx: TuningContext, history: History) -> Decision:
        """The next step, rebuilt from the history alone."""
        epoch = history.in_epoch()
        running = epoch[-1] if epoch and epoch[-1].outcome is Outcome.RUNNING else None
        end: Outcome | None = None
        if running is not None and running.windows:
            verdict = self._close(ctx, running)
            if verdict is None:
                out = acceptance_rules_out(ctx, history, running)
                if out is not None:
                    return self._next(ctx, history, Outcome.MEASURED, f"{running.arm}: {out}", None)
                requests, drafted = trial_evidence(running)
                seen = f"{requests:.0f} canary requests"
                if not math.isnan(drafted):
                    seen += f" and {drafted:.0f} drafted tokens (minDrafts {ctx.min_drafts})"
                why = f"too little evidence so far ({seen})"
                if judged_windows(running, ctx.objective.guardrails) == 0:
                    why = _unjudged(running) or "no window judged on guardrails yet"
                return Decision(
                    DecisionKind.TRIAL,
                    parse_arm(running.arm),
                    f"{running.arm}: {why}; measuring another window",
                )
            end, why = verdict
            if end is Outcome.ABORTED:
                history = history.update_last(running.ended(end, why))
                return self._next(ctx, history, end, f"guardrail: {why}", None)
            # Keep the running trial's windows in the evidence while deciding whether one
            # more window of it (no restart) is worth more than moving on.
            return self._next(ctx, history, end, _unjudged(running), running)
        return self._next(ctx, history, end, "", None)

    # -- a running trial -------------------------------------------------------------------

    def _close(self, ctx: TuningContext, t: TrialRecord) -> tuple[Outcome, str] | None:
        return close_trial(ctx, t)

    # -- the next arm ----------------------------------------------------------------------

    def _next(
        self,
        ctx: TuningContext,
        history: History,
        end: Outcome | None,
        prefix: str,
        running: TrialRecord | None,
    ) -> Decision:
        """The next trial, promotion or end of the search, from the beliefs the history gives.

        In order: the trial budget; the evidence the model needs before it can predict; the
        leader (the best measured arm); the stop when it is ε-best with probability 1 − δ;
        an early promotion of a leader that beats the incumbent with confidence; and else
        the challenger most likely to improve on the leader, or the running trial extended.
        """
        minimise = ctx.objective.metric.minimise
        beliefs = build_beliefs(ctx.space, history, ctx.incumbent, minimise, ctx.min_requests)
        bad_drafters = _infeasible_drafters(history)
        for name in list(beliefs.arms):
            if beliefs.arms[name].arm.drafter in bad_drafters:
                del beliefs.arms[name]
        tried, attempts = _tries(history)
        trials = len(history.in_epoch())
        turn = _Turn(ctx, history, beliefs, end, prefix, running)

        if trials >= ctx.max_trials:
            leader = _leader(beliefs, measured_only=True) or ctx.incumbent
            names = list(beliefs.arms)
            rng = np.random.default_rng([ctx.seed, history.epoch, trials, _windows(history)])
            return turn.finish(
                leader,
                posterior_draws(beliefs, names, rng),
                names,
                f"trial budget of {ctx.max_trials} spent",
            )

        # 1. Evidence the model needs before it can predict, and priors for what it cannot.
        needed = _needed_evidence(turn, tried)
        if needed is not None:
            return needed
        _add_unpriced(beliefs, ctx, bad_drafters, tried)

        # 2. The leader: the best measured arm (the incumbent counts as measured). Unmeasured
        # arms only ever challenge it: nothing is promoted on a prediction alone.
        best = _leader(beliefs, measured_only=True)
        if best is None:
            return turn.decision(
                DecisionKind.PROMOTE, ctx.incumbent, "no candidate can be estimated"
            )
        leader = best
        lb = beliefs.arms[leader.name]

        # 3. Stop when the leader is ε-best with probability 1 − δ.
        names = list(beliefs.arms)
        rng = np.random.default_rng([ctx.seed, history.epoch, trials, _windows(history)])
        draws = posterior_draws(beliefs, names, rng)
        li = names.index(leader.name)
        tol = math.log(1 + ctx.epsilon)
        p_ok = float(np.mean(draws[:, li] <= draws.min(axis=1) + tol))
        if p_ok >= 1 - ctx.delta:
            return turn.finish(
                leader,
                draws,
                names,
                f"{leader.name} is within {ctx.epsilon:.0%} of the best with probability "
                f"{p_ok:.2f}: {_describe(lb, minimise, ctx)}",
            )

        # 4. The challenger (_challenge); an arm tried MAX_TRIALS_PER_ARM times is not restarted.
        beats = np.mean(draws < draws[:, [li]] - tol, axis=0)
        beats[li] = -1.0
        # 4a. A leader that beats the incumbent with confidence is promoted now, and the
        # search goes on against it: users get the gain while the last doubts are settled.
        if leader.name != ctx.incumbent.name:
            promoted = _promote_early(turn, leader, draws, names, beats, tried)
            if promoted is not None:
                return promoted
        return _challenge(turn, leader, draws, names, beats, p_ok, attempts, running)


def _infeasible_drafters(history: History) -> set[str]:
    """The drafters of the epoch's arms that could not start.

    What keeps an arm from starting is its drafter's memory (weights, KV pool share), not
    its ``k``: every arm of that drafter would fail the same way on the same pods.
    """
    return {
        a.drafter
        for t in history.in_epoch()
        if t.outcome is Outcome.INFEASIBLE and (a := parse_arm(t.arm)).drafter
    }


def _tries(history: History) -> tuple[set[str], dict[str, int]]:
    """The epoch's tried arms, and how many trials each has had.

    A trial ended before its first window (suspended, the target went missing, the
    metrics failed) says nothing about its arm: the arm is still untried, and the trial
    counts towards no arm's attempts. One that could not start, or is running, counts.
    """
    tried = {
        t.arm
        for t in history.in_epoch()
        if t.windows or t.outcome in (Outcome.INFEASIBLE, Outcome.RUNNING)
    }
    attempts: dict[str, int] = {}
    for t in history.in_epoch():
        if t.arm in tried:
            attempts[t.arm] = attempts.get(t.arm, 0) + 1
    return tried, attempts


@dataclass(frozen=True)
class _Turn:
    """One decision's inputs, and the two ways it ends: a plain decision or the search's end.

    Every reason the policy gives starts with the caller's ``prefix`` (why the last trial
    ended) and ends with the model's notes, and carries every arm's estimate as of this
    decision, priors of unseen drafters included: what a user reads is the whole
    evidence the decision rests on.
    """

    ctx: TuningContext
    history: History
    beliefs: Beliefs
    end: Outcome | None
    prefix: str
    running: TrialRecord | None = None

    def decision(self, kind: DecisionKind, arm: Arm, why: str) -> Decision:
        """A decision with the prefix, the model's notes and every arm's estimate."""
        reason = f"{self.prefix}; {why}" if self.prefix else why
        if self.beliefs.notes:
            reason += " (" + "; ".join(self.beliefs.notes) + ")"
        # Every arm's estimate as of this decision, priors of unseen drafters included.
        minimise = self.ctx.objective.metric.minimise
        return Decision(kind, arm, reason, self.end, _estimates(self.beliefs, minimise))

    def past_warm_up(self, leader: Arm, why: str) -> Decision | None:
        """Another window of the running trial, where its arm leads but was seen only in
        warm-up windows (:attr:`~spectune.search.model.ArmBelief.settled`); else None.

        Such a lead is read with the warm-up's heavy-tailed error (:func:`posterior_draws`),
        which a real lead of a tenth does not clear in one window: ending the search on
        the incumbent there would give the lead up on the one window least able to show
        it. The next window is past the warm-up, and it costs no restart.
        """
        b, running = self.beliefs.arms.get(leader.name), self.running
        if b is None or b.settled or running is None or running.arm != leader.name:
            return None
        if len(running.windows) >= MAX_WINDOWS_PER_TRIAL:
            return None
        return self.another_window(
            leader,
            f"{why}; {leader.name} is not yet ahead of the incumbent with confidence, but "
            "it was seen only in its canary's first window, which the warm-up biases",
        )

    def another_window(self, arm: Arm, why: str) -> Decision:
        """The running trial of ``arm`` goes on for another window (no restart), with
        every arm's estimate."""
        minimise = self.ctx.objective.metric.minimise
        return Decision(
            DecisionKind.TRIAL,
            arm,
            f"{why}; measuring another window",
            None,
            _estimates(self.beliefs, minimise),
        )

    def finish(self, leader: Arm, draws: np.ndarray, names: list[str], why: str) -> Decision:
        """The search's end: the leader, or the incumbent where the leader is not ahead.

        The leader replaces the incumbent only when it is ahead of it with confidence
        (:func:`_not_ahead`) and no measured gap refutes its lead (:func:`_gap_veto`): a
        promotion costs a restart, and one on a lead within the noise would as likely
        be a loss.
        """
        ctx, history = self.ctx, self.history
        not_ahead = _not_ahead(draws, names, leader, ctx)
        more = self.past_warm_up(leader, why) if not_ahead is not None else None
        if more is not None:
            return more
        held = not_ahead or _gap_veto(history, leader, ctx)
        if held is not None:
            return self.decision(DecisionKind.PROMOTE, ctx.incumbent, f"{why}; {held}")
        return self.decision(DecisionKind.PROMOTE, _with_schedule(ctx, history, leader), why)


def _needed_evidence(turn: _Turn, tried: set[str]) -> Decision | None:
    """The trial the model needs before it can predict what drafting costs, or None.

    What drafting costs follows from ``off``, or from another k of the incumbent's drafter
    (two lengths give the plain step and the draft cost; model.py) — the way a load move
    went, or a shorter one that the incumbent's counters favour — a trial that may itself
    be the optimum. Under saturation neither is read off drafted arms: the batch sits at
    the engine's limit whatever the arm, so only ``off``'s own trial says what it costs.
    """
    ctx, history, beliefs = turn.ctx, turn.history, turn.beliefs
    if not (beliefs.needs_off and OFF.name not in tried and OFF.name not in beliefs.excluded):
        return None
    second = _second_length(ctx, history, beliefs, tried | set(beliefs.excluded))
    if second is not None:
        arm, how = second
        return turn.decision(
            DecisionKind.TRIAL,
            arm,
            f"measuring {arm.name} rather than off: {how}, and a second draft length "
            f"of {arm.drafter} gives the plain step and the draft cost at this load",
        )
    why = "measuring off to learn what drafting costs"
    if beliefs.saturated:
        why += (
            ": the pods are saturated (requests queue for many steps), so drafted "
            "arms' latencies say nothing about an arm that drafts less"
        )
    return turn.decision(DecisionKind.TRIAL, OFF, why)


def _add_unpriced(
    beliefs: Beliefs, ctx: TuningContext, bad_drafters: set[str], tried: set[str]
) -> None:
    """Add a wide prior belief for each arm the model cannot price, so it enters the race.

    A drafter whose acceptance was never seen enters at its largest k (one trial there
    predicts every smaller k) with a wide prior relative to off's belief
    (:data:`UNEXPLORED_GAIN`; the incumbent's when off cannot be estimated yet): it is
    tried when nothing the model can see is more promising, and it keeps the search from
    stopping until it has been ruled in or out. A drafter whose acceptance is known but
    which the model cannot price at this load (the load moved while ``off`` ran: no draft
    cost has been measured at it) enters the same way, halfway up its k range, as a
    second length does after a fall. A listed in-engine adaptive arm is its own
    experiment: no other arm's counters predict it (its k moves per step, per request or
    per tier), so until its own trial has measured it, it races with the wide prior of an
    unseen drafter.
    """
    priced = {b.arm.drafter for b in beliefs.arms.values()}
    off_belief = beliefs.arms.get(OFF.name)
    prior = (off_belief.loss if off_belief is not None else 0.0) - UNEXPLORED_GAIN
    for d in ctx.space.drafters:
        if d.name in bad_drafters:
            continue
        mean, spread = prior, UNEXPLORED_SPREAD
        if d.name in beliefs.unexplored_drafters:
            arm, mean, spread = unexplored_prior(d, beliefs, ctx)
        elif d.name in beliefs.survival and d.name not in priced:
            arm = Arm(d.name, math.ceil(d.max_k / 2))
        else:
            continue
        if arm.name not in tried and arm.name not in beliefs.excluded:
            beliefs.arms[arm.name] = ArmBelief(arm, mean, spread, False, 0, math.nan, math.nan)
    for arm in ctx.space.adaptive:
        if arm.drafter in bad_drafters or arm.name in beliefs.arms:
            continue
        if arm.name not in tried and arm.name not in beliefs.excluded:
            beliefs.arms[arm.name] = ArmBelief(
                arm, prior, UNEXPLORED_SPREAD, False, 0, math.nan, math.nan
            )


@dataclass(frozen=True)
class _Lead:
    """How surely a leader beats the incumbent, and on what grounds."""

    better: float
    """The probability that it does (by ε, or without margin on a shortcut)."""
    why: str
    """The sentence that says so, for the decision's reason."""
    shortcut: bool
    """The lead rests on the target's load rather than on the trials' objective alone:
    the incumbent saturating or queueing alone (:func:`_amplified`), or a load move that
    widens the lead (:func:`_load_favours`)."""


def _lead_over_incumbent(turn: _Turn, leader: Arm, draws: np.ndarray, names: list[str]) -> _Lead:
    """How surely ``leader`` beats the incumbent at the load it will carry once promoted.

    On the posterior draws, by ε. Where that is not sure, two facts about the target's
    load can make it so without the margin. An incumbent that saturates or queues alone
    turns a per-token lead into a larger one on the objective (:func:`_amplified`), and
    the per-token lead is measured to a percent per window, where the trials' p95s at a
    lighter load move by tens of percent; and a load that is still moving the way that
    favours the leader (a shorter k gains as the batch grows, a longer one as it shrinks:
    :func:`_load_favours`) makes the lead measured now the least it will have.
    """
    ctx, history = turn.ctx, turn.history
    li = names.index(leader.name)
    tol = math.log(1 + ctx.epsilon)
    ii = names.index(ctx.incumbent.name) if ctx.incumbent.name in names else -1
    better = float(np.mean(draws[:, li] < draws[:, ii] - tol)) if ii >= 0 else 0.0
    why = (
        f"{leader.name} beats the incumbent {ctx.incumbent.name} by "
        f"{ctx.epsilon:.0%} with probability {better:.2f}"
    )
    unsure = better < 1 - ctx.delta and ii >= 0
    ahead = float(np.mean(draws[:, li] < draws[:, ii])) if unsure else math.nan
    amp = (
        _amplified(history, ctx.incumbent.name, leader.name, ctx.objective.metric)
        if unsure
        else None
    )
    faster, alone_how = amp if amp is not None else (None, "")
    if faster is not None:
        # The lead at the target's load follows from the per-token lead, measured
        # to a percent per window, not from the trials' p95s at a lighter load,
        # which move by tens of percent: the objective only must not show the
        # leader behind with confidence. No ε margin: that load widens the lead.
        if ahead >= ctx.delta:
            better = max(ahead, faster)
        why = (
            f"{leader.name} beats the incumbent {ctx.incumbent.name} at the target's "
            f"load (no margin: the incumbent {alone_how} alone, and {leader.name}, with "
            f"a KV pool as large, is faster per token with probability {faster:.2f} "
            f"and ahead in the trials with probability {ahead:.2f})"
        )
    moving = None
    if unsure and faster is None:
        moving = _load_favours(history, ctx.incumbent, leader)
    if moving is not None:
        # The load is still moving the way that widens this leader's lead (a
        # shorter k gains as the batch grows, a longer one as it shrinks): the
        # lead measured now is the least it will have once promoted.
        better = ahead
        why = (
            f"{leader.name} beats the incumbent {ctx.incumbent.name} with probability "
            f"{better:.2f} (no margin: {moving})"
        )
    return _Lead(better, why, faster is not None or moving is not None)


def _promote_early(
    turn: _Turn,
    leader: Arm,
    draws: np.ndarray,
    names: list[str],
    beats: np.ndarray,
    tried: set[str],
) -> Decision | None:
    """The promotion of a leader that beats the incumbent with confidence, or None.

    Promoted now, with the search going on against it: users get the gain while the
    last doubts are settled. Two things come first: a predicted refinement sure to beat
    the leader by more than the leader beats the incumbent is tried before either is
    promoted (:func:`_sure_refinement`), and a measured gap that refutes the lead keeps
    the incumbent (:func:`_gap_veto`).
    """
    ctx, history, beliefs = turn.ctx, turn.history, turn.beliefs
    minimise = ctx.objective.metric.minimise
    lb = beliefs.arms[leader.name]
    lead = _lead_over_incumbent(turn, leader, draws, names)
    confident = lead.better >= 1 - ctx.delta
    sure = None
    if confident and not lead.shortcut:
        sure = _sure_refinement(beliefs, names, beats, tried, ctx, leader)
    if sure is not None:
        # An arm read off the measured ones beats this leader by ε with confidence,
        # by at least as much as the leader beats the incumbent: the search would
        # promote it next, so it is tried first. One rollout fewer, the answer one
        # trial sooner; the leader stays the fallback.
        # Not while a load move goes on: the best k moves with it. Nor when the
        # leader's lead rests on the incumbent saturating or queueing alone (the
        # shortcut above): every minute the incumbent stays costs users its queue,
        # and the refinement's lead is read at the trial's lighter load (one
        # replica: half the target's), so it waits for its own trial against the
        # promoted leader. Deferring the promotion for a trial of the refinement
        # would keep the queueing incumbent in place for that trial's windows, and
        # under queueing the cost of that delay grows like ρ/(1 − ρ), far beyond
        # the ε the refinement might add.
        sb = beliefs.arms[sure.name]
        return turn.decision(
            DecisionKind.TRIAL,
            sure,
            f"{lead.why}, but {sure.name} beats {leader.name} by {ctx.epsilon:.0%} with "
            f"probability {beats[names.index(sure.name)]:.2f}, by more than "
            f"{leader.name} beats the incumbent: trying {sure.name} before promoting "
            f"either ({_describe(sb, minimise, ctx)}; {_describe(lb, minimise, ctx)})",
        )
    refuted = _gap_veto(history, leader, ctx) if confident else None
    if refuted is not None:
        return turn.decision(DecisionKind.PROMOTE, ctx.incumbent, f"{lead.why}, but {refuted}")
    if confident:
        return Decision(
            DecisionKind.PROMOTE,
            leader,
            f"{lead.why} ({_describe(lb, minimise, ctx)}); promoting it while the search goes on",
            turn.end,
            _estimates(beliefs, minimise),
            final=False,
        )
    return None


def _challenge(
    turn: _Turn,
    leader: Arm,
    draws: np.ndarray,
    names: list[str],
    beats: np.ndarray,
    p_ok: float,
    attempts: dict[str, int],
    running: TrialRecord | None,
) -> Decision:
    """The next trial against ``leader``, another window of the running one, or the end.

    Among arms that beat the leader by ε with probability at least δ, the one with the
    largest expected improvement: a drafter never seen (wide prior) outranks a small,
    likely refinement of k, which the next epoch of evidence can still make. An arm
    tried :data:`MAX_TRIALS_PER_ARM` times is not restarted, and the incumbent is
    measured all the time. With no such arm the search ends (:meth:`_Turn.finish`).
    """
    ctx, beliefs = turn.ctx, turn.beliefs
    minimise = ctx.objective.metric.minimise
    li = names.index(leader.name)
    tol = math.log(1 + ctx.epsilon)
    for i, n in enumerate(names):
        if i != li and attempts.get(n, 0) >= MAX_TRIALS_PER_ARM:
            beats[i] = -1.0
        if n == ctx.incumbent.name:
            beats[i] = -1.0  # the incumbent is measured all the time; no trial needed
    gain = np.mean(np.maximum(draws[:, [li]] - draws - tol, 0.0), axis=0)
    gain[beats < ctx.delta] = -1.0
    ci = int(np.argmax(gain)) if np.max(gain) >= 0 else int(np.argmax(beats))
    challenger = beliefs.arms[names[ci]].arm
    race = None
    if running is not None:
        race = _in_race(turn, running, leader, challenger, float(beats[ci]), draws, names, p_ok)
    extend = running is not None and len(running.windows) < MAX_WINDOWS_PER_TRIAL
    if extend and race is not None and running is not None and beats[ci] >= ctx.delta:
        return turn.another_window(
            parse_arm(running.arm), f"{running.arm} is still in the race ({race})"
        )
    if beats[ci] < ctx.delta:
        return turn.finish(
            leader,
            draws,
            names,
            f"no arm is likely to beat {leader.name} by {ctx.epsilon:.0%} "
            f"(P(within ε) = {p_ok:.2f})",
        )

    cb = beliefs.arms[challenger.name]
    return turn.decision(
        DecisionKind.TRIAL,
        challenger,
        f"{challenger.name} may beat {leader.name} by {ctx.epsilon:.0%} "
        f"(P = {beats[ci]:.2f}): {_describe(cb, minimise, ctx)}",
    )


def _in_race(
    turn: _Turn,
    running: TrialRecord,
    leader: Arm,
    challenger: Arm,
    challenger_beats: float,
    draws: np.ndarray,
    names: list[str],
    p_ok: float,
) -> str | None:
    """Why the arm on the canary is still in the race, or None when it is not.

    It is when it is still the leader or the challenger: its own figures, not its
    drafter's, are in question — unless it leads and the challenger beats it by ε with
    confidence: then no window of the leader can spare the challenger's trial. So is an
    arm the ongoing load move favours over the incumbent (:func:`_load_favours`) while it
    is not behind it with confidence: draft costs grow with the batch, so its lead grows
    window by window as the move goes on (a doubling of the batch can turn a tie into a
    lead of a tenth or more), and a trial moved on from it would leave the lead unseen.
    Another window of it needs no restart.
    """
    ctx = turn.ctx
    in_race = running.arm == challenger.name or (
        running.arm == leader.name and challenger_beats < 1 - ctx.delta
    )
    race = f"P(within ε) = {p_ok:.2f}"
    if not in_race and {running.arm, ctx.incumbent.name} <= set(names):
        ri, ii = names.index(running.arm), names.index(ctx.incumbent.name)
        favoured = _load_favours(turn.history, ctx.incumbent, parse_arm(running.arm))
        if favoured is not None and float(np.mean(draws[:, ri] < draws[:, ii])) >= ctx.delta:
            in_race, race = True, favoured
    return race if in_race else None


def _sure_refinement(
    beliefs: Beliefs,
    names: list[str],
    beats: np.ndarray,
    tried: set[str],
    ctx: TuningContext,
    leader: Arm,
) -> Arm | None:
    """The untried, predicted arm that beats ``leader`` by ε with probability ≥ 1 − δ and
    whose expected gain over it is at least the leader's own over the incumbent (the
    incumbent's log ratio is 0, so: loss ≤ 2 · the leader's loss); the best such, or None.

    ``beats[i]`` is arm ``names[i]``'s probability of beating the leader by ε. A wide prior
    (a drafter never seen) cannot be that sure; a prediction anchored on a measured arm of
    the same drafter, the per-position curve read at a shorter k, can.
    """
    bound = 2 * beliefs.arms[leader.name].loss
    pool = [
        beliefs.arms[n]
        for i, n in enumerate(names)
        if n not in (leader.name, ctx.incumbent.name)
        and n not in tried
        and not beliefs.arms[n].measured
        and beats[i] >= 1 - ctx.delta
        and beliefs.arms[n].loss <= bound
    ]
    return min(pool, key=lambda x: (x.loss, x.arm.k)).arm if pool else None


def _second_length(
    ctx: TuningContext, history: History, beliefs: Beliefs, skip: set[str]
) -> tuple[Arm, str] | None:
    """Another k of the incumbent's drafter to measure instead of ``off``, and why.

    Two draft lengths of one drafter give both the plain step and the draft cost
    (``model._off_from_two_lengths``), and the second may itself be the optimum, where
    ``off`` seldom is. After a load move the k goes the way of the move: the best k can
    only fall as the batch grows (verification over ``b(k+1)`` tokens) and rise as it
    shrinks. After a rise the shortest k is measured — the longest lever for the cost line
    and the likeliest new optimum — or, from ``k = 1``, nothing (``off`` is the next step
    down); after a fall, the k halfway to the drafter's largest. Outside a load move it is
    the shorter k that the incumbent's acceptance curve predicts best at the draft cost
    assumed until one is measured (:func:`_shorter_length`), or nothing when none beats
    the incumbent there. None as well when the incumbent is off or a schedule, its
    drafter's acceptance is unknown, the pods are saturated (two drafted lengths say
    nothing about ``off`` there), or the wanted k was tried or excluded.
    """
    inc = ctx.incumbent
    d = inc.drafter
    if d is None or inc.adaptive is not None or d not in beliefs.survival:
        return None
    if beliefs.saturated:
        return None
    spec = next((x for x in ctx.space.drafters if x.name == d), None)
    if spec is None:
        return None
    direction = _load_direction(history)
    k: int | None
    if direction == 0:
        shorter = _shorter_length(ctx, beliefs)
        if shorter is None:
            return None
        k, ratio = shorter
        why = (
            f"its acceptance curve, at the draft cost assumed until one is measured "
            f"(c = {ctx.assumed_draft_cost:g}), puts it at {ratio:.2f}× the incumbent's "
            f"{ctx.objective.metric.value}"
        )
    elif direction > 0:
        k = 1 if inc.k > 1 else None
        why = "the load rose, so the best k fell"
    else:
        k = math.ceil((inc.k + spec.max_k) / 2) if inc.k < spec.max_k else None
        why = "the load fell, so the best k rose"
    if k is None or Arm(d, k).name in skip:
        return None
    return Arm(d, k), why


def _shorter_length(ctx: TuningContext, beliefs: Beliefs) -> tuple[int, float] | None:
    """The shorter k of the incumbent's drafter that its measured acceptance predicts best,
    with its objective relative to the incumbent's; None when no shorter k beats it by ε
    (a trial that is not worth a restart on its own).

    Before any draft cost is measured, the per-position curve prices every smaller k at
    the assumed one (``TuningContext.assumed_draft_cost``, ``SPECTUNE_DRAFT_COST``;
    :func:`~spectune.core.predict_speedup`); for a per-token p95 the tail that the spread
    of acceptance across requests adds at each k is included
    (:func:`~spectune.core.tail_ratio`: requests that accept little pay for every drafted
    position, so the p95's best k sits below the mean's). Only shorter: a setting chosen
    on an idle box is, under load, at or past the best k, and the counters say nothing
    about positions beyond the incumbent's.
    """
    inc = ctx.incumbent
    d = inc.drafter or ""
    curve = beliefs.survival[d][: inc.k]
    if inc.k < 2 or len(curve) < inc.k:
        return None
    table = predict_speedup(np.clip(curve, 0.0, 1.0), ctx.assumed_draft_cost)
    spread = beliefs.spreads.get(d) if ctx.objective.metric is Metric.TPOT_P95 else None

    def latency(k: int) -> float:
        tail = tail_ratio(spread, k) if spread is not None else 1.0
        return tail / float(table.speedup[k])

    best = min(range(1, inc.k), key=latency)
    ratio = latency(best) / latency(inc.k)
    return (best, ratio) if ratio * (1 + ctx.epsilon) < 1.0 else None


def _load_direction(history: History) -> int:
    """+1 / −1 when the current epoch was opened because the load rose / fell, else 0.

    Compares the running batch of the last window before the re-tune (the one that
    showed the move) with the first window of the epoch it ended.
    """
    return _move_direction(_load_move(history))


def _move_direction(moved: tuple[WindowRecord, WindowRecord] | None) -> int:
    """+1 / −1 / 0 for the batch from the first to the last of :func:`_load_move`'s pair."""
    if moved is None:
        return 0
    a, b = moved[0].incumbent, moved[1].incumbent
    assert a is not None and b is not None
    first, last = a.running, b.running
    if math.isnan(first) or math.isnan(last) or first == last:
        return 0
    return 1 if last > first else -1


def _load_move(history: History) -> tuple[WindowRecord, WindowRecord] | None:
    """The first and the last window of the epoch before this one, when this one was
    opened because the load moved; else None."""
    if history.epoch not in history.load_epochs:
        return None
    before = history.epoch - 1
    windows = [w for w in history.baseline_windows(before) if w.incumbent is not None]
    windows += [w for t in history.in_epoch(before) for w in t.windows if w.incumbent]
    if len(windows) < 2:
        return None
    windows.sort(key=lambda w: w.start_s)
    return windows[0], windows[-1]


def _service_batch(w: WindowRecord) -> float:
    """Requests running on the whole service per target pod: a window beside a canary and
    one without it compare (the canary's share would lower the target's own batch)."""
    inc, can = w.incumbent, w.canary
    if inc is None or not inc.pods:
        return math.nan
    total = inc.running * inc.pods + (can.running * can.pods if can is not None else 0.0)
    return total / inc.pods


def _load_favours(history: History, incumbent: Arm, leader: Arm) -> str | None:
    """Why the load, still moving as it was when the search re-opened, widens the leader's
    lead over the incumbent; None when it does not.

    Verification runs over ``b(k+1)`` tokens and drafting costs grow with the batch while
    acceptance does not (DESIGN.md §1), so as the batch grows an arm that drafts less —
    a shorter ``k`` of the incumbent's drafter, or ``off`` — gains on one that drafts
    more, and as it shrinks the one that drafts more gains. In an epoch opened by a load
    move (:func:`_load_direction`) whose latest paired window carries a batch
    (:func:`_service_batch`) beyond the one that showed the move, by at least
    :data:`~spectune.search.objective.SMALL_BATCH_CHANGE` in the same direction, the move
    is going on: the leader's lead will be larger by the time it is rolled out, and
    under a ramp the lead the trials measure lags the load (once the load passes what the
    incumbent can serve, its queue grows without bound while the leader's may not, and a
    small lead in a trial becomes a large one). Other drafters are not compared this way:
    their costs grow with the batch at their own rates.
    """
    moved = _load_move(history)
    direction = _move_direction(moved)
    if moved is None or direction == 0:
        return None
    if leader.adaptive is not None or incumbent.adaptive is not None:
        return None
    same = leader.drafter is not None and leader.drafter == incumbent.drafter
    less = (leader.is_off and not incumbent.is_off) or (same and leader.k < incumbent.k)
    more = (incumbent.is_off and not leader.is_off) or (same and leader.k > incumbent.k)
    if not (less if direction > 0 else more):
        return None
    paired = [w for t in history.in_epoch() for w in t.windows if w.incumbent and w.canary]
    if not paired:
        return None
    then = _service_batch(moved[1])
    now = _service_batch(max(paired, key=lambda w: w.start_s))
    if not direction * (now - then) >= SMALL_BATCH_CHANGE:
        return None
    return (
        f"the load is still {'rising' if direction > 0 else 'falling'}, {then:.1f} → "
        f"{now:.1f} requests running per target pod since the search re-opened, and "
        f"{leader.name}, drafting {'less' if direction > 0 else 'more'}, gains as it does"
    )


def _with_schedule(ctx: TuningContext, history: History, leader: Arm) -> Arm:
    """The leader, or a per-batch-size table for its drafter learned over earlier loads."""
    if not ctx.space.schedules:
        return leader
    table = learned_schedule(history, leader, epoch_batch(history, history.epoch), LOAD_FACTOR)
    return table if table is not None else leader


def posterior_draws(beliefs: Beliefs, names: list[str], rng: np.random.Generator) -> np.ndarray:
    """:data:`SAMPLES` joint draws of the arms' log objective ratios, one column per name.

    Measured arms and priors are independent normals, except an arm seen only in its
    trials' first windows (:attr:`~spectune.search.model.ArmBelief.settled`), drawn from a
    Student t with :data:`WARM_UP_DOF` degrees of freedom: the canary's warm-up biases
    such a window by an amount no count of requests bounds (``model._beyond_interval``), and
    its errors have heavier tails than a normal's. A prediction read from a measured
    arm of its drafter (:attr:`ArmBelief.anchor`) is that arm's draw plus the model's step
    between them: both carry the anchor's measurement error, so a noisy window moves them
    together, and only the model's step separates them — "k = 3 beats the measured k = 8"
    is as sure as the model, however few requests k = 8 was measured on.
    """
    means = np.array([beliefs.arms[n].loss for n in names])
    spreads = np.array([beliefs.arms[n].spread for n in names])
    draws = rng.normal(means, spreads, size=(SAMPLES, len(names)))
    for i, n in enumerate(names):
        if not beliefs.arms[n].settled:
            draws[:, i] = means[i] + spreads[i] * rng.standard_t(WARM_UP_DOF, size=SAMPLES)
    for i, n in enumerate(names):
        anchor = beliefs.arms[n].anchor
        if anchor is None or anchor == n or anchor not in names:
            continue
        j = names.index(anchor)
        step = rng.normal(0.0, max(beliefs.arms[n].relative_spread, 1e-9), size=SAMPLES)
        draws[:, i] = draws[:, j] + (means[i] - means[j]) + step
    return draws


def _not_ahead(draws: np.ndarray, names: list[str], leader: Arm, ctx: TuningContext) -> str | None:
    """Why the search ends on the incumbent rather than on ``leader``, or None to promote it.

    The stopping rule asks whether the leader is within ε of the best arm, and an arm with
    the incumbent's physics is: when the leader is the incumbent's twin (or any arm whose
    difference from it is noise), its measured ratio is below 1 half the time, it leads
    half the time, and it would be promoted — a rollout of every target pod bought for
    nothing, at a rate near 1/2 for each such arm tried. Promoting only a leader that is
    ahead of the incumbent with posterior probability ≥ 1 − δ bounds that rate at δ (for a
    calibrated posterior, P ≥ 1 − δ under the null happens with probability δ), the risk the
    SpecTuning states. What it can cost is a lead the trials could not tell from noise; the
    ε-best stop puts the leader within ε of the best, so keeping an incumbent that is not
    confidently behind it gives up little more than ε.
    """
    if leader.name == ctx.incumbent.name or ctx.incumbent.name not in names:
        return None
    li, ii = names.index(leader.name), names.index(ctx.incumbent.name)
    ahead = float(np.mean(draws[:, li] < draws[:, ii]))
    if ahead >= 1 - ctx.delta:
        return None
    return (
        f"{leader.name} is ahead of the incumbent {ctx.incumbent.name} with probability only "
        f"{ahead:.2f} (< {1 - ctx.delta:.2f}): keeping {ctx.incumbent.name}"
    )


def _per_pod_rate(s: WindowStats | None, w: WindowRecord) -> float:
    """Finished requests per pod per second of one group over a window (NaN if unknown)."""
    span = w.end_s - w.start_s
    if s is None or not s.pods or not span > 0 or not s.requests > 0:
        return math.nan
    return s.requests / s.pods / span


def _gap_ratios(history: History, arm: str) -> list[float]:
    """The canary's load per pod over the target's own, for every trial window of this
    epoch that measured ``arm``; only windows where both are known.

    The target's own load per pod is what the whole service finished in the same window
    (canary and incumbent) over the replicas the target has alone (its last window alone
    before the trial): all of it is the target's once the trial ends, and read in the
    same window it moves with a ramp, where a window alone before the trial would show
    the load as it was then.
    """
    alone = history.baseline_windows()
    ratios: list[float] = []
    for t in history.in_epoch():
        if t.arm != arm:
            continue
        before = [w for w in alone if w.end_s <= t.started_s + 1e-9] or list(alone)
        target = before[-1].incumbent if before else None
        if target is None or not target.pods:
            continue
        for w in t.windows:
            rate = _per_pod_rate(w.canary, w)
            if w.canary is None or w.incumbent is None or not math.isfinite(rate):
                continue
            span = w.end_s - w.start_s
            own = (w.canary.requests + w.incumbent.requests) / target.pods / span
            if own > 0:
                ratios.append(rate / own)
    return ratios


def _across_gap(ratios: Sequence[float]) -> bool:
    """Whether every trial window of an arm (its :func:`_gap_ratios`) carried another load
    per pod than the target's own: outside
    :data:`~spectune.search.history.MATCHED_LOAD_BAND`. False without a window."""
    return bool(ratios) and all(abs(r - 1.0) > MATCHED_LOAD_BAND for r in ratios)


def _gap_veto(history: History, leader: Arm, ctx: TuningContext) -> str | None:
    """Why a lead measured across a per-pod load gap is not taken as the target's, or None:
    a rollback refuted such a lead in this epoch (:func:`_load_gap_refuted`), or the
    leader is slower per token than the incumbent (:func:`_slower_across_gap`)."""
    ratios = _gap_ratios(history, leader.name)
    return _load_gap_refuted(history, leader, ratios) or _slower_across_gap(
        history, leader, ctx, ratios
    )


def _slower_across_gap(
    history: History, leader: Arm, ctx: TuningContext, ratios: Sequence[float]
) -> str | None:
    """Why a lead on a queue-counting objective, measured only at a lighter load per pod
    than the target's (``ratios``: the leader's :func:`_gap_ratios`), is not taken from a
    leader slower per token; None otherwise.

    A canary beside the target serves N/(N+c) of its per-pod load, and an objective that
    counts the queue (e2e or TTFT p95) depends on the load through the utilisation
    ρ = λ·s, with s the time a pod needs per request (its time per token times the
    tokens): the wait grows like ρ/(1 − ρ). Of two arms at the same load, the one that is
    slower per token has the larger s, so the larger ρ, and the gap between their waits
    only widens as λ rises to the target's own: a leader slower per token than the
    incumbent beside it cannot queue less than the incumbent at the target's load, and
    the lead its trials showed at the lighter load is the p95's noise over a few hundred
    requests (or its shape), not a property that carries across the gap. The per-token
    mean, over thousands of tokens, varies by :data:`TOKEN_WINDOW_SPREAD`
    between windows: slower with P ≥ 1 − δ (normal in log space over the windows) is the
    test. Only windows in which the canary carried no more load per pod than the
    incumbent (within :data:`~spectune.search.history.MATCHED_LOAD_BAND`) are read: in
    one that carried more, a slower token may be its larger batch's. A TPOT objective
    reads the per-token tail itself, not the queue: the premise does not hold there.
    """
    metric = ctx.objective.metric
    if metric not in (Metric.E2E_P95, Metric.TTFT_P95) or leader.name == ctx.incumbent.name:
        return None
    if not ratios or not all(r < 1.0 - MATCHED_LOAD_BAND for r in ratios):
        return None
    logs = [
        math.log(can.tpot_mean / inc.tpot_mean)
        for can, inc, w in _trial_pairs(history, ctx.incumbent.name, leader.name)
        if w.load_ratio <= 1.0 + MATCHED_LOAD_BAND and can.tpot_mean > 0 and inc.tpot_mean > 0
    ]
    if not logs:
        return None
    mean, se = _log_ratio(logs)
    slower = 0.5 * math.erfc(-mean / se / math.sqrt(2))
    if slower < 1 - ctx.delta:
        return None
    return (
        f"{leader.name}'s lead was measured only at {max(ratios):.2f}× or less of the "
        f"target's own load per pod, and it is slower per token than the incumbent "
        f"{ctx.incumbent.name} beside it ({math.exp(mean):.2f}×, probability {slower:.2f}): "
        f"at the target's load it would queue more, not less, so {ctx.incumbent.name} stays"
    )


def _load_gap_refuted(history: History, leader: Arm, ratios: Sequence[float]) -> str | None:
    """Why ``leader`` is not promoted on trials at another per-pod load, or None.

    A canary beside the target (one replica, an autoscaler, ``placement: beside``) serves
    N/(N+c) of the target's per-pod load, and the model reads its lead across that gap:
    close to capacity the gap decides (a queue grows without bound past it), and what an
    arm shows at half the load says little of it at the whole. The verification measures
    the promoted arm on the target at its own load; a rollback there is a direct
    measurement that the lead read across the gap was wrong by more than its interval, so
    for this epoch (one load) the transfer is refuted, not merely noisy: another arm
    judged only across the same gap is held too, until a trial at the target's own load
    (a matched window) or a new epoch measures it. Without a rollback the interval's
    claim stands, and an arm with one matched window is judged on it. ``ratios`` are the
    leader's :func:`_gap_ratios`.
    """
    if not _across_gap(ratios):
        return None
    for epoch, arm, infeasible, _ in history.failures:
        if epoch == history.epoch and not infeasible and _across_gap(_gap_ratios(history, arm)):
            return (
                f"{arm}, promoted on trials beside the target at another load per pod, "
                f"regressed at the target's own load and was rolled back: {leader.name}'s "
                "lead, measured across the same gap, is not taken as the target's "
                "(strategy inPlace, or a canary in the place of target pods, measures at "
                "its load)"
            )
    return None


def _leader(b: Beliefs, measured_only: bool) -> Arm | None:
    pool = [x for x in b.arms.values() if x.measured or not measured_only]
    if not pool:
        return None
    # Ties go to the arm with less drafting (cheaper, fewer moving parts).
    return min(pool, key=lambda x: (round(x.loss, 9), x.arm.k)).arm


def _windows(h: History) -> int:
    """Windows recorded so far, those the history's compaction dropped included (a seed:
    dropping old windows must not change a draw)."""
    _, trial_windows, alone = h.recorded()
    return trial_windows + alone


def _estimates(b: Beliefs, minimise: bool) -> dict[str, Estimate]:
    sign = 1.0 if minimise else -1.0
    out = {}
    for name, x in b.arms.items():
        v = math.exp(sign * x.loss)
        lo, hi = (
            math.exp(sign * (x.loss - 1.96 * x.spread)),
            math.exp(sign * (x.loss + 1.96 * x.spread)),
        )
        out[name] = Estimate(v, min(lo, hi), max(lo, hi), x.measured)
    return out


def _describe(x: ArmBelief, minimise: bool, ctx: TuningContext) -> str:
    sign = 1.0 if minimise else -1.0
    ratio = math.exp(sign * x.loss)
    how = "measured" if x.measured else "predicted"
    return (
        f"{x.arm.name} {how} at {ratio:.2f}× the incumbent's {ctx.objective.metric.value} "
        f"(±{100 * (math.exp(1.96 * x.spread) - 1):.0f} %)"
    )


def _amplified(
    history: History, incumbent: str, leader: str, metric: Metric
) -> tuple[float, str] | None:
    """The probability that the leader serves a token faster than the incumbent, when the
    incumbent's load will widen that lead into one on the objective, and how the
    incumbent's window alone showed that load ("saturates" or "queues"); else None.

    Canary pods are added beside the target's, so trials run below the load the target
    carries alone. When the incumbent's last window alone was saturated (requests queued
    for many steps, :func:`~spectune.search.objective.saturated`) — or, for an objective
    that counts the queue, queued longer than beside the leader's canary with confidence
    (:func:`_queues_alone`) — and the leader, on the canary, was not saturated, serves each
    token faster than the incumbent beside it and has a KV pool at least as large, then at
    the target's load the leader runs a smaller batch and admits at least as many
    requests: it queues less, and the lead the trial showed is the least it will have
    there (by Little's law a pod's batch is its arrival rate times the time a request
    spends in it, so at the same rate the faster arm runs the smaller batch, which is
    faster still per step, while the saturated one queues: a lead of a few percent per
    token becomes tens of percent on the p95). The ε margin, which asks a change to be
    worth its restart, is then met by that amplification, and what decides is whether the
    leader is faster per token at all: the mean per-token latency of thousands of tokens,
    whose ratio varies by :data:`TOKEN_WINDOW_SPREAD` between windows,
    where the trials' p95 of a few hundred requests at a lighter load varies by ten times
    that: a p95 rests on the dozen or so requests in its top twentieth, a mean on every
    token. Normal in log space over the windows, with their spread floored at that.
    """
    alone = [
        w.incumbent
        for w in history.baseline_windows()
        if w.incumbent is not None and w.incumbent_arm == incumbent
    ]
    if not alone:
        return None
    pairs = [(can, inc) for can, inc, _ in _trial_pairs(history, incumbent, leader)]
    if saturated(alone[-1]):
        how = "saturates"
    elif _queues_alone(alone[-1], [inc for _, inc in pairs], metric):
        how = "queues"
    else:
        return None
    logs: list[float] = []
    for can, inc in pairs:
        if saturated(can) or not can.num_gpu_blocks or not inc.num_gpu_blocks:
            return None
        if can.num_gpu_blocks < inc.num_gpu_blocks:
            return None
        if not (can.tpot_mean > 0 and inc.tpot_mean > 0):
            return None
        logs.append(math.log(can.tpot_mean / inc.tpot_mean))
    if not logs:
        return None
    mean, se = _log_ratio(logs)
    if not mean < 0:
        return None
    return 0.5 * math.erfc(mean / se / math.sqrt(2)), how


def _trial_pairs(
    history: History, incumbent: str, leader: str
) -> list[tuple[WindowStats, WindowStats, WindowRecord]]:
    """``(canary, incumbent, window)`` of the leader's trial windows in this epoch against
    this incumbent, both sides measured; a backlog pair compares no arms and is left out."""
    return [
        (w.canary, w.incumbent, w)
        for t in history.in_epoch()
        if t.arm == leader and t.incumbent == incumbent
        for w in t.windows
        if w.canary is not None and w.incumbent is not None and not w.backlog_pair
    ]


def _log_ratio(logs: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of per-window log ratios of per-token latency: the spread
    between windows, floored at :data:`TOKEN_WINDOW_SPREAD` (one window
    cannot show its own)."""
    mean = sum(logs) / len(logs)
    sd = float(np.std(logs, ddof=1)) if len(logs) > 1 else 0.0
    return mean, max(sd, TOKEN_WINDOW_SPREAD) / math.sqrt(len(logs))


def _queues_alone(alone: WindowStats, beside: Sequence[WindowStats], metric: Metric) -> bool:
    """Whether the incumbent alone queued longer than beside the leader's canary, with
    confidence, on an objective that counts the queue (e2e or TTFT p95).

    The lower end of the queue p95's interval in its last window alone (``alone``) lies
    above the upper end in every window of the leader's trial (``beside``: the
    incumbent's side of each): the queue grows with the load, so the
    target's load is on the rising part of the queueing curve, where the wait grows like
    ρ/(1 − ρ) with the utilisation ρ, and an arm that needs less time per token (lower ρ)
    gains more there than at the trial's lighter load. Short of saturation, so the
    incumbent's batch still measures its speed: a queue that triples when the canary's
    share of the load returns to the target is the steep part of that curve, and a lead
    of a tenth on the trials' p95 can become a third at the target's load. A TPOT
    objective leaves the queue out, and a larger batch costs a drafting arm more per
    token (SmartSpec): no such premise there.
    """
    if metric not in (Metric.E2E_P95, Metric.TTFT_P95) or math.isnan(alone.queue_p95_low):
        return False
    return bool(beside) and all(alone.queue_p95_low > s.queue_p95_high for s in beside)
