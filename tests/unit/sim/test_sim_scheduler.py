"""The scheduler's limits as vLLM has them: max_num_seqs, the token budget, FCFS."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from spectune.search.arms import parse_arm
from spectune.sim import Fleet, Scenario


def _sample(page: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(name)


def test_max_num_seqs_caps_the_batch_and_the_rest_wait(
    make_scenario: Callable[..., Scenario],
) -> None:
    scenario = make_scenario(target={"max_num_seqs": 4}, load=[{"at_s": 0, "requests_per_s": 4.0}])
    fleet = Fleet(scenario, arms=parse_arm("eagle3/3"))
    running, waiting = [], []
    for t in range(5, 120, 5):
        fleet.advance(float(t))
        page = fleet.metrics_text(0)
        running.append(_sample(page, "vllm:num_requests_running"))
        waiting.append(_sample(page, "vllm:num_requests_waiting"))
    assert max(running) == 4
    assert max(waiting) > 0
    # first come, first served: requests start in arrival order
    records = sorted(fleet.records(), key=lambda r: r.arrival_s)
    starts = [r.arrival_s + r.queue_s for r in records]
    assert starts == sorted(starts)


def test_prefill_is_chunked_under_the_token_budget(
    make_scenario: Callable[..., Scenario],
) -> None:
    small = make_scenario(target={"max_num_batched_tokens": 256})
    large = make_scenario()
    pages = []
    ttft = []
    for scenario in (small, large):
        fleet = Fleet(scenario, arms=parse_arm("eagle3/3"))
        fleet.advance(120.0)
        pages.append(fleet.metrics_text(0))
        ttft.append(sorted(r.ttft_s for r in fleet.records())[len(fleet.records()) // 2])
    name = "vllm:iteration_tokens_total"
    count = _sample(pages[0], name + "_count")
    # no step of the small budget processed more than 512 tokens ...
    assert _sample(pages[0], name + "_bucket", le="512.0") == count
    # ... while the default budget prefills whole prompts in one step
    assert _sample(pages[1], name + "_bucket", le="512.0") < _sample(pages[1], name + "_count")
    # and chunking a prompt over many steps delays its first token
    assert ttft[0] > ttft[1]
