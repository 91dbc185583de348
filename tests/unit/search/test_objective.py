"""One group's window figures (``window_stats``) from real histograms and counters."""

from __future__ import annotations

import math

import pytest

from spectune.engines import Dialect
from spectune.metrics import Histogram, Observation
from spectune.search.objective import Metric, Objective, window_stats

#: vLLM's TTFT buckets up to 2.5 s, seconds.
TTFT_BOUNDS = (0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, math.inf)


def test_a_burst_in_the_top_few_percent_moves_the_p95_and_not_the_p90() -> None:
    # 640 first tokens: 95 % under half a second, the 32 of a catch-up burst at 1-2.5 s.
    counts = (0, 0, 0, 0, 300, 608, 608, 608, 640, 640)
    ttft = Histogram(TTFT_BOUNDS, tuple(float(c) for c in counts), 300 * 0.2 + 308 * 0.4 + 48, 640)
    obs = Observation(Dialect.VLLM_V1, 300.0, ("canary-0",), None, ttft=ttft)
    s = window_stats(obs, Objective())
    assert s.ttft_p95_low > 0.5  # the burst is the p95
    assert 0.25 < s.ttft_p90_low < 0.5  # the p90 is the pod's
    assert math.isnan(s.queue_p90_low)  # no queue-time histogram in this window


#: vLLM's per-token latency buckets up to 0.1 s.
TPOT_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, math.inf)


def test_a_tpot_p95_the_buckets_cannot_place_is_marked_as_bounded_only() -> None:
    # 300 requests at 3–6 ms per token: one full bucket, whose p95 no histogram can place.
    hidden = Histogram(TPOT_BOUNDS, (300.0,) * 6, 300 * 0.004, 300)
    # 10 % of them above 10 ms: the p95 lies in the second bucket, which the fit can read.
    seen = Histogram(TPOT_BOUNDS, (270.0, 300.0, 300.0, 300.0, 300.0, 300.0), 1.5, 300)
    obs = Observation(Dialect.VLLM_V1, 300.0, ("canary-0",), None, tpot=hidden)
    assert window_stats(obs, Objective()).objective_bound == 0.01
    seen_obs = Observation(Dialect.VLLM_V1, 300.0, ("canary-0",), None, tpot=seen)
    assert math.isnan(window_stats(seen_obs, Objective()).objective_bound)
    # 300 requests all within 10–25 ms: the bucket bounds the p95 on both sides, no more.
    sole = Histogram(TPOT_BOUNDS, (0.0, 300.0, 300.0, 300.0, 300.0, 300.0), 300 * 0.014, 300)
    sole_obs = Observation(Dialect.VLLM_V1, 300.0, ("canary-0",), None, tpot=sole)
    s = window_stats(sole_obs, Objective())
    assert (s.objective_floor, s.objective_bound) == (0.01, 0.025)
    # Only a TPOT objective is modelled from acceptance.
    e2e = Objective(Metric.E2E_P95)
    assert math.isnan(window_stats(obs, e2e).objective_bound)


def test_a_token_weighted_tpot_histogram_is_as_sure_as_its_requests_not_its_tokens() -> None:
    # SGLang's inter-token latency counts every token; 40 000 of them from 200 requests.
    # Each request's tokens share its acceptance and batch: the p95's interval is as wide
    # as 200 observations give, not 40 000.
    bounds = (0.01, 0.02, 0.04, 0.06, 0.08, math.inf)
    shares = (0.05, 0.55, 0.90, 0.97, 1.0, 1.0)
    e2e = Histogram((5.0, 10.0, 20.0, math.inf), (50.0, 150.0, 200.0, 200.0), 1600.0, 200)

    def stats(tokens: int, finished: Histogram | None) -> tuple[float, float]:
        tpot = Histogram(bounds, tuple(s * tokens for s in shares), 0.025 * tokens, tokens)
        obs = Observation(Dialect.SGLANG, 300.0, ("pod-0",), None, tpot=tpot, e2e=finished)
        s = window_stats(obs, Objective())
        return s.objective, math.log(s.objective_high / s.objective_low)

    p95, width = stats(40_000, e2e)
    same_p95, as_if_200 = stats(200, None)
    assert p95 == pytest.approx(same_p95)  # the estimate is the histogram's either way
    assert width == pytest.approx(as_if_200)  # the width is 200 requests'
    _, as_if_independent = stats(40_000, None)
    assert width > 10 * as_if_independent
    # The window's requests are its finished requests, not its tokens: the minimum evidence
    # per trial and the offered load (requests per second) count requests on SGLang too.
    tpot = Histogram(bounds, tuple(s * 40_000 for s in shares), 1000.0, 40_000)
    obs = Observation(Dialect.SGLANG, 300.0, ("pod-0",), None, tpot=tpot, e2e=e2e)
    assert window_stats(obs, Objective()).requests == 200
