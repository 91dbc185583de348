"""Rollout readiness as a classification: waiting, ready or stuck (never a bare boolean).

The actuator asks it after every canary start and promotion. ``stuck`` means the rollout
will not finish on its own — the Deployment passed its progress deadline, or a pod of the
new arm crash-loops or was OOM-killed (a drafter too large for the GPU) — and the arm is
rolled back and marked infeasible. Pure: objects in, verdict out.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Readiness", "RolloutState", "classify_rollout"]

Obj = dict[str, Any]

_STUCK_WAITING = {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerError"}
_STUCK_TERMINATED = {"OOMKilled", "Error"}
#: A container that restarted this often is crash-looping even if the kubelet has not said so.
MAX_RESTARTS = 3


class Readiness(enum.Enum):
    """Where a rollout is."""

    WAITING = "waiting"
    READY = "ready"
    STUCK = "stuck"


@dataclass(frozen=True)
class RolloutState:
    """A verdict and its reason (shown in events and status)."""

    readiness: Readiness
    reason: str


def classify_rollout(deployment: Obj, pods: Sequence[Obj] = ()) -> RolloutState:
    """Classify a Deployment's rollout from its status and its pods' container states."""
    meta, spec, status = (
        deployment.get("metadata", {}),
        deployment.get("spec", {}),
        deployment.get("status", {}),
    )
    for pod in pods:
        name = pod.get("metadata", {}).get("name", "?")
        for cs in pod.get("status", {}).get("containerStatuses") or []:
            state = cs.get("state") or {}
            last = cs.get("lastState") or {}
            waiting = (state.get("waiting") or {}).get("reason")
            if waiting in _STUCK_WAITING:
                message = (state.get("waiting") or {}).get("message", "")
                return RolloutState(Readiness.STUCK, f"pod {name}: {waiting} {message}".strip())
            for term in (state.get("terminated"), last.get("terminated")):
                reason = (term or {}).get("reason")
                if reason == "OOMKilled" or (
                    reason in _STUCK_TERMINATED and cs.get("restartCount", 0) >= MAX_RESTARTS
                ):
                    return RolloutState(Readiness.STUCK, f"pod {name}: container {reason}")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return RolloutState(
                Readiness.STUCK, cond.get("message") or "progress deadline exceeded"
            )
    want = spec.get("replicas", 1)
    if status.get("observedGeneration", 0) < meta.get("generation", 0):
        return RolloutState(Readiness.WAITING, "the controller has not seen the new spec yet")
    updated = status.get("updatedReplicas", 0)
    available = status.get("availableReplicas", 0)
    total = status.get("replicas", 0)
    if updated < want:
        return RolloutState(Readiness.WAITING, f"{updated}/{want} replicas updated")
    if total > updated:
        return RolloutState(Readiness.WAITING, f"{total - updated} old replica(s) terminating")
    if available < want:
        return RolloutState(Readiness.WAITING, f"{available}/{want} replicas available")
    return RolloutState(Readiness.READY, f"{available}/{want} replicas ready")
