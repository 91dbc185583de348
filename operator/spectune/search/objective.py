"""What "better" means for one deployment: the objective metric and its guardrails.

The SpecTuning's ``objective`` (and a scenario's) becomes an :class:`Objective`; the policy
ranks arms by it, the controller checks guardrails with it, and the bench scores runs with
it. :func:`window_stats` turns one group's :class:`~spectune.metrics.Observation` into the
figures every later step needs, so they are computed in one place.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from spectune.core import gamma_quantiles
from spectune.metrics.observation import Histogram, Observation

__all__ = [
    "Guardrails",
    "Metric",
    "Objective",
    "WindowStats",
    "fitted_quantile_interval",
    "quantile_interval",
    "same_load",
    "saturated",
    "window_stats",
]


class Metric(enum.Enum):
    """Objective metrics (SpecTuning ``objective.metric``)."""

    TPOT_P95 = "tpotP95"
    E2E_P95 = "e2eP95"
    TTFT_P95 = "ttftP95"
    OUTPUT_TOKENS_PER_SECOND = "outputTokensPerSecond"
    GOODPUT = "goodput"

    @property
    def minimise(self) -> bool:
        """Whether smaller is better."""
        return self in (Metric.TPOT_P95, Metric.E2E_P95, Metric.TTFT_P95)

    @classmethod
    def parse(cls, text: str) -> Metric:
        """The metric named ``text``; a clear error lists the valid names."""
        for m in cls:
            if m.value == text:
                return m
        valid = ", ".join(m.value for m in cls)
        from spectune.errors import SpecError

        raise SpecError(f"objective.metric: unknown metric {text!r}; valid metrics: {valid}")


@dataclass(frozen=True)
class Guardrails:
    """Largest tolerated relative regressions of a trial against the incumbent (0.2 = 20 %)."""

    max_ttft_p95_regression: float | None = 0.2
    max_queue_p95_regression: float | None = 0.2


@dataclass(frozen=True)
class Objective:
    """The metric to optimise and the guardrails to respect while exploring."""

    metric: Metric = Metric.TPOT_P95
    guardrails: Guardrails = field(default_factory=Guardrails)


@dataclass(frozen=True)
class WindowStats:
    """One group's figures over one window (all latencies in seconds).

    ``objective_low``/``objective_high`` bound the objective at 95 % where it is a
    quantile (from the histogram's order statistics); NaN when unknown.
    """

    objective: float
    objective_low: float
    objective_high: float
    requests: float
    """Requests finished in the window (the end-to-end histogram's count; without one, the
    per-token histogram's): what evidence thresholds and load figures count."""
    tpot_mean: float
    tpot_p95: float
    ttft_p95: float
    ttft_p95_low: float
    ttft_p95_high: float
    queue_p95: float
    queue_p95_low: float
    queue_p95_high: float
    e2e_p95: float
    tokens_per_s: float
    running: float
    pods: int
    k: int
    drafts: float
    accepted_per_pos: tuple[float, ...]
    mean_accepted_length: float
    num_gpu_blocks: int | None
    preemptions: float
    draft_tokens: float = math.nan
    """Draft tokens proposed over the window (NaN where the dialect exports none): with
    accepted tokens, the engine's own acceptance rate, whatever k each pod ran."""
    ttft_p90_low: float = math.nan
    """Lower 95 % bound of the TTFT p90 (read between the buckets, as Prometheus does)."""
    queue_p90_low: float = math.nan
    """Lower 95 % bound of the queue-time p90."""
    ttft_p80_low: float = math.nan
    """Lower 95 % bounds of lower TTFT and queue-time quantiles: what a guardrail reads when
    a catch-up burst fills the p90's tail too (``search/spectune_policy.py``)."""
    ttft_p70_low: float = math.nan
    ttft_p50_low: float = math.nan
    queue_p80_low: float = math.nan
    queue_p70_low: float = math.nan
    queue_p50_low: float = math.nan
    objective_bound: float = math.nan
    """Where the objective is the TPOT p95 and the histogram cannot place it inside its
    bucket, that bucket's upper edge (NaN otherwise): the p95 falls in the first bucket, or
    in one that holds the whole window. The histogram then bounds the p95 and says nothing
    of where it lies between the edges, and the model reads the tail from acceptance
    instead (:mod:`spectune.core._tail`)."""
    objective_floor: float = 0.0
    """That bucket's lower edge: 0 for the first bucket."""

    @property
    def tokens_per_pod(self) -> float:
        """Output tokens per second per pod (NaN without pods): at saturation, the arm's
        service rate."""
        return self.tokens_per_s / self.pods if self.pods else math.nan


#: A bucket that holds this share of a window's observations leaves their spread unknown:
#: with (almost) none on either side, any shape of the right mean fits the counts, so the
#: gamma fit's quantile inside the bucket is a guess: at light load every request's
#: per-token latency can fall within one bucket (the low ones each span a factor of two
#: or more: vLLM's 10–25 ms, 25–50 ms), and a p95 read from its counts can then be off by
#: a tenth or more either way.
SOLE_BUCKET_SHARE = 0.99

#: Batches closer than this many requests cost the same per step (memory-bound), whatever
#: their ratio: 1 → 2 running requests is noise at low load, not a load shift.
SMALL_BATCH_CHANGE = 4.0


def same_load(a: float, b: float, factor: float) -> bool:
    """Whether two running batch sizes per pod are the same load for tuning purposes.

    Draft costs depend on the batch (verification over ``b(k+1)`` tokens), so the controller
    re-opens a search and the model drops old costs when the load moved: by more than
    ``factor`` and by at least :data:`SMALL_BATCH_CHANGE` requests. Unknown (NaN) is same.
    """
    if math.isnan(a) or math.isnan(b) or abs(a - b) < SMALL_BATCH_CHANGE:
        return True
    lo, hi = sorted((max(a, 1e-9), max(b, 1e-9)))
    return hi / lo <= factor


#: A request that waits longer than this many decode steps to be scheduled found the pod
#: full: its batch is pinned at the engine's limit (``max_num_seqs`` or the KV pool).
SATURATION_STEPS = 20.0
#: ...and longer than this: an idle pod's p95 read from vLLM's first queue-time buckets
#: (0.3 s, 0.5 s, 0.8 s) is an interpolation inside them, not a wait.
SATURATION_FLOOR_S = 1.0


def saturated(s: WindowStats) -> bool:
    """Whether a group was saturated in a window: requests queued for many steps.

    Below saturation vLLM admits a request within a step or two, so the queue-time p95
    is a step's length; at saturation it grows with the backlog (minutes). Then the batch
    is pinned at a limit and per-token latency stops measuring speed: an arm that needs
    fewer steps per token (less drafting) would run a smaller batch, not the same one.
    """
    step = s.tpot_mean * max(s.mean_accepted_length, 1.0)
    if math.isnan(s.queue_p95) or math.isnan(step) or step <= 0:
        return False
    return s.queue_p95 > max(SATURATION_STEPS * step, SATURATION_FLOOR_S)


def quantile_interval(h: Histogram | None, q: float, z: float = 1.96) -> tuple[float, float, float]:
    """A quantile and a distribution-free interval from the ranks of its order statistics.

    The rank of the ``q`` quantile among ``n`` observations is binomial with mean ``n·q``
    and variance ``n·q·(1−q)``; reading the histogram at ranks ``n·q ± z·√(n·q(1−q))``
    bounds the quantile. Returns ``(estimate, low, high)``, all NaN without data.
    """
    if h is None or h.count <= 0:
        return math.nan, math.nan, math.nan
    n = h.count
    half = z * math.sqrt(n * q * (1 - q))
    lo_q = max(0.0, (n * q - half) / n)
    hi_q = min(1.0, (n * q + half) / n)
    return h.quantile(q), h.quantile(lo_q), h.quantile(hi_q)


def fitted_quantile_interval(
    h: Histogram | None, q: float, z: float = 1.96, independent: float | None = None
) -> tuple[float, float, float]:
    """Like :func:`quantile_interval`, read from a gamma fitted to the histogram.

    Latency buckets are too coarse for linear interpolation to tell arms apart (see
    :mod:`spectune.core._quantile`); the fitted gamma keeps the exact mean and the bucket
    shares. Falls back to interpolation with fewer than 20 observations.

    ``independent`` caps the sample size the interval's width is computed from (None: every
    observation counts). A token-weighted histogram (SGLang's inter-token latency) holds
    one observation per token, and the tokens of one request share its acceptance and its
    batch: read as independent, they gave intervals five times too narrow (an A/A window
    pair on sglang-mixed missed its own 95 % interval in 20 of 40 windows,
    ``benchmarks/aa_intervals.py``). Its independent observations are about its requests.
    """
    if h is None or h.count < 20 or not h.mean > 0:
        return quantile_interval(h, q, z)
    n = h.count
    m = min(n, independent) if independent is not None and independent > 0 else n
    half = z * math.sqrt(q * (1 - q) / m)
    lo_q = min(max(q - half, 1e-6), 1 - 1e-6)
    hi_q = min(max(q + half, 1e-6), 1 - 1e-6)
    est, low, high = gamma_quantiles(h.bounds, h.cumulative, h.mean, (q, lo_q, hi_q))
    return est, low, high


def _unplaced_bucket(h: Histogram | None, q: float) -> tuple[float, float]:
    """(lower, upper) edges of the bucket of the ``q`` quantile when the histogram cannot
    place the quantile inside it: the first bucket (nothing below it to go on), or a bucket
    that holds the whole window (:data:`SOLE_BUCKET_SHARE`). Else ``(0, NaN)``."""
    if h is None or h.count <= 0 or not h.bounds or not math.isfinite(h.bounds[0]):
        return 0.0, math.nan
    if h.cumulative[0] >= q * h.count:
        return 0.0, h.bounds[0]
    for i in range(1, len(h.bounds)):
        if not math.isfinite(h.bounds[i]):
            break
        if h.cumulative[i] - h.cumulative[i - 1] >= SOLE_BUCKET_SHARE * h.count:
            return h.bounds[i - 1], h.bounds[i]
    return 0.0, math.nan


def _mean(h: Histogram | None) -> float:
    return h.mean if h is not None else math.nan


def _mean_running(obs: Observation) -> float:
    """Time-averaged running requests per pod over the window, by Little's law.

    The ``num_requests_running`` gauge is one instant; under a ramp or a burst it swings
    by an order of magnitude between scrapes. The time the window's requests spent
    running (end-to-end minus queue time, from the histograms' sums) divided by the window
    is the average batch the pods carried. Falls back to the gauge.
    """
    if obs.e2e is not None and obs.window_s and obs.pods:
        busy = obs.e2e.sum - (obs.queue.sum if obs.queue is not None else 0.0)
        if obs.e2e.count > 0 and busy >= 0:
            return busy / obs.window_s / len(obs.pods)
    return obs.running if obs.running is not None else math.nan


def window_stats(obs: Observation, objective: Objective) -> WindowStats:
    """The figures of one group's observation, with the objective's value."""
    # At most one independent per-token latency per finished request (see the function).
    finished = obs.e2e.count if obs.e2e is not None and obs.e2e.count > 0 else None
    tpot_count = obs.tpot.count if obs.tpot is not None else 0.0
    tpot95, tpot_lo, tpot_hi = fitted_quantile_interval(obs.tpot, 0.95, independent=finished)
    ttft95, ttft_lo, ttft_hi = fitted_quantile_interval(obs.ttft, 0.95)
    # Queue time has a mass at zero that no gamma fits: read it as Prometheus does.
    queue95, queue_lo, queue_hi = quantile_interval(obs.queue, 0.95)
    e2e95, e2e_lo, e2e_hi = fitted_quantile_interval(obs.e2e, 0.95)
    window = obs.window_s or math.nan
    tokens_per_s = (obs.generation_tokens or 0.0) / window if obs.window_s else math.nan
    by_metric = {
        Metric.TPOT_P95: (tpot95, tpot_lo, tpot_hi),
        Metric.TTFT_P95: (ttft95, ttft_lo, ttft_hi),
        Metric.E2E_P95: (e2e95, e2e_lo, e2e_hi),
        # Throughput per pod, so a canary of one pod compares with an incumbent of three.
        Metric.OUTPUT_TOKENS_PER_SECOND: (
            tokens_per_s / max(len(obs.pods), 1),
            math.nan,
            math.nan,
        ),
        Metric.GOODPUT: (tokens_per_s / max(len(obs.pods), 1), math.nan, math.nan),
    }
    value, low, high = by_metric[objective.metric]
    floor, bound = 0.0, math.nan
    if objective.metric is Metric.TPOT_P95:
        floor, bound = _unplaced_bucket(obs.tpot, 0.95)
    spec = obs.spec
    per_pos = spec.accepted_per_pos if spec is not None and spec.accepted_per_pos else ()
    drafts = spec.drafts if spec is not None and spec.drafts else 0.0
    accepted = spec.accepted if spec is not None and spec.accepted is not None else 0.0
    if drafts > 0:
        mal = 1.0 + accepted / drafts
    elif obs.accept_length_gauge is not None:
        mal = obs.accept_length_gauge
    else:
        mal = 1.0
    return WindowStats(
        objective=value,
        objective_low=low,
        objective_high=high,
        requests=finished if finished is not None else tpot_count,
        tpot_mean=_mean(obs.tpot),
        tpot_p95=tpot95,
        ttft_p95=ttft95,
        ttft_p95_low=ttft_lo,
        ttft_p95_high=ttft_hi,
        queue_p95=queue95,
        queue_p95_low=queue_lo,
        queue_p95_high=queue_hi,
        e2e_p95=e2e95,
        tokens_per_s=tokens_per_s,
        running=_mean_running(obs),
        pods=len(obs.pods),
        k=len(per_pos),
        drafts=drafts,
        accepted_per_pos=tuple(per_pos),
        mean_accepted_length=mal,
        num_gpu_blocks=obs.num_gpu_blocks,
        preemptions=obs.preemptions or 0.0,
        draft_tokens=(
            spec.draft_tokens if spec is not None and spec.draft_tokens is not None else math.nan
        ),
        ttft_p90_low=quantile_interval(obs.ttft, 0.90)[1],
        queue_p90_low=quantile_interval(obs.queue, 0.90)[1],
        ttft_p80_low=quantile_interval(obs.ttft, 0.80)[1],
        ttft_p70_low=quantile_interval(obs.ttft, 0.70)[1],
        ttft_p50_low=quantile_interval(obs.ttft, 0.50)[1],
        queue_p80_low=quantile_interval(obs.queue, 0.80)[1],
        queue_p70_low=quantile_interval(obs.queue, 0.70)[1],
        queue_p50_low=quantile_interval(obs.queue, 0.50)[1],
        objective_bound=bound,
        objective_floor=floor,
    )
