"""drafters[].adaptive: a user lists in-engine adaptive modes, and each reaches the search.

The refusals the CRD's CEL rules also make are in ``bad_specs.py`` (both tiers run them);
these are the ones only the operator checks (ordering of a table, the detected engine).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from spectune.api.convert import to_search_space
from spectune.api.spec import Engine, parse_spec
from spectune.api.validation import InvalidSpecError
from spectune.errors import SpecError
from spectune.search.arms import AdaptiveMode

from .bad_specs import BASE

ROWS = [{"minBatch": 1, "maxBatch": 32, "k": 5}, {"minBatch": 33, "maxBatch": 512, "k": 3}]


def _with(adaptive: list[dict[str, Any]], *, method: str = "eagle3", **top: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    spec["drafters"][1] = {**spec["drafters"][1], "method": method, "adaptive": adaptive}
    spec.update(top)
    return spec


def test_listed_vllm_modes_reach_the_search_space_as_their_arms() -> None:
    spec = _with(
        [
            {"mode": "batchTable", "table": ROWS},
            {"mode": "verify", "maxK": 8, "table": ROWS},
            {"mode": "verify", "table": ROWS},  # maxK unset: the drafter's (6)
        ]
    )
    space = to_search_space(parse_spec(spec))
    assert [a.name for a in space.adaptive] == [
        "eagle3/sched:1-32=5,33-512=3",
        "eagle3/verify:8:1-32=5,33-512=3",
        "eagle3/verify:6:1-32=5,33-512=3",
    ]
    assert [a.adaptive for a in space.adaptive] == [
        AdaptiveMode.BATCH_TABLE,
        AdaptiveMode.VERIFY,
        AdaptiveMode.VERIFY,
    ]
    # candidates beside the fixed k, not instead of them
    names = [a.name for a in space.arms()]
    assert "eagle3/6" in names and names[-3:] == [a.name for a in space.adaptive]


def test_sglang_tiers_default_to_sglangs_steps_and_strategy() -> None:
    spec = _with(
        [
            {"mode": "tiers"},
            {"mode": "tiers", "steps": [1, 2, 4], "strategy": "throughputAware"},
            {"mode": "tiers", "steps": [2, 5], "strategy": "acceptLength"},
        ],
        engine="sglang",
    )
    names = [a.name for a in to_search_space(parse_spec(spec)).adaptive]
    assert names == [
        "eagle3/tiers:1,3,7",
        "eagle3/tiers:1,2,4:throughput_aware",
        "eagle3/tiers:2,5",
    ]


def test_without_a_listing_there_are_no_adaptive_arms() -> None:
    assert to_search_space(parse_spec(BASE)).adaptive == ()


@pytest.mark.parametrize(
    ("adaptive", "path", "words"),
    [
        (
            [{"mode": "batchTable", "table": [ROWS[1], ROWS[0]]}],
            "spec.drafters[1].adaptive[0].table[1].minBatch",
            "ascending batch sizes, without overlap",
        ),
        (
            [{"mode": "batchTable", "table": [ROWS[0], {**ROWS[1], "minBatch": 20}]}],
            "spec.drafters[1].adaptive[0].table[1].minBatch",
            "not above the previous row's maxBatch (32)",
        ),
        (
            [{"mode": "batchTable", "table": [{**ROWS[0], "k": 0}]}],
            "spec.drafters[1].adaptive[0].table",
            "every k is 0",
        ),
        (
            [{"mode": "verify", "table": [{**ROWS[0], "k": 9}]}],
            "spec.drafters[1].adaptive[0].table",
            "exceeds the drafter's maxK (6)",
        ),
        (
            [{"mode": "batchTable", "table": ROWS}, {"mode": "batchTable", "table": ROWS}],
            "spec.drafters[1].adaptive[1]",
            "the same adaptive arm as adaptive[0]",
        ),
        (
            [{"mode": "batchTable", "table": ROWS, "maxK": 8}],
            "spec.drafters[1].adaptive[0].maxK",
            "verify only",
        ),
    ],
)
def test_a_malformed_listing_names_the_field_and_the_fix(
    adaptive: list[dict[str, Any]], path: str, words: str
) -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_spec(_with(adaptive))
    assert err.value.fields == (path,), str(err.value)
    assert words in str(err.value)


def test_unordered_tiers_name_the_steps() -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_spec(_with([{"mode": "tiers", "steps": [3, 1]}], engine="sglang"))
    assert err.value.fields == ("spec.drafters[1].adaptive[0].steps",)
    assert "ascending and distinct" in str(err.value)


@pytest.mark.parametrize(
    ("method", "mode", "names"),
    [
        ("draft_model", "verify", "dflash, dspark, eagle3, mtp"),
        ("mtp", "tiers", "eagle, eagle3"),
    ],
)
def test_a_method_the_mode_does_not_run_with_is_refused(method: str, mode: str, names: str) -> None:
    entry: dict[str, Any] = {"mode": mode} if mode == "tiers" else {"mode": mode, "table": ROWS}
    engine = "sglang" if mode == "tiers" else "vllm"
    with pytest.raises(InvalidSpecError) as err:
        parse_spec(_with([entry], method=method, engine=engine))
    assert err.value.fields == ("spec.drafters[1].adaptive[0].mode",)
    assert f"runs with methods {names}, not {method}" in str(err.value)


def test_an_engine_detected_on_the_target_refuses_the_other_engines_mode() -> None:
    spec = _with([{"mode": "batchTable", "table": ROWS}])
    del spec["engine"]
    parsed = parse_spec(spec)  # no engine named: the spec alone is valid
    with pytest.raises(SpecError) as err:
        to_search_space(parsed, Engine.SGLANG)
    assert str(err.value).startswith("spec.drafters[1].adaptive[0].mode: batchTable is vLLM's")
    assert "use sglang's mode (tiers)" in str(err.value)
    assert len(to_search_space(parsed, Engine.VLLM).adaptive) == 1
