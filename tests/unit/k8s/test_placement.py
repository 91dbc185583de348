"""Which placement a canary gets and why, and what the target's annotations say it holds.

Pure decisions (``k8s/placement.py``): the operator's behaviour on a real API server is in
``tests/integration/operator/test_placement.py``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from spectune.api.spec import PlacementChoice
from spectune.control.ports import Placement
from spectune.k8s.actuator import KubeActuator
from spectune.k8s.placement import (
    ANNOTATION_REPLICAS_BEFORE,
    ANNOTATION_REPLICAS_DURING,
    Hold,
    Scaling,
    autoscaler_of,
    choose_placement,
    scaling_of,
)

AUTO, REPLACE, BESIDE = PlacementChoice.AUTO, PlacementChoice.REPLACE, PlacementChoice.BESIDE


@pytest.mark.parametrize(
    ("choice", "n", "c", "owner", "unknown", "placement", "reason"),
    [
        (AUTO, 3, 1, None, None, Placement.REPLACE, None),
        (REPLACE, 2, 1, None, None, Placement.REPLACE, None),
        (AUTO, 1, 1, None, None, Placement.BESIDE, "SingleReplica"),
        (AUTO, 0, 1, None, None, Placement.BESIDE, "SingleReplica"),
        (AUTO, 2, 2, None, None, Placement.BESIDE, "CanaryNotSmaller"),
        (AUTO, 3, 5, None, None, Placement.BESIDE, "CanaryNotSmaller"),
        (AUTO, 4, 1, "HorizontalPodAutoscaler web", None, Placement.BESIDE, "Autoscaled"),
        (AUTO, 4, 1, None, "HTTP 403 forbidden", Placement.BESIDE, "AutoscalerUnknown"),
        (BESIDE, 4, 1, None, None, Placement.BESIDE, "Requested"),
        (REPLACE, 1, 1, None, None, Placement.BESIDE, "SingleReplica"),
        (REPLACE, 4, 1, "ScaledObject web", None, Placement.BESIDE, "Autoscaled"),
    ],
)
def test_placement_and_its_reason(
    choice: PlacementChoice,
    n: int,
    c: int,
    owner: str | None,
    unknown: str | None,
    placement: Placement,
    reason: str | None,
) -> None:
    v = choose_placement(choice, n, c, owner, unknown)
    assert (v.placement, v.reason) == (placement, reason)
    assert v.message  # the LoadMatched condition's words, always there


def test_the_messages_name_the_numbers_and_a_refused_replace_says_so() -> None:
    ok = choose_placement(AUTO, 3, 1)
    assert "1 pod(s)" in (ok.message or "") and "target's 3" in (ok.message or "")
    single = choose_placement(REPLACE, 1, 1)
    assert (single.message or "").startswith("search.placement: replace cannot hold")
    assert "1/2 of the target's load" in (single.message or "")
    hpa = choose_placement(AUTO, 4, 1, "HorizontalPodAutoscaler web")
    assert "HorizontalPodAutoscaler web" in (hpa.message or "")
    assert "cannot hold" not in (hpa.message or "")  # auto never promised replace
    # The operator's own case sits on top of the rules both bodies share.
    assert choose_placement(AUTO, 1, 1, None, "HTTP 403").reason == "SingleReplica"


def _hpa(name: str, target: str, kind: str = "Deployment", api: str = "apps/v1") -> Any:
    ref = {"kind": kind, "name": target, "apiVersion": api}
    return {"metadata": {"name": name}, "spec": {"scaleTargetRef": ref}}


def test_an_autoscaler_owns_the_target_only_through_its_scale_target_ref() -> None:
    assert autoscaler_of([_hpa("h", "llama")], [], "llama") == "HorizontalPodAutoscaler h"
    assert autoscaler_of([_hpa("h", "other")], [], "llama") is None
    assert autoscaler_of([_hpa("h", "llama", kind="StatefulSet")], [], "llama") is None
    # A KEDA ScaledObject's kind and apiVersion default to an apps/v1 Deployment.
    keda = {"metadata": {"name": "k"}, "spec": {"scaleTargetRef": {"name": "llama"}}}
    assert autoscaler_of([], [keda], "llama") == "ScaledObject k"
    assert autoscaler_of([{"metadata": {"name": "x"}, "spec": {}}], [], "llama") is None


def _target(replicas: int | None, **notes: str) -> Any:
    spec = {} if replicas is None else {"replicas": replicas}
    return {"metadata": {"annotations": notes}, "spec": spec}


def test_what_the_annotations_say_spectune_holds() -> None:
    before, during = ANNOTATION_REPLICAS_BEFORE, ANNOTATION_REPLICAS_DURING
    assert scaling_of(_target(3)).hold is Hold.NONE
    assert scaling_of(_target(None)).replicas == 1  # the API server's default
    scaled = scaling_of(_target(2, **{before: "3", during: "2"}))
    assert scaled.hold is Hold.SCALED and scaled.external("llama") is None
    assert scaling_of(_target(3, **{before: "3"})).hold is Hold.RESTORING
    # Someone else scaled it while a trial held it at 2: theirs is kept, the numbers said.
    human = scaling_of(_target(5, **{before: "3", during: "2"}))
    assert human.hold is Hold.EXTERNAL
    assert "scaled to 5" in (human.external("llama") or "")
    assert "held it at 2" in (human.external("llama") or "")
    assert "had 3" in (human.external("llama") or "")
    assert scaling_of(_target(4, **{before: "3"})).hold is Hold.EXTERNAL
    # A record that is not a count is no record (never restored to a guess).
    assert scaling_of(_target(2, **{before: "three", during: "2"})).hold is Hold.NONE


# -- the autoscaler lookup on a FAKE API: a refusal never wedges the loop ------------------------


class _Response:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.data = json.dumps(doc).encode()

    def release_conn(self) -> None:
        pass


class _FakeAutoscaling:
    """A FAKE AutoscalingV2Api: lists the given HPAs, or refuses as the API server does."""

    def __init__(self, items: list[Any], status: int | None = None) -> None:
        self.items, self.status = items, status

    def list_namespaced_horizontal_pod_autoscaler(self, ns: str, **_: Any) -> _Response:
        if self.status is not None:
            raise ApiException(status=self.status, reason="Forbidden")
        return _Response({"items": self.items})


class _FakeCustom:
    """A FAKE CustomObjectsApi for keda.sh ScaledObjects: 404 when KEDA is not installed."""

    def __init__(self, items: list[Any], status: int | None = None) -> None:
        self.items, self.status = items, status

    def list_namespaced_custom_object(self, *_: Any) -> dict[str, Any]:
        if self.status is not None:
            raise ApiException(status=self.status, reason="Not Found")
        return {"items": self.items}


def _verdict(autoscaling: _FakeAutoscaling, custom: _FakeCustom) -> Any:
    spt = {"metadata": {"name": "tune", "namespace": "ns", "uid": "0"}}
    kube = KubeActuator(k8s.ApiClient(), spt, "llama", "vllm", "vllm", {}, 1, AUTO)
    kube._autoscaling = autoscaling  # type: ignore[assignment]
    kube._custom = custom  # type: ignore[assignment]
    return asyncio.run(kube._verdict(Scaling(3, None, None)))


def test_keda_not_installed_is_no_autoscaler() -> None:
    v = _verdict(_FakeAutoscaling([]), _FakeCustom([], status=404))
    assert v.placement is Placement.REPLACE


def test_an_hpa_or_scaled_object_on_the_target_keeps_the_canary_beside() -> None:
    v = _verdict(_FakeAutoscaling([_hpa("web", "llama")]), _FakeCustom([], status=404))
    assert (v.placement, v.reason) == (Placement.BESIDE, "Autoscaled")
    keda = {"metadata": {"name": "k"}, "spec": {"scaleTargetRef": {"name": "llama"}}}
    v = _verdict(_FakeAutoscaling([]), _FakeCustom([keda]))
    assert (v.placement, v.reason) == (Placement.BESIDE, "Autoscaled")


def test_a_forbidden_lookup_falls_back_to_beside_and_says_why() -> None:
    v = _verdict(_FakeAutoscaling([], status=403), _FakeCustom([], status=404))
    assert (v.placement, v.reason) == (Placement.BESIDE, "AutoscalerUnknown")
    assert "HorizontalPodAutoscalers" in (v.message or "") and "403" in (v.message or "")
    v = _verdict(_FakeAutoscaling([]), _FakeCustom([], status=403))
    assert v.reason == "AutoscalerUnknown" and "ScaledObjects" in (v.message or "")
