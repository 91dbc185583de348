"""Specs as users write them: the examples parse, and every bad spec names its bad field."""

from __future__ import annotations

import copy
import datetime
import doctest
from pathlib import Path
from typing import Any

import pytest
import yaml

import spectune.api.spec
from spectune.api import parse_spec
from spectune.api.spec import Engine, Method, Mode, ObjectiveMetric, Strategy
from spectune.api.validation import FieldProblem, InvalidSpecError
from spectune.errors import SpecError

from .bad_specs import BAD_SPECS, BASE, BadSpec

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples").glob("spectuning*.yaml"))


def _load(path: Path) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return body


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_parses_and_round_trips(path: Path) -> None:
    spec = parse_spec(_load(path))
    assert parse_spec(spec.model_dump(mode="json")) == spec


def test_the_examples_cover_the_main_uses() -> None:
    specs = {p.name: parse_spec(_load(p)) for p in EXAMPLES}
    assert "spectuning.yaml" in specs and len(specs) >= 4
    values = list(specs.values())
    assert any(s.mode is Mode.AUTO and s.search.strategy is Strategy.CANARY for s in values)
    assert any(s.mode is Mode.RECOMMEND for s in values)
    assert any(s.engine is Engine.SGLANG for s in values)
    assert any(not s.allow_off and {d.method for d in s.drafters} == {Method.NGRAM} for s in values)
    assert any(s.metrics.scrape is not None for s in values)
    assert any(s.metrics.prometheus is not None for s in values)


def test_a_minimal_spec_gets_the_documented_defaults() -> None:
    spec = parse_spec({"targetRef": {"name": "llama"}, "metrics": {"scrape": {"port": 8000}}})
    assert spec.target_ref.kind == "Deployment" and spec.target_ref.container is None
    assert spec.engine is None and spec.drafters == () and spec.allow_off
    assert spec.metrics.scrape is not None and spec.metrics.scrape.path == "/metrics"
    s = spec.search
    assert (s.strategy, s.canary_replicas, s.window, s.min_drafts, s.max_trials) == (
        Strategy.CANARY,
        1,
        "5m",
        20000,
        12,
    )
    assert (s.epsilon, s.delta) == (0.02, 0.05)
    assert spec.objective.metric is ObjectiveMetric.TPOT_P95
    g = spec.objective.guardrails
    assert (g.max_ttft_p95_regression, g.max_queue_p95_regression) == (0.2, 0.2)
    r = spec.retune
    assert r.on_model_change and r.on_route_change and r.every is None
    assert (r.drift.threshold, r.drift.for_, r.drift.action.value) == (0.15, "30m", "retune")
    assert spec.mode is Mode.AUTO and not spec.suspend and not spec.restore_on_delete


def test_the_whole_resource_and_the_bare_spec_parse_alike() -> None:
    body = {"apiVersion": "spectune.io/v1alpha1", "kind": "SpecTuning", "spec": BASE}
    assert parse_spec(body) == parse_spec(BASE)


def test_a_body_of_another_kind_is_refused() -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_spec({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {}})
    assert err.value.fields == ("apiVersion", "kind", "spec")


@pytest.mark.parametrize("case", BAD_SPECS, ids=lambda c: c.id)
def test_bad_specs_name_the_field(case: BadSpec) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(case.spec())
    assert isinstance(err.value, InvalidSpecError)
    assert err.value.fields == (case.path,), str(err.value)
    assert str(err.value).startswith(f"invalid SpecTuning: {case.path}: ")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"drafters": [{"name": "ng", "method": "ngram"}, {"name": "e3", "method": "eagle3"}]},
            "spec.drafters[1].model: required for method eagle3",
        ),
        (
            {"drafters": [{"name": "ng", "method": "ngram", "maxK": 17}]},
            "spec.drafters[0].maxK: input should be less than or equal to 16 (got 17)",
        ),
        ({"engine": "trtllm"}, "spec.engine: input should be 'vllm' or 'sglang' (got \"trtllm\")"),
        (
            {"search": {"window": "5 min"}},
            "spec.search.window: '5 min' is not a duration; write e.g. 90s, 5m or 1h30m",
        ),
        ({"serch": {}}, "spec.serch: unknown field"),
        ({"drafters": [], "allowOff": False}, "spec.drafters: list at least one drafter"),
    ],
)
def test_messages_say_what_is_wrong(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSpecError, match=None) as err:
        parse_spec({**BASE, **change})
    assert message in str(err.value)


def test_every_bad_field_is_reported_at_once() -> None:
    spec = copy.deepcopy(BASE)
    spec["engine"] = "trtllm"
    spec["search"] = {"maxTrials": 0, "window": "soon"}
    spec["targetRef"] = {"name": "Not_A_Name"}
    with pytest.raises(InvalidSpecError) as err:
        parse_spec(spec)
    assert set(err.value.fields) == {
        "spec.engine",
        "spec.search.maxTrials",
        "spec.search.window",
        "spec.targetRef.name",
    }
    assert all(isinstance(p, FieldProblem) and p.reason for p in err.value.problems)


def test_a_value_that_is_not_json_is_refused_not_crashed_on() -> None:
    spec = copy.deepcopy(BASE)
    spec["retune"] = {"every": datetime.date(2025, 1, 1)}  # YAML reads 2025-01-01 as a date
    with pytest.raises(InvalidSpecError) as err:
        parse_spec(spec)
    assert err.value.fields == ("spec",)
    assert "not a JSON value" in str(err.value)


def test_a_spec_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(InvalidSpecError) as err:
        parse_spec({"spec": ["not", "an", "object"]})
    assert err.value.fields == ("spec",)


def test_null_means_unset() -> None:
    spec = copy.deepcopy(BASE)
    spec["engine"] = None
    spec["objective"] = {"guardrails": {"maxQueueP95Regression": None}}
    parsed = parse_spec(spec)
    assert parsed.engine is None
    assert parsed.objective.guardrails.max_queue_p95_regression is None
    assert parsed.objective.guardrails.max_ttft_p95_regression == 0.2


def test_models_are_frozen() -> None:
    spec = parse_spec(BASE)
    with pytest.raises(ValueError, match="frozen"):
        spec.suspend = True  # type: ignore[misc]


def test_the_docstring_examples_hold() -> None:
    result = doctest.testmod(spectune.api.spec, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
