"""A spec becomes the search space, objective and loop settings the controller runs on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from spectune.api import parse_spec, to_controller_config, to_objective, to_search_space
from spectune.api.spec import DriftAction, Engine, ObjectiveMetric, PodAction, SpecTuningSpec
from spectune.control.controller import ControllerConfig
from spectune.control.controller import DriftAction as LoopDriftAction
from spectune.search.arms import OFF, Arm
from spectune.search.objective import Guardrails, Metric, Objective
from spectune.search.policy import DrafterSpec, SearchSpace

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _example(name: str) -> SpecTuningSpec:
    return parse_spec(yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8")))


def _minimal(**extra: Any) -> SpecTuningSpec:
    return parse_spec({"targetRef": {"name": "x"}, "metrics": {"scrape": {"port": 8000}}, **extra})


def test_search_space_of_the_main_example() -> None:
    space = to_search_space(_example("spectuning.yaml"))
    assert space == SearchSpace(
        drafters=(DrafterSpec("eagle3", "eagle3", 8), DrafterSpec("ngram", "ngram", 8)),
        allow_off=True,
        per_position=True,
        schedules=True,  # vLLM with search.schedule: auto (the default)
    )
    arms = space.arms()
    assert arms[0] == OFF and len(arms) == 1 + 8 + 8
    assert Arm("eagle3", 8) in arms and Arm("ngram", 1) in arms


def test_off_is_no_candidate_when_disallowed() -> None:
    space = to_search_space(_example("spectuning-ngram.yaml"))
    assert not space.allow_off
    assert OFF not in space.arms()
    assert [d.name for d in space.drafters] == ["ngram-short", "ngram-long"]


@pytest.mark.parametrize(
    ("engine", "detected", "per_position"),
    [
        ("vllm", None, True),
        ("sglang", None, False),
        (None, Engine.SGLANG, False),
        (None, Engine.VLLM, True),
        (None, None, True),
        ("vllm", Engine.SGLANG, True),  # what the user wrote wins
    ],
)
def test_per_position_acceptance_is_expected_from_vllm_only(
    engine: str | None, detected: Engine | None, per_position: bool
) -> None:
    space = to_search_space(_minimal(engine=engine), detected)
    assert space.per_position is per_position


def test_objective_of_the_sglang_example() -> None:
    assert to_objective(_example("spectuning-sglang.yaml")) == Objective(
        metric=Metric.OUTPUT_TOKENS_PER_SECOND,
        guardrails=Guardrails(max_ttft_p95_regression=0.3, max_queue_p95_regression=None),
    )


@pytest.mark.parametrize("metric", list(ObjectiveMetric))
def test_every_objective_metric_has_a_counterpart(metric: ObjectiveMetric) -> None:
    objective = to_objective(_minimal(objective={"metric": metric.value}))
    assert objective.metric.value == metric.value
    assert objective.guardrails == Guardrails(0.2, 0.2)


def test_controller_config_of_the_main_example() -> None:
    assert to_controller_config(_example("spectuning.yaml")) == ControllerConfig(
        window_s=300.0,
        max_trials=12,
        epsilon=0.02,
        delta=0.05,
        drift_threshold=0.15,
        drift_for_s=1800.0,
        drift_action=LoopDriftAction.RETUNE,
        retune_every_s=168 * 3600.0,
    )


def test_controller_config_of_the_recommend_example() -> None:
    config = to_controller_config(_example("spectuning-recommend.yaml"), seed=7)
    assert (config.window_s, config.max_trials, config.retune_every_s) == (600.0, 8, None)
    assert (config.drift_threshold, config.drift_for_s) == (0.2, 3600.0)
    assert config.drift_action is LoopDriftAction.ALERT
    assert config.seed == 7
    # what the spec does not carry keeps the loop's defaults
    defaults = ControllerConfig()
    assert (config.poll_s, config.ready_timeout_s, config.load_shift) == (
        defaults.poll_s,
        defaults.ready_timeout_s,
        defaults.load_shift,
    )


@pytest.mark.parametrize("action", list(DriftAction))
def test_every_drift_action_has_a_counterpart(action: DriftAction) -> None:
    config = to_controller_config(_minimal(retune={"drift": {"action": action.value}}))
    assert config.drift_action.value == action.value


@pytest.mark.parametrize("action", list(PodAction))
def test_every_pod_action_has_a_counterpart(action: PodAction) -> None:
    config = to_controller_config(_minimal(retune={"drift": {"podAction": action.value}}))
    assert config.pod_action.value == action.value


def test_pod_decay_only_alerts_unless_asked_and_keeps_one_ready_pod() -> None:
    config = to_controller_config(_minimal())
    assert config.pod_action.value == "alert" and config.min_ready_pods == 1
    asked = _minimal(retune={"drift": {"podAction": "restartPod", "minReadyPods": 3}})
    assert to_controller_config(asked).min_ready_pods == 3


def test_min_drafts_reaches_the_loop() -> None:
    assert to_controller_config(_minimal(search={"minDrafts": 5000})).min_drafts == 5000
    assert to_controller_config(_minimal()).min_drafts == 20000  # the spec's default


def test_compound_durations_are_seconds() -> None:
    spec = _minimal(search={"window": "1m30s"}, retune={"every": "1d12h"})
    config = to_controller_config(spec)
    assert (config.window_s, config.retune_every_s) == (90.0, 129600.0)
