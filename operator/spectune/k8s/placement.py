"""Where a canary's pods serve, and the bookkeeping that makes ``replace`` crash-safe.

``replace`` (the default where it can hold) scales the target from N to N−c while a trial's
c canary pods serve, so N pods share the traffic as they did before and each carries the
target's own per-pod load: the speculation payoff depends on exactly that per-pod batch.
``beside`` adds the canary's pods to the target's N (each pod then carries N/(N+c) of its
load). The actuator (``k8s/actuator.py``) asks :func:`choose_placement` (the rules both
bodies share, ``control/placement.py``, and the operator's own case) which one holds and
why, and reads and writes the replica counts it owes through the annotations below, on the
target itself: the actuator's memory is lost on a restart, the target's annotations are not.

Pure: objects in, verdicts out.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from spectune.api.spec import PlacementChoice
from spectune.control.placement import PlacementVerdict
from spectune.control.placement import choose_placement as shared_choice
from spectune.control.ports import Placement

__all__ = [
    "ANNOTATION_LEAVING",
    "ANNOTATION_REPLICAS_BEFORE",
    "ANNOTATION_REPLICAS_DURING",
    "LEAVING_STOPPED",
    "LEAVING_SUPERSEDED",
    "Hold",
    "Scaling",
    "autoscaler_of",
    "choose_placement",
    "scaling_of",
]

Obj = dict[str, Any]

ANNOTATION_REPLICAS_BEFORE = "spectune.io/replicas-before-trial"
"""On the target: its replica count N before a trial scaled it down (written with the scale)."""
ANNOTATION_REPLICAS_DURING = "spectune.io/replicas-during-trial"
"""On the target: the count N−c spectune set for the trial (absent while it goes back to N)."""
ANNOTATION_LEAVING = "spectune.io/leaving"
"""On a canary: it goes once its place is taken (:data:`LEAVING_SUPERSEDED`: by the next
trial's canary; :data:`LEAVING_STOPPED`: by the target's own pods back at N)."""
LEAVING_SUPERSEDED = "superseded"
LEAVING_STOPPED = "stopped"


def choose_placement(
    choice: PlacementChoice,
    replicas: int,
    canary_replicas: int,
    autoscaler: str | None = None,
    autoscaler_unknown: str | None = None,
) -> PlacementVerdict:
    """Replace where it can hold, else beside with the reason.

    The rules are the ones both bodies share
    (:func:`spectune.control.placement.choose_placement`: one replica, c ≥ N, an
    autoscaler that owns the count, ``beside`` requested); the operator adds the case the
    simulator never has: whether an autoscaler owns the target's replicas cannot be told
    (``autoscaler_unknown``: the RBAC forbids listing them). That counts as one (reason
    ``AutoscalerUnknown``): the safe side is not to scale. With ``placement: replace`` the
    message says that replace cannot hold.
    """
    verdict = shared_choice(choice.value, replicas, canary_replicas, autoscaler)
    if verdict.placement is Placement.REPLACE and autoscaler_unknown is not None:
        verdict = PlacementVerdict(
            Placement.BESIDE,
            "AutoscalerUnknown",
            f"whether an autoscaler owns the target's replicas cannot be told "
            f"({autoscaler_unknown}); spectune does not scale it, so the canary runs beside "
            "the target",
        )
    if verdict.placement is Placement.REPLACE:
        return PlacementVerdict(
            Placement.REPLACE,
            None,
            f"the canary's {canary_replicas} pod(s) take the place of as many of the target's "
            f"{replicas}: every pod serves the target's own per-pod load",
        )
    message = verdict.message or ""
    if choice is PlacementChoice.REPLACE:
        message = f"search.placement: replace cannot hold: {message}"
    share = f"each pod carries {replicas}/{replicas + canary_replicas} of the target's load"
    return PlacementVerdict(verdict.placement, verdict.reason, f"{message} ({share})")


def autoscaler_of(
    hpas: Iterable[Mapping[str, Any]], scaled_objects: Iterable[Mapping[str, Any]], target: str
) -> str | None:
    """The autoscaler whose ``scaleTargetRef`` is Deployment ``target``, named, or None.

    A KEDA ScaledObject's ``kind`` and ``apiVersion`` default to an ``apps/v1``
    Deployment; a HorizontalPodAutoscaler states them.
    """
    for kind, items, default_kind in (
        ("HorizontalPodAutoscaler", hpas, None),
        ("ScaledObject", scaled_objects, "Deployment"),
    ):
        for obj in items:
            ref = (obj.get("spec") or {}).get("scaleTargetRef") or {}
            api = str(ref.get("apiVersion") or "apps/v1")
            if (
                ref.get("kind", default_kind) == "Deployment"
                and ref.get("name") == target
                and api.split("/")[0] in ("apps", "extensions")
            ):
                name = (obj.get("metadata") or {}).get("name", "?")
                return f"{kind} {name}"
    return None


class Hold(enum.Enum):
    """What spectune holds the target's replica count at, from its annotations."""

    NONE = "none"
    """No trial scaled it: the count is the target owner's."""
    SCALED = "scaled"
    """At N−c for a trial."""
    RESTORING = "restoring"
    """Back at N; the canary leaves once the target's pods are Ready."""
    EXTERNAL = "external"
    """Someone else set another count while spectune held it: theirs is kept."""


@dataclass(frozen=True)
class Scaling:
    """The target's replica count and what spectune recorded about it."""

    replicas: int
    before: int | None
    during: int | None

    @property
    def hold(self) -> Hold:
        """Where the count stands (see :class:`Hold`)."""
        if self.before is None:
            return Hold.NONE
        expected = self.during if self.during is not None else self.before
        if self.replicas != expected:
            return Hold.EXTERNAL
        return Hold.SCALED if self.during is not None else Hold.RESTORING

    def external(self, target: str) -> str | None:
        """What someone else did to the count, in words with the numbers, or None."""
        if self.hold is not Hold.EXTERNAL:
            return None
        if self.during is not None:
            return (
                f"Deployment {target} was scaled to {self.replicas} replica(s) while a trial "
                f"held it at {self.during} (it had {self.before})"
            )
        return (
            f"Deployment {target} was scaled to {self.replicas} replica(s) while spectune "
            f"restored it to {self.before}"
        )


def _count(value: object) -> int | None:
    try:
        n = int(str(value))
    except ValueError:
        return None
    return n if n >= 0 else None


def scaling_of(target: Mapping[str, Any]) -> Scaling:
    """The target's :class:`Scaling` (an annotation that is not a count is read as absent)."""
    meta = target.get("metadata") or {}
    notes = meta.get("annotations") or {}
    replicas = (target.get("spec") or {}).get("replicas")
    before = (
        _count(notes[ANNOTATION_REPLICAS_BEFORE]) if ANNOTATION_REPLICAS_BEFORE in notes else None
    )
    during = (
        _count(notes[ANNOTATION_REPLICAS_DURING]) if ANNOTATION_REPLICAS_DURING in notes else None
    )
    return Scaling(
        1 if replicas is None else int(replicas), before, during if before is not None else None
    )
