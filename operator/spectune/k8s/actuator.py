"""The operator's Actuator: canary Deployments and promotions through the Kubernetes API.

One per SpecTuning, built by ``handlers.py`` with the shared ApiClient from kopf's memo.
The kubernetes client is synchronous; every call runs in a worker thread so the operator's
event loop never blocks, and objects are read as the API server's JSON (plain dicts, no
client model objects: ``connect.read_json``). Conflicts (409) are retried with a fresh read
(:meth:`KubeActuator.patch_target`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from spectune.control.ports import Deployment
from spectune.errors import SourceUnavailableError, SpecError, SpecTuneError
from spectune.k8s.connect import read_json
from spectune.k8s.deployments import (
    ANNOTATION_FINGERPRINT,
    LABEL_OWNER,
    LABEL_ROLE,
    DrafterArgs,
    arm_from_spec,
    canary_deployment,
    current_spec,
    edit_guard,
    fingerprint,
    model_version,
    owned_by,
    promote_patch,
)
from spectune.k8s.rollout import Readiness, classify_rollout
from spectune.search.arms import Arm, parse_arm

__all__ = [
    "ForbiddenError",
    "HumanEditError",
    "KubeActuator",
    "NotOwnedError",
    "TargetMissingError",
    "api_error",
]

T = TypeVar("T")
Obj = dict[str, Any]

CONFLICT_BACKOFF_S = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
"""The wait before each patch of the target, tried in a row while it keeps changing (HTTP 409).

The first conflict is usually the one other writer: read again and patch at once. A target
in the middle of a rollout changes many times a second (the Deployment controller writes its
status on every pod that comes up, and each write is a new resourceVersion), so later tries
wait longer, for a quiet moment; about 3 s in all before the turn gives up and retries later.
"""


class TargetMissingError(SourceUnavailableError):
    """The target Deployment does not exist (temporary: it may come back)."""


class HumanEditError(SpecTuneError):
    """The target's speculative setting is not the one the operator applied: not written.

    Raised by a guarded write (:meth:`KubeActuator.patch_target`) that found, on the fresh
    read it patches from, a hand edit (or the fingerprint annotation removed). The tuning
    loop pauses, as for an edit it sees at the start of a turn.
    """


class NotOwnedError(SourceUnavailableError):
    """A Deployment the operator would create exists and is not this SpecTuning's.

    Temporary: whoever owns it may rename or delete it; until then it is never touched.
    """


class ForbiddenError(SpecError):
    """The API server refused a call for lack of permission (HTTP 403).

    The message names the verb and the resource, as the API server said them. Not a fault of
    the spec and not temporary either: the tuning loop says so in a condition and an event and
    looks again now and then, since someone may fix the RBAC.
    """


class KubeActuator:
    """Canary strategy over a real API server.

    Parameters
    ----------
    api
        A configured ``kubernetes.client.ApiClient``.
    spt
        The SpecTuning object (``metadata.name``, ``namespace``, ``uid``) that owns canaries.
    target, container, engine
        The target Deployment's name, its engine container and the engine dialect.
    drafters
        The SpecTuning's drafters by name.
    canary_replicas
        Replicas of each canary Deployment.
    """

    def __init__(
        self,
        api: k8s.ApiClient,
        spt: Obj,
        target: str,
        container: str | None,
        engine: str,
        drafters: Mapping[str, DrafterArgs],
        canary_replicas: int = 1,
    ) -> None:
        self._apps = k8s.AppsV1Api(api)
        self._core = k8s.CoreV1Api(api)
        self._api = api
        self._spt = spt
        self._ns = spt["metadata"]["namespace"]
        self._target = target
        self._container = container
        self._engine = engine
        self._drafters = dict(drafters)
        self._replicas = canary_replicas

    @property
    def container(self) -> str | None:
        """The engine container's name (None: the Deployment's only or first container)."""
        return self._container

    @property
    def engine(self) -> str:
        """The engine dialect of the target's arguments (``vllm`` or ``sglang``)."""
        return self._engine

    @property
    def drafters(self) -> Mapping[str, DrafterArgs]:
        """The SpecTuning's drafters by name."""
        return self._drafters

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        return await self._call(read_json, fn, *args, **kwargs)

    async def read_target(self) -> Obj:
        """The target Deployment as a plain dict."""
        try:
            return await self._read(self._apps.read_namespaced_deployment, self._target, self._ns)
        except ApiException as exc:
            if exc.status == 404:
                raise TargetMissingError(
                    f"Deployment {self._ns}/{self._target} not found; waiting for it to exist"
                ) from None
            raise api_error(exc, f"read Deployment {self._ns}/{self._target}") from None

    async def _canaries(self) -> list[Obj]:
        """This SpecTuning's canaries: labelled as such AND owned by it (:func:`owned_by`).

        The label selector only narrows the list; a Deployment that merely copies the labels
        (someone else's, or a leftover of a deleted SpecTuning of the same name) is skipped,
        so it is never read as a canary, never deleted and never patched.
        """
        selector = f"{LABEL_OWNER}={self._spt['metadata']['name']},{LABEL_ROLE}=canary"
        try:
            res = await self._read(
                self._apps.list_namespaced_deployment, self._ns, label_selector=selector
            )
        except ApiException as exc:
            raise api_error(exc, "list canary Deployments") from None
        uid = str(self._spt["metadata"].get("uid") or "")
        items: list[Obj] = res.get("items") or []
        return [d for d in items if owned_by(d, uid)]

    async def pods(self, deployment: Obj) -> list[Obj]:
        """The pods of ``deployment`` (for the target: its own, never its canaries')."""
        return await self._pods(deployment)

    async def _pods(self, deployment: Obj) -> list[Obj]:
        match = deployment["spec"]["selector"].get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
        try:
            res = await self._read(
                self._core.list_namespaced_pod, self._ns, label_selector=selector
            )
        except ApiException as exc:
            raise api_error(exc, "list pods") from None
        pods: list[Obj] = res.get("items") or []
        if LABEL_ROLE not in match:
            # The target's selector also matches canary pods; judge only the target's own.
            pods = [
                p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_ROLE) != "canary"
            ]
        return pods

    async def deployment(self) -> Deployment:
        """What runs now: the target's arm, the canary's arm and readiness, the model version."""
        target = await self.read_target()
        incumbent = arm_from_spec(
            current_spec(target, self._container, self._engine), self._drafters
        )
        rollout = classify_rollout(target, await self._pods(target))
        rolling = rollout.readiness is Readiness.WAITING
        canary_arm: Arm | None = None
        ready = False
        failure = None
        canaries = await self._canaries()
        if canaries:
            c = canaries[0]
            canary_arm = parse_arm(c["metadata"]["annotations"]["spectune.io/arm"])
            state = classify_rollout(c, await self._pods(c))
            ready = state.readiness is Readiness.READY
            failure = state.reason if state.readiness is Readiness.STUCK else None
        return Deployment(
            incumbent=incumbent,
            canary=canary_arm,
            canary_ready=ready,
            canary_failure=failure,
            rolling=rolling,
            model_version=model_version(target, self._container, self._engine),
            target_failure=rollout.reason if rollout.readiness is Readiness.STUCK else None,
        )

    async def start_canary(self, arm: Arm) -> None:
        """Replace any canary with one running ``arm``."""
        await self.stop_canary()
        target = await self.read_target()
        body = canary_deployment(
            target, arm, self._drafters, self._spt, self._replicas, self._container, self._engine
        )
        name = body["metadata"]["name"]
        try:
            await self._call(self._apps.create_namespaced_deployment, self._ns, body)
        except ApiException as exc:
            if exc.status != 409:
                raise api_error(exc, f"create canary Deployment {name}") from None
            # Already there: ours from before a restart is fine; anyone else's is left alone.
            if not any(c["metadata"]["name"] == name for c in await self._canaries()):
                raise NotOwnedError(
                    f"cannot create canary Deployment {self._ns}/{name}: a Deployment of that "
                    "name exists and is not owned by this SpecTuning (no ownerReference to it "
                    f"or no {ANNOTATION_FINGERPRINT} annotation), so spectune leaves it alone; "
                    "rename or delete it"
                ) from None

    async def stop_canary(self) -> None:
        """Delete every canary of this SpecTuning (their pods go with them).

        Each delete is conditioned on the uid that was listed, so an object replaced under
        the same name in between (not ours any more) is refused by the API server (409).
        """
        for c in await self._canaries():
            meta = c["metadata"]
            try:
                await self._call(
                    self._apps.delete_namespaced_deployment,
                    meta["name"],
                    self._ns,
                    propagation_policy="Background",
                    body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=meta["uid"])),
                )
            except ApiException as exc:
                if exc.status not in (404, 409):  # gone, or replaced by someone else's
                    raise api_error(exc, f"delete canary {meta['name']}") from None

    async def adopt(self, target: Obj) -> None:
        """Record the target's current speculative setting as the applied one.

        Writes only the fingerprint annotation on the Deployment's own metadata (no rollout),
        so that a later hand edit of its arguments is told apart from the operator's patches.
        The fingerprint is computed from the read that the patch's resourceVersion guards, so
        an edit landing meanwhile is never recorded as the operator's own.
        """
        del target  # adopted as read afresh below

        def annotate(fresh: Obj) -> Obj:
            spec = current_spec(fresh, self._container, self._engine)
            return {"metadata": {"annotations": {ANNOTATION_FINGERPRINT: fingerprint(spec)}}}

        await self.patch_target(annotate, guarded=False)

    async def promote(self, arm: Arm) -> None:
        """Roll the target onto ``arm`` (strategic merge patch; retried on conflict)."""
        await self.patch_target(
            lambda target: promote_patch(target, arm, self._drafters, self._container, self._engine)
        )

    async def patch_target(self, build: Callable[[Obj], Obj], *, guarded: bool = True) -> Obj:
        """Patch the target with ``build(fresh target)``, guarded by its resourceVersion.

        A conflict (HTTP 409: someone wrote the Deployment between our read and our patch)
        is retried with a fresh read, so the patch is always computed from the current
        object and another writer's change (an extra flag, an image bump) is never lost;
        the tries wait longer and longer (:data:`CONFLICT_BACKOFF_S`).

        ``guarded`` (every write of the speculative setting): each fresh read is checked
        with :func:`~spectune.k8s.deployments.edit_guard` first, and a hand edit raises
        :class:`HumanEditError` with nothing written. The read and the check are one step
        before the patch, and the resourceVersion in the patch makes the API server refuse
        it if anything (an edit included) was written after that read, so an edit can never
        land between the check and the write. Unguarded: annotation-only writes that keep
        whatever the target runs (adopting a setting, dropping a trial's bookkeeping).
        Returns the target as read for the patch that went through.
        """
        for wait in CONFLICT_BACKOFF_S:
            await asyncio.sleep(wait)
            target = await self.read_target()
            if guarded and (why := edit_guard(target, self._container, self._engine)):
                raise HumanEditError(f"{why}; not overwritten")
            patch = build(target)
            patch.setdefault("metadata", {})["resourceVersion"] = target["metadata"][
                "resourceVersion"
            ]
            try:
                await self._call(
                    self._apps.patch_namespaced_deployment, self._target, self._ns, patch
                )
                return target
            except ApiException as exc:
                if exc.status == 409:
                    continue  # someone else wrote in between: read again and re-apply
                if exc.status == 404:
                    raise TargetMissingError(
                        f"Deployment {self._ns}/{self._target} not found; waiting for it to exist"
                    ) from None
                raise api_error(exc, f"patch Deployment {self._ns}/{self._target}") from None
        raise SourceUnavailableError(
            f"Deployment {self._ns}/{self._target} kept changing under "
            f"{len(CONFLICT_BACKOFF_S)} patches in a row over {sum(CONFLICT_BACKOFF_S):.1f} s "
            "(HTTP 409); will retry"
        )

    async def target_pods(self) -> list[Obj]:
        """The target's own pods (never its canaries')."""
        return await self._pods(await self.read_target())

    async def canary_pods(self) -> list[Obj]:
        """The pods of this SpecTuning's canary Deployment (none without a canary)."""
        pods: list[Obj] = []
        for c in await self._canaries():
            pods += await self._pods(c)
        return pods

    async def settle(self) -> None:
        """Nothing to finish: a canary is removed at once (the in-place actuator defers)."""


def api_error(exc: ApiException, what: str) -> Exception:
    """The project error for a failed API call: :class:`ForbiddenError` for a 403 (naming the
    missing permission), else :class:`SourceUnavailableError` (temporary)."""
    if exc.status == 403:
        return ForbiddenError(
            f"forbidden to {what}: {_server_message(exc)}; the operator's RBAC lacks this "
            "permission: apply the RBAC manifest of this release (deploy/rbac.yaml)"
        )
    return SourceUnavailableError(f"cannot {what}: HTTP {exc.status} {exc.reason}")


def _server_message(exc: ApiException) -> str:
    """The API server's own words (they name the verb, resource and group), else the reason."""
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if isinstance(body, str):
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("message"), str):
            return str(doc["message"])
    return str(exc.reason or "Forbidden")
