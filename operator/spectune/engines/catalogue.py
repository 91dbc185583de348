"""What each engine exports: metric names, kinds, labels and buckets, per dialect.

This module is *what to ask*; ``spectune.metrics`` is *how to ask*. The simulator uses the
same names to produce its pages, and the parsers use them to read pages, so the two can
never drift apart. Names follow ``reference/engines.md`` (§1.1, §1.2, §1.4, §2.2, §3) and
are the names Prometheus sees: counters carry their ``_total`` suffix here.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from spectune.errors import InputError

__all__ = [
    "ITL_BUCKETS",
    "REQUEST_LATENCY_BUCKETS",
    "SGLANG",
    "TRTLLM",
    "TTFT_BUCKETS",
    "VLLM_ITERATION_TOKENS_BUCKETS",
    "VLLM_V0",
    "VLLM_V1",
    "Catalogue",
    "Dialect",
    "catalogue_for",
    "detect_dialect",
]


class Dialect(enum.Enum):
    """The metric dialect of a serving engine."""

    VLLM_V1 = "vllm"
    VLLM_V0 = "vllm-v0"
    SGLANG = "sglang"
    TRTLLM = "trtllm"


# vLLM V1 histogram buckets (vllm/v1/metrics/buckets.py, reference/engines.md §1.4).
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
VLLM_ITERATION_TOKENS_BUCKETS: tuple[float, ...] = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
)  # fmt: skip


@dataclass(frozen=True)
class Catalogue:
    """The series names one dialect uses for each quantity spectune reads.

    ``None`` means the dialect does not export that quantity. Counter names include the
    ``_total`` suffix; histogram names are the base name (``_bucket``/``_sum``/``_count``
    are appended by the exposition format).
    """

    dialect: Dialect
    # speculation counters (cumulative)
    drafts: str | None
    draft_tokens: str | None
    accepted_tokens: str | None
    accepted_per_pos: str | None
    position_label: str | None
    drafted_per_pos: str | None
    emitted_tokens: str | None
    # speculation gauges (interval ratios, not cumulative)
    acceptance_rate_gauge: str | None
    accept_length_gauge: str | None
    efficiency_gauge: str | None
    # load, queue, KV
    running: str
    waiting: str
    kv_usage: str | None
    cache_config_info: str | None
    kv_capacity_tokens_gauge: str | None
    preemptions: str | None
    generation_tokens: str | None
    prompt_tokens: str | None
    # latency histograms
    tpot_hist: str | None
    ttft_hist: str | None
    queue_hist: str | None
    e2e_hist: str | None
    itl_hist: str | None
    # label that separates data-parallel engines / ranks on one pod
    engine_label: str | None
    # families whose presence identifies the dialect
    signature: tuple[str, ...]

    def spec_counter_names(self) -> tuple[str, ...]:
        """Names of the speculation counters this dialect exports."""
        names = (
            self.drafts,
            self.draft_tokens,
            self.accepted_tokens,
            self.accepted_per_pos,
            self.drafted_per_pos,
            self.emitted_tokens,
        )
        return tuple(n for n in names if n is not None)


VLLM_V1 = Catalogue(
    dialect=Dialect.VLLM_V1,
    drafts="vllm:spec_decode_num_drafts_total",
    draft_tokens="vllm:spec_decode_num_draft_tokens_total",
    accepted_tokens="vllm:spec_decode_num_accepted_tokens_total",
    accepted_per_pos="vllm:spec_decode_num_accepted_tokens_per_pos_total",
    position_label="position",
    drafted_per_pos=None,
    emitted_tokens=None,
    acceptance_rate_gauge=None,
    accept_length_gauge=None,
    efficiency_gauge=None,
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    kv_usage="vllm:kv_cache_usage_perc",
    cache_config_info="vllm:cache_config_info",
    kv_capacity_tokens_gauge=None,
    preemptions="vllm:num_preemptions_total",
    generation_tokens="vllm:generation_tokens_total",
    prompt_tokens="vllm:prompt_tokens_total",
    tpot_hist="vllm:request_time_per_output_token_seconds",
    ttft_hist="vllm:time_to_first_token_seconds",
    queue_hist="vllm:request_queue_time_seconds",
    e2e_hist="vllm:e2e_request_latency_seconds",
    itl_hist="vllm:inter_token_latency_seconds",
    engine_label="engine",
    signature=("vllm:num_requests_running", "vllm:kv_cache_usage_perc"),
)

VLLM_V0 = Catalogue(
    dialect=Dialect.VLLM_V0,
    drafts=None,
    draft_tokens="vllm:spec_decode_num_draft_tokens_total",
    accepted_tokens="vllm:spec_decode_num_accepted_tokens_total",
    accepted_per_pos=None,
    position_label=None,
    drafted_per_pos=None,
    emitted_tokens="vllm:spec_decode_num_emitted_tokens_total",
    acceptance_rate_gauge="vllm:spec_decode_draft_acceptance_rate",
    accept_length_gauge=None,
    efficiency_gauge="vllm:spec_decode_efficiency",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    kv_usage="vllm:gpu_cache_usage_perc",
    cache_config_info="vllm:cache_config_info",
    kv_capacity_tokens_gauge=None,
    preemptions="vllm:num_preemptions_total",
    generation_tokens="vllm:generation_tokens_total",
    prompt_tokens="vllm:prompt_tokens_total",
    tpot_hist="vllm:time_per_output_token_seconds",
    ttft_hist="vllm:time_to_first_token_seconds",
    queue_hist=None,
    e2e_hist="vllm:e2e_request_latency_seconds",
    itl_hist=None,
    engine_label=None,
    signature=("vllm:num_requests_running", "vllm:gpu_cache_usage_perc"),
)

SGLANG = Catalogue(
    dialect=Dialect.SGLANG,
    drafts=None,
    draft_tokens=None,
    accepted_tokens=None,
    accepted_per_pos=None,
    position_label=None,
    drafted_per_pos=None,
    emitted_tokens=None,
    acceptance_rate_gauge="sglang:spec_accept_rate",
    accept_length_gauge="sglang:spec_accept_length",
    efficiency_gauge=None,
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    kv_usage="sglang:token_usage",
    cache_config_info=None,
    kv_capacity_tokens_gauge="sglang:max_total_num_tokens",
    preemptions="sglang:num_retracted_requests_total",
    generation_tokens="sglang:generation_tokens_total",
    prompt_tokens="sglang:prompt_tokens_total",
    tpot_hist="sglang:inter_token_latency_seconds",
    ttft_hist="sglang:time_to_first_token_seconds",
    queue_hist="sglang:queue_time_seconds",
    e2e_hist="sglang:e2e_request_latency_seconds",
    itl_hist="sglang:inter_token_latency_seconds",
    engine_label="tp_rank",
    signature=("sglang:num_running_reqs",),
)

TRTLLM = Catalogue(
    dialect=Dialect.TRTLLM,
    drafts=None,
    draft_tokens="trtllm_spec_decode_num_draft_tokens_total",
    accepted_tokens="trtllm_spec_decode_num_accepted_tokens_total",
    accepted_per_pos="trtllm_spec_decode_accepted_tokens_total",
    position_label="token_position",
    drafted_per_pos="trtllm_spec_decode_drafted_tokens_total",
    emitted_tokens=None,
    acceptance_rate_gauge=None,
    accept_length_gauge="trtllm_spec_decode_acceptance_length",
    efficiency_gauge=None,
    running="trtllm_num_requests_running",
    waiting="trtllm_num_requests_waiting",
    kv_usage="trtllm_kv_cache_utilization",
    cache_config_info=None,
    kv_capacity_tokens_gauge=None,
    preemptions=None,
    generation_tokens=None,
    prompt_tokens=None,
    tpot_hist="trtllm_time_per_output_token_seconds",
    ttft_hist="trtllm_time_to_first_token_seconds",
    queue_hist="trtllm_request_queue_time_seconds",
    e2e_hist="trtllm_e2e_request_latency_seconds",
    itl_hist=None,
    engine_label=None,
    signature=("trtllm_num_requests_running",),
)

_BY_DIALECT = {c.dialect: c for c in (VLLM_V1, VLLM_V0, SGLANG, TRTLLM)}


def catalogue_for(dialect: Dialect | str) -> Catalogue:
    """Return the catalogue of a dialect, given as a :class:`Dialect` or its value.

    Raises :class:`~spectune.errors.InputError` naming the valid dialects on an unknown name.
    """
    if isinstance(dialect, Dialect):
        return _BY_DIALECT[dialect]
    for d, cat in _BY_DIALECT.items():
        if d.value == dialect:
            return cat
    valid = ", ".join(d.value for d in Dialect)
    raise InputError(f"unknown engine dialect {dialect!r}; valid dialects: {valid}")


def detect_dialect(family_names: Iterable[str]) -> Dialect:
    """Tell the dialect of a page from the names of the metric families it holds.

    V1 and V0 vLLM share most names; V0 is recognised by its KV gauge
    ``vllm:gpu_cache_usage_perc`` without the V1 ``vllm:kv_cache_usage_perc``, or by its
    legacy acceptance gauge. Raises :class:`~spectune.errors.InputError` when the page is
    not from a serving engine spectune knows.
    """
    names = set(family_names)
    # prometheus_client's parser strips _total from counter family names; accept both.
    names |= {n + "_total" for n in names}
    if "vllm:kv_cache_usage_perc" in names or VLLM_V1.accepted_per_pos in names:
        return Dialect.VLLM_V1
    if "vllm:spec_decode_draft_acceptance_rate" in names or "vllm:gpu_cache_usage_perc" in names:
        return Dialect.VLLM_V0
    if "vllm:num_requests_running" in names:
        return Dialect.VLLM_V1
    if any(n.startswith("sglang:") for n in names):
        return Dialect.SGLANG
    if any(n.startswith("trtllm_") for n in names):
        return Dialect.TRTLLM
    raise InputError(
        "this page is not from a serving engine spectune knows (no vllm:, sglang: or trtllm_ "
        "metrics); point spectune at the engine's /metrics endpoint"
    )
