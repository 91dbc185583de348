"""Fakes of the cluster and Prometheus for driving the real tuning loop in unit tests.

:class:`FakeWorld` holds one target Deployment (a plain dict), the canary arms, the status
writes and the events. :class:`FakeKube` stands in for ``KubeActuator`` and
:class:`FakeProm` for ``PrometheusSource`` (tests monkeypatch them into
``spectune.k8s.tuning``); :class:`FakeCustom` stands in for the CustomObjectsApi of the
SpecTuning. None of them touches a network: they are fakes, and the tests say so.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kubernetes.client.exceptions import ApiException

from spectune.control.ports import Deployment
from spectune.errors import SourceUnavailableError
from spectune.k8s.actuator import HumanEditError, TargetMissingError
from spectune.k8s.deployments import (
    ANNOTATION_FINGERPRINT,
    DrafterArgs,
    arm_from_spec,
    current_spec,
    edit_guard,
    fingerprint,
    model_version,
    promote_patch,
)
from spectune.metrics.observation import Observation
from spectune.search.arms import Arm

Obj = dict[str, Any]
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
EAGLE = "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"


def target(args: list[str] | None = None) -> Obj:
    """A one-replica vLLM Deployment, rolled out and ready."""
    return {
        "metadata": {"name": "llama", "namespace": "ns", "resourceVersion": "1",
                     "generation": 1, "annotations": {}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "llama"}},
            "template": {"spec": {"containers": [
                {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                 "args": list(args or ["serve", MODEL])}]}},
        },
        "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                   "availableReplicas": 1},
    }  # fmt: skip


def adopted(deployment: Obj) -> Obj:
    """``deployment`` with the fingerprint annotation of what it runs, as tuning adopts it."""
    spec = current_spec(deployment, None, "vllm")
    deployment["metadata"].setdefault("annotations", {})[ANNOTATION_FINGERPRINT] = fingerprint(spec)
    return deployment


def _merge(into: Obj, patch: Mapping[str, Any]) -> None:
    """JSON merge patch, with containers merged by name (as a strategic merge patch does)."""
    for k, v in patch.items():
        if v is None:
            into.pop(k, None)
        elif k == "containers":
            for c in v:
                mine = next(x for x in into[k] if x["name"] == c["name"])
                _merge(mine, c)
        elif isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


@dataclass
class FakeWorld:
    """The fake cluster: the target, the canaries, what the operator wrote."""

    target: Obj | None = field(default_factory=target)
    canaries: list[Arm] = field(default_factory=list)
    status_writes: list[Obj] = field(default_factory=list)
    status_managers: set[str] = field(default_factory=set)
    """Field managers the status writes named."""
    status: Obj = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    conflicts: int = 0
    """Status patches still to be preceded by another writer's write (so they answer 409)."""
    answered_409: int = 0
    resource_version: int = 1
    """The SpecTuning's resourceVersion: every write moves it on."""
    failing: bool = False
    """Whether Prometheus fails (connection refused) for every window."""
    mix: list[Obj] = field(default_factory=list)
    """The traffic-mix query's result rows."""
    observation: Observation | None = None
    canary_observation: Observation | None = None
    """What the canary's pods answer (``observation`` when None)."""
    canary_stops: int = 0
    rolling: bool = False
    """Whether the target's rollout is in progress (the fake rolls out at once otherwise)."""
    error: Exception | None = None
    """What every window of Prometheus raises instead of answering (before ``failing``)."""
    canary_error: Exception | None = None
    """What the canary's windows raise (``error`` when None)."""
    prom_headers: list[dict[str, str]] = field(default_factory=list)
    """The HTTP headers each Prometheus source was built with."""
    prom_connections: list[dict[str, Any]] = field(default_factory=list)
    """The ``tls`` and ``cluster`` each Prometheus source was built with."""

    def patch_target(self, patch: Mapping[str, Any]) -> None:
        assert self.target is not None
        before = copy.deepcopy(self.target["spec"]["template"])
        body = {k: v for k, v in patch.items() if k != "metadata"}
        meta = dict(patch.get("metadata") or {})
        meta.pop("resourceVersion", None)
        _merge(self.target, {"metadata": meta, **body})
        self.target["metadata"]["resourceVersion"] = str(
            int(self.target["metadata"]["resourceVersion"]) + 1
        )
        if self.target["spec"]["template"] != before:
            # The Deployment controller rolls it out at once (kwok-fast).
            self.target["metadata"]["generation"] += 1
            self.target["status"]["observedGeneration"] = self.target["metadata"]["generation"]

    def reasons(self) -> list[str]:
        return [r for _, r, _ in self.events]


class FakeKube:
    """A fake ``KubeActuator`` over :attr:`world` (see the module docstring)."""

    world: ClassVar[FakeWorld]

    def __init__(
        self,
        api: Any,
        spt: Obj,
        target: str,
        container: str | None,
        engine: str,
        drafters: Mapping[str, DrafterArgs],
        canary_replicas: int = 1,
        placement: Any = None,
    ) -> None:
        self.container, self.engine, self.drafters = container, engine, dict(drafters)
        self._name = target

    async def read_target(self) -> Obj:
        if self.world.target is None:
            raise TargetMissingError(f"Deployment ns/{self._name} not found; waiting for it")
        return copy.deepcopy(self.world.target)

    async def pods(self, deployment: Obj) -> list[Obj]:
        return []

    async def target_pods(self) -> list[Obj]:
        return []

    async def canary_pods(self) -> list[Obj]:
        return []

    async def deployment(self) -> Deployment:
        t = await self.read_target()
        arm = arm_from_spec(current_spec(t, self.container, self.engine), self.drafters)
        canary = self.world.canaries[0] if self.world.canaries else None
        return Deployment(
            arm,
            canary,
            canary is not None,
            None,
            self.world.rolling,
            model_version(t, None, "vllm"),
        )

    async def start_canary(self, arm: Arm) -> None:
        self.world.canaries = [arm]

    async def stop_canary(self) -> None:
        if self.world.canaries:
            self.world.canary_stops += 1
        self.world.canaries = []

    async def adopt(self, target: Obj) -> None:
        spec = current_spec(target, self.container, self.engine)
        self.world.patch_target({"metadata": {"annotations": {
            ANNOTATION_FINGERPRINT: fingerprint(spec)}}})  # fmt: skip

    async def patch_target(self, build: Any, *, guarded: bool = True) -> Obj:
        """As the real one: a guarded write refuses a hand-edited target (the real guard)."""
        t = await self.read_target()
        if guarded and (why := edit_guard(t, self.container, self.engine)):
            raise HumanEditError(f"{why}; not overwritten")
        self.world.patch_target(build(t))
        return t

    async def promote(self, arm: Arm) -> None:
        await self.patch_target(
            lambda t: promote_patch(t, arm, self.drafters, self.container, self.engine)
        )

    async def settle(self) -> None:
        return None

    async def restored(self, timeout_s: float = 0.0) -> bool:
        return True


class FakeProm:
    """A fake ``PrometheusSource``: fails like an unreachable server, or answers the world's."""

    world: ClassVar[FakeWorld]

    def __init__(
        self,
        url: str,
        selector: str,
        headers: Mapping[str, str] | None = None,
        tls: Any = None,
        cluster: tuple[str, str] | None = None,
        **_: Any,
    ) -> None:
        self.url = url
        self.canary = "-spt-" in selector  # canary Deployments are named <target>-spt-<arm>
        self.world.prom_headers.append(dict(headers or {}))
        self.world.prom_connections.append({"tls": tls, "cluster": cluster})

    async def observe(self, window_s: float, at: float | None = None) -> Observation:
        if self.canary and self.world.canary_error is not None:
            raise self.world.canary_error
        if self.world.error is not None:
            raise self.world.error
        if self.world.failing or self.world.observation is None:
            raise SourceUnavailableError(f"cannot reach Prometheus at {self.url}: refused")
        if self.canary and self.world.canary_observation is not None:
            return self.world.canary_observation
        return self.world.observation

    async def query(self, promql: str, at: float | None = None) -> list[Obj]:
        if self.world.failing:
            raise SourceUnavailableError(f"cannot reach Prometheus at {self.url}: refused")
        return copy.deepcopy(self.world.mix)


class FakeCustom:
    """A fake CustomObjectsApi for one SpecTuning: lists it, reads and patches its status.

    Like the API server, it refuses (HTTP 409) a patch whose ``metadata.resourceVersion`` is
    not the object's current one; ``world.conflicts`` makes another writer write the status
    (moving the resourceVersion on) just before that many of the operator's patches.
    """

    def __init__(self, world: FakeWorld, body: Obj) -> None:
        self.world = world
        self.body = body

    def _meta(self) -> Obj:
        return {**self.body["metadata"], "resourceVersion": str(self.world.resource_version)}

    def list_namespaced_custom_object(self, *_: Any) -> Obj:
        return {"items": [self.body]}

    def get_namespaced_custom_object(self, *_: Any) -> Obj:
        return {**self.body, "metadata": self._meta(), "status": copy.deepcopy(self.world.status)}

    def patch_namespaced_custom_object_status(self, *args: Any, field_manager: str = "") -> Obj:
        patch = args[-1]
        self.world.status_managers.add(field_manager)
        if self.world.conflicts > 0:
            self.world.conflicts -= 1
            self.world.resource_version += 1  # someone else's write lands first
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != str(self.world.resource_version):
            self.world.answered_409 += 1
            raise ApiException(status=409, reason="Conflict")
        doc = patch["status"]
        self.world.status_writes.append(copy.deepcopy(doc))
        self.world.status = copy.deepcopy(doc)
        self.world.resource_version += 1
        return {**self.body, "metadata": self._meta(), "status": copy.deepcopy(doc)}
