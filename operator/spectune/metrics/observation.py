"""A window of observations: what changed on a set of pods between two moments.

The diagnosis and the tuning brain read only :class:`Observation`, never raw pages or
PromQL results, so the page-pair path, the pod scraper, Prometheus and the simulator all
meet here. Counters become window deltas with Prometheus' reset rule (a counter that went
down restarted from zero, so its increase is its new value); histograms become per-bucket
deltas; gauges are read at the end of the window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from spectune.engines import Catalogue, Dialect, catalogue_for
from spectune.errors import InputError
from spectune.metrics.exposition import Labels, Sample, Snapshot

__all__ = [
    "PROCESS_START",
    "Histogram",
    "Observation",
    "PodCounts",
    "SpecCounts",
    "observation_from_pages",
]


@dataclass(frozen=True)
class Histogram:
    """A histogram's increase over a window: upper bounds (``+Inf`` last) and counts.

    ``cumulative[i]`` is the number of observations ``<= bounds[i]``, as in the
    exposition format.
    """

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float
    count: float

    @property
    def mean(self) -> float:
        """Mean observation, NaN when the window saw none."""
        return self.sum / self.count if self.count > 0 else math.nan

    def quantile(self, q: float) -> float:
        """Estimate the ``q`` quantile by linear interpolation within buckets.

        This is Prometheus' ``histogram_quantile`` rule, so the figure matches what a
        dashboard on the same data shows. NaN when the window saw no observation; the
        highest finite bound when the quantile falls in the ``+Inf`` bucket.
        """
        total = self.cumulative[-1] if self.cumulative else 0.0
        if total <= 0 or not 0.0 <= q <= 1.0:
            return math.nan
        rank = q * total
        cum = np.asarray(self.cumulative, dtype=float)
        i = int(np.searchsorted(cum, rank, side="left"))
        i = min(i, len(cum) - 1)
        upper = self.bounds[i]
        if math.isinf(upper):
            return self.bounds[i - 1] if i > 0 else math.nan
        lower = self.bounds[i - 1] if i > 0 else 0.0
        below = cum[i - 1] if i > 0 else 0.0
        in_bucket = cum[i] - below
        if in_bucket <= 0:
            return upper
        return float(lower + (upper - lower) * (rank - below) / in_bucket)

    def merged(self, other: Histogram) -> Histogram:
        """The sum of two histograms with the same bounds (e.g. two pods)."""
        if other.bounds != self.bounds:
            raise InputError(
                "cannot add histograms with different buckets; pods run different versions"
            )
        cum = tuple(a + b for a, b in zip(self.cumulative, other.cumulative, strict=True))
        return Histogram(self.bounds, cum, self.sum + other.sum, self.count + other.count)


@dataclass(frozen=True)
class SpecCounts:
    """Speculation counter increases over the window, summed over pods and engines.

    Fields a dialect does not export are ``None``. ``accepted_per_pos[i]`` counts passes
    whose draft tokens ``0..i`` were all accepted (vLLM's semantics), so
    ``accepted_per_pos[i] / drafts`` is ``P(L >= i+1)``.
    """

    drafts: float | None
    draft_tokens: float | None
    accepted: float | None
    accepted_per_pos: tuple[float, ...] | None
    emitted: float | None = None


#: The start time of the engine's process, Unix seconds: prometheus_client's process
#: collector exports it on Linux (vLLM, SGLang and trtllm-serve are Python servers).
PROCESS_START = "process_start_time_seconds"


@dataclass(frozen=True)
class PodCounts:
    """One pod's speculation counts over the window, and when its engine started.

    ``first_accepted`` counts the passes whose first drafted token landed (the first
    per-position counter), so ``first_accepted / drafts`` is the pod's ``P(L >= 1)``;
    ``started_s`` is its :data:`PROCESS_START` (None where the page has none). Fields the
    dialect does not export are None.
    """

    drafts: float | None
    first_accepted: float | None
    accepted: float | None
    started_s: float | None = None


@dataclass(frozen=True)
class Observation:
    """Everything spectune reads from one set of pods over one window.

    Gauges (``running``, ``waiting``, ``kv_usage``) are means over pods of the value at the
    end of the window (or over the window, for Prometheus); ``running`` is therefore the
    batch size of a typical pod. Capacities are the smallest over pods: the tightest pod
    is the one that queues.
    """

    dialect: Dialect
    window_s: float | None
    pods: tuple[str, ...]
    spec: SpecCounts | None
    acceptance_rate_gauge: float | None = None
    accept_length_gauge: float | None = None
    efficiency_gauge: float | None = None
    spec_steps_gauge: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    preemptions: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_capacity_tokens: int | None = None
    tpot: Histogram | None = None
    ttft: Histogram | None = None
    queue: Histogram | None = None
    e2e: Histogram | None = None
    resets: tuple[str, ...] = ()
    failed_pods: Mapping[str, str] = field(default_factory=dict)
    tpot_family: str | None = None
    """The histogram ``tpot`` was read from (the dialect's per-token one, or an older
    version's family where the page lacks it)."""
    tpot_per_step: bool = False
    """Whether ``tpot`` still holds per-step values (one observation per engine step, so
    one per mean accepted length of tokens): the reader divides by that length. False once
    the window could divide itself (its counters give the length) or when the pods do not
    speculate (a step is a token)."""
    configured_k: int | None = None
    """The draft length the engine states in an info gauge (TensorRT-LLM's
    ``speculative_config_info``), None where it states none."""
    spec_draft_tokens_gauge: float | None = None
    """SGLang's active tokens verified per pass (``spec_num_draft_tokens``), mean over pods."""
    request_acceptance: Histogram | None = None
    """Per-request acceptance rates of the requests finished in the window, where the
    engine exports them as a histogram (vLLM's ``request_spec_decode_acceptance_rate``)."""
    engine_version: str | None = None
    """The engine and version range the pages' families place them in."""
    notes: tuple[str, ...] = ()
    """What the window read differently from the dialect's newest families, and why."""
    covered: float | None = None
    """Share of the window that the least-seen pod's counters span (from Prometheus: its
    first sample in the window to its last). Below 1 by about one scrape interval when
    every pod served throughout; far below it when Prometheus first scraped a pod late in
    the window (a pod that just became ready), whose increases are then stretched from a
    fraction of it. None when the source read pages at both ends of the whole window."""
    per_pod: Mapping[str, PodCounts] = field(default_factory=dict)
    """Each pod's own speculation counts and start time: what tells one pod's decay from a
    change that moves every pod (``diagnose.pod_decay``)."""

    @property
    def speculating(self) -> bool:
        """Whether the pods run speculative decoding (their spec families exist)."""
        return self.spec is not None or self.accept_length_gauge is not None

    @property
    def generation_tokens_per_s(self) -> float | None:
        """Output tokens per second over the window, all pods together."""
        if self.generation_tokens is None or not self.window_s:
            return None
        return self.generation_tokens / self.window_s


def _delta(before: float | None, after: float) -> tuple[float, bool]:
    """Increase of a counter; a decrease means the process restarted (Prometheus' rule)."""
    if before is None:
        return after, False
    if after < before:
        return after, True
    return after - before, False


def _by_labels(samples: Iterable[Sample]) -> dict[Labels, float]:
    return {s.labels: s.value for s in samples}


def _finite(snap: Snapshot, name: str) -> None:
    """Refuse a counter (or histogram part) whose value is NaN or infinite.

    A counter counts events: it is a finite number on any engine that works. ``+Inf`` or
    NaN is a corrupt page (or another program's), and read on it would give an infinite
    or NaN increase, hence an acceptance or a latency that means nothing.
    """
    for sample in snap.series(name):
        if not math.isfinite(sample.value):
            labels = ",".join(f'{k}="{v}"' for k, v in sample.labels)
            raise InputError(
                f"pod {snap.pod}: counter {name}{{{labels}}} is {sample.value:g}; a counter "
                "is never NaN or infinite, so the page is corrupt and the window cannot be read"
            )


def _counter_delta(
    before: Snapshot | None, after: Snapshot, name: str | None
) -> tuple[dict[Labels, float], bool] | None:
    """Per-series increase of a counter between two snapshots; None if absent after."""
    if name is None or not after.has(name):
        return None
    _finite(after, name)
    if before is not None:
        _finite(before, name)
    prev = _by_labels(before.series(name)) if before is not None else {}
    out: dict[Labels, float] = {}
    reset = False
    for labels, value in _by_labels(after.series(name)).items():
        d, r = _delta(prev.get(labels), value)
        out[labels] = d
        reset |= r
    return out, reset


def _drop(labels: Labels, *keys: str) -> Labels:
    return tuple((k, v) for k, v in labels if k not in keys)


def _histogram_delta(
    before: Snapshot | None, after: Snapshot, name: str | None
) -> tuple[Histogram, bool] | None:
    """Window increase of a histogram, all series on the pod summed (e.g. DP engines)."""
    if name is None or not after.has(name + "_bucket"):
        return None
    for snap in (after, before):
        for part in ("_bucket", "_sum", "_count"):
            if snap is not None:
                _finite(snap, name + part)
    reset = False
    # Group the bucket samples by their series (labels without ``le``).
    after_b: dict[Labels, dict[float, float]] = {}
    for s in after.series(name + "_bucket"):
        le = s.label("le")
        if le is None:
            continue
        after_b.setdefault(_drop(s.labels, "le"), {})[float(le)] = s.value
    before_b: dict[Labels, dict[float, float]] = {}
    if before is not None:
        for s in before.series(name + "_bucket"):
            le = s.label("le")
            if le is not None:
                before_b.setdefault(_drop(s.labels, "le"), {})[float(le)] = s.value
    sums_a, counts_a = (
        _by_labels(after.series(name + "_sum")),
        _by_labels(after.series(name + "_count")),
    )
    sums_b = _by_labels(before.series(name + "_sum")) if before else {}
    counts_b = _by_labels(before.series(name + "_count")) if before else {}
    total: Histogram | None = None
    for series, buckets in after_b.items():
        bounds = tuple(sorted(buckets))
        prev = before_b.get(series, {})
        # A histogram restarts as a whole: if its count went down, take every value as is.
        count_after = counts_a.get(series, buckets[bounds[-1]])
        count_before = counts_b.get(series)
        restarted = count_before is not None and count_after < count_before
        reset |= restarted
        if restarted or not prev:
            cum = tuple(buckets[b] for b in bounds)
            s_sum, s_count = sums_a.get(series, 0.0), count_after
        else:
            cum = tuple(max(0.0, buckets[b] - prev.get(b, 0.0)) for b in bounds)
            s_sum = sums_a.get(series, 0.0) - sums_b.get(series, 0.0)
            s_count = count_after - (count_before or 0.0)
        h = Histogram(bounds, cum, s_sum, s_count)
        total = h if total is None else total.merged(h)
    if total is None:
        return None
    return total, reset


def _sum(values: Mapping[Labels, float]) -> float:
    return math.fsum(values.values())


def _per_position(values: Mapping[Labels, float], label: str) -> tuple[float, ...]:
    by_pos: dict[int, float] = {}
    for labels, v in values.items():
        pos = dict(labels).get(label)
        if pos is None:
            continue
        try:
            i = int(pos)
        except ValueError:
            raise InputError(f"position label {label}={pos!r} is not an integer") from None
        by_pos[i] = by_pos.get(i, 0.0) + v
    if not by_pos:
        return ()
    k = max(by_pos) + 1
    return tuple(by_pos.get(i, 0.0) for i in range(k))


def _gauge_mean(snap: Snapshot, name: str | None) -> float | None:
    found = snap.series(name)
    vals = [s.value for s in found if not math.isnan(s.value)]
    if not vals:
        return None
    return math.fsum(vals) / len(vals)


def _engine_values(snap: Snapshot, name: str | None, cat: Catalogue) -> list[float]:
    """A gauge's value on each engine of a pod.

    Ranks of one scheduler (SGLang's ``tp_rank``, ``pp_rank``, ``moe_ep_rank``) export the
    same value each, so they are averaged; separate schedulers (vLLM's ``engine``,
    SGLang's ``dp_rank``) stay apart, for the caller to sum (a queue) or average (a batch
    size). A draft engine's own series (``engine_type="draft"``) describe the drafter's
    scheduler, not the target's, and are left out when the target's are there.
    """
    found = [s for s in snap.series(name) if not math.isnan(s.value)]
    target = [s for s in found if s.label("engine_type") != "draft"]
    groups: dict[Labels, list[float]] = {}
    for sample in target or found:
        groups.setdefault(_drop(sample.labels, *cat.replica_labels), []).append(sample.value)
    return [math.fsum(v) / len(v) for v in groups.values()]


def _engine_mean(snap: Snapshot, name: str | None, cat: Catalogue) -> float | None:
    vals = _engine_values(snap, name, cat)
    return math.fsum(vals) / len(vals) if vals else None


def _engine_sum(snap: Snapshot, name: str | None, cat: Catalogue) -> float | None:
    vals = _engine_values(snap, name, cat)
    return math.fsum(vals) if vals else None


def _tpot_family(page: Snapshot, cat: Catalogue) -> tuple[str | None, bool]:
    """The per-token latency histogram a page holds, and whether it is per step."""
    if cat.tpot_hist is not None and page.has(cat.tpot_hist + "_bucket"):
        return cat.tpot_hist, cat.tpot_per_step
    for name, per_step in cat.tpot_fallbacks:
        if page.has(name + "_bucket"):
            return name, per_step
    return cat.tpot_hist, cat.tpot_per_step


def per_token(h: Histogram, length: float) -> Histogram:
    """A per-step latency histogram read as per-token: every value divided by ``length``.

    One engine step of a speculating request emits ``length`` tokens on average, so a
    step's latency over ``length`` is the latency per token. Dividing by the mean rather
    than each step's own count keeps the mean exact and moves every quantile by the same
    factor; the spread of accepted lengths from step to step is not in the histogram.
    """
    bounds = tuple(b if math.isinf(b) else b / length for b in h.bounds)
    return Histogram(bounds, h.cumulative, h.sum / length, h.count)


def _spec_config_k(snap: Snapshot, name: str | None) -> int | None:
    """The draft length in an info gauge's labels (TensorRT-LLM's speculative config)."""
    for sample in snap.series(name):
        lab = dict(sample.labels)
        for key in ("max_draft_len", "num_speculative_tokens", "max_draft_tokens"):
            raw = lab.get(key)
            if raw is not None:
                try:
                    return int(float(raw))
                except ValueError:
                    continue
    return None


def _cache_info(snap: Snapshot, cat: Catalogue) -> tuple[int | None, int | None, int | None]:
    """(num_gpu_blocks, block_size, kv_cache_size_tokens) from cache_config_info labels."""
    blocks = size = tokens = None
    for s in snap.series(cat.cache_config_info):
        lab = dict(s.labels)
        blocks = _int_label(lab, "num_gpu_blocks", blocks)
        size = _int_label(lab, "block_size", size)
        tokens = _int_label(lab, "kv_cache_size_tokens", tokens)
    if tokens is None and cat.kv_capacity_tokens_gauge is not None:
        g = _gauge_mean(snap, cat.kv_capacity_tokens_gauge)
        tokens = int(g) if g is not None and not math.isnan(g) else None
    return blocks, size, tokens


def _int_label(labels: Mapping[str, str], key: str, current: int | None) -> int | None:
    raw = labels.get(key)
    if raw is None or raw in ("None", ""):
        return current
    try:
        value = int(float(raw))
    except ValueError:
        return current
    return value if current is None else min(current, value)


def _add(a: float | None, b: float | None) -> float | None:
    if b is None:
        return a
    return b if a is None else a + b


def _min_int(a: int | None, b: int | None) -> int | None:
    if b is None:
        return a
    return b if a is None else min(a, b)


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return math.fsum(vals) / len(vals) if vals else None


def observation_from_pages(
    before: Sequence[Snapshot],
    after: Sequence[Snapshot],
    window_s: float | None = None,
    failed_pods: Mapping[str, str] | None = None,
) -> Observation:
    """Build an :class:`Observation` from pages taken at the start and end of a window.

    Pages are matched by pod name; a pod seen only at the end counts from zero (it
    started inside the window). Every pod must speak the same dialect.

    Raises :class:`~spectune.errors.InputError` when there are no end pages, when pods
    speak different dialects, or when a pod's start page has no end page.
    """
    if not after:
        raise InputError("no metric pages to read at the end of the window")
    dialects = {s.dialect for s in after} | {s.dialect for s in before}
    if len(dialects) > 1:
        names = ", ".join(sorted(d.value for d in dialects))
        raise InputError(f"the pages come from different engines ({names}); diagnose one at a time")
    dialect = after[0].dialect
    cat = catalogue_for(dialect)
    start = {s.pod: s for s in before}
    ends = {s.pod: s for s in after}
    missing = sorted(set(start) - set(ends))
    if missing:
        raise InputError(
            f"pod(s) {', '.join(missing)} have a start page but no end page; give both pages "
            "of each pod in the same order"
        )

    spec: SpecCounts | None = None
    drafts = draft_tokens = accepted = emitted = None
    per_pos: list[float] = []
    gen = prompt = preempt = None
    running: list[float | None] = []
    waiting: list[float | None] = []
    kv: list[float | None] = []
    rate_g: list[float | None] = []
    len_g: list[float | None] = []
    eff_g: list[float | None] = []
    steps_g: list[float | None] = []
    blocks = size = tokens = None
    hists: dict[str, Histogram | None] = {
        "tpot": None, "ttft": None, "queue": None, "e2e": None, "request_acceptance": None,
    }  # fmt: skip
    resets: list[str] = []
    has_spec_counter = False
    tpot_name, tpot_step = _tpot_family(next(iter(ends.values())), cat)
    verify: float | None = None
    drafted_pp: float | None = None
    accepted_pp: float | None = None
    configured_k: int | None = None
    draft_tokens_g: list[float | None] = []
    kv_fallback_used = False
    per_pod: dict[str, PodCounts] = {}

    for pod, end in ends.items():
        beg = start.get(pod)
        if beg is not None:
            _check_one_process(pod, beg, end, (cat.drafts, cat.draft_tokens, cat.accepted_tokens))
        reset = False

        def counter(
            name: str | None, end: Snapshot = end, beg: Snapshot | None = beg
        ) -> float | None:
            nonlocal reset
            d = _counter_delta(beg, end, name)
            if d is None:
                return None
            values, r = d
            reset |= r
            return _sum(values)

        d_drafts = counter(cat.drafts)
        d_draft_tokens = counter(cat.draft_tokens)
        d_accepted = counter(cat.accepted_tokens)
        d_emitted = counter(cat.emitted_tokens)
        verify = _add(verify, counter(cat.verify_calls))
        if any(v is not None for v in (d_drafts, d_draft_tokens, d_accepted)):
            has_spec_counter = True
        drafts = _add(drafts, d_drafts)
        draft_tokens = _add(draft_tokens, d_draft_tokens)
        accepted = _add(accepted, d_accepted)
        emitted = _add(emitted, d_emitted)
        pod_drafts, pod_first = d_drafts, None
        pp = _counter_delta(beg, end, cat.accepted_per_pos)
        if pp is not None and cat.position_label is not None:
            values, r = pp
            reset |= r
            pos = _per_position(values, cat.position_label)
            pod_first = pos[0] if pos else None
            accepted_pp = _add(accepted_pp, math.fsum(pos))
            if len(pos) > len(per_pos):
                per_pos.extend([0.0] * (len(pos) - len(per_pos)))
            for i, v in enumerate(pos):
                per_pos[i] += v
        if cat.drafts is None and cat.drafted_per_pos is not None:
            # TensorRT-LLM counts drafted tokens per position; position 0 is drafted in every
            # pass that drafted at all, so it is the number of drafts.
            dp = _counter_delta(beg, end, cat.drafted_per_pos)
            if dp is not None:
                values, r = dp
                reset |= r
                first = _per_position(values, cat.position_label or "position")
                drafts = _add(drafts, first[0] if first else None)
                pod_drafts = first[0] if first else None
                drafted_pp = _add(drafted_pp, math.fsum(first))
        gen = _add(gen, counter(cat.generation_tokens))
        prompt = _add(prompt, counter(cat.prompt_tokens))
        preempt = _add(preempt, counter(cat.preemptions))
        for key, name in (
            ("tpot", tpot_name),
            ("ttft", cat.ttft_hist),
            ("queue", cat.queue_hist),
            ("e2e", cat.e2e_hist),
            ("request_acceptance", cat.request_acceptance_hist),
        ):
            h = _histogram_delta(beg, end, name)
            if h is not None:
                hist, r = h
                reset |= r
                prev = hists[key]
                hists[key] = hist if prev is None else prev.merged(hist)
        running.append(_engine_mean(end, cat.running, cat))
        waiting.append(_engine_sum(end, cat.waiting, cat))
        usage = _engine_mean(end, cat.kv_usage, cat)
        if usage is None and cat.kv_usage_fallback is not None:
            usage = _engine_mean(end, cat.kv_usage_fallback, cat)
            kv_fallback_used |= usage is not None
        kv.append(usage)
        rate_g.append(_engine_mean(end, cat.acceptance_rate_gauge, cat))
        len_g.append(_engine_mean(end, cat.accept_length_gauge, cat))
        eff_g.append(_engine_mean(end, cat.efficiency_gauge, cat))
        steps_g.append(_engine_mean(end, cat.spec_steps_gauge, cat))
        draft_tokens_g.append(_engine_mean(end, cat.spec_draft_tokens_gauge, cat))
        pod_k = _spec_config_k(end, cat.spec_config_info)
        configured_k = pod_k if configured_k is None else configured_k
        b, sz, tk = _cache_info(end, cat)
        if b is None and cat.kv_max_blocks is not None:
            max_blocks = _engine_sum(end, cat.kv_max_blocks, cat)
            per_block = _engine_mean(end, cat.kv_tokens_per_block, cat)
            b = int(max_blocks) if max_blocks is not None else None
            sz = int(per_block) if per_block is not None else None
        blocks, size, tokens = _min_int(blocks, b), _min_int(size, sz), _min_int(tokens, tk)
        if reset:
            resets.append(pod)
        if pod_drafts is not None:
            started = end.total(PROCESS_START)
            per_pod[pod] = PodCounts(pod_drafts, pod_first, d_accepted, started)

    notes: list[str] = []
    steps = _mean(steps_g)
    draft_per_pass = _mean(draft_tokens_g)
    if has_spec_counter:
        spec = SpecCounts(
            drafts=drafts,
            draft_tokens=draft_tokens,
            accepted=accepted,
            accepted_per_pos=tuple(per_pos) if per_pos else None,
            emitted=emitted,
        )
    elif verify and gen is not None:
        spec = _sglang_counts(verify, gen, steps, draft_per_pass, notes)
    if (
        drafted_pp is not None
        and draft_tokens
        and abs(drafted_pp - draft_tokens) > 0.02 * draft_tokens
    ):
        notes.append(
            f"the per-request per-position counters and the per-iteration totals disagree: "
            f"drafted tokens summed over positions {drafted_pp:.0f} vs "
            f"{cat.draft_tokens} {draft_tokens:.0f}; per-position rates use the per-position "
            "counters, the overall rate the totals"
        )
    elif (
        dialect is Dialect.TRTLLM
        and accepted_pp is not None
        and accepted
        and abs(accepted_pp - accepted) > 0.02 * accepted
    ):
        notes.append(
            f"the per-request per-position counters and the per-iteration totals disagree: "
            f"accepted tokens summed over positions {accepted_pp:.0f} vs "
            f"{cat.accepted_tokens} {accepted:.0f}; per-position rates use the per-position "
            "counters, the overall rate the totals"
        )
    accept_len = _mean(len_g)
    # SGLang reports 0 for its spec gauges when speculation is off.
    if dialect is Dialect.SGLANG and accept_len is not None and accept_len <= 0:
        accept_len = None
    if blocks is not None and size is not None and tokens is None:
        tokens = blocks * size
    if kv_fallback_used:
        notes.append(
            f"KV usage from {cat.kv_usage_fallback} (this vLLM predates {cat.kv_usage}, 0.9)"
        )
    tpot = hists["tpot"]
    speculating = spec is not None or accept_len is not None
    if tpot_name != cat.tpot_hist and tpot is not None:
        notes.append(f"per-token latency from {tpot_name} (the page has no {cat.tpot_hist})")
    if tpot is not None and tpot_step and not speculating:
        tpot_step = False  # without speculation a step emits one token
    if tpot is not None and tpot_step and spec is not None and spec.drafts and spec.accepted:
        length = 1 + spec.accepted / spec.drafts
        tpot = per_token(tpot, length)
        tpot_step = False
        notes.append(
            f"{tpot_name} is observed once per engine step, which emits {length:.2f} tokens "
            "on average under speculation: per-token latency is it divided by that mean "
            "accepted length (vLLM 0.11 and later export the per-token "
            "request_time_per_output_token_seconds)"
        )
    return Observation(
        dialect=dialect,
        window_s=window_s,
        pods=tuple(ends),
        spec=spec,
        acceptance_rate_gauge=_mean(rate_g) if accept_len is not None or spec else None,
        accept_length_gauge=accept_len,
        efficiency_gauge=_mean(eff_g),
        spec_steps_gauge=steps,
        generation_tokens=gen,
        prompt_tokens=prompt,
        preemptions=preempt,
        running=_mean(running),
        waiting=_sum_opt(waiting),
        kv_usage=_mean(kv),
        num_gpu_blocks=blocks,
        block_size=size,
        kv_capacity_tokens=tokens,
        tpot=tpot,
        ttft=hists["ttft"],
        queue=hists["queue"],
        e2e=hists["e2e"],
        resets=tuple(resets),
        failed_pods=dict(failed_pods or {}),
        tpot_family=tpot_name if tpot is not None else None,
        tpot_per_step=tpot_step if tpot is not None else False,
        configured_k=configured_k,
        spec_draft_tokens_gauge=draft_per_pass,
        request_acceptance=hists["request_acceptance"],
        engine_version=_version(after),
        notes=tuple(notes),
        per_pod=per_pod,
    )


_NAMING = {
    "sglang_": "names spelled sglang_ (':' rewritten on the way)",
    "vllm_": "names spelled vllm_ (':' rewritten on the way)",
    "trtllm:": "names spelled trtllm: (Dynamo's prefixing)",
    "unprefixed": "names without the trtllm_ prefix",
}


def _version(pages: Sequence[Snapshot]) -> str | None:
    found = sorted(
        {
            p.identity.version + (f"; {_NAMING[p.identity.naming]}" if p.identity.naming else "")
            for p in pages
            if p.identity is not None
        }
    )
    return "; ".join(found) if found else None


def _sglang_counts(
    verify: float,
    generated: float,
    steps: float | None,
    draft_per_pass: float | None,
    notes: list[str],
) -> SpecCounts | None:
    """SGLang's exact window counts from its two counters, or None when they cannot be.

    ``spec_verify_calls_total`` and ``generation_tokens_total`` both grow when a request
    finishes, by its verification passes and its output tokens, so their increases over a
    window give the request-weighted mean accepted length exactly (each pass emits its
    accepted drafts plus one token of the target): accepted drafts are the output tokens
    less one per pass. A length below 1 or above the tokens a pass can verify is not one
    drafter's window (the counters come from different processes or workers), and the
    gauges are read instead.
    """
    length = generated / verify
    most = steps + 1 if steps else draft_per_pass
    if length < 1 or (most is not None and length > most + 1e-9):
        bound = "below 1" if length < 1 else f"above the {most:g} tokens a pass verifies"
        notes.append(
            f"sglang:generation_tokens_total / sglang:spec_verify_calls_total = "
            f"{generated:.0f} / {verify:.0f} = {length:.2f}, {bound}: the two counters do "
            "not describe one drafter, so acceptance comes from the gauges"
        )
        return None
    notes.append(
        f"mean accepted length {length:.3f} = Δsglang:generation_tokens_total / "
        "Δsglang:spec_verify_calls_total (exact over the window, request-weighted; both "
        "count finished requests, so the window lags requests still running)"
    )
    return SpecCounts(drafts=verify, draft_tokens=None, accepted=generated - verify,
                      accepted_per_pos=None)  # fmt: skip


def _check_one_process(pod: str, beg: Snapshot, end: Snapshot, names: Sequence[str | None]) -> None:
    """Refuse a page pair that cannot be one engine process at two moments.

    A restart resets every counter together, so among the speculation counters one going
    back while another goes forward means two processes behind one address (a Service
    scraped instead of its pods) — read as a restart it would invent an acceptance. A
    speculation counter on the start page and missing from the end page is a truncated
    page (an engine cannot stop speculating without a new pod).
    """
    back: list[str] = []
    forward: list[str] = []
    for name in names:
        if name is None or not beg.has(name):
            continue
        _finite(beg, name)
        _finite(end, name)
        if not end.has(name):
            raise InputError(
                f"pod {pod}: {name} is on the window's first page but missing from its last; "
                "the end page looks truncated"
            )
        was, now = _sum(_by_labels(beg.series(name))), _sum(_by_labels(end.series(name)))
        if now < was:
            back.append(name)
        elif now > was:
            forward.append(name)
    if back and forward:
        raise InputError(
            f"pod {pod}: {', '.join(back)} went backwards while {', '.join(forward)} went "
            "forward; these pages are not one engine process (scrape the pods, not a Service)"
        )


def _sum_opt(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return math.fsum(vals) if vals else None
