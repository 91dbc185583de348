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
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from spectune.api.spec import PlacementChoice
from spectune.control.placement import PlacementVerdict
from spectune.control.ports import Deployment, Placement
from spectune.errors import SourceUnavailableError, SpecError, SpecTuneError
from spectune.k8s.connect import read_json
from spectune.k8s.deployments import (
    ANNOTATION_FINGERPRINT,
    LABEL_OWNER,
    LABEL_ROLE,
    DrafterArgs,
    arm_from_spec,
    canary_deployment,
    canary_name,
    current_spec,
    edit_guard,
    fingerprint,
    model_version,
    owned_by,
    promote_patch,
)
from spectune.k8s.placement import (
    ANNOTATION_LEAVING,
    ANNOTATION_REPLICAS_BEFORE,
    ANNOTATION_REPLICAS_DURING,
    LEAVING_STOPPED,
    LEAVING_SUPERSEDED,
    Hold,
    Scaling,
    autoscaler_of,
    choose_placement,
    scaling_of,
)
from spectune.k8s.rollout import Readiness, classify_rollout
from spectune.search.arms import Arm, parse_arm

__all__ = [
    "FIELD_MANAGER",
    "ForbiddenError",
    "HumanEditError",
    "KubeActuator",
    "NotOwnedError",
    "TargetMissingError",
    "api_error",
]

T = TypeVar("T")
Obj = dict[str, Any]

FIELD_MANAGER = "spectune"
"""The field manager of every write to a Deployment (and of the status): the target's
``managedFields`` say which fields spectune set, so its change is attributable. The writes
are strategic-merge patches under a resourceVersion precondition, not server-side apply: an
apply of the container's ``args`` would take their ownership from the GitOps tool or the
person that set them, and force the next apply of theirs into a conflict."""

CONFLICT_BACKOFF_S = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
"""The wait before each patch of the target, tried in a row while it keeps changing (HTTP 409).

The first conflict is usually the one other writer: read again and patch at once. A target
in the middle of a rollout changes many times a second (the Deployment controller writes its
status on every pod that comes up, and each write is a new resourceVersion), so later tries
wait longer, for a quiet moment; about 3 s in all before the turn gives up and retries later.
"""

AUTOSCALER_TTL_S = 30.0
"""Seconds an answer to "does an autoscaler own the target's replicas?" is reused: two list
calls per poll for an object that changes at human speed would be most of the actuator's
API traffic. A trial starts only on a fresh answer (:meth:`KubeActuator.start_canary`)."""

RESTORE_POLL_S = 1.0
"""Seconds between looks while waiting for the target's pods to be Ready at N again."""

GONE_WAIT_S = 30.0
"""Seconds a trial waits for the same arm's earlier canary to finish its deletion (its pods
terminate first) before creating it again; the create then fails loudly if it is not gone."""


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
    placement
        ``spec.search.placement``. With ``replace`` (or ``auto`` where it can hold,
        :func:`~spectune.k8s.placement.choose_placement`) a trial's canary takes the place
        of as many target pods; the default ``beside`` (what the loop's bare actuators use)
        never scales the target down, and restores a count a trial left scaled.

    Placement ``replace`` is reconciled, never remembered: each :meth:`deployment`,
    :meth:`settle` and :meth:`stop_canary` reads the target's annotations
    (:data:`~spectune.k8s.placement.ANNOTATION_REPLICAS_BEFORE` N, ``..._DURING`` N−c) and
    the canaries' ``spectune.io/leaving`` marks and takes the next step: the target down to
    N−c once the newest canary is Ready (one patch writes the count and its record), an
    older canary deleted once the newest one is Ready, the target back to N when no trial
    canary holds its place, a stopped canary deleted once the target's pods are Ready at N,
    and the record dropped after. A restarted operator (or another replica) continues from
    whatever step the last one reached; at no step do fewer than N pods serve.
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
        placement: PlacementChoice = PlacementChoice.BESIDE,
    ) -> None:
        self._apps = k8s.AppsV1Api(api)
        self._core = k8s.CoreV1Api(api)
        self._autoscaling = k8s.AutoscalingV2Api(api)
        self._custom = k8s.CustomObjectsApi(api)
        self._choice = placement
        self._scaler: tuple[float, str | None, str | None] | None = None
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

    # -- placement ------------------------------------------------------------------------------

    async def _autoscaler(self, fresh: bool = False) -> tuple[str | None, str | None]:
        """The autoscaler that owns the target's replicas (named), and why that cannot be told.

        A 404 on the ScaledObject resource means KEDA is not installed: none. A 403 (the
        RBAC lacks get/list on them) is not an answer: the caller falls back to beside with
        the reason instead of wedging the loop.
        """
        now = time.monotonic()
        if not fresh and self._scaler is not None and now - self._scaler[0] < AUTOSCALER_TTL_S:
            return self._scaler[1], self._scaler[2]
        unknown: list[str] = []
        hpas: list[Obj] = []
        scaled: list[Obj] = []
        try:
            res = await self._read(
                self._autoscaling.list_namespaced_horizontal_pod_autoscaler, self._ns
            )
            hpas = res.get("items") or []
        except ApiException as exc:
            unknown.append(f"listing HorizontalPodAutoscalers: {_why(exc)}")
        try:
            listed: object = await self._call(
                self._custom.list_namespaced_custom_object,
                "keda.sh",
                "v1alpha1",
                self._ns,
                "scaledobjects",
            )
            scaled = (listed.get("items") if isinstance(listed, dict) else None) or []
        except ApiException as exc:
            if exc.status != 404:  # 404: no such resource type, KEDA is not installed
                unknown.append(f"listing KEDA ScaledObjects: {_why(exc)}")
        owner = autoscaler_of(hpas, scaled, self._target)
        why = "; ".join(unknown) or None
        self._scaler = (now, owner, why)
        return owner, why

    async def _verdict(self, scaling: Scaling, fresh: bool = False) -> PlacementVerdict:
        """Where a canary serves now, for a target of ``scaling``'s N."""
        n = scaling.before if scaling.before is not None else scaling.replicas
        plain = choose_placement(self._choice, n, self._replicas)
        if plain.placement is Placement.BESIDE:  # decided without asking about autoscalers
            return plain
        owner, unknown = await self._autoscaler(fresh)
        return choose_placement(self._choice, n, self._replicas, owner, unknown)

    async def placement(self) -> PlacementVerdict:
        """Where this SpecTuning's canaries serve, and why not in the target's place."""
        return await self._verdict(scaling_of(await self.read_target()))

    # -- the reconcile ----------------------------------------------------------------------------

    async def _delete(self, canary: Obj, *, wait_for_pods: bool) -> None:
        """Delete a canary, conditioned on the uid that was listed.

        ``wait_for_pods``: foreground deletion, so the Deployment stays listed (with its
        deletionTimestamp) until its pods are gone: what tells the reconcile that an older
        canary no longer serves. An object replaced under the same name in between (not ours
        any more) is refused by the API server (409).
        """
        meta = canary["metadata"]
        if meta.get("deletionTimestamp"):
            return
        try:
            await self._call(
                self._apps.delete_namespaced_deployment,
                meta["name"],
                self._ns,
                propagation_policy="Foreground" if wait_for_pods else "Background",
                body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=meta["uid"])),
            )
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone, or replaced by someone else's
                raise api_error(exc, f"delete canary {meta['name']}") from None

    async def _mark(self, canary: Obj, leaving: str | None) -> None:
        """Set (or clear) a canary's ``spectune.io/leaving`` mark."""
        meta = canary["metadata"]
        if meta.get("deletionTimestamp") or _leaving(canary) == leaving:
            return
        patch = {
            "metadata": {
                "annotations": {ANNOTATION_LEAVING: leaving},
                "uid": meta["uid"],
            }
        }
        try:
            await self._call(
                self._apps.patch_namespaced_deployment,
                meta["name"],
                self._ns,
                patch,
                field_manager=FIELD_MANAGER,
            )
        except ApiException as exc:
            if exc.status not in (404, 409, 422):  # gone or replaced meanwhile
                raise api_error(exc, f"patch canary {meta['name']}") from None

    def _scale_down(self, c: int) -> Callable[[Obj], Obj]:
        def build(fresh: Obj) -> Obj:
            s = scaling_of(fresh)
            if s.hold is not Hold.NONE or s.replicas - c < 1:
                return {}
            return {
                "metadata": {
                    "annotations": {
                        ANNOTATION_REPLICAS_BEFORE: str(s.replicas),
                        ANNOTATION_REPLICAS_DURING: str(s.replicas - c),
                    }
                },
                "spec": {"replicas": s.replicas - c},
            }

        return build

    @staticmethod
    def _scale_back(fresh: Obj) -> Obj:
        s = scaling_of(fresh)
        if s.hold is not Hold.SCALED or s.before is None:
            return {}
        return {
            "metadata": {"annotations": {ANNOTATION_REPLICAS_DURING: None}},
            "spec": {"replicas": s.before},
        }

    @staticmethod
    def _forget(fresh: Obj) -> Obj:
        notes = (fresh.get("metadata") or {}).get("annotations") or {}
        drop = [a for a in (ANNOTATION_REPLICAS_BEFORE, ANNOTATION_REPLICAS_DURING) if a in notes]
        return {"metadata": {"annotations": dict.fromkeys(drop)}} if drop else {}

    async def _reconcile(self) -> _View:
        """One step towards what the annotations and marks say (see the class docstring)."""
        target = await self.read_target()
        canaries = await self._canaries()
        scaling = scaling_of(target)
        verdict = await self._verdict(scaling)
        hold = scaling.hold
        current = _current(canaries)
        others = [c for c in canaries if c is not current]
        ready = current is not None and await self._ready(current)
        acted = False
        if hold is Hold.SCALED and (current is None or verdict.placement is not Placement.REPLACE):
            # Nothing holds the place of the target's missing pods: back to N.
            for c in others:
                await self._mark(c, LEAVING_STOPPED)
            await self.patch_target(self._scale_back, guarded=False)
            acted = True
        elif hold is Hold.SCALED:
            if ready:
                for c in others:
                    await self._delete(c, wait_for_pods=True)
                    acted = True
        elif hold is Hold.RESTORING:
            if _restored(target, scaling):
                for c in others:
                    await self._delete(c, wait_for_pods=True)
                if not others:
                    await self.patch_target(self._forget, guarded=False)
                acted = True
        elif hold is Hold.NONE:
            for c in others:
                await self._delete(c, wait_for_pods=False)
            if (
                current is not None
                and ready
                and verdict.placement is Placement.REPLACE
                and classify_rollout(target).readiness is Readiness.READY
            ):
                await self.patch_target(self._scale_down(self._replicas), guarded=False)
                acted = True
        if acted:
            target = await self.read_target()
            canaries = await self._canaries()
            scaling = scaling_of(target)
            current = _current(canaries)
            ready = current is not None and await self._ready(current)
        return _View(target, canaries, scaling, verdict, current, ready)

    async def _ready(self, canary: Obj) -> bool:
        return classify_rollout(canary, await self._pods(canary)).readiness is Readiness.READY

    async def deployment(self) -> Deployment:
        """What runs now: the target's arm, the canary's arm and readiness, the model version.

        With placement ``replace``, ``canary_ready`` says that the newest canary is Ready,
        every older canary and its pods are gone, and the target is Ready at N−c: a window
        that starts then sees the target's own per-pod load. ``rolling`` is True while the
        target goes back to N.
        """
        view = await self._reconcile()
        target = view.target
        incumbent = arm_from_spec(
            current_spec(target, self._container, self._engine), self._drafters
        )
        rollout = classify_rollout(target, await self._pods(target))
        hold = view.scaling.hold
        rolling = rollout.readiness is Readiness.WAITING or hold is Hold.RESTORING
        canary_arm: Arm | None = None
        ready = False
        failure = None
        c = view.current
        if c is not None:
            canary_arm = parse_arm(c["metadata"]["annotations"]["spectune.io/arm"])
            state = classify_rollout(c, await self._pods(c))
            ready = state.readiness is Readiness.READY
            failure = state.reason if state.readiness is Readiness.STUCK else None
            if view.verdict.placement is Placement.REPLACE:
                ready = (
                    ready
                    and len(view.canaries) == 1
                    and hold is Hold.SCALED
                    and rollout.readiness is Readiness.READY
                )
        return Deployment(
            incumbent=incumbent,
            canary=canary_arm,
            canary_ready=ready,
            canary_failure=failure,
            rolling=rolling,
            model_version=model_version(target, self._container, self._engine),
            target_failure=rollout.reason if rollout.readiness is Readiness.STUCK else None,
            placement=view.verdict.placement,
            placement_reason=view.verdict.reason,
            placement_message=view.verdict.message,
            scaled_externally=view.scaling.external(self._target),
        )

    async def start_canary(self, arm: Arm) -> None:
        """Put a canary on ``arm``.

        Beside the target (or while it is not scaled down), any other canary goes at once.
        While a trial holds the target at N−c, the previous trial's canary stays until this
        one is Ready (it holds the place of the target's missing pods): capacity never dips,
        and the target stays at N−c across consecutive trials.
        """
        target = await self.read_target()
        scaling = scaling_of(target)
        await self._verdict(scaling, fresh=True)  # a trial starts on a fresh answer
        name = canary_name(self._target, arm)
        canaries = await self._canaries()
        mine = [c for c in canaries if c["metadata"]["name"] == name]
        for c in canaries:
            if c["metadata"]["name"] == name:
                continue
            if scaling.hold is Hold.SCALED:
                await self._mark(c, LEAVING_SUPERSEDED)
            elif scaling.hold is Hold.RESTORING:
                await self._mark(c, LEAVING_STOPPED)
            else:
                await self._delete(c, wait_for_pods=False)
        if mine and not mine[0]["metadata"].get("deletionTimestamp"):
            await self._mark(mine[0], None)  # a trial of an arm that was on its way out
            return
        if mine:  # its earlier canary is still being deleted (its pods terminate): let it go
            await self._gone(name)
        body = canary_deployment(
            target, arm, self._drafters, self._spt, self._replicas, self._container, self._engine
        )
        try:
            await self._call(
                self._apps.create_namespaced_deployment, self._ns, body, field_manager=FIELD_MANAGER
            )
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
            if any(
                c["metadata"]["name"] == name and c["metadata"].get("deletionTimestamp")
                for c in await self._canaries()
            ):
                raise SourceUnavailableError(
                    f"canary Deployment {self._ns}/{name} of an earlier trial is still being "
                    "deleted; will retry"
                ) from None

    async def _gone(self, name: str) -> None:
        """Wait (at most :data:`GONE_WAIT_S`) for our canary ``name`` to be deleted."""
        deadline = time.monotonic() + GONE_WAIT_S
        while time.monotonic() < deadline:
            if not any(c["metadata"]["name"] == name for c in await self._canaries()):
                return
            await asyncio.sleep(RESTORE_POLL_S)

    async def stop_canary(self) -> None:
        """Remove every canary of this SpecTuning.

        A target a trial scaled down goes back to N first; the canaries are marked and leave
        once the target's pods are Ready at N (:meth:`settle`, :meth:`deployment`). A count
        someone else set meanwhile is kept: the record is dropped and the canaries go at
        once. A target never scaled down (or missing): the canaries go at once.
        """
        try:
            target = await self.read_target()
        except TargetMissingError:
            for c in await self._canaries():
                await self._delete(c, wait_for_pods=False)
            return
        scaling = scaling_of(target)
        canaries = await self._canaries()
        if scaling.hold in (Hold.SCALED, Hold.RESTORING):
            for c in canaries:
                await self._mark(c, LEAVING_STOPPED)
            await self._reconcile()
            return
        if scaling.hold is Hold.EXTERNAL:
            await self.patch_target(self._forget, guarded=False)
        for c in canaries:
            await self._delete(c, wait_for_pods=False)

    async def restored(self, timeout_s: float = 0.0) -> bool:
        """Reconcile until nothing is owed: the target at its own count, no canary leaving.

        Looks every :data:`RESTORE_POLL_S` for at most ``timeout_s`` (0: one look); True
        once done. A trial's canary (not marked leaving) may stay. A missing target owes
        nothing: its canaries are deleted and the answer is True.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                view = await self._reconcile()
            except TargetMissingError:
                # No target, no count to give back: the canaries just go (their owner is
                # gone, so nothing would ever hold their place again).
                for c in await self._canaries():
                    await self._delete(c, wait_for_pods=False)
                return True
            done = view.scaling.hold is Hold.NONE and all(
                c is view.current and not c["metadata"].get("deletionTimestamp")
                for c in view.canaries
            )
            if done or time.monotonic() >= deadline:
                return done
            await asyncio.sleep(RESTORE_POLL_S)

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
            if not patch:
                return target  # nothing to write on this read
            patch.setdefault("metadata", {})["resourceVersion"] = target["metadata"][
                "resourceVersion"
            ]
            try:
                await self._call(
                    self._apps.patch_namespaced_deployment,
                    self._target,
                    self._ns,
                    patch,
                    field_manager=FIELD_MANAGER,
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
        """One reconcile step (a restore under way goes on; see the class docstring)."""
        await self._reconcile()


class _View:
    """What the reconcile saw after its step."""

    def __init__(
        self,
        target: Obj,
        canaries: list[Obj],
        scaling: Scaling,
        verdict: PlacementVerdict,
        current: Obj | None,
        ready: bool,
    ) -> None:
        self.target = target
        self.canaries = canaries
        self.scaling = scaling
        self.verdict = verdict
        self.current = current
        self.ready = ready


def _leaving(canary: Obj) -> str | None:
    notes = (canary.get("metadata") or {}).get("annotations") or {}
    value = notes.get(ANNOTATION_LEAVING)
    return str(value) if value else None


def _current(canaries: list[Obj]) -> Obj | None:
    """The trial's canary: the newest one neither marked leaving nor being deleted."""
    live = [c for c in canaries if not _leaving(c) and not c["metadata"].get("deletionTimestamp")]
    live.sort(
        key=lambda c: (str(c["metadata"].get("creationTimestamp", "")), c["metadata"]["name"])
    )
    return live[-1] if live else None


def _restored(target: Obj, scaling: Scaling) -> bool:
    """Whether the target serves with N available pods again (N: the recorded count)."""
    n = scaling.before
    meta, status = target.get("metadata") or {}, target.get("status") or {}
    return (
        n is not None
        and scaling.replicas == n
        and status.get("observedGeneration", 0) >= meta.get("generation", 0)
        and status.get("availableReplicas", 0) >= n
    )


def _why(exc: ApiException) -> str:
    return f"HTTP {exc.status} {_server_message(exc) if exc.status == 403 else exc.reason}"


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
