"""The operator end to end on the real API server, the real Prometheus and simulated pods.

Each test runs ``spectune run`` as the RBAC manifest's ServiceAccount for its namespace,
creates a vLLM-like Deployment whose pods (on kwok nodes) are given a body by
``spectune sim serve`` (``tests/fixtures/simpods.py``) and scraped by Prometheus, and applies
a SpecTuning. Windows are 10 s of wall time on a simulator running 30x faster (300 s of
serving per window).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from spectune.api.names import GROUP, KIND, PLURAL, VERSION
from spectune.k8s.projection import decode_memory
from tests.fixtures.cluster import Cluster, wait_for
from tests.fixtures.prometheus import Prometheus
from tests.fixtures.simpods import SimPods
from tests.integration.operator.conftest import OperatorProcess
from tests.integration.operator.helpers import (
    EAGLE,
    MODEL,
    TARGET,
    Env,
    arm_of,
    diagnostics,
    spectuning,
)


def test_auto_mode_explores_promotes_and_cleans_up(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    env.create_spt(spectuning(prometheus.url))
    why = diagnostics(env, op, sims)

    phases: list[str] = []
    owned: list[Any] = []

    def monitoring() -> bool:
        phase = env.status().get("phase")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        for c in env.canaries():
            if c.metadata.name not in {o.metadata.name for o in owned}:
                owned.append(c)
        return phase == "Monitoring"

    wait_for(monitoring, timeout=240, interval=0.5, message=lambda: f"Monitoring; {why()}")
    assert phases[0] == "Baseline" and "Exploring" in phases, phases

    # Canaries ran the trials, owned by the SpecTuning, and are gone after convergence.
    assert owned, "no canary Deployment was ever created"
    spt_uid = env.spt()["metadata"]["uid"]
    for c in owned:
        refs = c.metadata.owner_references
        assert refs and refs[0].kind == KIND and refs[0].uid == spt_uid, refs
    wait_for(lambda: not env.canaries(), timeout=30, message="canaries removed after promotion")

    # The promoted setting is what the Deployment runs, and what the status says.
    status = env.status()
    promoted = decode_memory(status["history"])["history"]["promotions"][-1][1]
    wait_for(lambda: arm_of(env.target_args()) == promoted, timeout=30, message="promotion")
    wait_for(
        lambda: env.status()["applied"]["arm"] == promoted,
        timeout=40,
        message=lambda: f"status.applied = {promoted}; {why()}",
    )
    assert status["recommendation"]["arm"]
    assert status["trials"] and all(t["outcome"] != "running" for t in status["trials"])
    assert {"TrialStarted", "Promoted"} <= env.reasons()
    ready = env.condition("Ready")
    assert ready is not None and ready["status"] == "True" and ready["lastTransitionTime"]

    # The operator's own metrics.
    import httpx

    page = httpx.get(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5).text
    assert f'spectune_phase{{name="tune",namespace="{namespace}",phase="Monitoring"}} 1.0' in page
    assert "spectune_trials{" in page

    # Deleting the SpecTuning leaves the target on the promoted setting.
    env.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "tune")

    def gone() -> bool:
        try:
            env.spt()
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, timeout=30, message="the SpecTuning's finalizer released")
    assert arm_of(env.target_args()) == promoted
    assert not env.canaries()


def test_in_place_strategy_tunes_the_target_itself(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """``strategy: inPlace``: no canary is ever created; each trial patches the target (its
    args carry the trial's arm and the ``spectune.io/trial`` annotation says so), each trial
    window is a switchback pair of the target on the trial arm and back on the incumbent,
    and the search converges with the winner in the target's args and no trial annotation
    left."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    env.create_spt(spectuning(prometheus.url, search={"window": "5m", "maxTrials": 3,
                                                      "strategy": "inPlace"}))  # fmt: skip
    why = diagnostics(env, op, sims)
    seen_trials: set[str] = set()
    canaries: list[str] = []

    def monitoring() -> bool:
        notes = env.target().metadata.annotations or {}
        if "spectune.io/trial" in notes:
            seen_trials.add(notes["spectune.io/trial"])
        canaries.extend(c.metadata.name for c in env.canaries())
        return env.status().get("phase") == "Monitoring"

    wait_for(monitoring, timeout=300, interval=0.5, message=lambda: f"Monitoring; {why()}")
    assert not canaries, f"canaries under inPlace: {canaries}"
    assert seen_trials, "no trial was ever applied to the target"
    trials = env.trials()
    assert trials and all(t["outcome"] != "running" for t in trials), trials
    assert any(t.get("windows", 0) > 0 and t["outcome"] == "measured" for t in trials), trials
    status = env.status()
    promoted = decode_memory(status["history"])["history"]["promotions"][-1][1]
    wait_for(
        lambda: arm_of(env.target_args()) == promoted and env.target_ready(),
        timeout=60,
        message=lambda: f"the target runs {promoted}; {why()}",
    )
    notes = env.target().metadata.annotations or {}
    assert "spectune.io/trial" not in notes and "spectune.io/incumbent" not in notes, notes
    assert "TrialStarted" in env.reasons()
    assert op.process.poll() is None


def test_recommend_mode_never_changes_the_deployment(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    env = Env(cluster, namespace)
    spec = json.dumps({"method": "eagle3", "model": EAGLE, "num_speculative_tokens": 3})
    env.create_target(["serve", MODEL, "--speculative-config", spec])
    before = env.target()
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    env.create_spt(spectuning(prometheus.url, mode="recommend"))
    why = diagnostics(env, op, sims)

    def recommended() -> dict[str, Any] | None:
        s = env.status()
        if s.get("phase") == "Converged" and s.get("recommendation"):
            return s
        return None

    status = wait_for(recommended, timeout=90, message=lambda: f"a recommendation; {why()}")
    rec = status["recommendation"]
    assert rec["drafter"] == "eagle3" and 1 <= rec["k"] <= 3
    assert "assuming draft cost" in rec["reason"]
    assert status["acceptance"]["rate"] > 0.3
    assert status["applied"]["arm"] == "eagle3/3"
    time.sleep(3)
    after = env.target()
    assert after.metadata.generation == before.metadata.generation
    assert after.metadata.annotations == before.metadata.annotations
    assert not env.canaries()


def test_invalid_specs_are_refused_with_the_field_named(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    env = Env(cluster, namespace)
    # The API server refuses what its schema and CEL rules can see...
    bad = spectuning(prometheus.url, drafters=[{"name": "e3", "method": "eagle3"}])
    with pytest.raises(ApiException) as err:
        env.create_spt(bad)
    assert err.value.status == 422 and "model" in err.value.body
    # ...and the operator refuses what only the cluster can tell, naming the field.
    env.create_target(["serve", MODEL])
    op = start_operator(namespace)
    env.create_spt(
        spectuning(prometheus.url, targetRef={"name": TARGET, "container": "sglang-main"})
    )

    def invalid() -> dict[str, Any] | None:
        c = env.condition("Ready")
        return c if c is not None and c["reason"] == "InvalidSpec" else None

    cond = wait_for(invalid, timeout=60, message=lambda: f"InvalidSpec; {op.log()[-2000:]}")
    assert cond["status"] == "False"
    assert "spec.targetRef.container" in cond["message"] and "vllm" in cond["message"], cond
    assert cond["observedGeneration"] == env.spt()["metadata"]["generation"]
    assert env.status()["phase"] == "Failed"
    assert not env.canaries()


def test_human_edit_pauses_tuning_and_nothing_is_overwritten(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    env.create_spt(spectuning(prometheus.url, search={"window": "10m", "maxTrials": 4}))
    why = diagnostics(env, op, sims)
    wait_for(
        lambda: "spectune.io/fingerprint" in (env.target().metadata.annotations or {}),
        timeout=60,
        message=lambda: f"the operator adopted the target; {why()}",
    )
    human = json.dumps({"method": "eagle3", "model": EAGLE, "num_speculative_tokens": 2})
    edited = ["serve", MODEL, "--speculative-config", human]
    env.apps.patch_namespaced_deployment(
        TARGET,
        namespace,
        {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": edited}]}}}},
    )

    def paused() -> dict[str, Any] | None:
        c = env.condition("Ready")
        return c if c is not None and c["reason"] == "HumanEdit" else None

    cond = wait_for(paused, timeout=90, message=lambda: f"HumanEdit; {why()}")
    assert cond["status"] == "False" and "nothing is overwritten" in cond["message"]
    wait_for(lambda: "HumanEdit" in env.reasons(), timeout=30, message="a HumanEdit event")
    wait_for(lambda: not env.canaries(), timeout=30, message="canaries removed while paused")
    time.sleep(5)
    assert env.target_args() == edited
    assert env.condition("Ready")["reason"] == "HumanEdit"  # type: ignore[index]
