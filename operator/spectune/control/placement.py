"""Where a trial's canary serves: in the place of target pods, or beside them.

Both bodies ask :func:`choose_placement` (the operator with what it reads of the target and
its autoscalers, the simulator with its fleet), so the reasons a user reads in the
``LoadMatched`` condition are the same in the bench, the demo and a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from spectune.control.ports import Placement

__all__ = ["PlacementVerdict", "choose_placement"]


@dataclass(frozen=True)
class PlacementVerdict:
    """The placement a canary gets, and why not ``replace`` when it is not."""

    placement: Placement
    reason: str | None = None
    """``SingleReplica``, ``CanaryNotSmaller``, ``Autoscaled`` or ``Requested``; None for
    replace."""
    message: str | None = None

    @property
    def matched(self) -> bool:
        """Whether the canary's pods carry the target's own per-pod load."""
        return self.placement is Placement.REPLACE


def choose_placement(
    requested: str, replicas: int, canary_replicas: int, autoscaler: str | None = None
) -> PlacementVerdict:
    """The placement of a canary of ``canary_replicas`` pods beside a target of ``replicas``.

    ``requested`` is ``search.placement`` (``auto``, ``replace`` or ``beside``);
    ``autoscaler`` names what owns the target's replica count (``HorizontalPodAutoscaler
    ns/name``), or None. Replace holds only where matched load leaves an incumbent to pair
    with and nobody else owns the count:

    * one replica: the canary in its place would leave no incumbent serving at all;
    * a canary at least as large as the target: the same;
    * an autoscaler owns the replicas: scaling against it is a fight it wins within its
      sync period (and one the user never asked for), and editing it is worse.

    ``replace`` requested where it cannot hold falls back to beside with the same reason:
    the canary then runs at N/(N+c) of the per-pod load, and the condition says so.
    """
    if requested == "beside":
        return PlacementVerdict(Placement.BESIDE, "Requested", "search.placement is beside")
    if replicas <= 1:
        return PlacementVerdict(
            Placement.BESIDE,
            "SingleReplica",
            "the target has 1 replica: a canary in its place would leave no incumbent to "
            "compare with, so it runs beside it at half the load per pod (strategy inPlace "
            "tunes one replica at its full load)",
        )
    if canary_replicas >= replicas:
        return PlacementVerdict(
            Placement.BESIDE,
            "CanaryNotSmaller",
            f"canaryReplicas {canary_replicas} is not below the target's {replicas} "
            "replicas: no incumbent would be left, so the canary runs beside it",
        )
    if autoscaler is not None:
        return PlacementVerdict(
            Placement.BESIDE,
            "Autoscaled",
            f"{autoscaler} owns the target's replica count: spectune never scales against "
            "it, so the canary runs beside the target",
        )
    return PlacementVerdict(Placement.REPLACE)
