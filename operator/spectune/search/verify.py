"""Post-promotion verification: is the arm now on the target worse than what it replaced?

A trial measures an arm on canary pods beside the target's, at the canary's share of the
traffic. What users then get is the arm on the target, at the target's own load, and
nothing in the trial proves that the two agree (a balancer that sends the canary fewer
requests, a queue the canary did not share, a tail a few hundred requests did not show).
So after every promotion the controller compares the target's own windows with the
predecessor's *reference windows* — its last windows on the target before the promotion —
and rolls back when the promoted arm is worse with confidence (``control/controller.py``).
The same test against the setting the run started on (the floor) keeps any arm the
evidence puts below that setting from being kept, whatever path led to it.

**Comparable load, or no judgement.** A window is compared only with references at the
same offered load per target pod: finished requests per second per pod, within the
controller's load-shift factor (``ControllerConfig.load_shift``, the band in which the search
itself treats loads as one). Windows of the same kind are preferred (alone with alone,
beside a canary with beside a canary): both then carry the same share of the service's
traffic. (A saturated target's finished rate is its capacity, and the offered load is at
least that: a rate below the reference's there is the arm's slowness, and the window is
judged.) Beyond the band the window is **not judged** — not adjusted by the model: latency
near capacity grows like ρ/(1 − ρ) in the utilisation, and a model that extrapolates a p95
across a load change by more than a factor is a guess a rollback cannot rest on. An
unjudged window still counts towards the verification's windows; a verification that
judged none says so (``Verified=Unknown``).

**With confidence.** The objective (a p95) is worse when the lower end of the target's 95 %
interval lies above the upper end of every reference's; a guardrail (TTFT p95, queue-time
p95) when the lower end lies above the references' upper end times ``1 + tolerance``, plus
the buckets' resolution — the test a trial's guardrails apply
(:func:`~spectune.search.spectune_policy.guardrail_breach`). Two disjoint 95 % intervals
differ at well below 5 % by chance, so one such window is evidence enough to roll back: a
wrong rollback costs one restart, a missed one costs every user until the next search.
Where the target and its references were all saturated, their latencies count backlogs of
different ages, and the target is judged on its service rate too: output tokens per second
per pod below the references' beyond the counts' noise (:func:`_slower_when_saturated`).
Objectives without an interval (throughputs, which at an unchanged load equal the offered
load) are judged on the guardrails and that rate only. A p95 the histogram cannot place
inside its bucket (``WindowStats.objective_bound``: every per-token latency under vLLM's
first bucket) is judged by the mean per-token latency, which the histogram holds exactly:
worse when the target's mean exceeds every reference's by more than 1.96·√2 times the
window-to-window spread of a ratio of such means
(:data:`~spectune.search.model.MEASURED_FLOOR`), the reading the model itself gives a
hidden tail (the mean times the acceptance's tail ratio), and only where the target
carried no more requests per pod than the references (the mean rises with the request
rate: each prefill stalls the decodes beside it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from spectune.search.history import History, WindowRecord
from spectune.search.objective import Objective, WindowStats, saturated

__all__ = [
    "Reference",
    "Regression",
    "failing_arms",
    "per_pod_rate",
    "reference_windows",
    "regression",
]

#: Seconds added to a guardrail's line: the resolution of vLLM's smallest latency buckets
#: (as a trial's guardrails add).
ABSOLUTE_SLACK_S = 0.01


@dataclass(frozen=True)
class Reference:
    """One window of an arm on the target: its figures, its load, and whether a canary ran
    beside it (then the target carried its share of the traffic, not all of it)."""

    stats: WindowStats
    rate: float
    """Finished requests per second per target pod (:func:`per_pod_rate`)."""
    beside: bool
    end_s: float


@dataclass(frozen=True)
class Regression:
    """The verdict on one window of the promoted arm.

    ``judged`` is False when no reference was at a comparable load; ``why`` names the
    figure and the numbers when the arm is worse with confidence (None: it holds)."""

    judged: bool
    why: str | None = None
    reference_rate: float = math.nan


def per_pod_rate(w: WindowRecord, s: WindowStats | None = None) -> float:
    """Finished requests per second per pod of the target in a window, or of the group
    ``s`` of it (NaN if unknown)."""
    s, span = s or w.incumbent, w.end_s - w.start_s
    if s is None or span <= 0 or not s.pods or not s.requests > 0:
        return math.nan
    return s.requests / span / s.pods


def reference_windows(history: History, arm: str, before_s: float) -> list[Reference]:
    """``arm``'s windows on the target that ended by ``before_s``, latest first.

    Its windows alone (baseline windows it ran) and its side of every trial window it was
    the incumbent of, in the current epoch and the earlier ones whose acceptance still
    holds (a load move keeps the model and the traffic; any other re-tune does not).
    """
    out: list[Reference] = []
    for epoch in history.acceptance_epochs():
        for w in history.baseline_windows(epoch):
            if w.incumbent_arm == arm and w.incumbent is not None and w.end_s <= before_s:
                out.append(Reference(w.incumbent, per_pod_rate(w), w.canary is not None, w.end_s))
        for t in history.in_epoch(epoch):
            for w in t.windows:
                own = w.incumbent_arm or t.incumbent
                if own == arm and w.incumbent is not None and w.end_s <= before_s:
                    beside = w.canary is not None
                    out.append(Reference(w.incumbent, per_pod_rate(w), beside, w.end_s))
    out.sort(key=lambda r: r.end_s, reverse=True)
    return out


def _comparable(
    target: Reference, refs: Sequence[Reference], factor: float, most: int
) -> list[Reference]:
    """The latest ``most`` references at ``target``'s load (within ``factor``), of its kind
    when there are any."""

    full = saturated(target.stats)

    def near(r: Reference) -> bool:
        a, b = r.rate, target.rate
        if not (a > 0 and b > 0):
            return False
        # A saturated target finishes requests at its capacity, not at the offered load,
        # which is at least that: a rate below the reference's is the arm's slowness.
        return max(a, b) / min(a, b) <= factor or (full and b < a)

    close = [r for r in refs if near(r)]
    same = [r for r in close if r.beside == target.beside]
    return (same or close)[:most]


def regression(
    target: Reference,
    refs: Sequence[Reference],
    objective: Objective,
    factor: float,
    most: int = 2,
    where: str = "before",
) -> Regression:
    """Whether ``target`` (a window of the promoted arm) is worse with confidence than the
    comparable references among ``refs`` (see the module docstring); ``where`` names the
    references in the verdict ("before": the predecessor's windows)."""
    chosen = _comparable(target, refs, factor, most)
    if not chosen:
        return Regression(False)
    rate = math.fsum(r.rate for r in chosen) / len(chosen)
    s = target.stats
    ref = [r.stats for r in chosen]
    metric = objective.metric
    hidden = not math.isnan(s.objective_bound) or any(
        not math.isnan(r.objective_bound) for r in ref
    )
    if metric.minimise and hidden:
        # (Imported here: the model imports this module for failing_arms.)
        from spectune.search.model import MEASURED_FLOOR

        means = [r.tpot_mean for r in ref if r.tpot_mean > 0]
        margin = math.exp(1.96 * math.sqrt(2) * MEASURED_FLOOR)
        # Each request's prefill stalls the decodes beside it, so the mean per-token
        # latency rises with the request rate even inside the load band: judged only where
        # the target carried no more requests per pod than the references (up to the
        # Poisson noise of its count), so that a slower mean is the arm's.
        noise = 1.96 / math.sqrt(s.requests) if s.requests > 0 else math.inf
        lighter = target.rate <= max(r.rate for r in chosen) * (1 + noise)
        if means and lighter and s.tpot_mean > max(means) * margin:
            shown = ", ".join(f"{m * 1000:.1f}ms" for m in means)
            return Regression(
                True,
                f"{metric.value} hidden under the histogram's first bucket; mean per-token "
                f"latency {s.tpot_mean * 1000:.1f}ms vs {shown} {where}: beyond "
                f"+{margin - 1:.0%} with confidence",
                rate,
            )
    if metric.minimise and not hidden:
        highs = [r.objective_high for r in ref if not math.isnan(r.objective_high)]
        if highs and not math.isnan(s.objective_low) and s.objective_low > max(highs):
            shown = ", ".join(f"{r.objective:.3f}s" for r in ref)
            return Regression(
                True,
                f"{metric.value} {s.objective:.3f}s (at least {s.objective_low:.3f}s) vs "
                f"{shown} {where}, at most {max(highs):.3f}s: worse with confidence",
                rate,
            )
    slower = _slower_when_saturated(s, ref, where)
    if slower is not None:
        return Regression(True, slower, rate)
    g = objective.guardrails
    checks = (
        ("TTFT p95", g.max_ttft_p95_regression, s.ttft_p95, s.ttft_p95_low,
         [r.ttft_p95_high for r in ref], [r.ttft_p95 for r in ref]),
        ("queue p95", g.max_queue_p95_regression, s.queue_p95, s.queue_p95_low,
         [r.queue_p95_high for r in ref], [r.queue_p95 for r in ref]),
    )  # fmt: skip
    for label, tol, value, low, ref_highs, values in checks:
        highs = [h for h in ref_highs if not math.isnan(h)]
        if tol is None or math.isnan(low) or not highs:
            continue
        line = max(highs) * (1 + tol) + ABSOLUTE_SLACK_S
        if low > line:
            before = ", ".join(f"{v:.3f}s" for v in values)
            return Regression(
                True,
                f"{label} {value:.3f}s (at least {low:.3f}s) vs {before} {where}: beyond "
                f"+{tol:.0%} with confidence",
                rate,
            )
    return Regression(True, None, rate)


def _slower_when_saturated(
    s: WindowStats, refs: Sequence[WindowStats], where: str = "before"
) -> str | None:
    """Why a saturated target serves fewer tokens than its saturated references, or None.

    A saturated group finishes at its capacity, whatever the offered load above it, and a
    request that finds a backlog B waits B/capacity: the arm that serves fewer output
    tokens per second per pod queues longer on every latency objective and serves less on
    a throughput one, once the backlogs are alike — while each window's latency counts
    only how long its own backlog has grown. So where the target and every reference
    were saturated, the target is worse when its rate lies below every reference's by
    more than the Poisson noise of the two requests counts (1.96·√(1/n₁ + 1/n₂)).
    """
    if not saturated(s) or not refs or not all(saturated(r) for r in refs):
        return None
    mine, theirs = s.tokens_per_pod, [r.tokens_per_pod for r in refs]
    if not (mine > 0 and s.requests > 0) or not all(t > 0 for t in theirs):
        return None
    if not all(r.requests > 0 for r in refs):
        return None
    noise = max(math.exp(1.96 * math.sqrt(1 / s.requests + 1 / r.requests)) for r in refs)
    if mine * noise >= min(theirs):
        return None
    before = ", ".join(f"{t:.0f}" for t in theirs)
    return (
        f"saturated, it served {mine:.0f} output tokens/s per pod vs {before} {where}, also "
        f"saturated: below by more than the counts' noise (±{noise - 1:.0%}), so its queue "
        "grows faster at this load"
    )


def failing_arms(history: History) -> dict[str, str]:
    """Arms the controller found failing on the target, that no policy should pick again
    here, with why: those rolled back after a promotion in this epoch (the epoch is one
    load: a load move opens a new one, where the arm may be tried again), and those that
    could not start on the target in this epoch or an earlier one of the same model (a
    crash or an out-of-memory does not depend on the load)."""
    out: dict[str, str] = {}
    epochs = set(history.acceptance_epochs())
    for epoch, arm, infeasible, why in history.failures:
        if epoch == history.epoch or (infeasible and epoch in epochs):
            out.setdefault(arm, why)
    return out
