"""The ports the tuning loop drives: where arms go, where metrics come from, what time it is.

The controller (``control/controller.py``) is written once against these small Protocols and
driven by two bodies: the operator (Kubernetes Deployments, Prometheus or pod scrape, the
wall clock) and the simulator's bench (a simulated fleet in virtual time). Neither body's
types leak through here; the brain sees arms, observations and seconds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from spectune.metrics.observation import Observation
from spectune.search.arms import Arm

__all__ = ["Actuator", "Clock", "Deployment", "Group", "GroupMetrics"]


class Group(enum.Enum):
    """Which replicas an observation covers."""

    INCUMBENT = "incumbent"
    CANARY = "canary"


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
    """

    incumbent: Arm
    canary: Arm | None
    canary_ready: bool
    canary_failure: str | None
    rolling: bool
    model_version: str
    routes: str = ""
    target_failure: str | None = None


class Actuator(Protocol):
    """Applies arms: to canary replicas for a trial, or to the whole target to promote."""

    async def deployment(self) -> Deployment:
        """What runs now."""
        ...

    async def start_canary(self, arm: Arm) -> None:
        """Put the canary replicas on ``arm`` (a restart); returns at once."""
        ...

    async def stop_canary(self) -> None:
        """Remove the canary: its replicas leave (or return to the incumbent)."""
        ...

    async def promote(self, arm: Arm) -> None:
        """Roll the target onto ``arm``; returns at once, ``Deployment.rolling`` tells progress."""
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
