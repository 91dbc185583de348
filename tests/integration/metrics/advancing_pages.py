"""A small local HTTP server whose vLLM V1 pages advance with the wall clock.

Counters grow linearly in time at fixed rates, so the figures of any window are known in
closed form and the page at any moment can be rendered directly: the page-pair path and
Prometheus see the same pods. Serves only on 127.0.0.1.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from spectune.engines.catalogue import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS

MODEL = "llama-test"


@dataclass(frozen=True)
class PodRates:
    """Per-second rates of one synthetic pod."""

    drafts_per_s: float = 400.0
    survival: Sequence[float] = (0.8, 0.6, 0.45, 0.3)
    requests_per_s: float = 2.0
    tpot_s: float = 0.018
    queue_s: float = 0.05
    e2e_s: float = 6.0
    running: float = 7.0
    num_gpu_blocks: int = 9000
    speculating: bool = True


def _hist(name: str, bounds: Sequence[float], value: float, count: float, lab: str) -> str:
    """A histogram whose every observation equals ``value`` (cumulative ``count``)."""
    lines = [f"# TYPE {name} histogram"]
    for b in bounds:
        lines.append(f'{name}_bucket{{{lab},le="{b}"}} {count if value <= b else 0.0}')
    lines.append(f'{name}_bucket{{{lab},le="+Inf"}} {count}')
    lines.append(f"{name}_sum{{{lab}}} {value * count}")
    lines.append(f"{name}_count{{{lab}}} {count}")
    return "\n".join(lines)


def render(rates: PodRates, elapsed: float) -> str:
    """The page of a pod ``elapsed`` seconds after it started."""
    lab = f'engine="0",model_name="{MODEL}"'
    t = max(elapsed, 0.0)
    drafts = rates.drafts_per_s * t
    k = len(rates.survival)
    per_pos = [drafts * s for s in rates.survival]
    gen = drafts * (1 + sum(rates.survival)) if rates.speculating else 400.0 * t
    reqs = rates.requests_per_s * t
    out = [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{lab}}} {rates.running}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{lab}}} 0",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{lab}}} 0.25",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="16",engine="0",gpu_memory_utilization="0.9",'
        f'num_gpu_blocks="{rates.num_gpu_blocks}"}} 1.0',
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{lab}}} {gen}",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{lab}}} 0",
        _hist("vllm:request_time_per_output_token_seconds", ITL_BUCKETS, rates.tpot_s, reqs, lab),
        _hist("vllm:request_queue_time_seconds", REQUEST_LATENCY_BUCKETS, rates.queue_s, reqs, lab),
        _hist("vllm:e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS, rates.e2e_s, reqs, lab),
    ]
    if rates.speculating:
        out += [
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}",
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
            f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {drafts * k}",
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
            f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {sum(per_pos)}",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
            *(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}'
                for i, v in enumerate(per_pos)
            ),
        ]
    return "\n".join(out) + "\n"


class AdvancingPod:
    """One pod: an HTTP server on 127.0.0.1 serving ``render(rates, now − start)``."""

    def __init__(self, rates: PodRates, start: float) -> None:
        self.rates = rates
        self.start = start
        pod = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = render(pod.rates, time.time() - pod.start).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def page_at(self, wall_time: float) -> str:
        """The page this pod serves at wall-clock time ``wall_time``."""
        return render(self.rates, wall_time - self.start)


@contextmanager
def advancing_pods(rates: Sequence[PodRates]) -> Iterator[list[AdvancingPod]]:
    """Start one server per rate set; stop them all on exit."""
    start = time.time()
    pods = [AdvancingPod(r, start) for r in rates]
    for p in pods:
        p.thread.start()
    try:
        yield pods
    finally:
        for p in pods:
            p.server.shutdown()
            p.server.server_close()
