r"""The model behind the policy: what every arm would do, from the few arms measured.

Two facts make most arms unnecessary to try (DESIGN.md §1):

* acceptance: vLLM's per-position counters at a drafter's largest ``k`` give
  :math:`P(L \ge i)` for every smaller ``k``, so the expected tokens per pass
  :math:`E_d(k) = 1 + \sum_{i \le k} P(L \ge i)` of every ``k`` follow from one trial;
* cost: the time of one verification pass relative to a plain decode step,
  :math:`r_d(k) = \tau_{d,k} E_d(k) / \tau_{\text{off}}`, where :math:`\tau` is the mean
  per-token latency relative to the incumbent in paired windows. It is 1 at ``k = 0`` and
  grows with ``k`` (``k`` draft steps, and verification over ``b(k+1)`` tokens once the
  batch passes the compute knee), so it is interpolated piecewise-linearly in ``k``
  through the measured points and :math:`(0, 1)`, and extrapolated with the slope of a
  line through the origin fitted to them (:math:`r = 1 + c k`, the draft cost ``c``).

The predicted mean per-token latency of an untried arm relative to the incumbent is
:math:`\hat\tau_{d,k} = \tau_{\text{off}}\, r_d(k) / E_d(k)`; the objective (a p95 or
throughput) is that times the drafter's measured ratio of objective to mean latency, which
carries tail and queueing effects (a drafter that shrinks the KV pool) from the measured
arms of the drafter to its other ``k``.

Where the per-token histogram cannot place a p95 (all of it in one bucket), or places a
drafted arm's p95 at a light load below what its acceptance alone gives (a two-mode
latency, which one gamma misreads), the window's p95 is modelled from its exact mean and
the drafter's spread of acceptance across requests (:class:`_Tails`,
:mod:`spectune.core._tail`).

A measured arm's ratio comes from its windows at the current load (:data:`SIMILAR_LOAD`
of the epoch's latest window): an epoch spans loads within the controller's load-move
factor, and draft costs move with the batch inside it.

Uncertainty is carried in log space. A measured arm's spread comes from the order-statistic
intervals of its p95s, window by window; an untried arm's from the model's own error on the
measured arms plus a penalty for extrapolating in ``k`` (larger without per-position data). A
prediction read from a measured arm of its drafter names it as its anchor, so that the
policy draws the two together (``spectune_policy.posterior_draws``); the step between them
carries the model's error between neighbouring k (:data:`ANCHOR_STEP`) and, where the epoch
saturated, the error of the objective-to-latency line's slope too.
Everything is rebuilt from the history on every call.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from spectune.core import AcceptanceSpread, fit_acceptance_spread, flat_rate_for_length, tail_ratio
from spectune.search.arms import OFF, Arm, parse_arm
from spectune.search.history import History, Outcome, TrialRecord, WindowRecord
from spectune.search.objective import SMALL_BATCH_CHANGE, WindowStats, same_load, saturated
from spectune.search.policy import SearchSpace
from spectune.search.schedule import epoch_batch
from spectune.search.verify import failing_arms

__all__ = ["ArmBelief", "Beliefs", "build_beliefs"]

#: Floor of a measured arm's log-spread: two windows of the same arm on the same traffic
#: differ by about this much even when the quantile intervals are tight.
MEASURED_FLOOR = 0.015
#: Log-spread added to every paired window beyond its quantile interval
#: (:func:`_beyond_interval`): the interval counts the window's requests as independent, but
#: the requests on one pod share its batches, so one pod's p95 moves with its own batch
#: history by more than its count of requests says. The A/A check
#: (``benchmarks/family.py --aa``: a drafter against its identical twin, on the ``tune``
#: worlds) measures it: the twin's TPOT p95 log ratios after the first window spread by
#: 0.06–0.08, where their intervals claim 0.01–0.05, and one in five lies outside its 95 %
#: interval.
WINDOW_SPREAD = 0.05
#: The same for a trial's first paired window, which the canary's warm-up biases too: the
#: twin's first-window ratios spread by ≈ 0.07 in log beyond their intervals.
FIRST_WINDOW_SPREAD = 0.08
#: Batch sizes within this factor of each other share draft costs across epochs (the
#: controller's default load-shift trigger is the same factor).
SIMILAR_LOAD = 1.6
#: Model error before any arm can test it (log units, ≈ 6 %).
MODEL_PRIOR = 0.06
#: Added log-spread per draft position of extrapolation beyond measured acceptance.
EXTRAPOLATION_STEP = 0.03
#: Added log-spread per k between an arm and the measured arm its prediction is anchored to:
#: the model's error in the ratio between neighbouring k is small (the same drafter, the
#: same traffic), far smaller than its error in absolute terms.
ANCHOR_STEP = 0.01
#: ...and per k away from a measured k when the engine gives no per-position data.
NO_POSITION_STEP = 0.06


@dataclass(frozen=True)
class ArmBelief:
    """Belief about one arm: log objective ratio to the incumbent (lower is better)."""

    arm: Arm
    loss: float
    spread: float
    measured: bool
    windows: int
    tpot_ratio: float
    expected_tokens: float
    anchor: str | None = None
    """For a prediction: the measured arm of the same drafter it was read from. Both share
    that arm's measurement error, so the policy samples this arm as the anchor's draw plus
    the model's step between them (:attr:`relative_spread`), not independently."""
    relative_spread: float = math.nan
    settled: bool = True
    """False for a measured arm seen only in its trials' first windows, whose lead the
    canary's warm-up can make (:func:`_beyond_interval`): not yet a ground to promote it."""


@dataclass
class Beliefs:
    """All arms' beliefs, plus what still has to be measured before the model can speak."""

    arms: dict[str, ArmBelief] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)
    unexplored_drafters: list[str] = field(default_factory=list)
    needs_off: bool = False
    costs: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    survival: dict[str, np.ndarray] = field(default_factory=dict)
    """P(L ≥ i) per drafter, for every drafter whose acceptance was seen."""
    spreads: dict[str, AcceptanceSpread] = field(default_factory=dict)
    """How acceptance varies across requests, per drafter whose counters allow the fit
    (three positions or more; :func:`~spectune.core.fit_acceptance_spread`)."""
    saturated: bool = False
    """A window of this epoch found the pods saturated (``objective.saturated``): latency
    ratios there do not extrapolate to other arms, so ``off`` must be measured."""


def _log(x: float) -> float:
    return math.log(x) if x > 0 and not math.isnan(x) else math.nan


def _side_spread(s: WindowStats) -> float:
    """Log-spread of one group's objective from its quantile interval (NaN if unknown)."""
    lo, hi = s.objective_low, s.objective_high
    if lo > 0 and hi > 0 and not (math.isnan(lo) or math.isnan(hi)):
        return (math.log(hi) - math.log(lo)) / (2 * 1.96)
    return math.nan


def _pair_spread(*sides: float) -> float:
    """Log-spread of one window's objective ratio from its two sides' spreads."""
    if any(math.isnan(x) for x in sides):
        return 0.05
    return math.sqrt(sum(x * x for x in sides))


def _beyond_interval(values: tuple[float, float, float], first: bool) -> tuple[float, float, float]:
    """A paired window's values, with the spread its quantile interval does not hold
    added in quadrature: :data:`FIRST_WINDOW_SPREAD` for a trial's first window,
    :data:`WINDOW_SPREAD` for the others.

    Every window: the requests on one pod are not independent draws, since each step's
    time is shared by the whole batch, so a pod's p95 carries its batch history's error
    on top of the counting error its interval holds. The first window besides: a canary's
    first window counts only the requests that both began and ended since the canary came
    up, a sample biased towards short requests, and it serves the balancer's catch-up
    burst (``spectune_policy.catch_up_burst``); the incumbent's counts requests of every
    length. From the second window on, both sides count the same mix.
    """
    can_value, inc_value, spread = values
    extra = FIRST_WINDOW_SPREAD if first else WINDOW_SPREAD
    return can_value, inc_value, math.hypot(spread, extra)


def _speed_pair(can: WindowStats, inc: WindowStats) -> tuple[float, float, float] | None:
    """A throughput objective's window in which neither side saturated, read on speed.

    Below saturation a pod finishes what it is sent: its output tokens per second are its
    share of the offered load, and the balancer sets that share (one that routes by
    outstanding requests sends a fresh canary a catch-up burst, and the pod that holds each
    request for less time more of them), not the arm's capacity. What such a window says of
    capacity is how fast each side ran the batch it had: output tokens per second per
    running request, the inverse of its mean per-token latency. A mean over thousands of
    tokens has no counting error to speak of (:data:`MEASURED_FLOOR`); what moves it is
    each pod's batch, the spread :func:`_beyond_interval` adds to every window. A saturated
    side's tokens per second is its capacity, so a window in which either side saturated
    keeps that reading (None here).
    """
    if saturated(can) or saturated(inc) or not (can.tpot_mean > 0 and inc.tpot_mean > 0):
        return None
    return 1.0 / can.tpot_mean, 1.0 / inc.tpot_mean, MEASURED_FLOOR


def _window_pair(
    tails: _Tails, w: WindowRecord, t: TrialRecord, first: bool, minimise: bool
) -> tuple[tuple[float, float, float], bool]:
    """The objectives a paired window compares and the log-spread of their ratio:
    :meth:`_Tails.pair`, or per-token speed for a throughput objective below saturation
    (:func:`_speed_pair`), with the spread beyond the interval (:func:`_beyond_interval`);
    and whether it was read on speed."""
    assert w.canary is not None and w.incumbent is not None
    speed = None if minimise else _speed_pair(w.canary, w.incumbent)
    values = speed or tails.pair(w.canary, t.arm, w.incumbent, t.incumbent)
    return _beyond_interval(values, first), speed is not None


def _random_effects(x: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Pooled mean and standard error of per-window log ratios ``x`` with inverse-variance
    weights ``w``, widened by the spread between windows beyond their own
    (DerSimonian–Laird).

    Each window's spread holds its counting error and one pod's batch noise
    (:func:`_beyond_interval`), but not what moves a pair of pods window by window: the
    traffic mix each pod drew, a pod's batch history that persists from one window to the
    next. Where the windows disagree by more than their spreads allow (Cochran's
    ``Q = Σ w (x − x̄)²`` above its ``n − 1`` degrees of freedom), that excess is a variance
    ``τ²`` shared by every window, and each window then counts with ``1/(1/w + τ²)``:
    windows that contradict each other are less evidence than their intervals claim. It
    never narrows the interval, and one window (or windows that agree) is read as before.
    """
    mean = float(np.sum(w * x) / np.sum(w))
    q = float(np.sum(w * (x - mean) ** 2))
    scale = float(np.sum(w) - np.sum(w * w) / np.sum(w))
    tau2 = max(0.0, (q - (len(x) - 1)) / scale) if scale > 0 else 0.0
    if tau2 == 0.0:
        return mean, float(1 / math.sqrt(np.sum(w)))
    wr = 1.0 / (1.0 / w + tau2)
    return float(np.sum(wr * x) / np.sum(wr)), float(1 / math.sqrt(np.sum(wr)))


@dataclass
class _Measured:
    obj_logs: list[float] = field(default_factory=list)
    obj_weights: list[float] = field(default_factory=list)
    tpot_logs: list[float] = field(default_factory=list)
    tokens: float = 0.0
    passes: float = 0.0
    requests: float = 0.0
    settled: bool = False
    """Measured in a window after its trial's first (:attr:`ArmBelief.settled`)."""

    def add(
        self,
        can: WindowStats,
        inc: WindowStats,
        sign: float,
        values: tuple[float, float, float],
        offset: tuple[float, float, float] = (0.0, 0.0, 0.0),
    ) -> None:
        """One paired window; ``offset`` = (loss, log tpot, spread) of its incumbent.

        ``values``: the two objectives to compare and the log-spread of their ratio
        (:meth:`_Tails.pair`: the windows' own, or tails the histogram cannot show, read
        from acceptance).
        """
        off_loss, off_tpot, off_spread = offset
        can_value, inc_value, pair_spread = values
        o = _log(can_value) - _log(inc_value)
        t = _log(can.tpot_mean) - _log(inc.tpot_mean) + off_tpot
        if not math.isnan(o):
            sp = math.hypot(max(pair_spread, MEASURED_FLOOR), off_spread)
            self.obj_logs.append(sign * o + off_loss)
            self.obj_weights.append(1 / (sp * sp))
        if not math.isnan(t):
            self.tpot_logs.append(t)
        self.requests += can.requests
        if can.drafts > 0:
            self.tokens += can.mean_accepted_length * can.drafts
            self.passes += can.drafts

    @property
    def loss(self) -> tuple[float, float]:
        """The windows' pooled log ratio and its spread, with the between-window spread
        the windows themselves show (:func:`_random_effects`)."""
        if not self.obj_logs:
            return math.nan, math.inf
        mean, se = _random_effects(np.asarray(self.obj_logs), np.asarray(self.obj_weights))
        return mean, max(se, MEASURED_FLOOR / 2)

    @property
    def tpot_ratio(self) -> float:
        return math.exp(float(np.mean(self.tpot_logs))) if self.tpot_logs else math.nan


def _capacity_pair(can: WindowStats, inc: WindowStats) -> tuple[float, float, float] | None:
    """Two saturated sides of a window compared on their service time, or None.

    A saturated group finishes requests at its capacity μ, and a request that finds a
    backlog B waits B/μ: its latency counts how long the backlog has grown (the
    incumbent's since before the trial, the canary's since its start), not the arm. At
    equal backlogs the wait is inversely proportional to the capacity, so the latency
    ratio the arms would show at the target's load is the inverse ratio of their output
    tokens per second per pod, with the Poisson spread of the two requests counts
    (√(1/n₁ + 1/n₂)). A throughput objective is that capacity already.
    """
    if not (saturated(can) and saturated(inc)):
        return None
    if not (can.tokens_per_pod > 0 and inc.tokens_per_pod > 0):
        return None
    if not (can.requests > 0 and inc.requests > 0):
        return None
    spread = math.sqrt(1 / can.requests + 1 / inc.requests)
    return 1.0 / can.tokens_per_pod, 1.0 / inc.tokens_per_pod, spread


def _survival(windows: Iterable[WindowStats]) -> np.ndarray:
    """Pooled P(L ≥ i) per position over windows, each position over the windows that drafted it."""
    acc: dict[int, float] = defaultdict(float)
    drafts: dict[int, float] = defaultdict(float)
    for s in windows:
        for i, v in enumerate(s.accepted_per_pos):
            acc[i] += v
            drafts[i] += s.drafts
    if not drafts:
        return np.zeros(0)
    k = max(drafts) + 1
    return np.array([acc[i] / drafts[i] if drafts[i] > 0 else 0.0 for i in range(k)])


def _expected(survival: np.ndarray, k: int) -> tuple[float, int]:
    """E(k) from a survival curve, extrapolating past its end; and how far it extrapolated."""
    if k <= len(survival):
        return 1.0 + float(np.sum(survival[:k])), 0
    s = list(survival)
    q = s[-1] / s[-2] if len(s) >= 2 and s[-2] > 0 else (s[-1] if s else 0.0)
    q = min(max(q, 0.0), 1.0)
    while len(s) < k:
        s.append((s[-1] if s else 1.0) * q)
    return 1.0 + float(np.sum(s[:k])), k - len(survival)


def _interp_cost(points: dict[int, float], k: int) -> float:
    """r(k) through (0, 1) and the measured (k, r) points; past them, r = 1 + c·k."""
    xs = sorted(points)
    pts = [(0, 1.0)] + [(x, points[x]) for x in xs]
    if k <= xs[-1]:
        for (x0, y0), (x1, y1) in itertools.pairwise(pts):
            if x0 <= k <= x1:
                return y0 + (y1 - y0) * (k - x0) / (x1 - x0)
    num = sum(x * (points[x] - 1) for x in xs)
    den = sum(x * x for x in xs)
    c = max(num / den, 0.0) if den else 0.0
    # Continue from the last measured point with the fitted slope.
    return points[xs[-1]] + c * (k - xs[-1])


class _Tails:
    """The TPOT p95 of windows whose histogram cannot show it, read from acceptance.

    Where every request's per-token latency sits under the histogram's first bound (10 ms
    in vLLM; an 8B model with a drafter runs at 3–6 ms), or within one bucket, the gamma
    fit has the exact mean and no tail: any shape fits one full bucket, and its p95 is a
    guess. The mean alone would rank arms wrongly too: acceptance varies across requests,
    and a request that accepts little pays the cost of a longer draft without its gain, so
    the p95 (those requests) is best at a smaller ``k`` than the mean. Such a window's
    p95 is its exact mean times the ratio of p95 to mean that the drafter's spread of
    acceptance across requests gives at its ``k`` (:func:`spectune.core.tail_ratio`),
    kept within the bucket's edges. ``off`` has ratio 1: without drafting the acceptance
    spread adds no tail. A modelled p95 never exceeds the window's step time
    (:func:`step_time`): a request emits at least one token per step, so none has a
    per-token latency above the steps it ran in.
    """

    def __init__(self, by_drafter: dict[str, list[WindowStats]]) -> None:
        self.spreads: dict[str, AcceptanceSpread] = {}
        self.used: dict[str, float] = {}
        """p95 over mean of each arm whose hidden tail was modelled, for the decision's notes."""
        for drafter, windows in by_drafter.items():
            counters = [(s.accepted_per_pos, s.drafts) for s in windows if s.drafts > 0]
            fit = fit_acceptance_spread(counters)
            if fit is not None:
                self.spreads[drafter] = fit

    def _acceptance_ratio(self, arm_name: str) -> float | None:
        """p95 over mean that the spread of acceptance across requests gives an arm: 1 for
        ``off``; None for a schedule or a drafter whose spread is not known."""
        arm = _arm_of(arm_name)
        if arm is None or arm.adaptive is not None:
            return None
        if arm.drafter is None:
            return 1.0
        spread = self.spreads.get(arm.drafter)
        return tail_ratio(spread, arm.k) if spread is not None else None

    def _ratio(self, s: WindowStats, arm_name: str) -> float | None:
        """p95 over mean for a window whose histogram hid its tail; None if unknown."""
        if math.isnan(s.objective_bound) or not s.tpot_mean > 0:
            return None
        return self._acceptance_ratio(arm_name)

    def _misread(self, s: WindowStats, arm_name: str) -> float | None:
        """p95 over mean for a window whose histogram placed its p95 below where
        acceptance alone puts it; None when the fit can be right or acceptance has no say.

        At a light load (a batch of fewer than
        :data:`~spectune.search.objective.SMALL_BATCH_CHANGE` requests per pod, whose steps
        cost the same whatever the batch) a drafted arm's requests differ in per-token
        latency by their acceptance, which the counters measure over thousands of drafts,
        and by what else stretches their steps (another request's prefill, a short
        output's luck). The p95 that acceptance alone gives is therefore the least the
        window's can be: where the gamma fit's whole 95 % interval lies below it, the fit
        is the one that is wrong — one gamma cannot hold two modes (ngram on 80 % chat and
        20 % summaries: 41-46 % of the requests under 10 ms, the rest 10-25 ms; the fit
        read the p95 at 11.0 ms [10.8, 11.2] where it was 15.3) — and the window is read
        from acceptance, as a hidden one is. A fit above it is the other sources' tail,
        and stands. ``off`` is never read this way: acceptance says nothing of its tail.
        """
        if not math.isnan(s.objective_bound) or not s.running < SMALL_BATCH_CHANGE:
            return None
        if saturated(s) or not s.tpot_mean > 0 or not s.objective_low > 0:
            return None
        ratio = self._acceptance_ratio(arm_name) if arm_name != OFF.name else None
        return ratio if ratio is not None and s.tpot_mean * ratio > s.objective_high else None

    def pair(
        self, can: WindowStats, can_arm: str, inc: WindowStats, inc_arm: str
    ) -> tuple[float, float, float]:
        """The two objectives of a paired window and the log-spread of their ratio.

        A modelled p95 is the window's exact mean times a ratio fixed by the fit, so what
        is uncertain in it is the mean: the spread across requests the ratio implies
        (CV ≈ (ratio − 1)/1.645), over the square root of the window's requests. A
        hidden tail that cannot be modelled (its drafter seen at fewer than three
        positions since the model changed) keeps the histogram's figure, and then so does
        the other side: a modelled p95 against the gamma fit's guess would compare two
        different things. A side the fit misread at a light load (:meth:`_misread`) is
        modelled beside a placed one: both are then the best reading there is of a p95.
        A placed side beside a modelled one is read under the model's premise too: no
        request slower per token than its steps (:func:`_within_step`), so its figure is
        capped at its step. The model leaves the steps' own spread out (``off`` is read
        at its mean); a placed p95 above the step holds that spread, or a fit that put a
        tail where no request can be (one gamma over a fast and a slow mode of requests,
        in buckets 10 ms wide), and would be set against a side that has none.
        """
        rc = self._ratio(can, can_arm) or self._misread(can, can_arm)
        ri = self._ratio(inc, inc_arm) or self._misread(inc, inc_arm)
        hidden_c = not math.isnan(can.objective_bound)
        hidden_i = not math.isnan(inc.objective_bound)
        if (hidden_c and rc is None) or (hidden_i and ri is None) or (rc is None and ri is None):
            return (
                can.objective,
                inc.objective,
                _pair_spread(_side_spread(can), _side_spread(inc)),
            )
        sides = []
        values = []
        for s, r, name in ((can, rc, can_arm), (inc, ri, inc_arm)):
            if r is None:
                step = step_time(s)
                values.append(s.objective if math.isnan(step) else min(s.objective, step))
                sides.append(_side_spread(s))
            else:
                r = _within_step(s, r)
                self.used[name] = r
                values.append(max(min(s.tpot_mean * r, s.objective_bound), s.objective_floor))
                sides.append((r - 1.0) / 1.645 / math.sqrt(max(s.requests, 1.0)))
        return values[0], values[1], _pair_spread(*sides)

    def note(self) -> str | None:
        """What the decision's reason says about modelled tails (None if there were none)."""
        drafted = {n: r for n, r in self.used.items() if n != OFF.name}
        if not drafted:
            return None
        ratios = ", ".join(f"{n} at {r:.2f}× its mean" for n, r in sorted(drafted.items()))
        return (
            "p95s the per-token histogram cannot place (every request in one bucket) or, "
            "at a light load, places below what acceptance alone gives are read from how "
            f"acceptance varies across requests: {ratios}"
        )


def step_time(s: WindowStats) -> float:
    """The mean duration of one engine step on a window's pods (NaN when unknown).

    By Little's law the pods finish ``tokens_per_pod`` output tokens per second over
    ``running`` requests, each step giving a request ``mean_accepted_length`` tokens on
    average over its steps (the counters weigh requests by their steps, as the running
    gauge does by time), so a step lasts ``running · mean_accepted_length /
    tokens_per_pod``. It needs no per-request weighting: the mean per-token latency
    times the tokens per step would, and overstates the step where the requests that
    accept most are also the longest.
    """
    tokens = s.tokens_per_pod
    if not (s.running > 0 and tokens > 0):
        return math.nan
    return s.running * max(s.mean_accepted_length, 1.0) / tokens


def _within_step(s: WindowStats, ratio: float) -> float:
    """``ratio`` (a modelled p95 over the window's mean) capped at the step time's ratio.

    A request's per-token latency is its decode time over its tokens, and every step it
    runs in gives it at least one token: it is at most the mean step it ran in. The
    acceptance model reads the p95 from one Beta distribution of rates fitted to pooled
    counters, and the counters do not tell the tail of the rates apart from how the
    requests' lengths go with their acceptance (short chat that accepts little beside
    long code that accepts much): its p95 can land above any request's. The step's own
    spread across requests (prefills of others) would lift a p95 over the mean step a
    little, but it does so for every arm alike, ``off`` included, which is read at its
    mean; so the cap is the step itself, never below the mean.
    """
    step = step_time(s)
    if math.isnan(step) or not s.tpot_mean > 0:
        return ratio
    return max(min(ratio, step / s.tpot_mean), 1.0)


def _arm_of(name: str) -> Arm | None:
    try:
        return parse_arm(name)
    except Exception:
        return None


def build_beliefs(
    space: SearchSpace, history: History, incumbent: Arm, minimise: bool, min_requests: int
) -> Beliefs:
    """Beliefs about every arm of ``space`` from the current epoch of ``history``."""
    sign = 1.0 if minimise else -1.0
    b = Beliefs()
    epoch_trials: Sequence[TrialRecord] = history.in_epoch()
    baseline: Sequence[WindowRecord] = history.baseline_windows()
    by_drafter = _acceptance_windows(history, incumbent)
    tails = _Tails(by_drafter)
    b.spreads = tails.spreads

    # A search may promote a clear winner and go on: trials then compare against different
    # incumbents. Each promoted arm was measured against the one before, so every
    # incumbent's offset to the current one follows by chaining those ratios.
    offsets = _incumbent_offsets(epoch_trials, incumbent.name, sign, tails)
    b.excluded = _exclusions(history, epoch_trials, incumbent)
    evidence = _measure(epoch_trials, baseline, incumbent, sign, minimise, tails, offsets)
    measured = evidence.measured
    _add_earlier_incumbents(epoch_trials, incumbent.name, offsets, measured)

    # The incumbent is the reference of every ratio.
    inc_length = _incumbent_length(evidence.inc_windows, incumbent)
    b.survival, b.unexplored_drafters = _survival_curves(space, by_drafter)
    if math.isnan(inc_length):
        # No window of the incumbent yet in this epoch (a load move skips the baseline):
        # its expected tokens per pass from the carried acceptance curve.
        seen = b.survival.get(incumbent.drafter or "")
        inc_length = _expected(seen, incumbent.k)[0] if seen is not None else 1.0

    b.saturated = _epoch_saturated(epoch_trials, baseline)
    priors = {} if b.saturated else _prior_costs(history)
    off = _off_latency(
        space, incumbent, inc_length, measured, min_requests, priors, b.survival, b.saturated
    )
    if off.note is not None:
        b.notes.append(off.note)
    b.needs_off = off.needs_measuring
    cost_points, b.costs = _cost_points(space, incumbent, inc_length, measured, off.tau, priors)

    shape = _shape_line(measured, incumbent, sign)
    model = _Model(space, sign, b.survival, cost_points, off.tau, off.inferred, shape)
    model.check(measured)
    anchors = _anchors(measured, incumbent, min_requests, b.excluded)
    b.arms = _arm_beliefs(
        space,
        incumbent,
        inc_length,
        evidence,
        min_requests,
        b.excluded,
        model,
        anchors,
        b.saturated,
    )
    b.notes.extend(_closing_notes(space, evidence, tails))
    return b


def _note_acceptance(
    by_drafter: dict[str, list[WindowStats]], arm_name: str, s: WindowStats | None
) -> None:
    """Add ``s`` to its drafter's acceptance windows when it holds a curve of that drafter.

    A window's acceptance counters describe its drafter at its ``k`` on this traffic, so
    every arm of one drafter adds to one curve. An arm that drafts per request or per tier
    (``verify``, ``tiers``) mixes draft lengths in its counters, which are then no curve of
    the drafter, and a window with no draft counted says nothing.
    """
    arm = _arm_of(arm_name)
    if s is None or arm is None or arm.drafter is None:
        return
    if arm.verify or arm.tiers is not None:
        # per-request or per-tier draft lengths: its counters are no curve of the drafter
        return
    if s.drafts > 0 or s.mean_accepted_length > 1:
        by_drafter[arm.drafter].append(s)


def _acceptance_windows(history: History, incumbent: Arm) -> dict[str, list[WindowStats]]:
    """Every window whose acceptance counters describe a drafter, per drafter.

    The current epoch's windows alone of the incumbent and its trials' windows on both
    sides, then those of the earlier epochs whose acceptance still holds. Acceptance is a
    property of the drafter on this traffic, not of the load (verification accepts the
    same tokens whatever the batch), so epochs re-opened only because the load moved lend
    theirs (:meth:`History.acceptance_epochs`) and one curve is fitted over all of them.
    """
    by_drafter: dict[str, list[WindowStats]] = defaultdict(list)
    for w in history.baseline_windows():
        if w.incumbent is not None and (not w.incumbent_arm or w.incumbent_arm == incumbent.name):
            _note_acceptance(by_drafter, incumbent.name, w.incumbent)
    for t in history.in_epoch():
        for w in t.windows:
            _note_acceptance(by_drafter, t.incumbent, w.incumbent)
            _note_acceptance(by_drafter, t.arm, w.canary)
    for epoch in history.acceptance_epochs()[1:]:
        for t in history.in_epoch(epoch):
            for w in t.windows:
                _note_acceptance(by_drafter, w.incumbent_arm or t.incumbent, w.incumbent)
                _note_acceptance(by_drafter, t.arm, w.canary)
        for w in history.baseline_windows(epoch):
            _note_acceptance(by_drafter, w.incumbent_arm, w.incumbent)
    return by_drafter


def _exclusions(
    history: History, epoch_trials: Sequence[TrialRecord], incumbent: Arm
) -> dict[str, str]:
    """The arms the search must not offer again, each with why.

    An arm the controller found failing on the target (rolled back, or unable to start:
    :func:`failing_arms`) would fail again there; one whose trial could not start would
    fail again on the same hardware; one that broke a guardrail in a window was judged on
    users' requests. An arm aborted before any window (suspended, the target missing, the
    metrics down) was never measured, so it is as untried as before. The incumbent is
    never excluded here: it is what is served.
    """
    excluded: dict[str, str] = {}
    for name, why in failing_arms(history).items():
        if name != incumbent.name:
            excluded[name] = why
    for t in epoch_trials:
        if t.outcome is Outcome.INFEASIBLE:
            excluded[t.arm] = f"could not start: {t.reason}"
        if t.outcome is Outcome.ABORTED and t.windows:
            excluded[t.arm] = f"guardrail: {t.reason}"
    return excluded


@dataclass(frozen=True)
class _Evidence:
    """The epoch's paired windows read as measurements of their arms."""

    measured: dict[str, _Measured]
    """Per arm: its windows' log ratios to the current incumbent, at the current load."""
    inc_windows: list[WindowStats]
    """The current incumbent's own windows, alone and beside its trials' canaries."""
    by_capacity: bool
    """Whether a window was compared on service rate (both sides saturated)."""
    by_speed: bool = False
    """Whether a throughput window was compared on per-token speed (neither saturated)."""


def _current_batch(epoch_trials: Sequence[TrialRecord]) -> float:
    """The incumbent's running batch per pod in the epoch's latest paired window (or NaN).

    That is the load the epoch runs at now, and the one every arm's ratio is read at
    (:func:`_measure`).
    """
    paired = sorted(
        (w for t in epoch_trials for w in t.windows if w.incumbent is not None and w.canary),
        key=lambda w: w.start_s,
    )
    return paired[-1].incumbent.running if paired and paired[-1].incumbent else math.nan


def _measure(
    epoch_trials: Sequence[TrialRecord],
    baseline: Sequence[WindowRecord],
    incumbent: Arm,
    sign: float,
    minimise: bool,
    tails: _Tails,
    offsets: dict[str, tuple[float, float, float]],
) -> _Evidence:
    """Each trial's paired windows at the current load, as log ratios to the incumbent.

    A window's ratio is taken against the trial's own incumbent and chained to the
    current one through ``offsets``; a trial whose incumbent cannot be chained, a window
    with no canary request or whose pair is a backlog's, measures nothing. Where both
    sides saturated, a latency objective is compared on service rate instead
    (:func:`_capacity_pair`): a saturated queue's latency is its backlog's age; where
    neither did, a throughput objective on per-token speed (:func:`_speed_pair`).
    """
    measured: dict[str, _Measured] = defaultdict(_Measured)
    inc_windows: list[WindowStats] = []
    by_capacity = by_speed = False
    for w in baseline:
        if w.incumbent is not None and (not w.incumbent_arm or w.incumbent_arm == incumbent.name):
            inc_windows.append(w.incumbent)
    # An arm's objective ratio is read from its windows at the load of the epoch's latest
    # paired window. Draft costs grow with the batch (verification runs over b(k+1)
    # tokens, and a larger batch leaves less idle compute to hide them in), so under a ramp
    # that stays inside the load-move factor an arm's gain moves window by window, a short
    # draft gaining on a long one by tens of percent as the batch grows a few times over:
    # pooled, its early windows hold back the promotion that the current load already
    # warrants. An arm with no window at the current load is unmeasured again (predicted;
    # re-tried).
    now_b = _current_batch(epoch_trials)
    for t in epoch_trials:
        offset = offsets.get(t.incumbent)
        for i, w in enumerate(t.windows):
            if w.incumbent is not None and t.incumbent == incumbent.name:
                inc_windows.append(w.incumbent)
            if w.canary is not None and not w.backlog_pair:
                inc_s = w.incumbent if w.canary.requests > 0 else None
                at_load = inc_s is not None and same_load(inc_s.running, now_b, SIMILAR_LOAD)
                if inc_s is not None and offset is not None and at_load:
                    pair, speed = _window_pair(tails, w, t, i == 0, minimise)
                    by_speed |= speed
                    capacity = _capacity_pair(w.canary, inc_s) if minimise else None
                    if capacity is not None:
                        pair, by_capacity = capacity, True
                    measured[t.arm].add(w.canary, inc_s, sign, pair, offset)
                    measured[t.arm].settled |= i > 0
    return _Evidence(measured, inc_windows, by_capacity, by_speed)


def _add_earlier_incumbents(
    epoch_trials: Sequence[TrialRecord],
    current: str,
    offsets: dict[str, tuple[float, float, float]],
    measured: dict[str, _Measured],
) -> None:
    """Add each earlier incumbent of the epoch to ``measured``, at its chained offset.

    An arm promoted away from mid-search was measured as the reference of the trials it
    served beside: its offset to the current incumbent (:func:`_incumbent_offsets`) is its
    ratio, and its windows beside those trials count as its requests and acceptance. An
    arm that was also measured as a canary keeps that direct measurement.
    """
    for t in epoch_trials:
        if t.incumbent == current or t.incumbent not in offsets:
            continue
        if t.incumbent in measured and measured[t.incumbent].obj_logs:
            continue
        off_loss, off_tpot, off_spread = offsets[t.incumbent]
        m = measured[t.incumbent]
        m.settled = True  # an incumbent's windows are no canary's warm-up
        m.obj_logs.append(off_loss)
        m.obj_weights.append(1 / max(off_spread, MEASURED_FLOOR) ** 2)
        m.tpot_logs.append(off_tpot)
        for w in (x for tt in epoch_trials if tt.incumbent == t.incumbent for x in tt.windows):
            if w.incumbent is not None:
                m.requests += w.incumbent.requests
                if w.incumbent.drafts > 0:
                    m.tokens += w.incumbent.mean_accepted_length * w.incumbent.drafts
                    m.passes += w.incumbent.drafts


def _incumbent_length(inc_windows: Sequence[WindowStats], incumbent: Arm) -> float:
    """The incumbent's expected tokens per pass over its windows (NaN when unknown).

    Pooled over draft passes (tokens over passes), so each window weighs by how many
    passes it ran; ``off`` emits one token per pass. An engine that counts no passes but
    exports a mean accepted length gets the plain mean of those; a drafted incumbent with
    neither is NaN, for the caller to read off the acceptance curve.
    """
    inc_tokens = sum(s.mean_accepted_length * s.drafts for s in inc_windows if s.drafts > 0)
    inc_passes = sum(s.drafts for s in inc_windows if s.drafts > 0)
    inc_length = inc_tokens / inc_passes if inc_passes > 0 else 1.0
    if incumbent.drafter is not None and inc_passes == 0:
        lengths = [s.mean_accepted_length for s in inc_windows if s.mean_accepted_length > 1]
        inc_length = float(np.mean(lengths)) if lengths else math.nan
    return inc_length


def _survival_curves(
    space: SearchSpace, by_drafter: dict[str, list[WindowStats]]
) -> tuple[dict[str, np.ndarray], list[str]]:
    """P(L ≥ i) per drafter of ``space`` whose acceptance was seen, and those unseen.

    Per-position counters give the curve directly (:func:`_survival`). An engine without
    them (SGLang) exports only a mean accepted length, and a flat per-token acceptance
    rate fitted to it at the longest draft seen is the least-assuming curve with that
    mean. A drafter with no window at all is unexplored: the model cannot speak for it.
    """
    survival: dict[str, np.ndarray] = {}
    unexplored: list[str] = []
    for d in space.drafters:
        windows = by_drafter.get(d.name, [])
        curve = _survival(windows)
        if len(curve) == 0 and windows:
            # No per-position data (SGLang): a flat per-token rate fitted to the length.
            best = max(windows, key=lambda s: s.k or 0)
            k = best.k or max(1, round(best.mean_accepted_length))
            a = flat_rate_for_length(best.mean_accepted_length, k)
            curve = a ** np.arange(1, k + 1)
        if len(curve) == 0:
            unexplored.append(d.name)
        else:
            survival[d.name] = curve
    return survival, unexplored


def _epoch_saturated(epoch_trials: Sequence[TrialRecord], baseline: Sequence[WindowRecord]) -> bool:
    """Whether any window of the epoch, on either side or alone, found the pods saturated.

    At saturation the batch sits at the engine's limit whatever the arm, and an arm with
    less drafting per token would run a smaller one: latency ratios there are set by the
    queue, not by acceptance and draft cost, so they do not extrapolate to other arms.
    """
    return any(
        saturated(s)
        for t in epoch_trials
        for w in t.windows
        for s in (w.incumbent, w.canary)
        if s is not None
    ) or any(saturated(w.incumbent) for w in baseline if w.incumbent is not None)


@dataclass(frozen=True)
class _OffLatency:
    """Off's per-token latency relative to the incumbent, and how it was found."""

    tau: float | None
    """None: not known (neither measured nor inferable)."""
    inferred: bool = False
    """Extrapolated to ``k = 0`` from two measured draft lengths."""
    note: str | None = None
    """What the decision's reason says about an inferred value."""
    needs_measuring: bool = False
    """Unknown, and ``off`` is in the space: it has to be measured."""


def _off_latency(
    space: SearchSpace,
    incumbent: Arm,
    inc_length: float,
    measured: dict[str, _Measured],
    min_requests: int,
    priors: dict[str, float],
    survival: dict[str, np.ndarray],
    saturated_epoch: bool,
) -> _OffLatency:
    """Off's per-token latency relative to the incumbent: the anchor of every cost point.

    In order of how directly it is known: 1 when ``off`` is the incumbent; its measured
    ratio; inferred from two draft lengths of the incumbent's drafter, which give both
    the plain step and the draft cost (:func:`_off_from_two_lengths`); or from an earlier
    epoch's draft cost at a similar load with the incumbent's expected tokens per pass.
    Under saturation the batch, not the arm, sets the latency, so neither inference
    holds there (:func:`_epoch_saturated`): ``off`` can then only be measured.
    """
    if incumbent.is_off:
        return _OffLatency(1.0)
    if OFF.name in measured and not math.isnan(measured[OFF.name].tpot_ratio):
        return _OffLatency(measured[OFF.name].tpot_ratio)
    two_lengths = (
        None
        if saturated_epoch
        else _off_from_two_lengths(incumbent, inc_length, measured, min_requests)
    )
    if two_lengths is not None:
        tau_off, other = two_lengths
        return _OffLatency(
            tau_off,
            inferred=True,
            note=f"off's latency inferred from {incumbent.name} and {other}: two draft "
            "lengths of one drafter give both the plain step and the draft cost",
        )
    prior = priors.get(incumbent.drafter or "")
    if prior is not None and incumbent.drafter in survival:
        return _OffLatency(
            inc_length / (1 + prior * incumbent.k),
            note=f"off's latency inferred from the earlier draft cost c = {prior:.3f}",
        )
    return _OffLatency(None, needs_measuring=space.allow_off)


def _cost_points(
    space: SearchSpace,
    incumbent: Arm,
    inc_length: float,
    measured: dict[str, _Measured],
    tau_off: float | None,
    priors: dict[str, float],
) -> tuple[dict[str, dict[int, float]], dict[str, float]]:
    r"""Cost points :math:`r_d(k)` per drafter, and the draft cost ``c`` fitted to each.

    A measured arm's pass costs its per-token latency times its tokens per pass, over
    off's: :math:`r = \tau E / \tau_{\text{off}}` (module docstring), the incumbent's
    included. ``c`` is the slope of a line through :math:`(0, 1)` fitted by least
    squares, clamped at 0 (noise can make it negative). A drafter with no measured arm
    but an earlier epoch's cost at a similar load (``priors``) gets the point
    :math:`(1, 1 + c)`; without off's latency there is no cost point at all.
    """
    cost_points: dict[str, dict[int, float]] = defaultdict(dict)
    costs: dict[str, float] = {}
    if tau_off is not None:
        if incumbent.drafter is not None and incumbent.adaptive is None:
            cost_points[incumbent.drafter][incumbent.k] = inc_length / tau_off
        for name, m in measured.items():
            arm = _arm_of(name)
            if arm is None or arm.drafter is None or arm.adaptive is not None or m.passes == 0:
                continue
            if math.isnan(m.tpot_ratio):
                continue
            cost_points[arm.drafter][arm.k] = m.tpot_ratio * (m.tokens / m.passes) / tau_off
        for drafter, pts in cost_points.items():
            den = sum(k * k for k in pts)
            c = sum(k * (r - 1) for k, r in pts.items()) / den if den else 0.0
            costs[drafter] = max(c, 0.0)
    for d in space.drafters:
        if d.name not in cost_points and d.name in priors and tau_off is not None:
            cost_points[d.name] = {1: 1 + priors[d.name]}
    return cost_points, costs


@dataclass(frozen=True)
class _ShapeLine:
    """The objective-to-latency ratio (tails, queueing) as a line in ``k`` per drafter.

    Points are (k, log objective ratio minus log per-token latency ratio, spread); ``off``
    is the point at ``k = 0`` of every drafter's line.
    """

    points: dict[str, list[tuple[int, float, float]]]
    off: tuple[int, float, float] | None
    everything: list[float]
    """Every drafter's values: their mean stands in for a drafter or ``off`` with none."""

    def line(self, drafter: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The drafter's line's points, 'off' among them: (k, value, spread) as arrays."""
        pts = list(self.points.get(drafter, ()))
        if self.off is not None:
            pts.append(self.off)
        table = np.array(pts, dtype=float).reshape(-1, 3)
        return table[:, 0], table[:, 1], table[:, 2]

    def at(self, arm: Arm) -> float:
        """The line's value at ``arm``'s ``k``: least squares through its drafter's points.

        With one distinct ``k`` the points' mean (a flat line); with no point at all, the
        mean of every drafter's, since tails and queueing are set by the traffic and the
        load as much as by the drafter.
        """
        if arm.drafter is None:
            if self.off is not None:
                return self.off[1]
            return float(np.mean(self.everything)) if self.everything else 0.0
        ks, vs, _ = self.line(arm.drafter)
        if not len(ks):
            return float(np.mean(self.everything)) if self.everything else 0.0
        if len(set(ks.tolist())) < 2:
            return float(np.mean(vs))
        # Least squares in closed form: np.polyfit goes through LAPACK, whose work buffers
        # (tens of MB per calling thread) the operator's thread pool would multiply.
        dk = ks - ks.mean()
        slope = float(np.dot(dk, vs - vs.mean()) / np.dot(dk, dk))
        return float(vs.mean() + slope * (arm.k - ks.mean()))

    def slope_error(self, drafter: str) -> float:
        """Standard error per k of :meth:`at`'s slope, from its points' own spreads.

        For an ordinary least-squares slope through points with spreads σ_i it is
        √(Σ (k_i − k̄)² σ_i²) / Σ (k_i − k̄)²; 0 without two distinct k (a flat line).
        """
        ks, _, sds = self.line(drafter)
        if len(set(ks.tolist())) < 2:
            return 0.0
        dk = ks - ks.mean()
        return math.sqrt(float(np.dot(dk * dk, np.square(sds)))) / float(np.dot(dk, dk))


def _shape_line(measured: dict[str, _Measured], incumbent: Arm, sign: float) -> _ShapeLine:
    """The objective-to-latency line through the measured arms and, at ``k = 0``, ``off``.

    A larger ``k`` widens the tail (requests that accept little pay for every drafted
    position), so a p95 optimum sits below the mean's: the ratio is a line in ``k``, not
    a constant. Each point carries its spread (the measured arm's), for the slope's
    error; the incumbent, the reference, is exact up to the measurement floor.
    """
    shape_points: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    off_point: tuple[int, float, float] | None = (
        (0, 0.0, MEASURED_FLOOR / 2) if incumbent.is_off else None
    )
    if incumbent.drafter is not None:
        shape_points[incumbent.drafter].append((incumbent.k, 0.0, MEASURED_FLOOR / 2))
    for name, m in measured.items():
        arm = _arm_of(name)
        loss, loss_spread = m.loss
        if arm is None or arm.adaptive is not None or math.isnan(loss):
            continue
        if math.isnan(m.tpot_ratio):
            continue
        value = loss - sign * math.log(m.tpot_ratio)
        if arm.drafter is None:
            off_point = (0, value, loss_spread)
        else:
            shape_points[arm.drafter].append((arm.k, value, loss_spread))
    everything = [v for pts in shape_points.values() for _, v, _ in pts]
    return _ShapeLine(shape_points, off_point, everything)


@dataclass
class _Model:
    r"""The acceptance-and-cost model of an arm's objective relative to the incumbent.

    The per-token latency is :math:`\hat\tau_{d,k} = \tau_{\text{off}}\, r_d(k) / E_d(k)`
    and the objective that times the drafter's objective-to-latency line (module
    docstring). Its spread is its own error on the measured arms (:meth:`check`), plus a
    step per draft position it extrapolates acceptance to and, without per-position
    data, per ``k`` away from a measured one.
    """

    space: SearchSpace
    sign: float
    survival: dict[str, np.ndarray]
    cost_points: dict[str, dict[int, float]]
    tau_off: float | None
    off_inferred: bool
    shape: _ShapeLine
    residuals: list[float] = field(default_factory=list)
    """Measured minus predicted loss of each measured arm the model can predict."""

    def predict(self, arm: Arm) -> tuple[float, float, float, float]:
        """(loss, spread, tpot ratio, E) of an arm from the model."""
        if arm.is_off:
            e = 1.0
            tau = self.tau_off if self.tau_off is not None else math.nan
            steps = 0
        else:
            d = arm.drafter or ""
            if d not in self.survival or d not in self.cost_points or self.tau_off is None:
                return math.nan, math.inf, math.nan, math.nan
            e, steps = _expected(self.survival[d], arm.k)
            tau = self.tau_off * _interp_cost(self.cost_points[d], arm.k) / e
        loss = self.sign * math.log(tau) + self.shape.at(arm) if tau > 0 else math.nan
        spread = MODEL_PRIOR
        if self.residuals:
            spread = max(math.sqrt(float(np.mean(np.square(self.residuals)))), MEASURED_FLOOR)
        measured_ks = [k for k in self.cost_points.get(arm.drafter or "", {})]
        if arm.is_off and self.off_inferred:
            spread += MODEL_PRIOR  # extrapolated to k = 0 from two measured lengths
        if not arm.is_off:
            spread += EXTRAPOLATION_STEP * steps
            if not self.space.per_position and measured_ks:
                spread += NO_POSITION_STEP * min(abs(arm.k - k) for k in measured_ks)
        return loss, spread, tau, e

    def check(self, measured: dict[str, _Measured]) -> None:
        """Record the model's error on the measured arms it can predict (:attr:`residuals`).

        Its root mean square, floored at :data:`MEASURED_FLOOR`, is the spread of every
        prediction: the model is as good on the arms it did not see as on those it did,
        and no better than two windows of one arm agree. An adaptive arm is no point of
        the model and is left out.
        """
        for name, m in measured.items():
            arm = _arm_of(name)
            loss, _ = m.loss
            if arm is None or arm.adaptive is not None or math.isnan(loss):
                continue
            p_loss, _, _, _ = self.predict(arm)
            if not math.isnan(p_loss):
                self.residuals.append(loss - p_loss)


def _anchors(
    measured: dict[str, _Measured], incumbent: Arm, min_requests: int, excluded: dict[str, str]
) -> dict[str, list[tuple[Arm, float, float]]]:
    """Measured arms per drafter, the incumbent among them: (arm, loss, spread) each.

    The model's bias on a drafter's measured arms (tails it cannot see, queueing) carries
    over to their neighbours, so predictions are read relative to them. Only an arm
    measured on enough requests to be believed, not excluded and not adaptive (whose
    counters are no point of its drafter's curve) anchors.
    """
    anchors: dict[str, list[tuple[Arm, float, float]]] = defaultdict(list)
    if incumbent.drafter is not None and incumbent.adaptive is None:
        anchors[incumbent.drafter].append((incumbent, 0.0, MEASURED_FLOOR / 2))
    for name, m in measured.items():
        arm = _arm_of(name)
        loss, spread = m.loss
        usable = m.requests >= min_requests and not math.isnan(loss) and name not in excluded
        if arm is not None and arm.drafter and arm.adaptive is None and usable:
            anchors[arm.drafter].append((arm, loss, spread))
    return anchors


def _arm_beliefs(
    space: SearchSpace,
    incumbent: Arm,
    inc_length: float,
    evidence: _Evidence,
    min_requests: int,
    excluded: dict[str, str],
    model: _Model,
    anchors: dict[str, list[tuple[Arm, float, float]]],
    saturated_epoch: bool,
) -> dict[str, ArmBelief]:
    """The belief about every arm of ``space`` that is not excluded.

    The incumbent is the reference (loss 0); an arm measured on at least
    ``min_requests`` requests is believed as measured; any other is predicted
    (:func:`_predicted`), except an adaptive arm, which is never read off another arm
    (the policy prices it as untried), and an arm the model cannot predict.
    """
    out: dict[str, ArmBelief] = {}
    for arm in space.arms():
        if arm.name in excluded:
            continue
        if arm.name == incumbent.name:
            length = inc_length if not arm.is_off else 1.0
            out[arm.name] = ArmBelief(
                arm, 0.0, MEASURED_FLOOR / 2, True, len(evidence.inc_windows), 1.0, length
            )
            continue
        got = evidence.measured.get(arm.name)
        if got is not None and got.requests >= min_requests:
            loss, spread = got.loss
            if not math.isnan(loss):
                e = got.tokens / got.passes if got.passes else 1.0
                out[arm.name] = ArmBelief(
                    arm,
                    loss,
                    spread,
                    True,
                    len(got.obj_logs),
                    got.tpot_ratio,
                    e,
                    settled=got.settled,
                )
                continue
        if arm.adaptive is not None:
            continue  # never read off another arm: the policy prices it as untried
        belief = _predicted(
            arm, model, anchors.get(arm.drafter or "", []), space.per_position, saturated_epoch
        )
        if belief is not None:
            out[arm.name] = belief
    return out


def _predicted(
    arm: Arm,
    model: _Model,
    anchors: Sequence[tuple[Arm, float, float]],
    per_position: bool,
    saturated_epoch: bool,
) -> ArmBelief | None:
    """An untried arm's belief from the model, read relative to its drafter's anchors.

    Each anchor gives one estimate, the model's prediction corrected by its error at the
    anchor, with the anchor's spread plus a step per ``k`` between them; the estimates
    are pooled by inverse variance, and the nearest anchor (smallest spread) is named so
    that the policy draws the two together. With no anchor the model's own prediction
    stands; None when the model cannot predict the arm.
    """
    loss, spread, tau, e = model.predict(arm)
    if not math.isnan(loss) and anchors:
        estimates: list[tuple[float, float]] = []
        nearest: tuple[float, str, float] | None = None  # (spread, anchor, its step)
        # Under saturation the objective-to-latency line is set by queueing, not by the
        # acceptance tail, and it is only as sure as the few noisy p95s it was drawn
        # through: its slope's error joins the model's usual step between neighbouring
        # k. Without it, a neighbour read off an anchor measured in a single window
        # would be called better or worse "with probability 1.00" on a line whose slope
        # the noise of one window's p95 (tens of percent) leaves undetermined.
        base = ANCHOR_STEP
        if saturated_epoch:
            base = math.hypot(ANCHOR_STEP, model.shape.slope_error(arm.drafter or ""))
        step = base + (NO_POSITION_STEP if not per_position else 0.0)
        for a_arm, a_loss, a_spread in anchors:
            a_model, _, _, _ = model.predict(a_arm)
            if math.isnan(a_model):
                continue
            sp = a_spread + step * abs(arm.k - a_arm.k)
            estimates.append((loss + a_loss - a_model, sp))
            if nearest is None or sp < nearest[0]:
                nearest = (sp, a_arm.name, step * abs(arm.k - a_arm.k))
        if nearest is not None:  # set with the first estimate
            weights = np.array([1 / (sp * sp) for _, sp in estimates])
            values = np.array([x for x, _ in estimates])
            loss = float(np.sum(weights * values) / np.sum(weights))
            spread = float(1 / math.sqrt(float(np.sum(weights))))
            return ArmBelief(arm, loss, spread, False, 0, tau, e, nearest[1], nearest[2])
    if not math.isnan(loss):
        return ArmBelief(arm, loss, spread, False, 0, tau, e)
    return None


def _closing_notes(space: SearchSpace, evidence: _Evidence, tails: _Tails) -> list[str]:
    """What the decision's reason says about how the beliefs were read, in order.

    An engine without per-position counters leaves other ``k`` to a flat-rate model; a
    throughput window read on speed and a window compared on service rate are not read on
    what the objective names; modelled tails are named with their ratios
    (:meth:`_Tails.note`).
    """
    notes: list[str] = []
    if not space.per_position:
        notes.append(
            "the engine exports no per-position acceptance: other k are modelled from a flat "
            "rate and tried rather than trusted"
        )
    if evidence.by_speed:
        notes.append(
            "windows where neither side saturated are compared on per-token speed: below "
            "saturation a pod's output tokens per second are the share of the load it is "
            "sent, not what it can serve"
        )
    if evidence.by_capacity:
        notes.append(
            "windows where both sides saturated are compared on output tokens per second per "
            "pod: a saturated queue's latency is its backlog's age, its service rate the arm's"
        )
    tail_note = tails.note()
    if tail_note is not None:
        notes.append(tail_note)
    return notes


def _off_from_two_lengths(
    incumbent: Arm, inc_length: float, measured: dict[str, _Measured], min_requests: int
) -> tuple[float, str] | None:
    r"""Off's per-token latency relative to the incumbent, from a second k of its drafter.

    With :math:`\tau_k = \tau_{\text{off}} (1 + c k) / E(k)`, two draft lengths of one
    drafter measured on the same traffic give two linear equations in
    :math:`\tau_{\text{off}}` and :math:`\tau_{\text{off}} c`; the pair farthest apart in
    ``k`` is used. The draft cost is clamped at 0 (noise can make it negative). Returns
    (τ_off, the other arm's name), or None without such a pair.
    """
    if incumbent.drafter is None or incumbent.adaptive is not None or inc_length < 1:
        return None
    best: tuple[int, float, float, str] | None = None
    for name, m in measured.items():
        arm = _arm_of(name)
        if arm is None or arm.drafter != incumbent.drafter or arm.adaptive is not None:
            continue
        if arm.k == incumbent.k or m.passes == 0 or m.requests < min_requests:
            continue
        if math.isnan(m.tpot_ratio):
            continue
        if best is None or abs(arm.k - incumbent.k) > best[0]:
            best = (abs(arm.k - incumbent.k), arm.k, m.tpot_ratio * m.tokens / m.passes, name)
    if best is None:
        return None
    _, k2, y2, name = best
    k1, y1 = incumbent.k, inc_length  # τ·E of the incumbent, whose τ is 1 by definition
    slope = max((y1 - y2) / (k1 - k2), 0.0)  # τ_off · c
    tau = (y1 - slope * k1) if slope > 0 else (y1 + y2) / 2
    return (tau, name) if tau > 0 else None


def _incumbent_offsets(
    trials: Sequence[TrialRecord], current: str, sign: float, tails: _Tails
) -> dict[str, tuple[float, float, float]]:
    """(loss, log tpot, spread) of each incumbent of the epoch relative to ``current``.

    Edges are the measured (canary, incumbent) pairs; the walk starts at ``current``.
    """
    edges: dict[tuple[str, str], _Measured] = defaultdict(_Measured)
    for t in trials:
        for i, w in enumerate(t.windows):
            if w.canary is not None and w.incumbent is not None and w.canary.requests > 0:
                values, _ = _window_pair(tails, w, t, i == 0, sign > 0)
                edges[(t.arm, t.incumbent)].add(w.canary, w.incumbent, sign, values)
    offsets: dict[str, tuple[float, float, float]] = {current: (0.0, 0.0, 0.0)}
    changed = True
    while changed:
        changed = False
        for (arm, inc), m in edges.items():
            loss, spread = m.loss
            tpot = math.log(m.tpot_ratio) if m.tpot_ratio > 0 else math.nan
            if math.isnan(loss) or math.isnan(tpot):
                continue
            if arm in offsets and inc not in offsets:
                a_loss, a_tpot, a_spread = offsets[arm]
                offsets[inc] = (a_loss - loss, a_tpot - tpot, math.hypot(a_spread, spread))
                changed = True
            elif inc in offsets and arm not in offsets:
                i_loss, i_tpot, i_spread = offsets[inc]
                offsets[arm] = (i_loss + loss, i_tpot + tpot, math.hypot(i_spread, spread))
                changed = True
    return offsets


def _prior_costs(history: History) -> dict[str, float]:
    """Draft costs c_d measured in earlier epochs at a similar load.

    Costs outlive model and route changes (they are properties of the drafter and the
    hardware), but not load changes: verification over ``b(k+1)`` tokens costs more once
    the batch passes the compute knee, so an epoch at another batch size is not used.
    """
    out: dict[str, float] = {}
    now_b = epoch_batch(history, history.epoch)
    if math.isnan(now_b) and history.epoch in history.load_epochs:
        return out  # the load just moved: no earlier epoch is known to be at this one
    for epoch in range(history.epoch):
        trials = history.in_epoch(epoch)
        if not trials or not same_load(epoch_batch(history, epoch), now_b, SIMILAR_LOAD):
            continue
        inc = _arm_of(trials[0].incumbent)
        if inc is None:
            continue
        past = History(
            history.trials, history.baseline, epoch, history.promotions, history.load_epochs
        )
        space = _space_from(trials)
        beliefs = build_beliefs(space, past, inc, True, 0) if space.drafters else None
        if beliefs is not None:
            out.update(beliefs.costs)
    return out


def _space_from(trials: Sequence[TrialRecord]) -> SearchSpace:
    from spectune.search.policy import DrafterSpec

    ks: dict[str, int] = {}
    for t in trials:
        for name in (t.arm, t.incumbent):
            arm = _arm_of(name)
            if arm is not None and arm.drafter is not None:
                ks[arm.drafter] = max(ks.get(arm.drafter, 0), arm.k)
    return SearchSpace(tuple(DrafterSpec(d, "", k) for d, k in sorted(ks.items())))
