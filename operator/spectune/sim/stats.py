"""Cumulative counters and histograms of one simulated engine, as the engine itself keeps them.

The engine feeds these in bulk (a whole run of steps at once), and the exposition module
turns them into a vLLM or SGLang ``/metrics`` page. They reset when a replica restarts, as
a real pod's counters do. Bucket edges come from :mod:`spectune.engines.catalogue` (vLLM)
and ``reference/engines.md`` §2.2 (SGLang).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from prometheus_client.utils import floatToGoString

from spectune.engines.catalogue import (
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    VLLM_ITERATION_TOKENS_BUCKETS,
)

__all__ = [
    "SGLANG_E2E_BUCKETS",
    "SGLANG_ITL_BUCKETS",
    "SGLANG_QUEUE_BUCKETS",
    "SGLANG_TTFT_BUCKETS",
    "EngineStats",
    "Hist",
    "buckets_1_2_5",
]

# SGLang defaults (reference/engines.md §2.2, python/sglang/srt/metrics/collector.py).
SGLANG_TTFT_BUCKETS: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
    200.0, 400.0,
)  # fmt: skip
SGLANG_ITL_BUCKETS: tuple[float, ...] = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
    0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0,
)  # fmt: skip
SGLANG_E2E_BUCKETS: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
    200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0,
)  # fmt: skip
SGLANG_QUEUE_BUCKETS: tuple[float, ...] = (
    0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0,
    1000.0, 1200.0, 1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0,
)  # fmt: skip


def buckets_1_2_5(max_value: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return tuple(out)
            out.append(float(v))
        exponent += 1


class Hist:
    """A cumulative Prometheus histogram: per-bucket counts (last = +Inf) and a sum.

    Observations are buffered and binned in bulk when the histogram is read (or the buffer
    grows), because the engine observes a few values at a time many thousands of times
    and numpy's per-call cost would dominate.
    """

    __slots__ = (
        "_bounds_list",
        "_counts",
        "_les",
        "_scalar_weights",
        "_scalars",
        "_total",
        "_values",
        "_weighted_values",
        "_weighted_weights",
        "_weights",
        "bounds",
    )

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds: NDArray[np.float64] = np.asarray(bounds, dtype=float)
        self._bounds_list = [float(b) for b in bounds]
        # prometheus_client's own spelling of `le` ("1.0", "0.001", "+Inf")
        self._les: list[str] = [floatToGoString(b) for b in self._bounds_list]  # type: ignore[no-untyped-call]
        self._counts: NDArray[np.int64] = np.zeros(len(bounds) + 1, dtype=np.int64)
        self._total = 0.0
        self._scalars: list[float] = []
        self._scalar_weights: list[float] = []
        self._values: list[NDArray[np.float64]] = []
        self._weights: list[float] = []
        self._weighted_values: list[NDArray[np.float64]] = []
        self._weighted_weights: list[NDArray[np.float64]] = []

    def observe(self, value: float, weight: float = 1.0) -> None:
        """One observation, counted ``weight`` times (``le`` is inclusive, as in Prometheus)."""
        self._scalars.append(value)
        self._scalar_weights.append(weight)
        if len(self._scalars) >= 4096:
            self._flush()

    def observe_many(
        self, values: NDArray[np.float64], weight: float | NDArray[np.float64] = 1.0
    ) -> None:
        """Many observations, each counted ``weight`` times (the sum grows by value·weight).

        ``weight`` is one number for all values, or one per value.
        """
        if isinstance(weight, np.ndarray):
            self._weighted_values.append(values)
            self._weighted_weights.append(weight)
        else:
            self._values.append(values)
            self._weights.append(weight)
        if len(self._values) + len(self._weighted_values) >= 1024:
            self._flush()

    def _flush(self) -> None:
        parts_v = self._values
        parts_w = [
            np.repeat(
                np.array(self._weights), np.fromiter((len(v) for v in parts_v), dtype=np.int64)
            )
        ]
        if self._scalars:
            parts_v = [*parts_v, np.array(self._scalars, dtype=float)]
            parts_w.append(np.array(self._scalar_weights, dtype=float))
            self._scalars.clear()
            self._scalar_weights.clear()
        if self._weighted_values:
            parts_v = [*parts_v, *self._weighted_values]
            parts_w += self._weighted_weights
            self._weighted_values = []
            self._weighted_weights = []
        if not parts_v:
            return
        values = np.concatenate(parts_v)
        weights = np.concatenate(parts_w)
        self._values.clear()
        self._weights.clear()
        idx = np.searchsorted(self.bounds, values, side="left")
        binned = np.bincount(idx, weights=weights, minlength=len(self._counts))
        self._counts += np.rint(binned).astype(np.int64)
        self._total += float(values @ weights)

    @property
    def counts(self) -> NDArray[np.int64]:
        """Per-bucket (not cumulative) counts; the last is the +Inf overflow."""
        self._flush()
        return self._counts

    @property
    def total(self) -> float:
        """Sum of the observed values."""
        self._flush()
        return self._total

    @property
    def count(self) -> int:
        """Number of observations."""
        return int(self.counts.sum())

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs as Prometheus exposes them, ending with ``+Inf``."""
        cum = np.cumsum(self.counts)
        out = [(le, float(c)) for le, c in zip(self._les, cum, strict=False)]
        out.append(("+Inf", float(cum[-1])))
        return out


class EngineStats:
    """Everything one engine has counted since it started."""

    def __init__(self, max_model_len: int, num_spec_tokens: int, sglang: bool) -> None:
        self.preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = {"stop": 0, "length": 0, "abort": 0}
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.num_requests = 0
        # speculation (vLLM V1 semantics, reference/engines.md §1.1)
        self.num_spec_tokens = num_spec_tokens
        self.drafts = 0
        self.draft_tokens = 0
        # how many (request, pass) pairs accepted exactly L drafts, L = 0..K; the accepted
        # and per-position counters follow from it
        self.accepted_hist: NDArray[np.int64] = np.zeros(num_spec_tokens + 1, dtype=np.int64)
        # histograms, vLLM V1 buckets
        self.iteration_tokens = Hist(VLLM_ITERATION_TOKENS_BUCKETS)
        self.ttft = Hist(TTFT_BUCKETS)
        self.itl = Hist(ITL_BUCKETS)
        self.tpot = Hist(ITL_BUCKETS)
        self.e2e = Hist(REQUEST_LATENCY_BUCKETS)
        self.queue = Hist(REQUEST_LATENCY_BUCKETS)
        self.inference = Hist(REQUEST_LATENCY_BUCKETS)
        self.prefill = Hist(REQUEST_LATENCY_BUCKETS)
        self.decode = Hist(REQUEST_LATENCY_BUCKETS)
        token_buckets = buckets_1_2_5(max_model_len)
        self.req_prompt_tokens = Hist(token_buckets)
        self.req_generation_tokens = Hist(token_buckets)
        self.req_max_generation_tokens = Hist(token_buckets)
        self.req_params_max_tokens = Hist(token_buckets)
        self.req_params_n = Hist((1.0, 2.0, 5.0, 10.0, 20.0))
        # SGLang's own histograms and interval gauges (only fed for engine: sglang)
        self.sglang = sglang
        self.sg_ttft = Hist(SGLANG_TTFT_BUCKETS)
        self.sg_itl = Hist(SGLANG_ITL_BUCKETS)
        self.sg_e2e = Hist(SGLANG_E2E_BUCKETS)
        self.sg_queue = Hist(SGLANG_QUEUE_BUCKETS)
        self.sg_interval_batches = 0
        self.sg_interval_forwards = 0
        self.sg_interval_emitted = 0
        self.sg_interval_tokens = 0
        self.sg_interval_start = 0.0
        self._finished: list[tuple[float, ...]] = []
        self.sg_accept_length = 0.0
        self.sg_accept_rate = 0.0
        self.sg_gen_throughput = 0.0

    @property
    def accepted(self) -> int:
        """``vllm:spec_decode_num_accepted_tokens_total``."""
        h = self.accepted_hist
        return int((h * np.arange(len(h))).sum())

    @property
    def accepted_per_pos(self) -> NDArray[np.int64]:
        """``..._per_pos_total``: position i counts passes that accepted drafts 0..i."""
        h = self.accepted_hist
        per_pos: NDArray[np.int64] = np.cumsum(h[::-1])[::-1][1:]
        return per_pos

    def request_finished(
        self,
        e2e: float,
        queue: float,
        inference: float,
        prefill: float,
        decode: float,
        prompt_tokens: int,
        generation_tokens: int,
        max_tokens: int,
    ) -> None:
        """Record one finished request's phases; binned into the histograms on :meth:`sync`."""
        self._finished.append(
            (e2e, queue, inference, prefill, decode, prompt_tokens, generation_tokens, max_tokens)
        )
        if len(self._finished) >= 4096:
            self.sync()

    def sync(self) -> None:
        """Bin the finished requests recorded since the last call (call before reading)."""
        if not self._finished:
            return
        rows = np.array(self._finished, dtype=float)
        self._finished.clear()
        e2e, queue, inference, prefill, decode, prompt, generated, max_tokens = rows.T
        self.e2e.observe_many(e2e)
        self.queue.observe_many(queue)
        self.inference.observe_many(inference)
        self.prefill.observe_many(prefill)
        self.decode.observe_many(decode)
        several = generated > 1
        self.tpot.observe_many(decode[several] / (generated[several] - 1))
        self.req_prompt_tokens.observe_many(prompt)
        self.req_generation_tokens.observe_many(generated)
        self.req_max_generation_tokens.observe_many(max_tokens)
        self.req_params_max_tokens.observe_many(max_tokens)
        self.req_params_n.observe_many(np.ones(len(rows)))
        if self.sglang:
            self.sg_e2e.observe_many(e2e)
            self.sg_queue.observe_many(queue)
