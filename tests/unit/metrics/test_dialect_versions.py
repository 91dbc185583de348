"""Families that differ by engine version and deployment, read from small pages.

Each page here is written in the engine's own shape (names, labels, kinds as
reference/engines.md gives them) to pin one rule; the public pages that motivated them are
in test_real_pages.py.
"""

from __future__ import annotations

import pytest

from spectune.diagnose import diagnose
from spectune.engines import Dialect, identify_page
from spectune.errors import InputError
from spectune.metrics import observation_from_pages, parse_page


def one(text: str, **kw: object):  # type: ignore[no-untyped-def]
    return observation_from_pages([], [parse_page(text, pod="p")], **kw)  # type: ignore[arg-type]


TRT = """\
trtllm_num_requests_running{@} 6
trtllm_num_requests_waiting{@} 0
trtllm_kv_cache_max_blocks{@} 4000
trtllm_kv_cache_tokens_per_block{@} 32
trtllm_speculative_config_info{@,decoding_type="Eagle3",max_draft_len="3"} 1
trtllm_spec_decode_num_draft_tokens_total{@} 30000
trtllm_spec_decode_num_accepted_tokens_total{@} 18000
trtllm_spec_decode_drafted_tokens_total{@,token_position="0"} 10000
trtllm_spec_decode_drafted_tokens_total{@,token_position="1"} 10000
trtllm_spec_decode_accepted_tokens_total{@,token_position="0"} 8000
trtllm_spec_decode_accepted_tokens_total{@,token_position="1"} 6000
""".replace("@", 'model_name="m",engine_type="trtllm"')


@pytest.mark.parametrize("spell", ["trtllm_", "trtllm:", ""])
def test_tensorrt_llm_pages_in_every_spelling_give_k_and_the_kv_pool(spell: str) -> None:
    obs = one(TRT.replace("trtllm_", spell))
    assert obs.dialect is Dialect.TRTLLM
    assert obs.configured_k == 3  # from speculative_config_info, though 2 positions are shown
    assert obs.kv_capacity_tokens == 4000 * 32 and obs.num_gpu_blocks == 4000
    d = diagnose(obs, draft_cost=0.1)
    assert d.current_k == 3
    # The per-request per-position counters drafted 20000, the totals say 30000.
    assert any("disagree" in n and "30000" in n for n in d.notes)


def test_sglang_ranks_of_one_scheduler_are_averaged_and_dp_ranks_added() -> None:
    rows = []
    for dp in ("0", "1"):
        for tp in ("0", "1", "2", "3"):
            lab = f'model_name="m",engine_type="unified",dp_rank="{dp}",tp_rank="{tp}",pp_rank="0"'
            rows += [
                f"sglang:num_running_reqs{{{lab}}} {8 if dp == '0' else 4}",
                f"sglang:num_queue_reqs{{{lab}}} {3 if dp == '0' else 1}",
                f"sglang:spec_accept_length{{{lab}}} {3.0 if dp == '0' else 2.0}",
                f"sglang:spec_accept_rate{{{lab}}} {0.5 if dp == '0' else 0.25}",
            ]
    obs = one("\n".join(rows) + "\n")
    assert obs.waiting == 4  # 3 + 1, not 16: TP ranks repeat their scheduler's queue
    assert obs.running == 6  # the batch of a typical engine
    assert obs.accept_length_gauge == pytest.approx(2.5)


def test_sglang_exact_length_comes_from_the_verify_counter() -> None:
    page = """\
sglang:num_running_reqs{model_name="m",tp_rank="0"} 2
sglang:spec_accept_length{model_name="m",tp_rank="0"} 3.9
sglang:spec_num_steps{model_name="m",tp_rank="0"} 3
sglang:generation_tokens_total{model_name="m",is_streaming="true"} 2500
sglang:generation_tokens_total{model_name="m",is_streaming="false"} 500
sglang:spec_verify_calls_total{model_name="m"} 1000
"""
    d = diagnose(one(page), draft_cost=0.1)
    assert d.current_k == 3
    assert d.acceptance.mean_accepted_length == pytest.approx(3.0)  # 3000 / 1000, not 3.9
    assert d.acceptance.drafts == 1000 and d.acceptance.rate_interval is not None


def test_vllm_per_request_acceptance_histogram_gives_the_spread() -> None:
    page = """\
vllm:num_requests_running{engine="0",model_name="m"} 1
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10000
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30000
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 18000
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8000
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6000
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 4000
vllm:request_spec_decode_acceptance_rate_bucket{engine="0",model_name="m",le="0.25"} 0
vllm:request_spec_decode_acceptance_rate_bucket{engine="0",model_name="m",le="0.5"} 20
vllm:request_spec_decode_acceptance_rate_bucket{engine="0",model_name="m",le="0.75"} 90
vllm:request_spec_decode_acceptance_rate_bucket{engine="0",model_name="m",le="1.0"} 100
vllm:request_spec_decode_acceptance_rate_bucket{engine="0",model_name="m",le="+Inf"} 100
vllm:request_spec_decode_acceptance_rate_sum{engine="0",model_name="m"} 60
vllm:request_spec_decode_acceptance_rate_count{engine="0",model_name="m"} 100
"""
    d = diagnose(one(page), draft_cost=0.1)
    assert d.request_spread is not None
    assert d.request_spread.mean == pytest.approx(0.6) and d.request_spread.requests == 100
    assert d.to_json()["request_spread"]["source"] == "per-request histogram"
    assert any("measured, not fitted" in n for n in d.notes)


def test_vllm_v0_reads_its_queue_histogram() -> None:
    page = """\
vllm:num_requests_running{model_name="m"} 2
vllm:num_requests_swapped{model_name="m"} 0
vllm:gpu_cache_usage_perc{model_name="m"} 0.3
vllm:request_queue_time_seconds_bucket{model_name="m",le="1.0"} 40
vllm:request_queue_time_seconds_bucket{model_name="m",le="+Inf"} 40
vllm:request_queue_time_seconds_sum{model_name="m"} 4
vllm:request_queue_time_seconds_count{model_name="m"} 40
"""
    obs = one(page)
    assert obs.dialect is Dialect.VLLM_V0 and obs.queue is not None and obs.queue.count == 40
    assert obs.kv_usage == pytest.approx(0.3)


def test_a_v1_page_of_0_8_is_v1_and_reads_the_old_kv_gauge() -> None:
    page = """\
vllm:num_requests_running{engine="0",model_name="m"} 2
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.4
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 3000
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 1500
"""
    obs = one(page)
    assert obs.dialect is Dialect.VLLM_V1
    assert obs.engine_version is not None and "0.8.3 to before 0.8.5" in obs.engine_version
    assert obs.kv_usage == pytest.approx(0.4)
    d = diagnose(obs, draft_cost=0.1, current_k=3)
    assert d.acceptance.mean_accepted_length == pytest.approx(1 + 1500 / 1000)


def test_a_length_no_pass_can_emit_is_refused() -> None:
    page = """\
vllm:num_requests_running{engine="0",model_name="m"} 2
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 1000
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 3000
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 1500
"""
    with pytest.raises(InputError, match="more than k \\+ 1"):
        diagnose(one(page), draft_cost=0.1, current_k=1)


@pytest.mark.parametrize(
    ("names", "labels", "dialect"),
    [
        ({"vllm:spec_decode_num_drafts_total"}, set(), Dialect.VLLM_V1),
        ({"vllm:spec_decode_draft_acceptance_rate"}, set(), Dialect.VLLM_V0),
        ({"sglang_num_running_reqs"}, set(), Dialect.SGLANG),
        ({"num_requests_running", "kv_cache_utilization"}, set(), Dialect.TRTLLM),
        ({"e2e_request_latency_seconds_bucket"}, {"engine_type"}, Dialect.TRTLLM),
    ],
)
def test_the_name_prefix_tells_the_engine(
    names: set[str], labels: set[str], dialect: Dialect
) -> None:
    assert identify_page(names, labels).dialect is dialect


def test_a_bare_histogram_of_another_program_is_not_tensorrt_llm() -> None:
    with pytest.raises(InputError, match="not from a serving engine"):
        identify_page({"e2e_request_latency_seconds_bucket"}, {"le"})


def test_older_sglang_reads_its_time_per_output_token_histogram() -> None:
    page = """\
sglang:num_running_reqs{model_name="m"} 2
sglang:spec_accept_length{model_name="m"} 2.5
sglang:spec_accept_rate{model_name="m"} 0.5
sglang:time_per_output_token_seconds_bucket{model_name="m",le="0.02"} 30
sglang:time_per_output_token_seconds_bucket{model_name="m",le="+Inf"} 40
sglang:time_per_output_token_seconds_sum{model_name="m"} 0.8
sglang:time_per_output_token_seconds_count{model_name="m"} 40
"""
    obs = one(page)
    assert obs.tpot_family == "sglang:time_per_output_token_seconds"
    assert obs.tpot is not None and obs.tpot.mean == pytest.approx(0.02)  # per token already
    assert any("time_per_output_token_seconds" in n for n in obs.notes)
