"""From a validated SpecTuning spec to the brain's own values.

The operator's daemon builds its :class:`~spectune.control.controller.Controller` from these:
the search space (:func:`to_search_space`), the objective (:func:`to_objective`) and the
loop's timing and thresholds (:func:`to_controller_config`). The API's enums and field names
are a versioned contract and the brain's are not, so they meet here, in one place, and a
test checks that every API value has a counterpart.

Spec fields the brain has no setting for are not mapped: ``search.schedule``,
``canaryReplicas`` (the actuator's business) and ``retune.onRouteChange`` (the route watch
in ``k8s/routes.py`` does not run without it); ``search.strategy`` maps to whether trial
and incumbent share the traffic.
"""

from __future__ import annotations

from spectune.api.spec import (
    AdaptiveArm,
    AdaptiveMode,
    Drafter,
    DriftAction,
    Engine,
    ObjectiveMetric,
    PodAction,
    Schedule,
    SpecTuningSpec,
    Strategy,
    TiersStrategy,
    engine_mismatch,
)
from spectune.control.controller import ControllerConfig
from spectune.control.controller import DriftAction as LoopDriftAction
from spectune.control.controller import PodAction as LoopPodAction
from spectune.durations import parse_duration
from spectune.errors import SpecError
from spectune.search.arms import SGLANG_STRATEGIES, Arm
from spectune.search.objective import Guardrails, Metric, Objective
from spectune.search.policy import DrafterSpec, SearchSpace

__all__ = ["to_controller_config", "to_objective", "to_search_space"]

_METRICS = {
    ObjectiveMetric.TPOT_P95: Metric.TPOT_P95,
    ObjectiveMetric.E2E_P95: Metric.E2E_P95,
    ObjectiveMetric.TTFT_P95: Metric.TTFT_P95,
    ObjectiveMetric.OUTPUT_TOKENS_PER_SECOND: Metric.OUTPUT_TOKENS_PER_SECOND,
    ObjectiveMetric.GOODPUT: Metric.GOODPUT,
}
_DRIFT_ACTIONS = {
    DriftAction.ALERT: LoopDriftAction.ALERT,
    DriftAction.RETUNE: LoopDriftAction.RETUNE,
}
# SGLang's strategy names (search/arms.py); acceptLength is its default, spelled as none.
_STRATEGIES = {
    TiersStrategy.ACCEPT_LENGTH: None,
    TiersStrategy.THROUGHPUT_AWARE: SGLANG_STRATEGIES[1],
}
_POD_ACTIONS = {
    PodAction.ALERT: LoopPodAction.ALERT,
    PodAction.RESTART_POD: LoopPodAction.RESTART_POD,
}


def to_search_space(spec: SpecTuningSpec, engine: Engine | None = None) -> SearchSpace:
    """The candidate arms: every drafter at ``1..maxK``, and ``off`` unless ``allowOff`` is false.

    ``engine`` is the engine detected on the target, used when ``spec.engine`` is unset; per
    position acceptance is expected from vLLM only (SGLang does not export it). With neither,
    vLLM is assumed.
    """
    chosen = spec.engine or engine or Engine.VLLM
    if problem := engine_mismatch(spec, chosen):
        field, reason = problem
        raise SpecError(f"spec.{field}: {reason} (detected from the target's command)")
    drafters = tuple(DrafterSpec(d.name, d.method.value, d.max_k) for d in spec.drafters)
    return SearchSpace(
        drafters=drafters,
        allow_off=spec.allow_off,
        per_position=chosen is Engine.VLLM,
        schedules=chosen is Engine.VLLM and spec.search.schedule is Schedule.AUTO,
        adaptive=tuple(_adaptive_arm(d, a) for d in spec.drafters for a in d.adaptive),
    )


def _adaptive_arm(drafter: Drafter, a: AdaptiveArm) -> Arm:
    """The search's arm for one listed adaptive mode of ``drafter``."""
    if a.mode is AdaptiveMode.BATCH_TABLE:
        return Arm.scheduled(drafter.name, a.rows())
    if a.mode is AdaptiveMode.VERIFY:
        k = a.max_k if a.max_k is not None else drafter.max_k
        return Arm.verifying(drafter.name, k, a.rows())
    strategy = _STRATEGIES[a.strategy or TiersStrategy.ACCEPT_LENGTH]
    return Arm.tiered(drafter.name, a.tiers, strategy)


def to_objective(spec: SpecTuningSpec) -> Objective:
    """The objective metric and the guardrails (``null`` guardrails stay unchecked)."""
    g = spec.objective.guardrails
    return Objective(
        metric=_METRICS[spec.objective.metric],
        guardrails=Guardrails(
            max_ttft_p95_regression=g.max_ttft_p95_regression,
            max_queue_p95_regression=g.max_queue_p95_regression,
        ),
    )


def to_controller_config(spec: SpecTuningSpec, *, seed: int = 0) -> ControllerConfig:
    """The loop's settings: window, trial budget, stopping rule, drift and scheduled re-tunes.

    Settings the spec does not carry (polling, readiness timeout, load shift) keep the
    controller's defaults; ``seed`` seeds the policy (the operator derives it from the
    resource, so a restart decides the same way).
    """
    search, retune = spec.search, spec.retune
    every = retune.every
    return ControllerConfig(
        window_s=parse_duration(search.window, "spec.search.window"),
        max_trials=search.max_trials,
        min_drafts=search.min_drafts,
        verify_windows=search.verify_windows,
        epsilon=search.epsilon,
        delta=search.delta,
        drift_threshold=retune.drift.threshold,
        drift_for_s=parse_duration(retune.drift.for_, "spec.retune.drift.for"),
        drift_action=_DRIFT_ACTIONS[retune.drift.action],
        pod_action=_POD_ACTIONS[retune.drift.pod_action],
        min_ready_pods=retune.drift.min_ready_pods,
        retune_every_s=(parse_duration(every, "spec.retune.every") if every is not None else None),
        retune_on_model_change=retune.on_model_change,
        shared_traffic=search.strategy is not Strategy.IN_PLACE,
        seed=seed,
    )
