"""Every dialect version the simulator serves reads back as the same engine.

The simulator draws one world and serves it as a given release's /metrics page
(``metrics_version``); the readers must find the same acceptance, k and load in each, and
say where an older family stood in for a newer one.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from spectune.diagnose import Diagnosis, diagnose
from spectune.errors import InputError
from spectune.metrics import Observation, observation_from_pages, parse_page
from spectune.search.arms import parse_arm
from spectune.sim import Fleet, Scenario


def window(scenario: Scenario, arm: str = "eagle3/4") -> Observation:
    fleet = Fleet(scenario, arms=parse_arm(arm))
    fleet.advance(60.0)
    start = parse_page(fleet.metrics_text(0), pod="p")
    fleet.advance(240.0)
    end = parse_page(fleet.metrics_text(0), pod="p")
    return observation_from_pages([start], [end], 240.0)


def read(scenario: Scenario, **kw: object) -> tuple[Observation, Diagnosis]:
    obs = window(scenario)
    return obs, diagnose(obs, draft_cost=0.1, **kw)  # type: ignore[arg-type]


def test_the_default_page_is_todays(make_scenario: Callable[..., Scenario]) -> None:
    page = Fleet(make_scenario(), arms=parse_arm("eagle3/4")).metrics_text(0)
    assert "vllm:request_time_per_output_token_seconds" in page
    assert "vllm:gpu_cache_usage_perc" not in page
    assert parse_page(page).identity is not None


@pytest.mark.parametrize("version", ["vllm-0.10", "vllm-0.8.5"])
def test_older_vllm_pages_give_the_same_acceptance_and_a_per_token_latency(
    version: str, make_scenario: Callable[..., Scenario]
) -> None:
    now_obs, now = read(make_scenario())
    old_obs, old = read(make_scenario(metrics_version=version))
    assert old_obs.dialect is now_obs.dialect
    assert old.current_k == now.current_k == 4
    assert old.acceptance.per_position == pytest.approx(now.acceptance.per_position)
    assert old_obs.kv_usage == pytest.approx(now_obs.kv_usage)
    assert old_obs.tpot_family == "vllm:time_per_output_token_seconds"
    assert old_obs.tpot is not None and now_obs.tpot is not None
    # The per-step histogram over the accepted length lands near the per-token one.
    assert old_obs.tpot.mean == pytest.approx(now_obs.tpot.mean, rel=0.25)
    assert any("once per engine step" in n for n in old.notes)
    if version == "vllm-0.8.5":
        assert any("gpu_cache_usage_perc" in n for n in old.notes)
        assert "before 0.9" in (old_obs.engine_version or "")


def test_an_early_v1_page_without_drafts_is_v1_and_asks_for_k(
    make_scenario: Callable[..., Scenario],
) -> None:
    scenario = make_scenario(metrics_version="vllm-0.8.3")
    obs = window(scenario)
    assert obs.dialect.value == "vllm"  # V1, not V0: no legacy gauges, accepted counts the prefix
    with pytest.raises(InputError, match="give it with --k"):
        diagnose(obs, draft_cost=0.1)
    _, now = read(make_scenario())
    d = diagnose(obs, draft_cost=0.1, current_k=4)
    assert d.acceptance.mean_accepted_length == pytest.approx(
        now.acceptance.mean_accepted_length, rel=1e-3
    )
    assert not any("V0" in n for n in d.notes)


def test_sglang_counters_give_the_windows_exact_length_where_the_gauge_is_a_snapshot(
    make_scenario: Callable[..., Scenario],
) -> None:
    fleet = Fleet(make_scenario(engine="sglang", metrics_version="sglang-2026"),
                  arms=parse_arm("eagle3/4"))  # fmt: skip
    fleet.advance(60.0)
    start = parse_page(fleet.metrics_text(0), pod="p")
    fleet.advance(240.0)
    end = parse_page(fleet.metrics_text(0), pod="p")
    obs = observation_from_pages([start], [end], 240.0)
    d = diagnose(obs, draft_cost=0.1)

    def count(page: object, name: str) -> float:
        total = page.total(name)  # type: ignore[attr-defined]
        assert total is not None
        return float(total)

    generated = count(end, "sglang:generation_tokens_total") - count(
        start, "sglang:generation_tokens_total"
    )
    passes = count(end, "sglang:spec_verify_calls_total") - count(
        start, "sglang:spec_verify_calls_total"
    )
    assert d.current_k == 4 and d.acceptance.drafts == pytest.approx(passes)
    assert d.acceptance.mean_accepted_length == pytest.approx(generated / passes)
    assert d.acceptance.rate_interval is not None  # counts, so an interval
    assert any("spec_verify_calls_total" in n for n in d.notes)
    # The gauge is the last 40 batches only; it is not what the window's counters say.
    assert obs.accept_length_gauge is not None


def test_an_sglang_page_spelled_with_underscores_reads_as_the_same_page(
    make_scenario: Callable[..., Scenario],
) -> None:
    _, plain = read(make_scenario(engine="sglang"))
    obs, spelled = read(make_scenario(engine="sglang", metrics_version="sglang-underscore"))
    assert "names spelled sglang_" in (obs.engine_version or "")
    assert spelled.acceptance == plain.acceptance and spelled.current_k == plain.current_k


def test_a_version_of_another_engine_is_refused(make_scenario: Callable[..., Scenario]) -> None:
    with pytest.raises(Exception, match="metrics_version 'sglang-2026' is not a vllm release"):
        make_scenario(metrics_version="sglang-2026")
