"""How the bench scores a run: phases, objective values from request records, efficiency and
guardrail breaches (DESIGN.md §5). The runner (``bench/runner.py``) calls these on the run's
own finished requests and on the oracle's (``bench/oracle.py``); nothing here simulates.

Definitions (the bench JSON's fields):

* **Phase**: the span between consecutive distinct scenario ``events`` times (every kind:
  ``model_version``, ``route_mix``, ``load``, ``pod_decay``, ``drafter_broken``) strictly
  inside ``(0, duration_s)``; a scenario without events has one phase ``[0, duration_s)``.
  Requests belong to the span they *finish* in.
* **Objective value** of a span, from the finished requests: ``tpotP95`` / ``ttftP95`` /
  ``e2eP95`` are the 95th percentiles (linear interpolation, NaN TPOTs of one-token outputs
  left out) of the requests' TPOT / TTFT / end-to-end latency in seconds;
  ``outputTokensPerSecond`` and ``goodput`` are output tokens over the span's length.
  NaN when no request finished.
* **Efficiency ratio** of a value against the best one: ``best / value`` for a metric to
  minimise, ``value / best`` for one to maximise — 1.0 is the best, lower is worse (above
  1.0 only for an arm outside the oracle's candidates, e.g. a per-batch-size schedule).
* **Guardrail breach**: the run is cut into windows of ``window_s`` seconds aligned to each
  phase's start (the last window of a phase may be shorter). In each window the run's TTFT
  p95 and queue-time p95 (and e2e / TPOT p95 when the scenario sets those guardrails) are
  compared with the same figure of two references in the same window of their own
  simulations: the scenario's ``initial`` arm (what users had without tuning) and the
  phase's oracle arm (the best there is). The window is breached when the run's p95 exceeds
  ``reference · (1 + tolerance) +`` :data:`ABSOLUTE_SLACK_S` for both references *with
  confidence*: the lower end of the run's 95 % order-statistic interval of its p95 lies
  above that line drawn from the upper end of each reference's interval (the test the
  controller's guardrails use, ``search.objective.quantile_interval``). Without that
  confidence, two runs of the same arm differ by more than 20 % in some windows — queueing
  p95s are bursty, and the simulator's request stream diverges when it is advanced in
  different steps. A breach is harm done by tuning — a trial or a promotion worse than both
  the untuned setting and the best — not the distance of a poor initial setting from the
  oracle, which the efficiencies measure: judged against the oracle alone,
  ``static:<initial>`` itself breached for the whole run (kv-pressure, seed 13: 2400 s of
  2400), and a tuner until it had promoted. Tolerances are the scenario's
  ``objective.guardrails``; without that block, TTFT and queue p95 at 0.2. Windows where
  the run, or every reference, finished fewer than :data:`MIN_WINDOW_REQUESTS` requests
  are not judged; a reference short of them is left out.
  ``guardrail_breach_s`` is the summed length of breached windows.
* **Recovery** after a ``model_version`` event (not a field of the contract's object; the
  bench's tables and ``benchmarks/`` report it): the simulated seconds from the event until
  the target serves, for the rest of the phase the event opens, arms within
  :data:`RECOVERY_EFFICIENCY` of that phase's oracle — each arm judged by its efficiency
  ratio over the phase from the oracle's static run of it, as ``efficiency`` judges the
  final choice. The target serves an arm from the end of its rollout (time 0 for the
  initial arm), not from the promotion's start. 0 when the arm served at the event is
  already within it; None when the one served at the phase's end is not.
* **Worse than initial** (``worse_than_initial_s``, beside the contract's object like
  recovery): the simulated seconds, after the first promotion, in which the target served
  an arm worse with confidence than the scenario's ``initial`` arm — the target serves an
  arm from its promotion on (a rollout in progress counts as its arm, as ``chosen_arm``
  does: a rollout that a saturated target drains slowly is served by its new pods the
  whole time, and a tuner is not excused by it) — each served arm judged
  in each guardrail window (as above) from the oracle's static runs of it and of the
  initial arm, which saw the same requests: for a p95 objective, the lower end of the
  served arm's 95 % order-statistic interval above the upper end of the initial arm's; for
  a throughput, below it by more than 1.96 × its relative Poisson error (1/√requests), in
  the window and in all the tokens finished since the run began. Both runs serve the same
  requests, so a throughput differs only in when they finish: after the load drops, a
  slower arm finishes in one window the requests it had left behind, and the faster one,
  which finished them earlier, is ahead then, not worse (cumulatively it never fell
  behind); an arm that cannot keep up falls behind in both. A
  tuner that users can leave running keeps it at 0 wherever the oracle is not worse than
  the initial arm. ``rollbacks`` counts the controller's ``RolledBack`` events.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from spectune.search.objective import Metric

if TYPE_CHECKING:
    from spectune.sim.fleet import RequestRecord
    from spectune.sim.scenario import Scenario

__all__ = [
    "ABSOLUTE_SLACK_S",
    "MIN_WINDOW_REQUESTS",
    "RECOVERY_EFFICIENCY",
    "GuardrailLimit",
    "RequestTable",
    "breach_seconds",
    "efficiency_ratio",
    "guardrail_limits",
    "metric_value",
    "p95_interval",
    "phase_spans",
    "recovery_seconds",
    "score_windows",
    "worse_seconds",
]

#: Seconds added to a guardrail's line: the resolution of vLLM's smallest latency buckets.
ABSOLUTE_SLACK_S = 0.01
#: Fewest finished requests on each side for a window's p95s to be compared.
MIN_WINDOW_REQUESTS = 20

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RequestTable:
    """Finished requests as columns (seconds; output tokens as floats), in finish order."""

    finish_s: Array
    tpot_s: Array
    ttft_s: Array
    queue_s: Array
    e2e_s: Array
    output_tokens: Array

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord]) -> RequestTable:
        """Columns of the simulator's request records."""

        def col(get: Callable[[RequestRecord], float]) -> Array:
            return np.fromiter((get(r) for r in records), dtype=np.float64, count=len(records))

        return cls(
            finish_s=col(lambda r: r.finish_s),
            tpot_s=col(lambda r: r.tpot_s),
            ttft_s=col(lambda r: r.ttft_s),
            queue_s=col(lambda r: r.queue_s),
            e2e_s=col(lambda r: r.e2e_s),
            output_tokens=col(lambda r: float(r.output_tokens)),
        )

    def __len__(self) -> int:
        return int(self.finish_s.size)

    def between(self, start_s: float, end_s: float) -> RequestTable:
        """The requests that finished in ``[start_s, end_s)``."""
        lo = int(np.searchsorted(self.finish_s, start_s, side="left"))
        hi = int(np.searchsorted(self.finish_s, end_s, side="left"))
        return RequestTable(
            self.finish_s[lo:hi],
            self.tpot_s[lo:hi],
            self.ttft_s[lo:hi],
            self.queue_s[lo:hi],
            self.e2e_s[lo:hi],
            self.output_tokens[lo:hi],
        )

    def column(self, name: str) -> Array:
        """One latency column by name (``tpot_s``, ``ttft_s``, ``queue_s``, ``e2e_s``)."""
        value: Array = getattr(self, name)
        return value


def _p95(values: Array) -> float:
    finite = values[~np.isnan(values)]
    return float(np.percentile(finite, 95)) if finite.size else math.nan


def p95_interval(values: Array, z: float = 1.96) -> tuple[float, float, float]:
    """The p95 and a distribution-free 95 % interval from the ranks of order statistics.

    The rank of the 0.95 quantile among ``n`` values is binomial with mean ``0.95·n`` and
    variance ``n·0.95·0.05``; the values at ranks ``0.95·n ± z·√(n·0.95·0.05)`` bound it.
    Returns ``(estimate, low, high)``, NaN without values.
    """
    finite = values[~np.isnan(values)]
    n = finite.size
    if n == 0:
        return math.nan, math.nan, math.nan
    q = 0.95
    half = z * math.sqrt(n * q * (1 - q)) / n
    est, low, high = np.percentile(
        finite, [100 * q, 100 * max(0.0, q - half), 100 * min(1.0, q + half)]
    )
    return float(est), float(low), float(high)


def metric_value(table: RequestTable, metric: Metric, start_s: float, end_s: float) -> float:
    """The objective over the requests finished in ``[start_s, end_s)`` (NaN if none)."""
    span = table.between(start_s, end_s)
    if len(span) == 0:
        return math.nan
    if metric is Metric.TPOT_P95:
        return _p95(span.tpot_s)
    if metric is Metric.TTFT_P95:
        return _p95(span.ttft_s)
    if metric is Metric.E2E_P95:
        return _p95(span.e2e_s)
    length = end_s - start_s
    return float(span.output_tokens.sum()) / length if length > 0 else math.nan


def efficiency_ratio(best: float, value: float, minimise: bool) -> float:
    """``best / value`` (minimise) or ``value / best`` (maximise); NaN when undefined."""
    if not (math.isfinite(best) and math.isfinite(value)) or best <= 0 or value <= 0:
        return math.nan
    return best / value if minimise else value / best


#: The efficiency ratio an arm must reach to count as recovered after a model change.
RECOVERY_EFFICIENCY = 0.95


def recovery_seconds(
    event_s: float,
    phase_end_s: float,
    served: Sequence[tuple[float, str]],
    efficiency: Mapping[str, float],
    threshold: float = RECOVERY_EFFICIENCY,
) -> float | None:
    """Seconds from a model change at ``event_s`` until the target stays within
    ``threshold`` of the phase's oracle (see the module docstring), or None.

    ``served`` is ``(time, arm)`` at time 0 and at the end of every rollout, in time order;
    ``efficiency[arm]`` each served arm's efficiency ratio over the phase
    ``[event_s, phase_end_s)``.
    """
    at_event = [arm for t, arm in served if t <= event_s]
    timeline = [(event_s, at_event[-1])] if at_event else []
    timeline += [(t, arm) for t, arm in served if event_s < t < phase_end_s]
    recovered: float | None = None
    for t, arm in timeline:
        ok = efficiency[arm] >= threshold
        if ok and recovered is None:
            recovered = t
        elif not ok:
            recovered = None
    return None if recovered is None else recovered - event_s


def phase_spans(scenario: Scenario) -> list[tuple[float, float]]:
    """``[start_s, end_s)`` of each phase: the spans between scenario event times."""
    end = float(scenario.duration_s)
    cuts = sorted({float(e.at_s) for e in scenario.events if 0.0 < e.at_s < end})
    edges = [0.0, *cuts, end]
    return list(itertools.pairwise(edges))


@dataclass(frozen=True)
class GuardrailLimit:
    """One guardrail: a latency column and the largest tolerated relative regression."""

    label: str
    column: str
    tolerance: float


def guardrail_limits(scenario: Scenario) -> list[GuardrailLimit]:
    """The scenario's guardrails (default: TTFT p95 and queue p95 at 0.2)."""
    g = scenario.objective.guardrails
    if g is None:
        return [
            GuardrailLimit("ttftP95", "ttft_s", 0.2),
            GuardrailLimit("queueP95", "queue_s", 0.2),
        ]
    pairs = (
        ("ttftP95", "ttft_s", g.maxTTFTP95Regression),
        ("queueP95", "queue_s", g.maxQueueP95Regression),
        ("e2eP95", "e2e_s", g.maxE2EP95Regression),
        ("tpotP95", "tpot_s", g.maxTPOTP95Regression),
    )
    return [GuardrailLimit(label, col, tol) for label, col, tol in pairs if tol is not None]


def score_windows(
    phases: Sequence[tuple[float, float]], window_s: float
) -> list[tuple[float, float, int]]:
    """``(start_s, end_s, phase index)`` of the guardrail windows of each phase."""
    out: list[tuple[float, float, int]] = []
    for p, (start, end) in enumerate(phases):
        t = start
        while t < end - 1e-9:
            out.append((t, min(t + window_s, end), p))
            t += window_s
    return out


def breach_seconds(
    run: RequestTable,
    references: Callable[[int], Sequence[RequestTable]],
    phases: Sequence[tuple[float, float]],
    window_s: float,
    limits: Sequence[GuardrailLimit],
) -> float:
    """Seconds of the run's windows in which a guardrail was broken (module docstring).

    ``references(phase)``: the runs a window is judged against; it is breached only when
    the run is worse than every one of them that can be judged there (enough requests, a
    p95), and not judged when none can.
    """
    if not limits:
        return 0.0
    total = 0.0
    for start, end, p in score_windows(phases, window_s):
        mine = run.between(start, end)
        if len(mine) < MIN_WINDOW_REQUESTS:
            continue
        refs = [r.between(start, end) for r in references(p)]
        refs = [r for r in refs if len(r) >= MIN_WINDOW_REQUESTS]
        for lim in limits:
            _, got_low, _ = p95_interval(mine.column(lim.column))
            highs = [p95_interval(r.column(lim.column))[2] for r in refs]
            highs = [h for h in highs if not math.isnan(h)]
            if math.isnan(got_low) or not highs:
                continue
            if got_low > max(highs) * (1.0 + lim.tolerance) + ABSOLUTE_SLACK_S:
                total += end - start
                break
    return total


def _worse(
    arm: RequestTable, initial: RequestTable, metric: Metric, start: float, end: float
) -> bool:
    """Whether ``arm``'s requests in ``[start, end)`` are worse than ``initial``'s with
    confidence on ``metric`` (module docstring, "Worse than initial")."""
    mine, base = arm.between(start, end), initial.between(start, end)
    if len(mine) < MIN_WINDOW_REQUESTS or len(base) < MIN_WINDOW_REQUESTS:
        return False
    column = {Metric.TPOT_P95: "tpot_s", Metric.TTFT_P95: "ttft_s", Metric.E2E_P95: "e2e_s"}
    if metric in column:
        _, low, _ = p95_interval(mine.column(column[metric]))
        _, _, high = p95_interval(base.column(column[metric]))
        return not (math.isnan(low) or math.isnan(high)) and low > high
    return _fewer_tokens(mine, base) and _fewer_tokens(
        arm.between(-math.inf, end), initial.between(-math.inf, end)
    )


def _fewer_tokens(mine: RequestTable, base: RequestTable) -> bool:
    """Whether ``mine`` finished fewer output tokens than ``base`` beyond 1.96 × the relative
    Poisson error of ``base``'s request count."""
    got, had = float(mine.output_tokens.sum()), float(base.output_tokens.sum())
    return len(base) > 0 and had > 0 and got < had * (1.0 - 1.96 / math.sqrt(len(base)))


def worse_seconds(
    served: Sequence[tuple[float, str]],
    first_promotion_s: float | None,
    runs: Callable[[str], RequestTable],
    initial: str,
    metric: Metric,
    phases: Sequence[tuple[float, float]],
    window_s: float,
) -> float:
    """Seconds after ``first_promotion_s`` in which the target served an arm worse than
    ``initial`` with confidence (module docstring); 0 without a promotion.

    ``served``: ``(time, arm)`` at time 0 and at every promotion, in time order;
    ``runs(arm)``: the oracle's static run of an arm.
    """
    if first_promotion_s is None:
        return 0.0
    base = runs(initial)
    total = 0.0
    for start, end, _ in score_windows(phases, window_s):
        if end <= first_promotion_s:
            continue
        lo = max(start, first_promotion_s)
        # The arms served over the window: the one at its start, then each promotion's.
        at_start = [arm for t, arm in served if t <= lo]
        cuts = [(lo, at_start[-1] if at_start else initial)]
        cuts += [(t, arm) for t, arm in served if lo < t < end]
        for (a, arm), b in zip(cuts, [t for t, _ in cuts[1:]] + [end], strict=True):
            if arm != initial and _worse(runs(arm), base, metric, start, end):
                total += b - a
    return total
