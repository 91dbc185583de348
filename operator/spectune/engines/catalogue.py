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
    "PageIdentity",
    "catalogue_for",
    "detect_dialect",
    "identify_page",
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
    # -- version-dependent and engine-specific families (absent: None / empty) ----------
    #: KV usage gauge of older versions, read where ``kv_usage`` is absent.
    kv_usage_fallback: str | None = None
    #: whether ``tpot_hist`` is observed once per engine step (not per token): with
    #: speculation one step emits the mean accepted length of tokens, so its values are
    #: divided by it.
    tpot_per_step: bool = False
    #: latency histograms read, in order, where ``tpot_hist`` is absent, each with whether
    #: it is per step (as ``tpot_per_step``).
    tpot_fallbacks: tuple[tuple[str, bool], ...] = ()
    #: counter of verification passes of finished requests (SGLang).
    verify_calls: str | None = None
    #: gauges of the active draft depth and tokens per verification (SGLang adaptive tiers).
    spec_steps_gauge: str | None = None
    spec_draft_tokens_gauge: str | None = None
    #: info gauge whose labels are the speculative config (TensorRT-LLM).
    spec_config_info: str | None = None
    #: KV capacity as blocks and tokens per block (TensorRT-LLM).
    kv_max_blocks: str | None = None
    kv_tokens_per_block: str | None = None
    #: histogram of per-request acceptance rates over finished requests.
    request_acceptance_hist: str | None = None
    #: labels whose series repeat one value (tensor/pipeline/expert-parallel ranks of one
    #: scheduler): gauges are averaged over them before engines are combined.
    replica_labels: tuple[str, ...] = ()

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
    kv_usage_fallback="vllm:gpu_cache_usage_perc",
    tpot_fallbacks=(
        ("vllm:inter_token_latency_seconds", True),
        ("vllm:time_per_output_token_seconds", True),
    ),
    request_acceptance_hist="vllm:request_spec_decode_acceptance_rate",
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
    queue_hist="vllm:request_queue_time_seconds",
    e2e_hist="vllm:e2e_request_latency_seconds",
    itl_hist=None,
    engine_label=None,
    signature=("vllm:num_requests_running", "vllm:gpu_cache_usage_perc"),
    tpot_per_step=True,
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
    engine_label="dp_rank",
    signature=("sglang:num_running_reqs",),
    tpot_fallbacks=(("sglang:time_per_output_token_seconds", False),),
    verify_calls="sglang:spec_verify_calls_total",
    spec_steps_gauge="sglang:spec_num_steps",
    spec_draft_tokens_gauge="sglang:spec_num_draft_tokens",
    replica_labels=("tp_rank", "pp_rank", "moe_ep_rank", "attn_cp_rank"),
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
    spec_config_info="trtllm_speculative_config_info",
    kv_max_blocks="trtllm_kv_cache_max_blocks",
    kv_tokens_per_block="trtllm_kv_cache_tokens_per_block",
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


@dataclass(frozen=True)
class PageIdentity:
    """Which engine a page comes from, which version range its families place it in, and
    how its names were spelled.

    ``version`` is inferred from the families the page holds (each engine added and renamed
    families at known releases, ``reference/engines.md`` §1.1–§1.4, §2.2, §3); it is a
    range, stated with the evidence, never a claim read from the page. ``naming`` is None
    for the engine's own spelling, otherwise the spelling the page used (``sglang_`` when
    a router or pipeline rewrote ``:``; ``trtllm:`` or no prefix for TensorRT-LLM behind
    Dynamo or ``trtllm-serve``'s ``/prometheus/metrics``); the parser renames such pages'
    samples to the catalogue's names.
    """

    dialect: Dialect
    version: str
    naming: str | None = None

    def canonical(self, name: str) -> str:
        """The catalogue's spelling of a sample name of this page."""
        if self.naming is None:
            return name
        if self.naming in ("sglang_", "vllm_"):
            engine = self.naming[:-1]
            return engine + ":" + name[len(self.naming) :] if name.startswith(self.naming) else name
        if self.naming == "trtllm:":
            return "trtllm_" + name[len("trtllm:") :] if name.startswith("trtllm:") else name
        if self.naming == "unprefixed" and ":" not in name and not name.startswith(_FOREIGN):
            return "trtllm_" + name
        return name


#: Families of TensorRT-LLM without their ``trtllm_`` prefix (what ``trtllm-serve`` exposed
#: on ``/prometheus/metrics`` before the prefix, e.g. vllm-project/aibrix#2004).
_TRTLLM_BARE = frozenset(
    {
        "num_requests_running", "num_requests_waiting", "kv_cache_utilization",
        "kv_cache_max_blocks", "kv_cache_free_blocks", "kv_cache_used_blocks",
        "kv_cache_tokens_per_block", "iteration_latency_seconds",
        "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
        "spec_decode_acceptance_length", "spec_decode_draft_overhead",
        "spec_decode_drafted_tokens", "spec_decode_accepted_tokens", "speculative_config_info",
        "e2e_request_latency_seconds", "time_to_first_token_seconds",
        "time_per_output_token_seconds", "request_queue_time_seconds", "request_success",
    }
)  # fmt: skip
#: Name prefixes of process and runtime collectors, never engine families.
_FOREIGN = ("python_", "process_", "go_", "http_", "nv_", "dynamo_")


def _strip(name: str) -> str:
    for suffix in ("_total", "_bucket", "_count", "_sum", "_created"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _versions(lo: tuple[int, ...] | None, hi: tuple[int, ...] | None) -> str:
    def v(t: tuple[int, ...]) -> str:
        return ".".join(str(x) for x in t)

    if lo and hi:
        return f"{v(lo)} to before {v(hi)}" if lo < hi else f"about {v(lo)} (mixed families)"
    if lo:
        return f"{v(lo)} or later"
    if hi:
        return f"before {v(hi)}"
    return "version not told by the page"


def _vllm_identity(names: set[str], labels: set[str]) -> PageIdentity:
    v0_only = {
        "vllm:spec_decode_draft_acceptance_rate",
        "vllm:spec_decode_efficiency",
        "vllm:spec_decode_num_emitted_tokens_total",
        "vllm:num_requests_swapped",
        "vllm:cpu_cache_usage_perc",
        # best_of left with V0 (V1 never took the parameter).
        "vllm:request_params_best_of_bucket",
    }
    v1_only = {
        "vllm:kv_cache_usage_perc",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:request_time_per_output_token_seconds_bucket",
    }
    if names & v0_only and not names & v1_only and "engine" not in labels:
        return PageIdentity(Dialect.VLLM_V0, "vLLM V0 engine (0.10 or earlier)")
    # Each family bounds the version: added in (lo) or gone from (hi) a release.
    lo: tuple[int, ...] | None = None
    hi: tuple[int, ...] | None = None
    why: list[str] = []

    def at_least(v: tuple[int, ...], reason: str) -> None:
        nonlocal lo
        if lo is None or v > lo:
            lo = v
        why.append(reason)

    def before(v: tuple[int, ...], reason: str) -> None:
        nonlocal hi
        if hi is None or v < hi:
            hi = v
        why.append(reason)

    spec = {
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    }
    if VLLM_V1.accepted_per_pos in names or VLLM_V1.drafts in names:
        at_least((0, 8, 5), "num_drafts and per-position counters (vllm#16665)")
    elif names & spec:
        before((0, 8, 5), "draft/accepted counters without num_drafts (vllm#15151)")
        at_least((0, 8, 3), "V1 spec counters (vllm#15151)")
    if "vllm:kv_cache_usage_perc" in names:
        at_least((0, 9), "kv_cache_usage_perc")
    elif "vllm:gpu_cache_usage_perc" in names:
        before((0, 9), "gpu_cache_usage_perc without kv_cache_usage_perc")
    if "vllm:inter_token_latency_seconds_bucket" in names:
        at_least((0, 11), "inter_token_latency_seconds")
    elif "vllm:time_per_output_token_seconds_bucket" in names:
        before((0, 11), "time_per_output_token_seconds without inter_token_latency_seconds")
    if "vllm:gpu_cache_usage_perc" in names and "vllm:kv_cache_usage_perc" in names:
        before((0, 11), "the deprecated gpu_cache_usage_perc beside kv_cache_usage_perc")
    if VLLM_V1.request_acceptance_hist is not None and (
        VLLM_V1.request_acceptance_hist + "_bucket" in names
    ):
        why.append("per-request acceptance histogram (vllm#44487)")
    version = f"vLLM V1 engine, {_versions(lo, hi)}"
    if why:
        version += " (" + "; ".join(why) + ")"
    return PageIdentity(Dialect.VLLM_V1, version)


def _sglang_identity(names: set[str], labels: set[str], naming: str | None) -> PageIdentity:
    why: list[str] = []
    if "sglang:spec_verify_calls_total" in names:
        why.append("spec_verify_calls_total: 2026 releases")
    if "sglang:spec_num_steps" in names or "sglang:spec_num_draft_tokens" in names:
        why.append("active-tier gauges of adaptive speculation (sglang#21599, 2026)")
    if "tp_rank" in labels:
        why.append(
            "per-rank labels tp_rank/pp_rank (seen from 0.5.1; sglang#4444's 2025-03 page has none)"
        )
    if "name" in labels and "model_name" not in labels:
        why.append("label 'name' instead of 'model_name' (0.3.x, 2024)")
    if "sglang:time_per_output_token_seconds_bucket" in names:
        why.append("time_per_output_token_seconds (older releases)")
    version = "SGLang" + (" (" + "; ".join(why) + ")" if why else ", version not told by the page")
    return PageIdentity(Dialect.SGLANG, version, naming)


def _trtllm_identity(names: set[str], naming: str | None) -> PageIdentity:
    if names & {
        "trtllm_spec_decode_num_draft_tokens_total",
        "trtllm_spec_decode_acceptance_length",
    }:
        version = "TensorRT-LLM, 2026 metrics collector (spec_decode families)"
    else:
        version = (
            "TensorRT-LLM, no spec_decode families (a release before its 2026 collector, "
            "or speculation off)"
        )
    return PageIdentity(Dialect.TRTLLM, version, naming)


def identify_page(family_names: Iterable[str], label_names: Iterable[str] = ()) -> PageIdentity:
    """Tell the engine, version range and spelling of a page from its names and labels.

    Detection falls back on the name prefix: any ``vllm:`` series makes a vLLM page (V0
    only when it holds V0-only families and nothing V1 has), any ``sglang:`` or
    ``sglang_`` series an SGLang page, any ``trtllm_``/``trtllm:`` series a TensorRT-LLM
    one, and unprefixed TensorRT-LLM family names with its ``engine_type`` label an
    unprefixed TensorRT-LLM page. Whether the page then holds what a window needs is the
    reader's question, answered with the missing names. Raises
    :class:`~spectune.errors.InputError` when no engine's names are on the page.
    """
    raw = set(family_names)
    labels = set(label_names)
    # prometheus_client's parser strips _total from counter family names; accept both.
    raw |= {n + "_total" for n in raw}
    if any(n.startswith("vllm:") for n in raw):
        return _vllm_identity(raw, labels)
    if any(n.startswith("vllm_") for n in raw) and not any(":" in n for n in raw):
        ident = _vllm_identity(
            {"vllm:" + n[5:] if n.startswith("vllm_") else n for n in raw}, labels
        )
        return PageIdentity(ident.dialect, ident.version, "vllm_")
    if any(n.startswith("sglang:") for n in raw):
        return _sglang_identity(raw, labels, None)
    if any(n.startswith("sglang_") for n in raw):
        renamed = {"sglang:" + n[7:] if n.startswith("sglang_") else n for n in raw}
        return _sglang_identity(renamed, labels, "sglang_")
    if any(n.startswith("trtllm_") for n in raw):
        return _trtllm_identity(raw, None)
    if any(n.startswith("trtllm:") for n in raw):
        return _trtllm_identity(
            {"trtllm_" + n[7:] if n.startswith("trtllm:") else n for n in raw}, "trtllm:"
        )
    bare = {_strip(n) for n in raw if ":" not in n}
    if bare & _TRTLLM_BARE and (
        "engine_type" in labels
        or bare
        & {"kv_cache_utilization", "spec_decode_acceptance_length", "iteration_latency_seconds"}
    ):
        return _trtllm_identity({"trtllm_" + n for n in raw if ":" not in n}, "unprefixed")
    raise InputError(
        "this page is not from a serving engine spectune knows (no vllm:, sglang:/sglang_ or "
        "trtllm_/trtllm: series, nor TensorRT-LLM's unprefixed families); point spectune at "
        "the engine's /metrics endpoint"
    )


def detect_dialect(family_names: Iterable[str], label_names: Iterable[str] = ()) -> Dialect:
    """The dialect of a page from its family names (see :func:`identify_page`)."""
    return identify_page(family_names, label_names).dialect
