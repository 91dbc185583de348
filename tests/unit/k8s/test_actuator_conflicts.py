"""The actuator's patch of the target under other writers: retried on fresh state, with waits.

``KubeActuator`` runs over a FAKE AppsV1Api (:class:`ChurningApps`): one Deployment whose
resourceVersion moves on by itself for a number of reads, as a Deployment in the middle of a
rollout does (its controller writes the status on every pod that comes up), and that refuses
a patch guarded by a stale resourceVersion with HTTP 409, as the API server does. The waits
between tries are recorded instead of slept. The real API server's conflict is exercised in
``tests/integration/operator/test_faults.py``.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from spectune.errors import SourceUnavailableError
from spectune.k8s import actuator as actuator_module
from spectune.k8s.actuator import CONFLICT_BACKOFF_S, KubeActuator
from spectune.k8s.deployments import DrafterArgs
from spectune.search.arms import Arm
from tests.unit.operator.fakes import EAGLE, MODEL, adopted, target

DRAFTERS = {"eagle3": DrafterArgs("eagle3", "eagle3", EAGLE)}


class _Response:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.data = json.dumps(doc).encode()

    def release_conn(self) -> None:
        pass


class ChurningApps:
    """A FAKE AppsV1Api: the target's resourceVersion moves on right after each of the first
    ``churn`` reads (a status write landing between the operator's read and its patch)."""

    def __init__(self, churn: int) -> None:
        self.obj = adopted(target())  # tuning adopted it: its fingerprint is there
        self.churn = churn
        self.reads = 0
        self.refused = 0
        self.managers: list[str | None] = []

    def _bump(self) -> None:
        meta = self.obj["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def read_namespaced_deployment(self, name: str, ns: str, **_: Any) -> _Response:
        doc = copy.deepcopy(self.obj)
        self.reads += 1
        if self.reads <= self.churn:
            self._bump()
        return _Response(doc)

    def patch_namespaced_deployment(
        self, name: str, ns: str, patch: dict[str, Any], field_manager: str | None = None
    ) -> None:
        self.managers.append(field_manager)
        if patch["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            self.refused += 1
            raise ApiException(status=409, reason="Conflict")
        container = patch["spec"]["template"]["spec"]["containers"][0]
        self.obj["spec"]["template"]["spec"]["containers"][0]["args"] = container["args"]
        self._bump()


def _promote(apps: ChurningApps, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(actuator_module.asyncio, "sleep", record)
    spt = {"metadata": {"name": "tune", "namespace": "ns", "uid": "0"}}
    kube = KubeActuator(k8s.ApiClient(), spt, "llama", "vllm", "vllm", DRAFTERS)
    kube._apps = apps  # type: ignore[assignment]
    asyncio.run(kube.promote(Arm("eagle3", 3)))
    return waits


def _args(apps: ChurningApps) -> list[str]:
    return list(apps.obj["spec"]["template"]["spec"]["containers"][0]["args"])


def test_a_target_mid_rollout_is_patched_once_it_holds_still(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five writes in a row land between read and patch (the old limit gave up there); the
    tries wait longer each time and the sixth goes through."""
    apps = ChurningApps(churn=5)
    waits = _promote(apps, monkeypatch)
    assert apps.refused == 5
    assert "--speculative-config" in _args(apps)
    assert json.loads(_args(apps)[_args(apps).index("--speculative-config") + 1]) == {
        "method": "eagle3", "model": EAGLE, "num_speculative_tokens": 3}  # fmt: skip
    assert waits == list(CONFLICT_BACKOFF_S[:6])
    assert waits[0] == 0 and all(a < b for a, b in itertools.pairwise(waits))
    # Every write is attributable: the target's managedFields name spectune.
    assert apps.managers and set(apps.managers) == {"spectune"}


def test_a_target_that_never_holds_still_is_left_untouched_and_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    apps = ChurningApps(churn=10**6)
    with pytest.raises(SourceUnavailableError, match=r"Deployment ns/llama kept changing"):
        _promote(apps, monkeypatch)
    assert apps.refused == len(CONFLICT_BACKOFF_S)
    assert _args(apps) == ["serve", MODEL]
