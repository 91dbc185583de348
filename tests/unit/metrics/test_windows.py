"""Windows: counter deltas, resets, pods that come and go, and pooling across pods."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spectune.errors import InputError
from spectune.metrics import Histogram, observation_from_pages, parse_page

LAB = 'engine="{e}",model_name="m"'


def vllm_page(
    drafts: float,
    per_pos: list[float],
    gen: float = 0.0,
    tpot: tuple[float, float] = (0.0, 0.0),
    engine: str = "0",
    blocks: int = 1000,
    extra: str = "",
) -> str:
    lab = LAB.format(e=engine)
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{lab}}} 4",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{lab}}} 0.5",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="16",engine="{engine}",num_gpu_blocks="{blocks}"}} 1',
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{lab}}} {gen}",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}",
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
        f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {drafts * len(per_pos)}",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
        f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {sum(per_pos)}",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        *(
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}'
            for i, v in enumerate(per_pos)
        ),
        "# TYPE vllm:request_time_per_output_token_seconds histogram",
        f'vllm:request_time_per_output_token_seconds_bucket{{{lab},le="0.01"}} 0',
        f'vllm:request_time_per_output_token_seconds_bucket{{{lab},le="0.025"}} {tpot[1]}',
        f'vllm:request_time_per_output_token_seconds_bucket{{{lab},le="+Inf"}} {tpot[1]}',
        f"vllm:request_time_per_output_token_seconds_sum{{{lab}}} {tpot[0]}",
        f"vllm:request_time_per_output_token_seconds_count{{{lab}}} {tpot[1]}",
        extra,
    ]
    return "\n".join(lines) + "\n"


def test_the_window_is_the_difference_of_the_two_pages() -> None:
    before = parse_page(vllm_page(1000, [800, 500], gen=5000, tpot=(2.0, 100)), "a")
    after = parse_page(vllm_page(3000, [2400, 1400], gen=9000, tpot=(5.0, 250)), "a")
    obs = observation_from_pages([before], [after], 60)
    assert obs.spec is not None
    assert obs.spec.drafts == 2000
    assert obs.spec.accepted_per_pos == (1600, 900)
    assert obs.spec.accepted == 2500
    assert obs.generation_tokens == 4000
    assert obs.generation_tokens_per_s == pytest.approx(4000 / 60)
    assert obs.tpot is not None and obs.tpot.count == 150
    assert obs.tpot.mean == pytest.approx(3.0 / 150)
    assert obs.resets == ()


def test_a_counter_that_went_down_restarted_and_counts_from_zero() -> None:
    before = parse_page(vllm_page(50_000, [40_000, 30_000], tpot=(9.0, 500)), "a")
    after = parse_page(vllm_page(1000, [700, 400], tpot=(1.0, 50)), "a")
    obs = observation_from_pages([before], [after], 60)
    assert obs.spec is not None
    assert obs.spec.drafts == 1000  # not −49 000
    assert obs.spec.accepted_per_pos == (700, 400)
    assert obs.tpot is not None and obs.tpot.count == 50
    assert obs.resets == ("a",)


def test_a_pod_seen_only_at_the_end_counts_from_zero() -> None:
    a0 = parse_page(vllm_page(100, [80]), "a")
    a1 = parse_page(vllm_page(200, [150]), "a")
    b1 = parse_page(vllm_page(40, [30]), "b")
    obs = observation_from_pages([a0], [a1, b1], 10)
    assert obs.spec is not None and obs.spec.drafts == 140
    assert obs.pods == ("a", "b")


def test_a_start_page_without_an_end_page_is_refused() -> None:
    a0 = parse_page(vllm_page(100, [80]), "a")
    b0 = parse_page(vllm_page(100, [80]), "b")
    with pytest.raises(InputError, match="b have a start page but no end page"):
        observation_from_pages([a0, b0], [a0], 10)


def test_pods_are_pooled_and_the_tightest_kv_pool_counts() -> None:
    p0 = [parse_page(vllm_page(0, [0, 0], blocks=900), n) for n in "ab"]
    p1 = [
        parse_page(vllm_page(1000, [800, 600], blocks=900), "a"),
        parse_page(vllm_page(3000, [1800, 900], blocks=800), "b"),
    ]
    obs = observation_from_pages(p0, p1, 10)
    assert obs.spec is not None
    assert obs.spec.drafts == 4000
    assert obs.spec.accepted_per_pos == (2600, 1500)
    assert obs.num_gpu_blocks == 800
    assert obs.kv_capacity_tokens == 800 * 16
    assert obs.running == 4


def test_data_parallel_engines_on_one_pod_are_summed() -> None:
    text = vllm_page(1000, [700]) + vllm_page(500, [300], engine="1").replace("# TYPE", "# X")
    # Second engine's samples without repeated TYPE lines, as one registry prints them.
    lines = [ln for ln in text.splitlines() if not ln.startswith("# X")]
    page = parse_page("\n".join(lines) + "\n", "a")
    obs = observation_from_pages([], [page], None)
    assert obs.spec is not None
    assert obs.spec.drafts == 1500
    assert obs.spec.accepted_per_pos == (1000,)


def test_speculation_off_has_no_spec_counts() -> None:
    text = "\n".join(ln for ln in vllm_page(0, [0]).splitlines() if "spec_decode" not in ln)
    page = parse_page(text + "\n", "a")
    obs = observation_from_pages([page], [page], 10)
    assert obs.spec is None and not obs.speculating


def test_pages_of_two_engines_are_refused() -> None:
    vllm = parse_page(vllm_page(10, [5]), "a")
    sglang = parse_page("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\n", "b")
    with pytest.raises(InputError, match="different engines"):
        observation_from_pages([], [vllm, sglang], 10)


def test_histogram_quantile_matches_prometheus_interpolation() -> None:
    rng = np.random.default_rng(3)
    values = rng.gamma(4.0, 0.005, 20_000)
    bounds = (0.005, 0.01, 0.02, 0.04, 0.08, math.inf)
    cum = tuple(float(np.sum(values <= b)) for b in bounds)
    h = Histogram(bounds, cum, float(values.sum()), float(len(values)))
    assert h.mean == pytest.approx(values.mean())
    # Linear interpolation inside a bucket lands within that bucket and near the truth.
    for q in (0.5, 0.9):
        est, true = h.quantile(q), float(np.quantile(values, q))
        i = int(np.searchsorted(bounds, true))
        low = bounds[i - 1] if i else 0.0
        assert low <= est <= bounds[i]
    assert math.isnan(Histogram(bounds, (0.0,) * 6, 0.0, 0.0).quantile(0.5))
    # A quantile in the +Inf bucket reports the highest finite bound, as Prometheus does.
    assert Histogram((0.1, math.inf), (0.0, 10.0), 50.0, 10.0).quantile(0.5) == 0.1
