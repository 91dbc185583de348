"""Findings: why speculation is or is not paying, with the numbers behind each verdict.

Called by ``spectune diagnose`` and ``spectune report`` today, and by the controller's
status writer later. Input is one :class:`~spectune.metrics.Observation` of the pods as
they run (and optionally one of the same traffic without speculation, the baseline);
output is a :class:`Diagnosis`: the acceptance curve, the draft cost and where it came
from, the predicted speedup for every draft length up to the measured one, and findings
coded as in DESIGN.md §1. Pure: no I/O.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any

import numpy as np

from spectune.core import (
    ConfidenceInterval,
    RequestAcceptance,
    acceptance_rate,
    break_even_survival,
    draft_cost_from_tpot,
    expected_tokens,
    flat_rate_for_length,
    flat_survival,
    mean_accepted_length,
    predict_speedup,
    request_acceptance_spread,
    survival_from_counts,
    survival_intervals,
    wilson_interval,
)
from spectune.engines import Catalogue, Dialect, catalogue_for
from spectune.errors import InputError
from spectune.metrics.observation import Histogram, Observation, per_token

__all__ = [
    "AcceptanceSummary",
    "Code",
    "Diagnosis",
    "DraftCost",
    "Finding",
    "PredictionRow",
    "Thresholds",
    "diagnose",
    "drafter_broken",
    "pod_decay",
]


class Code(enum.StrEnum):
    """Finding codes, the same in the CLI, the SpecTuning status and events."""

    LOW_ACCEPTANCE = "LOW_ACCEPTANCE"
    DRAFTER_TOO_EXPENSIVE = "DRAFTER_TOO_EXPENSIVE"
    K_PAST_PEAK = "K_PAST_PEAK"
    KV_POOL_SHRANK = "KV_POOL_SHRANK"
    QUEUEING = "QUEUEING"
    LARGE_BATCH_REGIME = "LARGE_BATCH_REGIME"
    HEALTHY = "HEALTHY"
    INSUFFICIENT_DATA = "INSUFFICIENT_DATA"
    DRAFTER_BROKEN = "DRAFTER_BROKEN"
    POD_ACCEPTANCE_DECAY = "POD_ACCEPTANCE_DECAY"


@dataclass(frozen=True)
class Thresholds:
    """The limits the findings use; every field has its unit and reason beside it."""

    #: first-position acceptance P(L>=1) below which the drafter mismatches the workload. The
    #: first position is used, not accepted/drafted tokens, because the overall rate falls
    #: with k by construction (it averages the decaying curve) while P(L>=1) does not.
    low_acceptance: float = 0.5
    #: smallest predicted relative gain of the best k over the current k worth a change.
    k_gain: float = 0.01
    #: conditional acceptance at position 2, P(L>=2)/P(L>=1), below which the curve "collapses".
    collapse_at_2: float = 0.4
    #: fewest drafts in a window for the per-position curve to mean anything (Wilson
    #: half-width at p = 0.5 is about 0.02 at 2000).
    min_drafts: int = 2000
    #: fewest finished requests for latency figures (TPOT, queue share).
    min_requests: int = 30
    #: fractional drop of KV blocks against the baseline that counts as a shrink.
    kv_shrink: float = 0.05
    #: queue time as a share of end-to-end latency above which waiting dominates.
    queue_share: float = 0.2
    #: tokens per verification pass past which a forward stops being memory-bound; a
    #: typical H100 bf16 knee (989 TFLOP/s / 3.35 TB/s ≈ 295, rounded down). Assumed
    #: unless the caller measured it.
    compute_knee_tokens: float = 256.0
    #: predicted or measured speedup margin over 1 that counts as "pays".
    healthy_margin: float = 0.03
    #: confidence of every interval reported.
    confidence: float = 0.95
    #: first-position acceptance P(L>=1) from which a drafter counts as accurate, so that a
    #: small gain is its cost's fault: at 0.8 and k = 3 a free drafter would emit
    #: 1 + 0.8 + 0.64 + 0.51 ≈ 2.95 tokens per pass.
    expensive_min_first: float = 0.8
    #: draft cost c, in target steps, of a cheap drafter: an EAGLE-style head is one decoder
    #: layer plus the LM head of a target with 32–80 layers, about 1/30 to 1/15 of a step.
    cheap_draft_cost: float = 0.05
    #: share of the gain a cheap drafter would give at the measured acceptance below which
    #: the measured gain counts as small against it.
    expensive_gain_share: float = 0.5
    #: first-position acceptance P(L>=1) that a working drafter never stays under (see
    #: :func:`drafter_broken`): a drafter whose upper bound is below it is broken.
    broken_level: float = 0.03
    #: one-sided confidence of that upper bound. High, because the finding makes ``auto``
    #: mode fall back at once (a restart of every pod).
    broken_confidence: float = 0.99
    #: relative shortfall of a pod's P(L>=1) against its younger peers' that counts as decay
    #: (see :func:`pod_decay`).
    decay_margin: float = 0.05
    #: one-sided confidence of the shortfall, shared (Bonferroni) over the pods tested.
    decay_confidence: float = 0.95


@dataclass(frozen=True)
class Finding:
    """One diagnosis: a code, a sentence, the numbers behind it, and what to do."""

    code: Code
    message: str
    evidence: Mapping[str, Any]
    action: str

    def to_json(self) -> dict[str, Any]:
        """The finding as the JSON object the CLI and status print."""
        return {
            "code": self.code.value,
            "message": self.message,
            "evidence": dict(self.evidence),
            "action": self.action,
        }


@dataclass(frozen=True)
class AcceptanceSummary:
    """Acceptance over the window. ``per_position[i]`` is ``P(L >= i+1)``.

    ``per_position_source`` is ``"measured"`` (per-position counters) or ``"modelled"``
    (a flat per-token rate fitted to the mean accepted length, for dialects that export
    no per-position data).
    """

    rate: float
    rate_interval: ConfidenceInterval | None
    mean_accepted_length: float
    per_position: tuple[float, ...]
    per_position_low: tuple[float, ...] | None
    per_position_high: tuple[float, ...] | None
    per_position_source: str
    drafts: float | None
    draft_tokens: float | None
    accepted_tokens: float | None


@dataclass(frozen=True)
class DraftCost:
    """The draft cost ``c`` in target-step units and where it came from.

    ``source`` is ``measured`` (baseline TPOT at the same load), ``assumed`` (given by
    the user) or ``unknown`` (``value`` is None).
    """

    value: float | None
    source: str
    detail: str


@dataclass(frozen=True)
class PredictionRow:
    """Expected tokens per pass and predicted speedup at one draft length (0 = off)."""

    k: int
    expected_tokens: float
    speedup: float | None


@dataclass(frozen=True)
class Diagnosis:
    """Everything ``spectune diagnose`` reports for one window."""

    engine: Dialect
    window_s: float | None
    pods: tuple[str, ...]
    acceptance: AcceptanceSummary
    current_k: int
    draft_cost: DraftCost
    prediction: tuple[PredictionRow, ...]
    best_k: int | None
    measured_speedup: float | None
    measured_speedup_interval: ConfidenceInterval | None
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = field(default=())
    counter_resets: tuple[str, ...] = field(default=())
    """The pods whose counters went back within the window (a restart)."""
    engine_version: str | None = None
    """The engine and version range the pages' families place them in."""
    request_spread: RequestAcceptance | None = None
    """Acceptance across requests, where the engine exports a per-request histogram."""

    @property
    def codes(self) -> tuple[Code, ...]:
        """The finding codes, in report order."""
        return tuple(f.code for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        """The JSON document of ``spectune diagnose --json``."""
        acc = self.acceptance
        return {
            "engine": self.engine.value,
            "engine_version": self.engine_version,
            "window_s": self.window_s,
            "pods": list(self.pods),
            "acceptance": {
                "rate": _num(acc.rate),
                "rate_interval": _interval(acc.rate_interval),
                "mean_accepted_length": _num(acc.mean_accepted_length),
                "per_position": [_num(v) for v in acc.per_position],
                "per_position_low": _list(acc.per_position_low),
                "per_position_high": _list(acc.per_position_high),
                "per_position_source": acc.per_position_source,
                "drafts": _num(acc.drafts),
                "draft_tokens": _num(acc.draft_tokens),
                "accepted_tokens": _num(acc.accepted_tokens),
            },
            "current": {"k": self.current_k},
            "draft_cost": {
                "value": _num(self.draft_cost.value),
                "source": self.draft_cost.source,
                "detail": self.draft_cost.detail,
            },
            "prediction": [
                {"k": r.k, "expected_tokens": _num(r.expected_tokens), "speedup": _num(r.speedup)}
                for r in self.prediction
            ],
            "best_k": self.best_k,
            "measured_speedup": _num(self.measured_speedup),
            "measured_speedup_interval": _interval(self.measured_speedup_interval),
            "findings": [f.to_json() for f in self.findings],
            "notes": list(self.notes),
            "counter_resets": list(self.counter_resets),
            "request_spread": None
            if self.request_spread is None
            else {
                "mean": _num(self.request_spread.mean),
                "sd": _num(self.request_spread.sd),
                "concentration": _num(self.request_spread.concentration),
                "requests": _num(self.request_spread.requests),
                "source": "per-request histogram",
            },
        }


def _num(v: float | None) -> float | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return round(float(v), 6)


def _list(v: Sequence[float] | None) -> list[float | None] | None:
    return None if v is None else [_num(x) for x in v]


def _interval(ci: ConfidenceInterval | None) -> dict[str, float | None] | None:
    if ci is None:
        return None
    return {"low": _num(ci.low), "high": _num(ci.high), "confidence": ci.confidence}


# -- acceptance ---------------------------------------------------------------------------


def _missing_families(obs: Observation) -> None:
    """Refuse pages that cannot give an acceptance, naming what is missing and the fix."""
    cat = catalogue_for(obs.dialect)
    looked = ", ".join(_spec_names(cat))
    seen = f"{obs.engine_version}: " if obs.engine_version else ""
    if not obs.speculating:
        raise InputError(
            f"{seen}no speculative-decoding metrics on these pages ({looked} absent): "
            f"speculation is off on these pods{_why_absent(obs.dialect)}; pass such pages as "
            "--baseline-before/--baseline-after of a speculating deployment instead"
        )
    spec = obs.spec
    if spec is None:
        return  # gauges only (SGLang): read as such
    need: list[str] = []
    if spec.accepted is None and cat.accepted_tokens is not None:
        need.append(cat.accepted_tokens)
    if spec.drafts is None and spec.draft_tokens is None:
        need.extend(n for n in (cat.drafts, cat.draft_tokens) if n is not None)
    if need:
        present = [
            name
            for name, value in (
                (cat.drafts, spec.drafts),
                (cat.draft_tokens, spec.draft_tokens),
                (cat.accepted_tokens, spec.accepted),
                (cat.accepted_per_pos, spec.accepted_per_pos),
            )
            if name is not None and value is not None
        ]
        raise InputError(
            f"{seen}these pages hold {', '.join(present)} but not {' or '.join(need)}, which a "
            "window needs for the acceptance; save the whole /metrics page (a grep of it "
            "keeps only the families it matched)"
        )


def _spec_names(cat: Catalogue) -> list[str]:
    names = [
        cat.drafts, cat.draft_tokens, cat.accepted_tokens, cat.accepted_per_pos,
        cat.accept_length_gauge, cat.acceptance_rate_gauge, cat.verify_calls,
    ]  # fmt: skip
    return [n for n in names if n is not None]


def _why_absent(dialect: Dialect) -> str:
    return {
        Dialect.VLLM_V1: (
            ", or stats are off (vLLM registers them only with a --speculative-config and "
            "feeds them only without --disable-log-stats)"
        ),
        Dialect.VLLM_V0: ", or stats are off (--disable-log-stats)",
        Dialect.SGLANG: (
            " (SGLang exports them with --enable-metrics and a --speculative-algorithm)"
        ),
        Dialect.TRTLLM: (
            " (TensorRT-LLM exports them from its 2026 metrics collector; older releases have none)"
        ),
    }[dialect]


def _current_k(obs: Observation, given: int | None) -> tuple[int, str, list[str]]:
    """The draft length the pods run, how it was found, and notes where sources disagree.

    Two facts cross-check it: vLLM creates one per-position series per draft position at
    start, so their count is k; and draft tokens per draft cannot exceed k (it falls below
    it where some passes draft fewer). A page cut short (a ``grep`` keeping some lines)
    loses positions, which shows as draft tokens per draft above the series count and as
    per-position accepted tokens summing to less than all accepted ones; then the larger
    k is the one the engine runs.
    """
    spec = obs.spec
    notes: list[str] = []
    n_pos = len(spec.accepted_per_pos) if spec is not None and spec.accepted_per_pos else None
    ratio = (
        spec.draft_tokens / spec.drafts
        if spec is not None and spec.draft_tokens and spec.drafts
        else None
    )
    by_ratio = math.ceil(ratio - 1e-6) if ratio is not None else None
    if given is not None:
        if given < 1:
            raise InputError(f"--k must be at least 1, got {given}")
        ceiling = max(v for v in (n_pos, by_ratio, 0) if v is not None)
        if n_pos is not None and given > ceiling:
            raise InputError(
                f"--k {given} is more than the {n_pos} per-position series on these pages "
                f"(and draft tokens per draft is {ratio or 0:.2f}); the engine creates one "
                f"series per draft position, so it runs k = {ceiling}: drop --k or fix it"
            )
        return given, "given", notes
    if spec is not None and n_pos is not None:
        k, source = n_pos, "per-position counters"
        if by_ratio is not None and ratio is not None and by_ratio > n_pos:
            k, source = by_ratio, "draft tokens per draft"
            notes.append(
                f"k = {by_ratio} from draft tokens per draft ({ratio:.2f}) rather than the "
                f"{n_pos} per-position series: draft tokens per draft cannot exceed k, so "
                "positions are missing from the page (cut short?); the missing positions are "
                "modelled from the accepted total"
            )
        elif ratio is not None and ratio < n_pos - 0.05:
            notes.append(
                f"passes draft {ratio:.2f} tokens on average, fewer than k = {n_pos}: some "
                "passes draft less (a per-batch-size schedule or structured output), so the "
                "per-position rates, over all passes, understate the positions' acceptance"
            )
        landed = math.fsum(spec.accepted_per_pos or ())
        if spec.accepted and landed < 0.99 * spec.accepted and k == n_pos:
            notes.append(
                f"the per-position accepted tokens sum to {landed:.0f}, less than the "
                f"{spec.accepted:.0f} accepted: counters of some positions are missing"
            )
        if obs.configured_k is not None and obs.configured_k > k:
            k, source = obs.configured_k, "speculative_config_info"
        return k, source, notes
    if obs.configured_k is not None:
        return obs.configured_k, "speculative_config_info", notes
    if by_ratio is not None:
        return by_ratio, "draft tokens per draft", notes
    if obs.spec_steps_gauge:
        return round(obs.spec_steps_gauge), "spec_num_steps gauge", notes
    if obs.spec_draft_tokens_gauge and obs.spec_draft_tokens_gauge > 1:
        # SGLang with a chain drafter verifies steps + 1 tokens (the root and each draft).
        return round(obs.spec_draft_tokens_gauge) - 1, "spec_num_draft_tokens gauge", notes
    if spec is not None and spec.emitted and spec.draft_tokens and obs.efficiency_gauge:
        # vLLM V0: efficiency = emitted / (passes·(k+1)), passes = draft_tokens / k; solve for k.
        slots = spec.emitted / obs.efficiency_gauge
        if slots > spec.draft_tokens:
            return round(spec.draft_tokens / (slots - spec.draft_tokens)), "efficiency gauge", notes
    if obs.accept_length_gauge and obs.acceptance_rate_gauge:
        # SGLang: rate = (length − 1) / k.
        k = round((obs.accept_length_gauge - 1) / obs.acceptance_rate_gauge)
        return k, "accept gauges", notes
    cat = catalogue_for(obs.dialect)
    tried = [n for n in (cat.accepted_per_pos, cat.drafts, cat.spec_steps_gauge,
                         cat.spec_config_info, cat.acceptance_rate_gauge) if n]  # fmt: skip
    raise InputError(
        "cannot tell the draft length k from these metrics (none of "
        f"{', '.join(tried)} is on the pages); give it with --k"
    )


def _tail(per_pos: Sequence[float], remainder: float, m: int) -> list[float]:
    """P(L ≥ i) of ``m`` positions missing from a page, from what the known ones leave.

    Their sum is the accepted tokens per draft that the known positions do not hold. A
    survival curve does not rise, so they continue the last known value by a common ratio
    r in [0, 1], found by bisection so the sum matches (clipped where it cannot).
    """
    last = per_pos[-1] if per_pos else 1.0
    if m <= 0 or remainder <= 0 or last <= 0:
        return [0.0] * max(m, 0)

    def total(r: float) -> float:
        return math.fsum(last * r**j for j in range(1, m + 1))

    lo, hi = 0.0, 1.0
    if total(hi) <= remainder:
        return [last] * m
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) < remainder else (lo, mid)
    r = (lo + hi) / 2
    return [last * r**j for j in range(1, m + 1)]


def _acceptance(obs: Observation, k: int, conf: float) -> tuple[AcceptanceSummary, list[str]]:
    spec = obs.spec
    notes: list[str] = []
    if spec is not None and spec.accepted_per_pos and spec.drafts:
        counts = list(spec.accepted_per_pos)
        landed = spec.accepted if spec.accepted is not None else float(sum(counts))
        drafted = spec.draft_tokens if spec.draft_tokens is not None else spec.drafts * k
        survival = list(survival_from_counts(counts, spec.drafts))
        low, high = (list(v) for v in survival_intervals(counts, spec.drafts, conf))
        source = "measured"
        if k > len(counts):
            tail = _tail(survival, (landed - math.fsum(counts)) / spec.drafts, k - len(counts))
            span = f"{len(counts) + 1}–{k}" if k > len(counts) + 1 else f"{k}"
            notes.append(
                f"position(s) {span} are not on the page: modelled from the "
                "accepted tokens the others leave, continuing the curve by a common ratio"
            )
            survival += tail
            low += [0.0] * len(tail)
            high += [survival[len(counts) - 1]] * len(tail)
            source = "measured+modelled"
        survival = survival[:k]
        return (
            AcceptanceSummary(
                rate=acceptance_rate(landed, drafted),
                rate_interval=wilson_interval(landed, drafted, conf),
                mean_accepted_length=mean_accepted_length(landed, spec.drafts),
                per_position=tuple(float(v) for v in survival),
                per_position_low=tuple(float(v) for v in low[:k]),
                per_position_high=tuple(float(v) for v in high[:k]),
                per_position_source=source,
                drafts=spec.drafts,
                draft_tokens=drafted,
                accepted_tokens=landed,
            ),
            notes,
        )
    # No per-position counters: the mean accepted length is exact where passes are
    # counted; the curve is modelled.
    drafts: float | None
    draft_tokens: float | None
    accepted: float | None
    ci: ConfidenceInterval | None
    if obs.dialect is Dialect.VLLM_V0 and spec is not None and spec.draft_tokens:
        if spec.accepted is None:
            raise InputError("vLLM V0 pages need vllm:spec_decode_num_accepted_tokens_total")
        rate = acceptance_rate(spec.accepted, spec.draft_tokens)
        ci = wilson_interval(spec.accepted, spec.draft_tokens, conf)
        passes = spec.draft_tokens / k
        emitted = spec.emitted if spec.emitted is not None else spec.accepted + passes
        length = emitted / passes
        drafts = passes
        draft_tokens, accepted = spec.draft_tokens, spec.accepted
        notes.append(
            "vLLM V0 counts every accepted draft token, not only the accepted prefix, so its "
            "acceptance rate overstates what lands; mean accepted length uses emitted tokens"
        )
    elif spec is not None and spec.accepted is not None and (spec.drafts or spec.draft_tokens):
        if spec.drafts:
            drafts = spec.drafts
        else:
            assert spec.draft_tokens is not None
            drafts = spec.draft_tokens / k
            notes.append(
                f"this version exports no count of drafts: passes = draft tokens / k = "
                f"{spec.draft_tokens:.0f} / {k}"
            )
        accepted = spec.accepted
        draft_tokens = spec.draft_tokens if spec.draft_tokens is not None else drafts * k
        length = 1 + accepted / drafts
        rate = acceptance_rate(accepted, draft_tokens)
        ci = wilson_interval(accepted, draft_tokens, conf)
    elif obs.accept_length_gauge is not None:
        length = obs.accept_length_gauge
        rate = (
            obs.acceptance_rate_gauge if obs.acceptance_rate_gauge is not None else (length - 1) / k
        )
        ci = None
        drafts = draft_tokens = accepted = None
        notes.append(
            "acceptance comes from interval gauges (no counters), averaged over pods and ranks; "
            "no interval can be given"
        )
    else:
        _missing_families(obs)
        raise InputError("no speculative-decoding metrics on these pages")  # pragma: no cover
    if length > k + 1 + 1e-9:
        raise InputError(
            f"mean accepted length {length:.2f} is more than k + 1 = {k + 1}, which no pass "
            "can emit: k is wrong (give --k) or the counters come from different processes"
        )
    a = flat_rate_for_length(length, k)
    notes.append(
        f"{obs.dialect.value} exports no per-position acceptance; the curve is modelled as a "
        f"flat per-token rate a = {a:.3f} fitted to the mean accepted length {length:.2f} "
        f"at k = {k}"
    )
    modelled = flat_survival(a, k)
    return (
        AcceptanceSummary(
            rate=rate,
            rate_interval=ci,
            mean_accepted_length=length,
            per_position=tuple(float(v) for v in modelled),
            per_position_low=None,
            per_position_high=None,
            per_position_source="modelled",
            drafts=drafts,
            draft_tokens=draft_tokens,
            accepted_tokens=accepted,
        ),
        notes,
    )


# -- latency ------------------------------------------------------------------------------


def _mean_se(h: Histogram) -> tuple[float, float]:
    """Mean (exact, from ``_sum``) and its standard error estimated from the buckets."""
    mean = h.mean
    bounds = np.asarray(h.bounds, dtype=float)
    counts = np.diff(np.concatenate([[0.0], np.asarray(h.cumulative, dtype=float)]))
    lower = np.concatenate([[0.0], bounds[:-1]])
    upper = np.where(np.isinf(bounds), lower, bounds)
    mid = (lower + upper) / 2
    n = max(h.count, 1.0)
    var = float(np.sum(counts * (mid - mean) ** 2) / n)
    # Bucket width adds a uniform-within-bucket variance term.
    var += float(np.sum(counts * (upper - lower) ** 2 / 12) / n)
    return mean, math.sqrt(var / n)


def _speedup_interval(
    on: Histogram, off: Histogram, conf: float
) -> tuple[float, ConfidenceInterval]:
    """TPOT_off / TPOT_on with a delta-method interval on the log ratio."""
    m_on, se_on = _mean_se(on)
    m_off, se_off = _mean_se(off)
    ratio = m_off / m_on
    z = NormalDist().inv_cdf((1 + conf) / 2)
    log_se = math.sqrt((se_on / m_on) ** 2 + (se_off / m_off) ** 2)
    return ratio, ConfidenceInterval(
        low=ratio * math.exp(-z * log_se), high=ratio * math.exp(z * log_se), confidence=conf
    )


def _gain(speedups: Sequence[float | None], best_k: int | None, k: int) -> float:
    """Relative predicted gain of the best k over the current k (0 when unknown)."""
    if best_k is None or k >= len(speedups):
        return 0.0
    best, now = speedups[best_k], speedups[k]
    if best is None or now is None or now <= 0:
        return 0.0
    return best / now - 1


def _queue_share(obs: Observation, th: Thresholds) -> float | None:
    """Queue time as a share of end-to-end latency, when enough requests finished."""
    if obs.queue is None or obs.e2e is None or obs.e2e.sum <= 0:
        return None
    if obs.e2e.count < th.min_requests:
        return None
    return obs.queue.sum / obs.e2e.sum


# -- perishability: a drafter that stopped working, a pod that decays with age --------------


def drafter_broken(
    drafts: float | None,
    first_accepted: float | None,
    accepted: float | None = None,
    thresholds: Thresholds | None = None,
) -> Finding | None:
    r"""``DRAFTER_BROKEN`` when a drafted arm's first token (almost) never lands, else None.

    Physics: the first drafted token lands when the drafter's proposal passes the target's
    verification. Any drafter that predicts the target at all — an n-gram matcher copying
    from the context, a draft model, an EAGLE/MTP head trained on the target's outputs —
    lands it in a sizeable share of passes; a poor fit shows as ``LOW_ACCEPTANCE`` (below
    0.5). A drafter whose weights did not load or were dropped (vLLM #52479), or that runs
    with the wrong algorithm or tokenizer (SGLang #21272: accept length 1.00 "with no error
    or warning"), proposes tokens unrelated to the target's: over a vocabulary of 10⁵
    tokens its first token lands close to never, and every pass then pays the draft and the
    longer verification for the one token the target emits anyway.

    Statistics: the passes whose first token landed are binomial in the drafts, so the
    Wilson upper bound of :math:`P(L \ge 1)` at one-sided confidence
    ``broken_confidence`` below ``broken_level`` says, with that confidence, that the
    drafter works in fewer than that share of passes. The bound carries the evidence
    needed: with nothing landed it falls below the level only past
    :math:`n > z^2 (1 - \ell) / \ell` drafts (about 175 at 0.99 and 0.03), so a window
    with few drafts never fires. Where the engine exports no per-position counter, the
    accepted tokens stand in for the first position's (``min(accepted, drafts)``): a pass
    that landed any token landed its first, so the stand-in is an upper bound and the test
    only more cautious.

    >>> f = drafter_broken(drafts=4000, first_accepted=3)
    >>> f.code.value, f.evidence["p_len_ge_1"]
    ('DRAFTER_BROKEN', 0.00075)
    >>> drafter_broken(drafts=100, first_accepted=0) is None  # too few drafts to say
    True
    """
    th = thresholds or Thresholds()
    if drafts is None or not drafts > 0:
        return None
    source = "first-position counter"
    if first_accepted is None:
        if accepted is None:
            return None
        first_accepted, source = accepted, "accepted tokens (an upper bound)"
    landed = min(max(first_accepted, 0.0), drafts)
    two_sided = 1 - 2 * (1 - th.broken_confidence)
    upper = wilson_interval(landed, drafts, two_sided).high
    if not upper < th.broken_level:
        return None
    p1 = landed / drafts
    length = 1 + accepted / drafts if accepted is not None else None
    return Finding(
        Code.DRAFTER_BROKEN,
        f"the drafter is broken: its first token landed in {p1:.2%} of {drafts:.0f} drafts "
        f"(at most {upper:.2%} at {th.broken_confidence:.0%} confidence, below "
        f"{th.broken_level:.0%}); every pass pays for a draft that never lands",
        {
            "drafts": _num(drafts),
            "p_len_ge_1": _num(p1),
            "p_len_ge_1_upper": _num(upper),
            "broken_level": th.broken_level,
            "confidence": th.broken_confidence,
            "mean_accepted_length": _num(length),
            "source": source,
        },
        "check the drafter's weights, method and tokenizer in the engine's start-up log (a "
        "wrong --speculative-algorithm, a draft model that failed to load); turn speculation "
        "off until it is fixed",
    )


def pod_decay(obs: Observation, thresholds: Thresholds | None = None) -> tuple[Finding, ...]:
    r"""``POD_ACCEPTANCE_DECAY`` for each pod whose acceptance fell below its younger peers'.

    Physics: the pods of one Deployment run the same arm on the same checkpoints, and the
    Service's balancer spreads requests over them at random, so over a window every pod
    drafts for the same mix of traffic. A change of the model or of the traffic therefore
    moves every pod's first-position acceptance together (that is drift, judged on the
    whole group). A pod whose acceptance falls while it runs — stale draft state or caches
    that grow with uptime (vLLM #41838: accepted length 3.07 → 2.8 over hours, reset by a
    restart; SGLang #28771: 3.33 → 1.90 in two hours with no error) — falls alone, and the
    pods started after it still hold the level. So each pod is compared with the pooled
    pods *younger* than it (by their engine's start time): lower than them is decay with
    age; the youngest pod has no such peer and is never flagged (a pod low from its start
    is not ageing). Routing that pins traffic to pods (sessions, prefix-aware routers)
    breaks the premise; the comparison is then of different traffic.

    Statistics: the passes whose first token landed are binomial per pod, so the shortfall
    :math:`\hat p_y - \hat p_i` of pod :math:`i` against its younger peers :math:`y` has
    the standard error :math:`\sqrt{\hat p_i(1-\hat p_i)/n_i + \hat p_y(1-\hat p_y)/n_y}`.
    The pod decays when the shortfall's lower bound at one-sided ``decay_confidence``,
    Bonferroni-shared over the pods tested, is above ``decay_margin`` of the peers' level:
    a real drop, and one large enough to matter (5 % of P(L≥1) is about 5 % of the speedup's
    gain at typical curves). Only pods with ``min_drafts`` drafts in the window count.
    """
    th = thresholds or Thresholds()
    pods = sorted(
        (
            (name, c)
            for name, c in obs.per_pod.items()
            if c.drafts is not None
            and c.drafts >= th.min_drafts
            and c.first_accepted is not None
            and c.started_s is not None
        ),
        key=lambda item: item[1].started_s or 0.0,
    )
    tested = [
        (name, c, [q for _, q in pods if (q.started_s or 0.0) > (c.started_s or 0.0)])
        for name, c in pods
    ]
    tested = [t for t in tested if t[2]]
    if not tested:
        return ()
    z = NormalDist().inv_cdf(1 - (1 - th.decay_confidence) / len(tested))
    out: list[tuple[float, Finding]] = []
    for name, c, younger in tested:
        n_i, x_i = c.drafts or 0.0, min(c.first_accepted or 0.0, c.drafts or 0.0)
        n_y = math.fsum(q.drafts or 0.0 for q in younger)
        x_y = math.fsum(min(q.first_accepted or 0.0, q.drafts or 0.0) for q in younger)
        p_i, p_y = x_i / n_i, x_y / n_y
        se = math.sqrt(p_i * (1 - p_i) / n_i + p_y * (1 - p_y) / n_y)
        low = (p_y - p_i) - z * se
        if not low > th.decay_margin * p_y:
            continue
        older = math.fsum((q.started_s or 0.0) for q in younger) / len(younger) - (
            c.started_s or 0.0
        )
        length = 1 + c.accepted / n_i if c.accepted is not None else None
        acc_y = [q.accepted for q in younger]
        peers_length = (
            1 + math.fsum(a for a in acc_y if a is not None) / n_y
            if all(a is not None for a in acc_y)
            else None
        )
        out.append(
            (
                low,
                Finding(
                    Code.POD_ACCEPTANCE_DECAY,
                    f"pod {name}'s acceptance decayed with its uptime: P(L≥1) {p_i:.3f} against "
                    f"{p_y:.3f} on the {len(younger)} pod(s) started after it (on average "
                    f"{older / 3600:.1f} h later), at least {low:.3f} lower at "
                    f"{th.decay_confidence:.0%} confidence; the same arm and traffic, so not "
                    "drift",
                    {
                        "pod": name,
                        "p_len_ge_1": _num(p_i),
                        "peers_p_len_ge_1": _num(p_y),
                        "shortfall_low": _num(low),
                        "decay_margin": th.decay_margin,
                        "drafts": _num(n_i),
                        "peers": len(younger),
                        "peers_drafts": _num(n_y),
                        "mean_accepted_length": _num(length),
                        "peers_mean_accepted_length": _num(peers_length),
                        "started_s": _num(c.started_s),
                        "older_than_peers_s": _num(older),
                    },
                    f"restart pod {name} (its replacement starts at the peers' level), or set "
                    "retune.drift.podAction: restartPod to let the operator do it one pod at a "
                    "time",
                ),
            )
        )
    return tuple(f for _, f in sorted(out, key=lambda item: -item[0]))


# -- the diagnosis ------------------------------------------------------------------------


def diagnose(
    obs: Observation,
    baseline: Observation | None = None,
    *,
    current_k: int | None = None,
    draft_cost: float | None = None,
    thresholds: Thresholds | None = None,
) -> Diagnosis:
    """Diagnose one window of a speculating deployment.

    Parameters
    ----------
    obs
        The pods as they run, with speculation on.
    baseline
        The same traffic without speculation (or on the previous setting), for the
        measured draft cost, the measured speedup and the KV-pool comparison.
    current_k
        The draft length, when the metrics cannot tell it.
    draft_cost
        An assumed draft cost ``c`` when there is no baseline.
    thresholds
        The limits of the findings.

    Raises
    ------
    InputError
        When the pods do not speculate, or the baseline does.
    """
    th = thresholds or Thresholds()
    _missing_families(obs)
    k, k_source, k_notes = _current_k(obs, current_k)
    acc, notes = _acceptance(obs, k, th.confidence)
    notes = [f"current k = {k} (from {k_source})", *k_notes, *obs.notes, *notes]
    if obs.tpot is not None and obs.tpot_per_step:
        # A per-step latency family the window could not divide itself (no count of
        # passes on the page): divide by the mean accepted length found here.
        obs = replace(obs, tpot=per_token(obs.tpot, acc.mean_accepted_length), tpot_per_step=False)
        notes.append(
            f"{obs.tpot_family} is observed once per engine step: per-token latency is it "
            f"divided by the mean accepted length {acc.mean_accepted_length:.2f}"
        )
    spread = _request_spread(obs)
    if spread is not None:
        notes.append(
            f"per-request acceptance from {catalogue_for(obs.dialect).request_acceptance_hist}: "
            f"mean {spread.mean:.3f}, sd {spread.sd:.3f} over {spread.requests:.0f} requests, "
            f"Beta concentration {spread.concentration:.1f} (measured, not fitted)"
        )
    if obs.resets:
        notes.append(
            f"counter reset within the window on {', '.join(obs.resets)} (the engine "
            "restarted): those pods' increases count from zero after the restart, as "
            "Prometheus' increase() does, so the window holds less of them than its length"
        )
    survival = np.asarray(acc.per_position, dtype=float)
    e_all = expected_tokens(survival)
    findings: list[Finding] = []

    # Draft cost: measured from the baseline at the same load, else assumed, else unknown.
    measured_speedup: float | None = None
    speedup_ci: ConfidenceInterval | None = None
    enough_requests = (
        obs.tpot is not None
        and obs.tpot.count >= th.min_requests
        and baseline is not None
        and baseline.tpot is not None
        and baseline.tpot.count >= th.min_requests
    )
    cost: DraftCost
    if enough_requests and baseline is not None and obs.tpot and baseline.tpot:
        if baseline.speculating:
            notes.append("the baseline pages speculate too: the cost is relative to that setting")
        measured_speedup, speedup_ci = _speedup_interval(obs.tpot, baseline.tpot, th.confidence)
        c = draft_cost_from_tpot(obs.tpot.mean, baseline.tpot.mean, acc.mean_accepted_length, k)
        cost = DraftCost(
            c,
            "measured",
            f"c = (TPOT_on·E/TPOT_off − 1)/k = ({obs.tpot.mean * 1e3:.2f} ms × "
            f"{acc.mean_accepted_length:.2f} / {baseline.tpot.mean * 1e3:.2f} ms − 1)/{k}",
        )
        if draft_cost is not None:
            notes.append(f"--draft-cost {draft_cost:g} ignored: the baseline measures c = {c:.3f}")
    elif draft_cost is not None:
        if draft_cost < 0:
            raise InputError(f"--draft-cost must be ≥ 0, got {draft_cost:g}")
        cost = DraftCost(draft_cost, "assumed", "given with --draft-cost")
    else:
        why = (
            "no baseline pages without speculation"
            if baseline is None
            else f"fewer than {th.min_requests} finished requests with TPOT in a window"
        )
        cost = DraftCost(None, "unknown", why)
        findings.append(
            Finding(
                Code.INSUFFICIENT_DATA,
                f"draft cost c is unknown ({why}), so speedups cannot be predicted",
                {"baseline": baseline is not None},
                "give --baseline-before/--baseline-after pages from the same traffic without "
                "speculation, or an assumed --draft-cost",
            )
        )

    if cost.value is not None:
        table = predict_speedup(survival, cost.value)
        best_k: int | None = int(table.best_k)
        speedups: list[float | None] = [float(s) for s in table.speedup]
    else:
        best_k = None
        speedups = [None] * len(e_all)
    prediction = tuple(PredictionRow(i, float(e_all[i]), speedups[i]) for i in range(len(e_all)))

    # Evidence volume.
    if acc.drafts is not None and acc.drafts < th.min_drafts:
        findings.append(
            Finding(
                Code.INSUFFICIENT_DATA,
                f"only {acc.drafts:.0f} drafts in the window; the per-position curve is not "
                f"reliable below {th.min_drafts}",
                {"drafts": acc.drafts, "min_drafts": th.min_drafts},
                "measure over a longer window or under more traffic",
            )
        )

    # Branch A: the drafter does not fit the workload. Only on enough drafts: below
    # min_drafts the first position's interval is wider than the gap to the threshold.
    enough_drafts = acc.drafts is None or acc.drafts >= th.min_drafts
    q2 = (
        acc.per_position[1] / acc.per_position[0]
        if len(acc.per_position) > 1 and acc.per_position[0] > 0
        else None
    )
    pp = acc.per_position
    first = pp[0] if pp else acc.rate
    first_landed = (
        pp[0] * acc.drafts
        if pp and acc.drafts is not None and acc.per_position_source.startswith("measured")
        else None
    )
    broken = drafter_broken(acc.drafts, first_landed, acc.accepted_tokens, th)
    if broken is not None:
        findings.append(broken)  # more than a poor fit: LOW_ACCEPTANCE would say less
    low = first < th.low_acceptance and enough_drafts and broken is None
    collapsed = (
        q2 is not None
        and acc.per_position_source == "measured"
        and q2 < th.collapse_at_2
        and enough_drafts
        and broken is None
    )
    if low or collapsed:
        why = (
            f"first-position acceptance {first:.2f} is below {th.low_acceptance:.2f}"
            if low
            else f"the curve collapses at position 2 (conditional acceptance {q2:.2f})"
        )
        findings.append(
            Finding(
                Code.LOW_ACCEPTANCE,
                f"the drafter does not fit this workload: {why}",
                {
                    "acceptance_rate": _num(acc.rate),
                    "p_len_ge_1": _num(acc.per_position[0]),
                    "conditional_at_2": _num(q2),
                },
                "try another drafter (EAGLE-3/MTP for chat, n-gram for copy-heavy routes) or "
                "turn speculation off for this route",
            )
        )

    # Draft length past the interior optimum.
    gain = _gain(speedups, best_k, k)
    if best_k is not None and best_k >= 1 and k > best_k and gain > th.k_gain and cost.value:
        be = break_even_survival(e_all, cost.value)
        findings.append(
            Finding(
                Code.K_PAST_PEAK,
                f"k = {k} is past the optimum k = {best_k}: position {k} lands with "
                f"P(L≥{k}) = {acc.per_position[k - 1]:.3f}, below its break-even {be[k - 1]:.3f}",
                {
                    "k": k,
                    "best_k": best_k,
                    "p_len_ge_k": _num(acc.per_position[k - 1]),
                    "break_even": _num(float(be[k - 1])),
                    "speedup_at_k": _num(speedups[k]),
                    "speedup_at_best_k": _num(speedups[best_k]),
                },
                f"set num_speculative_tokens to {best_k}",
            )
        )

    # Branch B: the drafter is accurate, yet speculation gains little against what the
    # same acceptance would give with a cheap drafter: its cost eats the gain.
    if cost.value is not None and first >= th.expensive_min_first and enough_drafts:
        cheap = float(predict_speedup(survival, th.cheap_draft_cost).speedup[k])
        gained = (
            measured_speedup if measured_speedup is not None else speedups[k]
        )  # measured where a baseline is, else predicted at the measured cost
        if gained is not None and gained - 1 < th.expensive_gain_share * (cheap - 1):
            share = cost.value * k / (1 + cost.value * k)
            how = "measured" if measured_speedup is not None else "predicted"
            findings.append(
                Finding(
                    Code.DRAFTER_TOO_EXPENSIVE,
                    f"the drafter is accurate (first position {first:.2f}) but a draft step "
                    f"costs c = {cost.value:.3f} target steps ({share:.0%} of each step at "
                    f"k = {k}): the {how} speedup {gained:.2f}× is small against the "
                    f"{cheap:.2f}× a drafter at c = {th.cheap_draft_cost:g} would give",
                    {
                        "p_len_ge_1": _num(first),
                        "draft_cost": _num(cost.value),
                        "draft_share_of_step": _num(share),
                        "speedup": _num(gained),
                        "speedup_source": how,
                        "speedup_at_cheap_cost": _num(cheap),
                        "cheap_draft_cost": th.cheap_draft_cost,
                        "measured_speedup": _num(measured_speedup),
                    },
                    "shrink the drafter (fewer layers), quantize it, or replace it with a "
                    "cheaper one (an EAGLE head or MTP instead of a draft model)",
                )
            )

    # Large batches: verification processes running·(k+1) tokens per pass.
    if obs.running is not None:
        tokens = obs.running * (k + 1)
        if tokens > th.compute_knee_tokens:
            findings.append(
                Finding(
                    Code.LARGE_BATCH_REGIME,
                    f"{obs.running:.0f} running requests × (k+1) = {tokens:.0f} tokens per "
                    f"verification pass, past the compute knee (~{th.compute_knee_tokens:.0f}, "
                    "assumed): verification is no longer near-free",
                    {
                        "running_per_pod": _num(obs.running),
                        "tokens_per_pass": _num(tokens),
                        "compute_knee_tokens": th.compute_knee_tokens,
                    },
                    "lower k at high concurrency (a per-batch-size schedule) or turn speculation "
                    "off above this load",
                )
            )

    # KV pool: a drafter's weights and KV come out of the request pool.
    if baseline is not None and obs.num_gpu_blocks and baseline.num_gpu_blocks:
        shrink = 1 - obs.num_gpu_blocks / baseline.num_gpu_blocks
        q_on = obs.queue.quantile(0.95) if obs.queue else math.nan
        q_off = baseline.queue.quantile(0.95) if baseline.queue else math.nan
        pressure = (
            bool(obs.preemptions)
            or bool(obs.waiting)
            or (not math.isnan(q_on) and not math.isnan(q_off) and q_on > 1.2 * q_off + 1e-3)
        )
        if shrink > th.kv_shrink and pressure:
            findings.append(
                Finding(
                    Code.KV_POOL_SHRANK,
                    f"the drafter cut the KV pool by {shrink:.0%} ({baseline.num_gpu_blocks} → "
                    f"{obs.num_gpu_blocks} blocks) and requests now wait",
                    {
                        "num_gpu_blocks": obs.num_gpu_blocks,
                        "baseline_num_gpu_blocks": baseline.num_gpu_blocks,
                        "queue_p95_s": _num(q_on),
                        "baseline_queue_p95_s": _num(q_off),
                        "preemptions": _num(obs.preemptions),
                        "waiting": _num(obs.waiting),
                    },
                    "use a smaller drafter, raise gpu_memory_utilization, or add replicas",
                )
            )

    # Queueing: latency dominated by waiting rather than decoding.
    queue_share = _queue_share(obs, th)
    if queue_share is not None and obs.queue is not None and queue_share > th.queue_share:
        findings.append(
            Finding(
                Code.QUEUEING,
                f"requests spend {queue_share:.0%} of their end-to-end time waiting in the queue",
                {"queue_share": _num(queue_share), "queue_p95_s": _num(obs.queue.quantile(0.95))},
                "capacity, not decoding speed, limits latency: add replicas or free KV "
                "memory before tuning k",
            )
        )

    findings.extend(pod_decay(obs, th))

    problems = {
        Code.LOW_ACCEPTANCE,
        Code.DRAFTER_TOO_EXPENSIVE,
        Code.K_PAST_PEAK,
        Code.DRAFTER_BROKEN,
        Code.POD_ACCEPTANCE_DECAY,
    }
    if not any(f.code in problems for f in findings):
        pays_measured = speedup_ci is not None and speedup_ci.low > 1.0
        at_k = speedups[k] if k < len(speedups) else None
        pays_predicted = speedup_ci is None and at_k is not None and at_k > 1 + th.healthy_margin
        if pays_measured or pays_predicted:
            evidence: dict[str, Any] = {"k": k, "predicted_speedup": _num(at_k)}
            if speedup_ci is not None:
                evidence |= {
                    "measured_speedup": _num(measured_speedup),
                    "interval_low": _num(speedup_ci.low),
                    "interval_high": _num(speedup_ci.high),
                }
                msg = (
                    f"speculation pays: measured speedup {measured_speedup:.2f}× "
                    f"({speedup_ci.low:.2f}–{speedup_ci.high:.2f} at {th.confidence:.0%})"
                )
            else:
                msg = f"speculation pays: predicted speedup {at_k:.2f}× at k = {k}"
            findings.append(
                Finding(
                    Code.HEALTHY,
                    msg,
                    evidence,
                    "keep this setting; re-check on model or traffic changes",
                )
            )

    return Diagnosis(
        engine=obs.dialect,
        window_s=obs.window_s,
        pods=obs.pods,
        acceptance=acc,
        current_k=k,
        draft_cost=cost,
        prediction=prediction,
        best_k=best_k,
        measured_speedup=measured_speedup,
        measured_speedup_interval=speedup_ci,
        findings=tuple(findings),
        notes=tuple(notes),
        counter_resets=obs.resets,
        engine_version=obs.engine_version,
        request_spread=spread,
    )


def _request_spread(obs: Observation) -> RequestAcceptance | None:
    """The spread of acceptance across requests, from the engine's per-request histogram."""
    h = obs.request_acceptance
    if h is None:
        return None
    return request_acceptance_spread(h.bounds, h.cumulative, h.sum)
