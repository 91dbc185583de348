"""Write the bundled example /metrics pages under examples/pages/ (deterministic).

The pages imitate real engines' exposition text as listed in reference/engines.md: vLLM V1
with and without speculation (same traffic), vLLM V0 legacy, SGLang and TensorRT-LLM. Each
example is a pair of moments (before/, after/) a window apart, one file per pod. The
README's quick start and the golden tests read them. Run: python3 hack/make_example_pages.py
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest

from spectune.engines.catalogue import (
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    VLLM_ITERATION_TOKENS_BUCKETS,
)

ROOT = Path(__file__).resolve().parent.parent / "operator" / "spectune" / "examples" / "pages"
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
TOTAL_REQUESTS = 5200


class _Static:
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return iter(self._metrics)


def render(metrics: list[Metric]) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Static(metrics))  # type: ignore[arg-type]
    return generate_latest(reg).decode()


def hist(
    name: str, doc: str, labels: dict[str, str], bounds: Sequence[float], obs: np.ndarray
) -> Metric:
    h = HistogramMetricFamily(name, doc, labels=list(labels))
    edges = [*bounds, float("inf")]
    cum = [float(np.sum(obs <= b)) for b in edges]
    buckets = [
        (("+Inf" if np.isinf(b) else repr(float(b))), c) for b, c in zip(edges, cum, strict=True)
    ]
    h.add_metric(list(labels.values()), buckets, float(obs.sum()))
    return h


def counter(name: str, doc: str, labels: dict[str, str], value: float) -> Metric:
    c = CounterMetricFamily(name, doc, labels=list(labels))
    c.add_metric(list(labels.values()), value)
    return c


def gauge(name: str, doc: str, labels: dict[str, str], value: float) -> Metric:
    g = GaugeMetricFamily(name, doc, labels=list(labels))
    g.add_metric(list(labels.values()), value)
    return g


def vllm_v1_page(
    seed: Sequence[int],
    t: float,
    requests: int,
    tpot_mean: float,
    survival: Sequence[float] | None,
    num_gpu_blocks: int,
    running: float,
) -> str:
    """A vLLM V1 page after ``requests`` finished requests (cumulative to moment ``t``)."""
    lab = {"model_name": MODEL, "engine": "0"}
    # Draw every request of the whole run, then keep those finished by moment t, so that
    # a later page is cumulative over an earlier one, as a real counter is.
    rng = np.random.default_rng(list(seed))
    n = TOTAL_REQUESTS
    out_tokens = rng.lognormal(np.log(300) - 0.245, 0.7, n).clip(1, 2048).round()[:requests]
    prompt_tokens = rng.lognormal(np.log(600) - 0.32, 0.8, n).clip(1, 8000).round()[:requests]
    tpot = rng.gamma(16.0, tpot_mean / 16.0, n)[:requests]
    queue = rng.exponential(0.02, n)[:requests]
    ttft = queue + rng.gamma(4.0, 0.06, n)[:requests]
    e2e = ttft + tpot * (out_tokens - 1)
    gen = float(out_tokens.sum())
    metrics: list[Metric] = [
        gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            lab,
            running,
        ),
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", lab, 0.0),
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lab, 0.31),
    ]
    info = GaugeMetricFamily(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        labels=[
            "block_size",
            "cache_dtype",
            "calculate_kv_scales",
            "cpu_offload_gb",
            "enable_prefix_caching",
            "engine",
            "gpu_memory_utilization",
            "is_attention_free",
            "num_cpu_blocks",
            "num_gpu_blocks",
            "num_gpu_blocks_override",
            "sliding_window",
        ],
    )
    info.add_metric(
        [
            "16",
            "auto",
            "False",
            "0",
            "True",
            "0",
            "0.9",
            "False",
            "None",
            str(num_gpu_blocks),
            "None",
            "None",
        ],
        1.0,
    )
    metrics.append(info)
    metrics += [
        counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", lab, 0.0
        ),
        counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            lab,
            float(prompt_tokens.sum()),
        ),
        counter("vllm:generation_tokens", "Number of generation tokens processed.", lab, gen),
    ]
    succ = CounterMetricFamily(
        "vllm:request_success",
        "Count of successfully processed requests.",
        labels=["engine", "finished_reason", "model_name"],
    )
    n_len = int(requests * 0.04)
    for reason, n in (("abort", 0), ("length", n_len), ("stop", requests - n_len)):
        succ.add_metric(["0", reason, MODEL], float(n))
    metrics.append(succ)
    steps_per_req = out_tokens / (1 + (sum(survival) if survival else 0.0))
    iteration = np.resize(np.array([8, 16, 64, 512, 2048]), max(1, int(steps_per_req.sum() / 8)))
    metrics += [
        hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            lab,
            VLLM_ITERATION_TOKENS_BUCKETS,
            iteration,
        ),
        hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            lab,
            TTFT_BUCKETS,
            ttft,
        ),
        hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            lab,
            ITL_BUCKETS,
            np.repeat(tpot * (1 + (sum(survival) if survival else 0.0)), 8),
        ),
        hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            lab,
            ITL_BUCKETS,
            tpot,
        ),
        hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            lab,
            REQUEST_LATENCY_BUCKETS,
            e2e,
        ),
        hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            lab,
            REQUEST_LATENCY_BUCKETS,
            queue,
        ),
        hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            lab,
            REQUEST_LATENCY_BUCKETS,
            tpot * (out_tokens - 1),
        ),
    ]
    if survival is not None:
        k = len(survival)
        passes = float(np.round(gen / (1 + sum(survival))))
        per_pos = [round(passes * s) for s in survival]
        accepted = float(sum(per_pos))
        metrics += [
            counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", lab, passes),
            counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", lab, passes * k
            ),
            counter(
                "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", lab, accepted
            ),
        ]
        pp = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            labels=["engine", "model_name", "position"],
        )
        for i, v in enumerate(per_pos):
            pp.add_metric(["0", MODEL, str(i)], float(v))
        metrics.append(pp)
    return f"# page at t={t:.0f}s\n" + render(metrics)


def write(name: str, moment: str, pod: str, text: str) -> None:
    path = ROOT / name / moment / f"{pod}.prom"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def vllm_pair(
    name: str, survival: Sequence[float] | None, tpot: float, blocks: int, seed: int
) -> None:
    for p in range(2):
        for moment, reqs in (("before", 4000), ("after", 4000 + 1200)):
            text = vllm_v1_page(
                (seed, p),
                0.0 if moment == "before" else 600.0,
                reqs,
                tpot,
                survival,
                blocks,
                running=6.0,
            )
            write(name, moment, f"pod-{p}", text)


def vllm_v0_pair() -> None:
    """Legacy V0: acceptance gauges plus accepted/draft/emitted counters, label model_name."""
    lab = {"model_name": MODEL}
    k = 4
    for p in range(2):
        for moment, passes in (("before", 90_000.0), ("after", 120_000.0 + 1000 * p)):
            accepted = passes * 1.9
            metrics: list[Metric] = [
                gauge(
                    "vllm:num_requests_running",
                    "Number of requests currently running on GPU.",
                    lab,
                    5,
                ),
                gauge(
                    "vllm:num_requests_waiting",
                    "Number of requests waiting to be processed.",
                    lab,
                    0,
                ),
                gauge(
                    "vllm:gpu_cache_usage_perc",
                    "GPU KV-cache usage. 1 means 100 percent usage.",
                    lab,
                    0.4,
                ),
                gauge(
                    "vllm:spec_decode_draft_acceptance_rate",
                    "Speulative token acceptance rate.",
                    lab,
                    1.9 / k,
                ),
                gauge(
                    "vllm:spec_decode_efficiency",
                    "Speculative decoding system efficiency.",
                    lab,
                    2.9 / (k + 1),
                ),
                counter(
                    "vllm:spec_decode_num_accepted_tokens",
                    "Number of accepted tokens.",
                    lab,
                    accepted,
                ),
                counter(
                    "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", lab, passes * k
                ),
                counter(
                    "vllm:spec_decode_num_emitted_tokens",
                    "Number of emitted tokens.",
                    lab,
                    accepted + passes,
                ),
                counter(
                    "vllm:generation_tokens",
                    "Number of generation tokens processed.",
                    lab,
                    accepted + passes,
                ),
            ]
            write("vllm-v0-k4", moment, f"pod-{p}", render(metrics))


def sglang_pair() -> None:
    """SGLang: spec acceptance only as interval gauges, per TP rank."""
    for p in range(2):
        for moment, gen in (("before", 2.0e6), ("after", 2.6e6)):
            metrics: list[Metric] = []
            for rank in ("0", "1"):
                lab = {
                    "model_name": MODEL,
                    "engine_type": "unified",
                    "tp_rank": rank,
                    "pp_rank": "0",
                }
                metrics += [
                    gauge("sglang:num_running_reqs", "The number of running requests.", lab, 12),
                    gauge(
                        "sglang:num_queue_reqs",
                        "The number of requests in the waiting queue.",
                        lab,
                        1,
                    ),
                    gauge("sglang:token_usage", "The token usage.", lab, 0.55),
                    gauge(
                        "sglang:max_total_num_tokens",
                        "Maximum total number of tokens.",
                        lab,
                        412_000,
                    ),
                    gauge(
                        "sglang:spec_accept_length",
                        "The average acceptance length of speculative decoding.",
                        lab,
                        2.8 + 0.05 * p,
                    ),
                    gauge(
                        "sglang:spec_accept_rate",
                        "The average acceptance rate of speculative decoding.",
                        lab,
                        (1.8 + 0.05 * p) / 3,
                    ),
                    counter(
                        "sglang:generation_tokens",
                        "Number of generation tokens processed.",
                        lab,
                        gen,
                    ),
                    counter(
                        "sglang:prompt_tokens", "Number of prefill tokens processed.", lab, gen * 2
                    ),
                ]
            write("sglang-eagle3", moment, f"pod-{p}", render(metrics))


def trtllm_pair() -> None:
    """TensorRT-LLM: counters with per-position drafted/accepted tokens."""
    lab0 = {"model_name": MODEL, "engine_type": "trtllm"}
    survival = [0.74, 0.52, 0.35]
    for moment, passes in (("before", 50_000.0), ("after", 80_000.0)):
        metrics: list[Metric] = [
            gauge("trtllm_num_requests_running", "Running requests.", lab0, 9),
            gauge("trtllm_num_requests_waiting", "Waiting requests.", lab0, 0),
            gauge("trtllm_kv_cache_utilization", "KV cache utilization.", lab0, 0.3),
            counter("trtllm_spec_decode_num_draft_tokens", "Draft tokens.", lab0, passes * 3),
            counter(
                "trtllm_spec_decode_num_accepted_tokens",
                "Accepted tokens.",
                lab0,
                passes * sum(survival),
            ),
            gauge(
                "trtllm_spec_decode_acceptance_length",
                "Acceptance length.",
                lab0,
                1 + sum(survival),
            ),
        ]
        drafted = CounterMetricFamily(
            "trtllm_spec_decode_drafted_tokens",
            "Drafted tokens per position.",
            labels=["engine_type", "model_name", "token_position"],
        )
        acc = CounterMetricFamily(
            "trtllm_spec_decode_accepted_tokens",
            "Accepted tokens per position.",
            labels=["engine_type", "model_name", "token_position"],
        )
        for i, s in enumerate(survival):
            drafted.add_metric(["trtllm", MODEL, str(i)], passes)
            acc.add_metric(["trtllm", MODEL, str(i)], round(passes * s))
        metrics += [drafted, acc]
        write("trtllm-eagle3-k3", moment, "pod-0", render(metrics))


def main() -> None:
    survival = [0.78, 0.59, 0.44, 0.32, 0.23, 0.16, 0.11]  # EAGLE-3 on chat, k = 7
    e7 = 1 + sum(survival)
    c = 0.12
    tpot_off = 0.030
    vllm_pair("vllm-eagle3-k7", survival, tpot_off * (1 + c * 7) / e7, 10_750, seed=1)
    vllm_pair("vllm-off", None, tpot_off, 11_360, seed=2)
    vllm_pair("vllm-ngram-k4-low", [0.22, 0.07, 0.02, 0.01], tpot_off * 1.08, 11_360, seed=3)
    vllm_v0_pair()
    sglang_pair()
    trtllm_pair()


if __name__ == "__main__":
    main()
