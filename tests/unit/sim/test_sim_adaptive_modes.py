"""The twin runs each in-engine adaptive mode at the level its documentation describes.

Read from what a user sees on the simulated engine's counters: drafted tokens per draft
(``num_draft_tokens / num_drafts``) and the per-token latency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from spectune.errors import SpecError
from spectune.search.arms import parse_arm
from spectune.sim import Scenario
from spectune.sim.fleet import Fleet
from spectune.sim.summary import summarise


def _run(scenario: Scenario, arm: str, seconds: float = 200.0) -> Fleet:
    fleet = Fleet(scenario, arms=parse_arm(arm))
    fleet.advance(seconds)
    return fleet


def _load(rate: float) -> dict[str, Any]:
    return {"load": [{"at_s": 0, "requests_per_s": rate}]}


def _tokens_per_draft(fleet: Fleet) -> float:
    t = fleet.totals()
    return t.draft_tokens / t.drafts


def test_a_batch_table_drafts_less_at_high_batch(make_scenario: Callable[..., Scenario]) -> None:
    table = "eagle3/sched:1-8=5,9-1024=1"
    low = _run(make_scenario(**_load(0.3)), table)
    high = _run(make_scenario(**_load(12.0)), table)
    assert _tokens_per_draft(low) > 4.0  # mostly at most eight running: k = 5
    assert _tokens_per_draft(high) < 2.0  # dozens running: k = 1


def test_adaptive_verification_spends_its_budget_on_the_likely_tokens(
    make_scenario: Callable[..., Scenario],
) -> None:
    scenario = make_scenario(**_load(6.0))
    verify = _run(scenario, "eagle3/verify:6:1-1024=2")
    fixed = _run(scenario, "eagle3/2")
    # about N x 2 drafted tokens verified per step, as at a fixed k of 2 ...
    assert _tokens_per_draft(verify) == pytest.approx(2.0, abs=0.35)
    # ... but spread by predicted acceptance, so more of them land
    v, f = verify.totals(), fixed.totals()
    assert v.accepted_tokens / v.draft_tokens > f.accepted_tokens / f.draft_tokens + 0.02


def _one_route(alpha: float) -> dict[str, Any]:
    return {
        "name": "chat",
        "share": 1.0,
        "prompt_tokens": {"dist": "fixed", "value": 400},
        "output_tokens": {"dist": "fixed", "value": 300},
        "acceptance": {"eagle3": {"alpha": alpha, "decay": 1.0, "spread": 50}},
    }


def test_sglang_tiers_follow_the_accept_length(make_scenario: Callable[..., Scenario]) -> None:
    def tiers_drafted(alpha: float) -> float:
        scenario = make_scenario(engine="sglang", routes=[_one_route(alpha)], **_load(1.0))
        return _tokens_per_draft(_run(scenario, "eagle3/tiers:1,3,7"))

    # accept length (bonus included) near 1.25 targets 2 steps: tier 1; near 4.6, tier 3..7
    assert tiers_drafted(0.2) < 1.5
    assert tiers_drafted(0.9) > 3.0


def test_an_adaptive_mode_is_refused_on_the_other_engine(
    make_scenario: Callable[..., Scenario],
) -> None:
    with pytest.raises(SpecError, match="this scenario's engine is vllm"):
        Fleet(make_scenario(), arms=parse_arm("eagle3/tiers:1,3,7"))
    with pytest.raises(SpecError, match="this scenario's engine is sglang"):
        Fleet(make_scenario(engine="sglang"), arms=parse_arm("eagle3/verify:5:1-64=3"))


def test_tpot_under_a_table_is_the_static_k_where_the_table_is_that_k(
    make_scenario: Callable[..., Scenario],
) -> None:
    scenario = make_scenario(**_load(1.0))
    same = summarise(_run(scenario, "eagle3/verify:3:1-1024=3").records(), 200)
    static = summarise(_run(scenario, "eagle3/3").records(), 200)
    # a budget of N x k with at most k per request verifies every drafted token
    assert same.tpot_p50 == pytest.approx(static.tpot_p50, rel=0.02)
