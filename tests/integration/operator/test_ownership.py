"""Issue [O] items 3, 4, 5 and 8 on the real API server: touch only what is ours, never
overwrite a hand edit, lose no status write, and never wedge a deletion.

Each test reproduces the fault on the real kube-apiserver (the one ``tests/fixtures/cluster.py``
starts), with the operator's own code: either ``spectune run`` as the RBAC manifest's
ServiceAccount, or the actuator / tuning loop / cleanup called in-process with that
ServiceAccount's credentials. What is asserted is what ``kubectl`` shows: Deployments, their
arguments and resourceVersions, the SpecTuning's status and events.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config
from kubernetes.client.exceptions import ApiException

from spectune.api.names import GROUP, PLURAL, VERSION
from spectune.k8s.actuator import HumanEditError, KubeActuator, NotOwnedError
from spectune.k8s.deployments import DrafterArgs, canary_name
from spectune.k8s.projection import decode_memory
from spectune.search.arms import Arm
from tests.fixtures.cluster import Cluster, wait_for
from tests.fixtures.prometheus import free_port
from tests.integration.operator.conftest import OperatorProcess
from tests.integration.operator.helpers import (
    EAGLE,
    MODEL,
    TARGET,
    Env,
    arm_of,
    deployment,
    kubeconfig_without,
    spectuning,
)

DRAFTERS = {"eagle3": DrafterArgs("eagle3", "eagle3", EAGLE)}


def _eagle(k: int) -> list[str]:
    spec = json.dumps({"method": "eagle3", "model": EAGLE, "num_speculative_tokens": k})
    return ["serve", MODEL, "--speculative-config", spec]


def _closed_prometheus() -> str:
    """A Prometheus URL nothing listens on: the loop holds, no trial starts."""
    return f"http://127.0.0.1:{free_port()}"


def _operator_api(kubeconfig: Path) -> Any:
    return config.new_client_from_config(str(kubeconfig))


def _edit_args(env: Env, args: list[str]) -> None:
    """A human's ``kubectl edit`` of the target's arguments."""
    env.apps.patch_namespaced_deployment(
        TARGET,
        env.ns,
        {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": args}]}}}},
    )


def _gone(env: Env, name: str = "tune") -> bool:
    try:
        env.spt(name)
    except ApiException as exc:
        return exc.status == 404
    return False


def _impostor(env: Env, name: str, spt: str = "tune") -> Any:
    """Someone else's Deployment that copies the canary labels and annotations, no owner."""
    body = deployment(["serve", MODEL], name=name)
    body["metadata"]["labels"] = {"spectune.io/spectuning": spt, "spectune.io/role": "canary"}
    body["metadata"]["annotations"] = {
        "spectune.io/arm": "eagle3/2",
        "spectune.io/fingerprint": "0000000000000000",
    }
    body["spec"]["replicas"] = 0  # no pods: nothing but the object itself is at stake
    env.apps.create_namespaced_deployment(env.ns, body)

    def settled() -> Any:
        # The Deployment controller writes the status once; after that, only a writer
        # (the operator, if it were wrong) moves the resourceVersion.
        d = env.apps.read_namespaced_deployment(name, env.ns)
        return d if d.status.observed_generation == d.metadata.generation else None

    return wait_for(settled, timeout=30, message=f"Deployment {name} observed")


# -- item 3: delete and patch only what it owns -------------------------------------------------


def test_a_deployment_with_canary_labels_that_is_not_owned_is_never_touched(
    cluster: Cluster,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """A Deployment that carries this SpecTuning's canary labels (and even a fingerprint
    annotation) but no ownerReference to it survives everything the operator cleans up: the
    stray canary removal at start (a real, owned canary left without a running trial is
    removed beside it, so cleanup does run) and the SpecTuning's deletion. Its
    resourceVersion never moves: not deleted, not patched."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    env.create_spt(spectuning(_closed_prometheus()))
    spt = env.spt()
    impostor = _impostor(env, "someone-elses")
    before = impostor.metadata.resource_version
    # An owned canary with no trial behind it (as left by a crash): the operator removes it.
    owned = KubeActuator(cluster.api, spt, TARGET, "vllm", "vllm", DRAFTERS)
    asyncio.run(owned.start_canary(Arm("eagle3", 3)))
    stray = canary_name(TARGET, Arm("eagle3", 3))
    assert {c.metadata.name for c in env.canaries()} == {stray, "someone-elses"}

    op = start_operator(namespace)
    wait_for(
        lambda: {c.metadata.name for c in env.canaries()} == {"someone-elses"},
        timeout=60,
        message=lambda: f"the owned stray canary removed; {op.log()[-3000:]}",
    )
    wait_for(
        lambda: "spectune.io/fingerprint" in (env.target().metadata.annotations or {}),
        timeout=60,
        message=lambda: f"the operator adopted the target; {op.log()[-3000:]}",
    )
    env.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "tune")
    wait_for(lambda: _gone(env), timeout=60, message=lambda: f"deleted; {op.log()[-3000:]}")
    after = env.apps.read_namespaced_deployment("someone-elses", namespace)
    assert after.metadata.resource_version == before, "someone else's Deployment was written"
    assert after.metadata.deletion_timestamp is None
    assert op.process.poll() is None


def test_a_canary_name_taken_by_someone_elses_deployment_is_left_alone(
    cluster: Cluster, namespace: str, operator_kubeconfig: Path
) -> None:
    """The canary the operator would create has a name already used by a Deployment it does
    not own: the start is refused naming the Deployment and the fix, and the Deployment is
    neither adopted as a canary nor changed."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    env.create_spt(spectuning(_closed_prometheus()))
    arm = Arm("eagle3", 2)
    taken = _impostor(env, canary_name(TARGET, arm))
    api = _operator_api(operator_kubeconfig)
    try:
        kube = KubeActuator(api, env.spt(), TARGET, "vllm", "vllm", DRAFTERS)
        with pytest.raises(NotOwnedError, match=r"not owned by this SpecTuning.*rename or delete"):
            asyncio.run(kube.start_canary(arm))
        assert asyncio.run(kube.deployment()).canary is None
        asyncio.run(kube.stop_canary())
    finally:
        api.close()
    now = env.apps.read_namespaced_deployment(taken.metadata.name, namespace)
    assert now.metadata.resource_version == taken.metadata.resource_version


# -- item 4: a hand edit is never overwritten ----------------------------------------------------


def _adopted_actuator(env: Env, api: Any, args: list[str]) -> KubeActuator:
    """The target running ``args``, adopted by the operator's actuator (its fingerprint)."""
    env.create_target(args)
    env.create_spt(spectuning(_closed_prometheus()))
    kube = KubeActuator(api, env.spt(), TARGET, "vllm", "vllm", DRAFTERS)
    asyncio.run(kube.adopt(asyncio.run(kube.read_target())))
    return kube


def test_a_promotion_never_overwrites_a_hand_edit_made_during_the_window(
    cluster: Cluster, namespace: str, operator_kubeconfig: Path
) -> None:
    """The target is edited by hand after the turn began (during the window): the promotion
    that window decided re-reads the target, sees the edit and writes nothing."""
    env = Env(cluster, namespace)
    api = _operator_api(operator_kubeconfig)
    try:
        kube = _adopted_actuator(env, api, ["serve", MODEL])
        _edit_args(env, _eagle(2))  # the human, mid-window
        generation = env.target().metadata.generation
        with pytest.raises(HumanEditError, match="edited by hand"):
            asyncio.run(kube.promote(Arm("eagle3", 3)))
    finally:
        api.close()
    assert env.target_args() == _eagle(2)
    assert env.target().metadata.generation == generation


def test_a_hand_edit_landing_between_the_read_and_the_patch_is_not_overwritten(
    cluster: Cluster, namespace: str, operator_kubeconfig: Path
) -> None:
    """The edit lands after the promotion's fresh read and its check, before its patch (the
    test forces that interleaving): the resourceVersion in the patch makes the real API
    server refuse it (409), the retry reads the edit and writes nothing."""
    env = Env(cluster, namespace)
    api = _operator_api(operator_kubeconfig)
    try:
        kube = _adopted_actuator(env, api, ["serve", MODEL])
        reads: list[str] = []
        read = kube.read_target

        async def read_then_a_human_edits() -> dict[str, Any]:
            target = await read()
            reads.append(target["metadata"]["resourceVersion"])
            if len(reads) == 1:
                _edit_args(env, _eagle(2))
            return target

        kube.read_target = read_then_a_human_edits  # type: ignore[method-assign]
        with pytest.raises(HumanEditError, match="edited by hand"):
            asyncio.run(kube.promote(Arm("eagle3", 3)))
    finally:
        api.close()
    assert len(reads) >= 2 and reads[0] != reads[1], reads  # refused once, read again
    assert env.target_args() == _eagle(2)


def _with_original(env: Env, original: str) -> dict[str, Any]:
    """The SpecTuning with a status history whose original setting is ``original``."""
    from spectune.control.controller import ControllerState
    from spectune.control.controller import Phase as LoopPhase
    from spectune.k8s.projection import Memory
    from spectune.search.history import History

    memory = Memory(History(), ControllerState(phase=LoopPhase.MONITORING), original).to_json()
    env.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, env.ns, PLURAL, "tune", {"status": {"history": memory}}
    )
    return env.spt()


@pytest.mark.parametrize("edited", [False, True], ids=["not-edited", "paused-edit"])
def test_restore_on_delete_never_overwrites_a_paused_edit(
    cluster: Cluster, namespace: str, operator_kubeconfig: Path, edited: bool
) -> None:
    """``restoreOnDelete: true``: a target still on the operator's eagle3/3 goes back to its
    original ``off``; one whose arguments were edited by hand (tuning paused) keeps the edit,
    and the cleanup says it left it."""
    from spectune.k8s.tuning import cleanup

    env = Env(cluster, namespace)
    env.create_target(_eagle(3))
    body = spectuning(_closed_prometheus(), restoreOnDelete=True)
    env.create_spt(body)
    api = _operator_api(operator_kubeconfig)
    try:
        kube = KubeActuator(api, env.spt(), TARGET, "vllm", "vllm", DRAFTERS)
        asyncio.run(kube.adopt(asyncio.run(kube.read_target())))
        if edited:
            _edit_args(env, _eagle(2))
        report = asyncio.run(cleanup(api, _with_original(env, "off")))
    finally:
        api.close()
    assert not report.failed, report
    if edited:
        assert env.target_args() == _eagle(2), str(report)
        assert any("edited by hand" in x for x in report.left), report
    else:
        assert arm_of(env.target_args()) == "off", str(report)


# -- item 5: status writes with optimistic concurrency --------------------------------------------


class WriterBeforePatch:
    """A wrapper around the real CustomObjectsApi: right before the loop's first status patch,
    another writer (as the admin, through the real API server) adds its own condition to the
    status. Every call goes to the real API server; nothing is faked."""

    def __init__(self, real: Any, other: Callable[[], None]) -> None:
        self._real = real
        self._other = other
        self.patches = 0
        self.refused = 0

    def patch_namespaced_custom_object_status(self, *args: Any, **kwargs: Any) -> Any:
        self.patches += 1
        if self.patches == 1:
            self._other()
        try:
            return self._real.patch_namespaced_custom_object_status(*args, **kwargs)
        except ApiException as exc:
            self.refused += exc.status == 409
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_concurrent_status_write_gets_a_real_409_and_nothing_is_lost(
    cluster: Cluster, namespace: str, operator_kubeconfig: Path
) -> None:
    """Someone else writes the status between the loop's read and its write: the real API
    server refuses the loop's patch (409, its resourceVersion is stale), the loop reads again
    and writes once more. The status then holds the loop's news (TargetMissing), the trial
    history it had, AND the other writer's condition."""
    from spectune.control.controller import ControllerState
    from spectune.control.controller import Phase as LoopPhase
    from spectune.k8s.projection import Memory
    from spectune.k8s.tuning import TuningLoop, WallClock
    from spectune.search.history import History, Outcome, TrialRecord
    from spectune.settings import Settings

    env = Env(cluster, namespace)
    env.create_spt(spectuning(_closed_prometheus()))  # its target does not exist
    trial = TrialRecord(arm="eagle3/3", incumbent="off", epoch=0, started_s=1.0)
    history = Memory(
        History().add_trial(trial.ended(Outcome.MEASURED, "2 window(s)")),
        ControllerState(phase=LoopPhase.EXPLORING),
        "off",
    ).to_json()
    env.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "tune", {"status": {"history": history}}
    )
    body = env.spt()

    def someone_else_writes() -> None:
        reviewed = {
            "type": "Reviewed",
            "status": "True",
            "reason": "PolicyCheck",
            "message": "checked by another controller",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        env.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "tune", {"status": {"conditions": [reviewed]}}
        )

    api = _operator_api(operator_kubeconfig)
    loop = TuningLoop(
        api,
        body,
        Settings(poll_s=0.1, metrics_port=0, liveness_port=0),
        WallClock(),
        None,
        lambda *e: None,
    )
    wrapper = WriterBeforePatch(loop._custom, someone_else_writes)
    loop._custom = wrapper  # type: ignore[assignment]
    try:
        asyncio.run(loop.turn())
    finally:
        api.close()
    assert wrapper.refused == 1, "the stale write was not refused by the API server"
    assert wrapper.patches == 2
    status = env.status()
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Ready"]["reason"] == "TargetMissing", by_type
    assert by_type["Reviewed"]["reason"] == "PolicyCheck", "the other writer's condition lost"
    trials = decode_memory(status["history"])["history"]["trials"]
    assert [t["arm"] for t in trials] == ["eagle3/3"], trials


# -- item 8: deletion never wedges --------------------------------------------------------------


@pytest.fixture
def kubeconfig_without_delete(
    cluster: Cluster, operator_kubeconfig: Path, tmp_path: Path
) -> Iterator[Path]:
    """The operator's permissions without ``delete`` on Deployments (a persistent error for
    the cleanup of canaries)."""
    with kubeconfig_without(cluster, operator_kubeconfig, tmp_path, "delete") as (path, _):
        yield path


def test_a_deletion_whose_cleanup_keeps_failing_still_completes(
    cluster: Cluster,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    kubeconfig_without_delete: Path,
) -> None:
    """The operator may not delete Deployments, and the SpecTuning has a canary: its cleanup
    fails on every try. After ``SPECTUNE_CLEANUP_TIMEOUT_SECONDS`` the finalizer goes anyway
    (the SpecTuning is deleted), a ``CleanupIncomplete`` Warning says what remains (the
    canaries), and the canary, owned by the SpecTuning, goes with it (garbage collector)."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    env.create_spt(spectuning(_closed_prometheus()))
    owned = KubeActuator(cluster.api, env.spt(), TARGET, "vllm", "vllm", DRAFTERS)
    asyncio.run(owned.start_canary(Arm("eagle3", 3)))
    op = start_operator(
        namespace, KUBECONFIG=str(kubeconfig_without_delete), SPECTUNE_CLEANUP_TIMEOUT_SECONDS="5"
    )
    # The loop itself cannot remove the stray canary either, and says so.
    wait_for(
        lambda: (env.condition("Ready") or {}).get("reason") == "Forbidden",
        timeout=60,
        message=lambda: f"Forbidden (delete); {op.log()[-3000:]}",
    )
    assert env.spt()["metadata"].get("finalizers"), "kopf put no finalizer on it"
    env.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "tune")
    wait_for(
        lambda: _gone(env),
        timeout=60,
        message=lambda: f"the SpecTuning deleted despite its cleanup failing; {op.log()[-3000:]}",
    )
    warned = wait_for(
        lambda: [e for e in env.events() if e.reason == "CleanupIncomplete"],
        timeout=15,
        message="a CleanupIncomplete event",
    )
    assert warned[0].type == "Warning", warned[0]
    assert "removing the canaries" in warned[0].message, warned[0].message
    assert "forbidden" in warned[0].message, warned[0].message
    wait_for(lambda: not env.canaries(), timeout=60, message="the garbage collector's deletion")
    assert op.process.poll() is None


# -- item 8: names that cannot fit a label value --------------------------------------------------


def test_a_spectuning_name_longer_than_a_label_value_is_refused(
    cluster: Cluster, namespace: str
) -> None:
    """Every canary carries the SpecTuning's name as a label value (63 characters at most):
    the API server refuses a longer name at creation, naming metadata.name; 63 is accepted."""
    env = Env(cluster, namespace)
    with pytest.raises(ApiException) as err:
        env.create_spt(spectuning(_closed_prometheus(), name="n" * 64))
    assert err.value.status == 422 and "metadata.name" in err.value.body, err.value.body
    env.create_spt(spectuning(_closed_prometheus(), name="n" * 63))


# -- item 9: the drafter model is confined -----------------------------------------------------


def test_a_drafter_model_needs_both_keys_on_a_trusting_target(
    cluster: Cluster,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """The target runs with --trust-remote-code. A SpecTuning with an EAGLE-3 drafter is
    refused (InvalidSpec naming the drafter and the fix) and nothing is created or touched;
    listing the model in the SpecTuning alone does not allow it (its author cannot allow
    themselves); the operator's allow-list matching it as well does."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL, "--trust-remote-code"])
    env.create_spt(spectuning(_closed_prometheus()))
    op = start_operator(namespace)

    def refused(generation: int) -> dict[str, Any] | None:
        c = env.condition("Ready")
        ok = c and c["reason"] == "InvalidSpec" and c.get("observedGeneration") == generation
        return c if ok else None

    cond = wait_for(
        lambda: refused(1), timeout=60, message=lambda: f"InvalidSpec (1); {env.status()}"
    )
    assert "drafter 'eagle3'" in cond["message"] and EAGLE in cond["message"], cond
    assert "spec.trustRemoteCode.allowedDrafterModels" in cond["message"], cond
    assert "SPECTUNE_DRAFTER_MODEL_ALLOW_LIST" in cond["message"], cond

    env.patch_spec({"trustRemoteCode": {"allowedDrafterModels": [EAGLE]}})
    cond = wait_for(
        lambda: refused(2),
        timeout=60,
        message=lambda: f"InvalidSpec (2); {env.status()} {env.spt()['metadata']}",
    )
    assert "operator's allow-list does not match it" in cond["message"], cond
    assert "does not list it" not in cond["message"].split("SPECTUNE_")[0], cond
    assert not env.canaries()
    assert "spectune.io/fingerprint" not in (env.target().metadata.annotations or {})

    op.stop()
    op = start_operator(namespace, SPECTUNE_DRAFTER_MODEL_ALLOW_LIST="yuhuili/*")
    wait_for(
        lambda: (env.condition("Ready") or {}).get("reason") == "Tuning",
        timeout=60,
        message=lambda: f"tuning once both keys agree; {op.log()[-3000:]}",
    )
    assert "spectune.io/fingerprint" in (env.target().metadata.annotations or {})
