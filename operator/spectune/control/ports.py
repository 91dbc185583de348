"""The ports the tuning loop drives: where arms go, where metrics come from, what time it is.

The controller (``control/controller.py``) is written once against these small Protocols and
driven by two bodies: the operator (Kubernetes Deployments, Prometheus or pod scrape, the
wall clock) and the simulator's bench (a simulated fleet in virtual time). Neither body's
types leak through here; the brain sees arms, observations and seconds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from spectune.metrics.observation import Observation
from spectune.search.arms import Arm

__all__ = ["Actuator", "Clock", "Deployment", "Group", "GroupMetrics", "Placement", "Pods"]


class Group(enum.Enum):
    """Which replicas an observation covers."""

    INCUMBENT = "incumbent"
    CANARY = "canary"


class Placement(enum.Enum):
    """Where a trial's arm runs (SpecTuning ``search.placement``, ``search.strategy``)."""

    REPLACE = "replace"
    """The canary's c pods take the place of c target pods: N pods serve, as before."""
    BESIDE = "beside"
    """The canary's pods are added to the target's N: every pod carries N/(N+c) of its load."""
    IN_PLACE = "inPlace"
    """The target's own pods run the trial arm (``strategy: inPlace``)."""


@dataclass(frozen=True)
class Deployment:
    """What runs now, as the actuator sees it.

    Attributes
    ----------
    incumbent
        The arm the target (all non-canary replicas) runs.
    canary
        The arm of the canary replicas, or ``None`` when there is no canary.
    canary_ready
        Whether every canary replica serves traffic on ``canary``.
    canary_failure
        Why the canary arm cannot start (OOM, engine start-up error), or ``None``.
    rolling
        Whether a promotion (rolling update of the target) is still in progress.
    model_version
        The target model's version (image, ``--model``, drafter or the
        ``spectune.io/model-version`` annotation): a change re-opens the search.
    routes
        A fingerprint of the traffic routes; a change re-opens the search. Empty when the
        body cannot tell.
    target_failure
        Why the target's own rollout cannot finish (a crash loop, an out-of-memory, the
        progress deadline exceeded: the rollout is stuck), or ``None``.
    placement
        Where a trial's canary pods serve: :attr:`Placement.REPLACE` (they take the place
        of as many target pods, so every pod carries the target's own per-pod load),
        :attr:`Placement.BESIDE` (added to the target's pods) or
        :attr:`Placement.IN_PLACE` (the target's pods themselves run the trial arm).
    placement_reason
        Why a canary runs beside the target rather than in place of its pods
        (``SingleReplica``, ``Autoscaled``, ``CanaryNotSmaller``, ``Requested``), or ``None``.
    placement_message
        That reason in words, with the numbers (for the ``LoadMatched`` condition).
    scaled_externally
        Someone other than spectune (a person, a GitOps sync, an autoscaler) changed the
        target's replica count while a trial held it at N−c: what happened, or ``None``.
        The trial ends, the canary goes, and the new count is kept.
    """

    incumbent: Arm
    canary: Arm | None
    canary_ready: bool
    canary_failure: str | None
    rolling: bool
    model_version: str
    routes: str = ""
    target_failure: str | None = None
    placement: Placement = Placement.BESIDE
    placement_reason: str | None = None
    placement_message: str | None = None
    scaled_externally: str | None = None


class Actuator(Protocol):
    """Applies arms: to canary replicas for a trial, or to the whole target to promote."""

    async def deployment(self) -> Deployment:
        """What runs now."""
        ...

    async def start_canary(self, arm: Arm) -> None:
        """Put the canary replicas on ``arm`` (a restart); returns at once.

        With :attr:`Placement.REPLACE` the body scales the target from N to N−c once the
        canary's pods are Ready (surge: capacity never dips), and reports
        ``canary_ready`` only when the target serves at N−c: a trial's first window starts
        at the target's own per-pod load.
        """
        ...

    async def stop_canary(self) -> None:
        """Remove the canary: its replicas leave (or return to the incumbent).

        With :attr:`Placement.REPLACE` the target goes back to N first and the canary
        leaves once the target's pods are Ready; ``Deployment.rolling`` is True until then.
        After :attr:`Deployment.scaled_externally` the count someone else set is kept.
        """
        ...

    async def promote(self, arm: Arm) -> None:
        """Roll the target onto ``arm``; returns at once, ``Deployment.rolling`` tells progress."""
        ...


class Pods(Protocol):
    """The target's own pods, for remediation (``retune.drift.podAction: restartPod``)."""

    async def ready(self) -> Sequence[str]:
        """The names of the target's pods that are Ready and not being deleted."""
        ...

    async def evict(self, pod: str) -> str | None:
        """Evict one pod of the target (its controller, the ReplicaSet, replaces it).

        Returns None once the pod is evicted (or already gone), else why the cluster refused:
        a PodDisruptionBudget that allows no disruption now. Eviction, not deletion, so the
        restart counts against the budgets the user set for voluntary disruptions, as a
        ``kubectl drain`` does.
        """
        ...


class GroupMetrics(Protocol):
    """Observations of the incumbent and canary replicas over the same window."""

    async def observe(self, window_s: float) -> Mapping[Group, Observation]:
        """Wait out ``window_s`` seconds and return each group's observation of it.

        A group with no serving replica in the window is absent from the mapping.
        """
        ...


class Clock(Protocol):
    """Time, real or virtual."""

    def now(self) -> float:
        """Seconds since an arbitrary origin."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass."""
        ...
