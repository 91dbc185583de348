"""The simulator's /metrics page is a real vLLM V1 (or SGLang) page, read by the real parsers."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from spectune.engines.catalogue import (
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    VLLM_ITERATION_TOKENS_BUCKETS,
    Dialect,
)
from spectune.metrics.exposition import parse_page
from spectune.search.arms import Arm, parse_arm
from spectune.sim import Fleet, Scenario
from spectune.sim.stats import buckets_1_2_5

VLLM_FAMILIES = {
    # name as the parser reports it (counters lose _total) -> kind
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_max_num_generation_tokens": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:request_params_n": "histogram",
}
SPEC_FAMILIES = {
    "vllm:spec_decode_num_drafts": "counter",
    "vllm:spec_decode_num_draft_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
}
BUCKETS = {
    "vllm:iteration_tokens_total": VLLM_ITERATION_TOKENS_BUCKETS,
    "vllm:time_to_first_token_seconds": TTFT_BUCKETS,
    "vllm:inter_token_latency_seconds": ITL_BUCKETS,
    "vllm:request_time_per_output_token_seconds": ITL_BUCKETS,
    "vllm:e2e_request_latency_seconds": REQUEST_LATENCY_BUCKETS,
    "vllm:request_queue_time_seconds": REQUEST_LATENCY_BUCKETS,
    "vllm:request_inference_time_seconds": REQUEST_LATENCY_BUCKETS,
    "vllm:request_prefill_time_seconds": REQUEST_LATENCY_BUCKETS,
    "vllm:request_decode_time_seconds": REQUEST_LATENCY_BUCKETS,
    "vllm:request_params_n": (1, 2, 5, 10, 20),
}


def _page(scenario: Scenario, arm: Arm, seconds: float = 120.0) -> str:
    fleet = Fleet(scenario, arms=arm)
    fleet.advance(seconds)
    return fleet.metrics_text(0)


def _families(page: str) -> dict[str, tuple[str, list[Sample]]]:
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(page)}


def _value(samples: list[Sample], name: str, **labels: str) -> float:
    for s in samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError(f"no sample {name} {labels}")


def test_vllm_page_has_every_family_with_its_kind(make_scenario: Callable[..., Scenario]) -> None:
    fams = _families(_page(make_scenario(), parse_arm("eagle3/4")))
    kinds = {name: kind for name, (kind, _) in fams.items() if not name.endswith("_created")}
    assert kinds == {**VLLM_FAMILIES, **SPEC_FAMILIES}


def test_spec_families_are_absent_when_off(make_scenario: Callable[..., Scenario]) -> None:
    page = _page(make_scenario(), Arm(None))
    assert "spec_decode" not in page
    assert set(VLLM_FAMILIES) <= set(_families(page))


def test_labels_and_positions(make_scenario: Callable[..., Scenario]) -> None:
    fams = _families(_page(make_scenario(), parse_arm("eagle3/4")))
    for name, (_, samples) in fams.items():
        for s in samples:
            assert s.labels.get("engine") == "0", name
            if name != "vllm:cache_config_info":
                assert s.labels.get("model_name") == "llama-70b", name
    per_pos = fams["vllm:spec_decode_num_accepted_tokens_per_pos"][1]
    positions = sorted(s.labels["position"] for s in per_pos if s.name.endswith("_per_pos_total"))
    assert positions == ["0", "1", "2", "3"]
    reasons = {s.labels["finished_reason"] for s in fams["vllm:request_success"][1]}
    assert {"stop", "length", "abort"} <= reasons


def test_cache_config_info_carries_the_pool(make_scenario: Callable[..., Scenario]) -> None:
    scenario = make_scenario()
    fleet = Fleet(scenario, arms=parse_arm("eagle3/3"))
    fams = _families(fleet.metrics_text(0))
    (info,) = fams["vllm:cache_config_info"][1]
    assert info.value == 1.0
    assert "model_name" not in info.labels
    assert info.labels["num_gpu_blocks"] == str(fleet.state(0).num_gpu_blocks)
    assert info.labels["block_size"] == "16"
    assert info.labels["gpu_memory_utilization"] == "0.9"
    tokens = int(info.labels["num_gpu_blocks"]) * 16
    assert info.labels["kv_cache_size_tokens"] == str(tokens)


def test_histogram_buckets_are_vllms(make_scenario: Callable[..., Scenario]) -> None:
    scenario = make_scenario()
    fams = _families(_page(scenario, parse_arm("eagle3/3")))
    token_buckets = buckets_1_2_5(scenario.max_model_len)
    expected = {
        **BUCKETS,
        "vllm:request_prompt_tokens": token_buckets,
        "vllm:request_generation_tokens": token_buckets,
        "vllm:request_max_num_generation_tokens": token_buckets,
        "vllm:request_params_max_tokens": token_buckets,
    }
    for name, bounds in expected.items():
        les = [s.labels["le"] for s in fams[name][1] if s.name == name + "_bucket"]
        assert les == [*(str(float(b)) for b in bounds), "+Inf"], name
        counts = [s.value for s in fams[name][1] if s.name == name + "_bucket"]
        assert counts == sorted(counts), f"{name} buckets must be cumulative"
        assert counts[-1] == _value(fams[name][1], name + "_count")


def test_counters_follow_vllm_semantics(make_scenario: Callable[..., Scenario]) -> None:
    scenario = make_scenario(
        load=[{"at_s": 0, "requests_per_s": 1.0}, {"at_s": 100, "requests_per_s": 0}]
    )
    fleet = Fleet(scenario, arms=parse_arm("eagle3/4"))
    fleet.advance(200.0)  # the load stops at 100 s: every request has finished
    records = fleet.records()
    fams = _families(fleet.metrics_text(0))

    def total(name: str) -> float:
        return _value(fams[name][1], name + "_total")

    drafts = total("vllm:spec_decode_num_drafts")
    accepted = total("vllm:spec_decode_num_accepted_tokens")
    per_pos = [
        _value(fams["vllm:spec_decode_num_accepted_tokens_per_pos"][1],
               "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
        for i in range(4)
    ]  # fmt: skip
    # one draft per request per verification pass, k draft tokens each
    assert drafts == sum(r.passes for r in records)
    assert total("vllm:spec_decode_num_draft_tokens") == 4 * drafts
    # position i counts passes whose drafts 0..i were all accepted
    assert drafts >= per_pos[0] >= per_pos[1] >= per_pos[2] >= per_pos[3] > 0
    assert sum(per_pos) == accepted
    # generation = one token per prefill + accepted + bonus, less what the last pass cut off
    generated = total("vllm:generation_tokens")
    assert generated == sum(r.output_tokens for r in records)
    assert len(records) + drafts + accepted - len(records) * 4 <= generated
    assert generated <= len(records) + drafts + accepted
    assert total("vllm:prompt_tokens") == sum(r.prompt_tokens for r in records)
    assert _value(fams["vllm:request_success"][1], "vllm:request_success_total",
                  finished_reason="stop") == len(records)  # fmt: skip
    itl = fams["vllm:inter_token_latency_seconds"][1]
    # one ITL observation per engine step per decoding request, not per token
    assert _value(itl, "vllm:inter_token_latency_seconds_count") == drafts
    ttft = _value(
        fams["vllm:time_to_first_token_seconds"][1], "vllm:time_to_first_token_seconds_count"
    )
    assert ttft == len(records)
    assert _value(fams["vllm:num_requests_running"][1], "vllm:num_requests_running") == 0


def test_the_projects_parser_reads_the_page(make_scenario: Callable[..., Scenario]) -> None:
    snapshot = parse_page(_page(make_scenario(), parse_arm("eagle3/3")), pod="sim-0")
    assert snapshot.dialect is Dialect.VLLM_V1
    assert snapshot.has("vllm:spec_decode_num_accepted_tokens_per_pos_total")


def test_sglang_dialect(make_scenario: Callable[..., Scenario]) -> None:
    page = _page(make_scenario(engine="sglang"), parse_arm("eagle3/3"))
    assert "vllm:" not in page
    fams = _families(page)
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                 "sglang:max_total_num_tokens", "sglang:spec_accept_length",
                 "sglang:spec_accept_rate", "sglang:gen_throughput"):  # fmt: skip
        assert fams[name][0] == "gauge", name
    for name in ("sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
                 "sglang:e2e_request_latency_seconds", "sglang:queue_time_seconds"):  # fmt: skip
        assert fams[name][0] == "histogram", name
    length = _value(fams["sglang:spec_accept_length"][1], "sglang:spec_accept_length")
    rate = _value(fams["sglang:spec_accept_rate"][1], "sglang:spec_accept_rate")
    assert 1.5 < length < 4.0  # accepted drafts + the bonus token, per forward
    assert rate == pytest.approx((length - 1.0) / 3.0)
    # SGLang's ITL is token-weighted: more observations than steps × requests
    assert parse_page(page, pod="sim-0").dialect is Dialect.SGLANG


def test_page_is_deterministic(make_scenario: Callable[..., Scenario]) -> None:
    scenario = make_scenario()
    assert _page(scenario, parse_arm("ngram/3")) == _page(scenario, parse_arm("ngram/3"))
