"""The SpecTuning status: what the operator did, what it recommends, and why.

The operator's handlers build a :class:`SpecTuningStatus` from the controller's state and
write ``status.model_dump(mode="json", exclude_none=True)`` into ``patch.status``; on
resume they read it back with :func:`parse_status` (the restart-safe trial history lives in
``history``). ``api/crd.py`` generates the status schema from these models, so every field
the controller writes is typed, bounded and explained in ``kubectl explain``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any

from pydantic import ConfigDict, Field, WithJsonSchema

from spectune.api.validation import ApiModel, Duration, validate_body

__all__ = [
    "MAX_TRIALS_IN_STATUS",
    "Acceptance",
    "Applied",
    "Condition",
    "ConditionStatus",
    "Finding",
    "Interval",
    "Phase",
    "Recommendation",
    "SpecTuningStatus",
    "Trial",
    "TrialOutcome",
    "parse_status",
]

MAX_TRIALS_IN_STATUS = 20
"""The status keeps the latest trials only; the policy's record is in ``history``."""

_ARM_DESCRIPTION = "off, <drafter>/<k> or <drafter>/sched:<lo>-<hi>=<k>,<lo>-<hi>=<k>"


class Phase(enum.StrEnum):
    """Where the tuning of this deployment stands."""

    BASELINE = "Baseline"
    EXPLORING = "Exploring"
    CONVERGED = "Converged"
    MONITORING = "Monitoring"
    VERIFYING = "Verifying"
    DRIFTED = "Drifted"
    DEGRADED = "Degraded"
    SUSPENDED = "Suspended"
    FAILED = "Failed"


class TrialOutcome(enum.StrEnum):
    """How a trial ended (or that it is still running)."""

    RUNNING = "running"
    MEASURED = "measured"
    ABORTED = "aborted"
    INFEASIBLE = "infeasible"


class ConditionStatus(enum.StrEnum):
    """The status of a condition, as in every Kubernetes condition."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Applied(ApiModel):
    """The speculative setting the target runs now, as the operator applied it."""

    drafter: str = Field(max_length=63, description="Drafter name, or off when speculation is off.")
    k: int = Field(ge=0, description="Draft length (num_speculative_tokens), tokens; 0 when off.")
    arm: str = Field(max_length=512, description=f"The arm's full name: {_ARM_DESCRIPTION}.")
    adaptive: str | None = Field(
        None,
        max_length=256,
        description=(
            "The in-engine adaptive mode the arm runs, with the engine's rule: batch-table "
            "(vLLM Dynamic SD), verify (vLLM adaptive verification) or tiers (SGLang "
            "--speculative-adaptive). Unset for a fixed k or off."
        ),
    )
    fingerprint: str = Field(
        max_length=128,
        description=(
            "Hash of the speculative arguments the operator wrote; a different hash on the "
            "target means a human edited it."
        ),
    )
    speedup: float | None = Field(
        None,
        ge=0,
        description=(
            "The applied arm's measured gain on the SpecTuning's objective against "
            "speculation off, a ratio (off's p95 / the arm's for a latency, the arm's / "
            "off's for a throughput; 1.54 = 54 % better; 1 when off is applied). Unset until "
            "both were measured in this search."
        ),
    )


class Interval(ApiModel):
    """A two-sided interval."""

    low: float = Field(description="Lower bound.")
    high: float = Field(description="Upper bound.")


class Recommendation(ApiModel):
    """The best arm found so far and what it is expected to gain."""

    arm: str = Field(max_length=512, description=f"The recommended arm: {_ARM_DESCRIPTION}.")
    drafter: str = Field(max_length=63, description="Drafter name, or off.")
    k: int = Field(ge=0, description="Draft length, tokens; 0 when off.")
    expected_speedup: float | None = Field(
        None,
        ge=0,
        description=(
            "Expected speedup of the objective against speculation off, a ratio (1.3 = 30 % "
            "better). Unset: not estimated yet."
        ),
    )
    interval: Interval | None = Field(
        None, description="95 % interval of expectedSpeedup. Unset: not estimated yet."
    )
    reason: str = Field("", max_length=1024, description="Why this arm, in one sentence.")


class Acceptance(ApiModel):
    """Measured acceptance of the applied drafter over the latest window."""

    rate: float = Field(
        ge=0, le=1, description="Accepted drafted tokens / drafted tokens, a fraction."
    )
    per_position: tuple[float, ...] = Field(
        (),
        max_length=16,
        description=(
            "Acceptance rate at each draft position 1..k (P(accepted length >= i)), fractions. "
            "Empty when the engine does not export it."
        ),
    )
    mean_accepted_length: float | None = Field(
        None,
        ge=0,
        description="Mean tokens emitted per verification pass (accepted + 1), tokens.",
    )
    window: Duration | None = Field(None, description="Length of the window measured.")


class Finding(ApiModel):
    """One diagnosis finding, coded as spectune diagnose codes it."""

    code: str = Field(
        max_length=64,
        pattern=r"^[A-Z][A-Z0-9_]*$",
        description=(
            "LOW_ACCEPTANCE, DRAFTER_TOO_EXPENSIVE, K_PAST_PEAK, KV_POOL_SHRANK, QUEUEING, "
            "LARGE_BATCH_REGIME, DRAFTER_BROKEN, POD_ACCEPTANCE_DECAY, HEALTHY or "
            "INSUFFICIENT_DATA."
        ),
    )
    message: str = Field(max_length=1024, description="What was found, in one sentence.")
    evidence: dict[str, Any] = Field(
        default_factory=dict, description="The numbers behind the finding, by name."
    )


class Trial(ApiModel):
    """One arm measured on the canary (or in place) against the incumbent."""

    arm: str = Field(max_length=512, description=f"The arm tried: {_ARM_DESCRIPTION}.")
    outcome: TrialOutcome = Field(
        description="running, measured, aborted (a guardrail fired) or infeasible (no start)."
    )
    started_at: datetime = Field(description="When the trial started (RFC 3339).")
    windows: int = Field(0, ge=0, description="Measurement windows completed. Default 0.")
    incumbent: str | None = Field(
        None, max_length=512, description="The arm the incumbent replicas ran."
    )
    canary_objective: float | None = Field(
        None, description="The objective measured on the trial arm (its unit: see objective)."
    )
    incumbent_objective: float | None = Field(
        None, description="The objective measured on the incumbent in the same windows."
    )
    canary_load_per_pod: float | None = Field(
        None,
        description=(
            "Requests the canary's pods finished per pod per second, mean over the windows."
        ),
    )
    incumbent_load_per_pod: float | None = Field(
        None,
        description=(
            "Requests the incumbent's pods finished per pod per second in the same windows."
        ),
    )
    canary_batch: float | None = Field(
        None, description="Mean running requests per canary pod (the batch), over the windows."
    )
    incumbent_batch: float | None = Field(
        None, description="Mean running requests per incumbent pod in the same windows."
    )
    load_ratio: float | None = Field(
        None,
        description=(
            "Canary over incumbent load per pod, mean over the windows: 1 when both serve the "
            "same per-pod load (placement replace); N/(N+c)-like shares show a canary beside."
        ),
    )
    matched_windows: int | None = Field(
        None,
        ge=0,
        description="Windows whose load ratio is within 15 % of 1 (judged as matched pairs).",
    )
    switchback: bool | None = Field(
        None,
        description=(
            "True for an inPlace trial: a switchback on the target itself, each window an "
            "A/B pair (a stretch of the trial arm, then one of the incumbent, each after a "
            "restart and a wash-out). Absent for a canary trial."
        ),
    )
    restarts: int | None = Field(
        None,
        ge=0,
        description=(
            "Restarts of the target this switchback trial caused so far: two per A/B pair "
            "(into the trial arm, back into the incumbent), one more for a rollback from the "
            "trial arm. Absent for a canary trial."
        ),
    )
    reason: str = Field("", max_length=1024, description="Why the trial ended as it did.")


class Condition(ApiModel):
    """A standard Kubernetes condition (Ready, MetricsAvailable, ...)."""

    type: str = Field(
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        description="Type of the condition in CamelCase, e.g. Ready.",
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        max_length=1024,
        pattern=r"^([A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?)$",
        description="Why, in CamelCase, e.g. InvalidSpec.",
    )
    message: str = Field(max_length=32768, description="Why, for humans.")
    last_transition_time: datetime = Field(description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        None, ge=0, description="The .metadata.generation the condition was set for."
    )


class SpecTuningStatus(ApiModel):
    """What the operator did, what it recommends, and why."""

    # Reading a status back must not fail on a field a newer operator wrote.
    model_config = ConfigDict(extra="ignore")

    phase: Phase | None = Field(
        None,
        description=(
            "Baseline, Exploring, Converged, Monitoring, Verifying, Drifted, Degraded, Suspended "
            "or Failed."
        ),
    )
    applied: Applied | None = Field(None, description="The setting the target runs now.")
    recommendation: Recommendation | None = Field(
        None, description="The best setting found and its expected gain."
    )
    acceptance: Acceptance | None = Field(
        None, description="Acceptance of the applied setting over the latest window."
    )
    diagnosis: tuple[Finding, ...] = Field(
        (), max_length=16, description="Findings on the latest window. Default []."
    )
    trials: tuple[Trial, ...] = Field(
        (),
        max_length=MAX_TRIALS_IN_STATUS,
        description="The latest trials, oldest first (at most 20). Default [].",
    )
    observed_model_version: str | None = Field(
        None, max_length=1024, description="The target's model version the search ran on."
    )
    observed_routes: str | None = Field(
        None, max_length=1024, description="Fingerprint of the traffic routes the search ran on."
    )
    observed_generation: int | None = Field(
        None, ge=0, description="The .metadata.generation last acted on."
    )
    conditions: tuple[Condition, ...] = Field(
        (),
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Standard conditions (Ready, MetricsAvailable, ...). Default [].",
    )
    history: Annotated[
        str | dict[str, Any] | None,
        # Any JSON value: version 2 is a string, version 1 (operators before it) an object.
        WithJsonSchema({"nullable": True, "x-kubernetes-preserve-unknown-fields": True}),
    ] = Field(
        None,
        description=(
            "The controller's restart-safe trial history and state, bounded (written and read "
            "by the operator only): base64 of gzipped JSON, one line in kubectl describe. "
            "Read it with: kubectl get spt NAME -o jsonpath='{.status.history}' | base64 -d "
            "| gunzip"
        ),
    )


def parse_status(body: Mapping[str, Any]) -> SpecTuningStatus:
    """The validated status of a SpecTuning (empty when it has none yet).

    ``body`` is the whole resource (with an optional ``status`` key) or the bare status.
    Raises :class:`~spectune.api.validation.InvalidSpecError` naming every bad field.
    """
    if not {"apiVersion", "kind", "metadata", "spec", "status"}.isdisjoint(body):
        body = body.get("status") or {}
    return validate_body(SpecTuningStatus, body, "status")
