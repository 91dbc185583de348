"""What the operator reads through the Kubernetes API, against a real API server.

The actuator and the metric sources read the target, its pods, its canaries and the
Prometheus credentials Secret as the API server's JSON (``spectune.k8s.connect.read_json``:
no client model objects, which cost most of the operator's memory at a few hundred
SpecTunings). These tests check that what they read is what ``kubectl`` shows, and that a
failed read is reported as the operator reports it (target missing, forbidden, Secret
missing).
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from kubernetes import client

from spectune.api.spec import SecretKeyRef
from spectune.k8s.actuator import ForbiddenError, KubeActuator, TargetMissingError
from spectune.k8s.deployments import DrafterArgs
from spectune.k8s.sources import (
    ANNOTATION_PROMETHEUS_URL,
    LABEL_CREDENTIALS,
    AuthSecretError,
    prometheus_headers,
)
from spectune.search.arms import Arm
from tests.fixtures.cluster import Cluster, wait_for
from tests.integration.operator.helpers import EAGLE, MODEL, TARGET, Env, spectuning

DRAFTERS = {"eagle3": DrafterArgs("eagle3", "eagle3", EAGLE)}


def _spt(env: Env) -> dict[str, Any]:
    """A SpecTuning to own the canaries (no operator runs: nothing else acts on it)."""
    env.create_spt(spectuning("http://prometheus.invalid:9090"))
    return env.spt()


def _kubectl_json(cluster: Cluster, *args: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)
    return doc


def test_target_pods_and_canary_are_read_as_kubectl_shows_them(
    cluster: Cluster, namespace: str
) -> None:
    """The target as read has kubectl's spec, labels and annotations; its pods are its own
    (never the canary's), and a canary started on eagle3/2 is found with its arm and pods."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    kube = KubeActuator(cluster.api, _spt(env), TARGET, "vllm", "vllm", DRAFTERS)

    target = asyncio.run(kube.read_target())
    shown = _kubectl_json(cluster, "deployment", TARGET, "-n", namespace)
    assert target["spec"] == shown["spec"]
    for key in ("name", "namespace", "uid", "labels", "annotations", "generation"):
        assert target["metadata"].get(key) == shown["metadata"].get(key), key

    pods = {p["metadata"]["name"] for p in asyncio.run(kube.target_pods())}
    listed = _kubectl_json(cluster, "pods", "-n", namespace, "-l", f"app={TARGET}")
    assert pods == {p["metadata"]["name"] for p in listed["items"]}
    assert len(pods) == 1

    asyncio.run(kube.start_canary(Arm("eagle3", 2)))

    def canary_ready() -> Any:
        dep = asyncio.run(kube.deployment())
        return dep if dep.canary_ready else None

    dep = wait_for(canary_ready, timeout=90, message="the canary rolled out")
    assert dep.canary == Arm("eagle3", 2)
    assert dep.incumbent == Arm(None)
    canary_pods = {p["metadata"]["name"] for p in asyncio.run(kube.canary_pods())}
    assert len(canary_pods) == 1 and not canary_pods & pods
    assert {p["metadata"]["name"] for p in asyncio.run(kube.target_pods())} == pods

    asyncio.run(kube.stop_canary())
    assert asyncio.run(kube.deployment()).canary is None


def test_a_missing_target_and_a_forbidden_read_are_named(cluster: Cluster, namespace: str) -> None:
    """A Deployment that does not exist is TargetMissing (temporary); a user that may not get
    Deployments is told the verb and the resource, as the API server said them."""
    spt = {"metadata": {"name": "tune", "namespace": namespace}}
    missing = KubeActuator(cluster.api, spt, "absent", None, "vllm", {})
    with pytest.raises(TargetMissingError, match=f"{namespace}/absent not found"):
        asyncio.run(missing.read_target())

    nobody = cluster.impersonating("spectune-test-nobody")
    try:
        denied = KubeActuator(nobody, spt, TARGET, None, "vllm", {})
        with pytest.raises(ForbiddenError) as info:
            asyncio.run(denied.read_target())
    finally:
        nobody.close()
    message = str(info.value)
    assert 'cannot get resource "deployments"' in message, message
    assert "spectune-test-nobody" in message, message


def test_prometheus_credentials_come_from_a_secret_that_opted_in(
    cluster: Cluster, namespace: str
) -> None:
    """A bearer token under the named key, basic auth from a basic-auth Secret, both
    labelled spectune.io/prometheus-credentials=true; an unlabelled Secret is refused with
    the message a missing one gets, and a Secret bound to a URL goes to no other."""
    core = client.CoreV1Api(cluster.api)
    url = "http://prometheus.monitoring:9090"
    opted = {LABEL_CREDENTIALS: "true"}

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    def headers(name: str, to: str = url) -> dict[str, str]:
        return asyncio.run(prometheus_headers(cluster.api, namespace, SecretKeyRef(name=name), to))

    core.create_namespaced_secret(
        namespace,
        {"metadata": {"name": "bearer", "labels": opted}, "data": {"token": b64("s3cret\n")}},
    )
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": "basic", "labels": opted},
            "type": "kubernetes.io/basic-auth",
            "data": {"username": b64("u"), "password": b64("p")},
        },
    )
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "unlabelled"}, "data": {"token": b64("other-team")}}
    )
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {
                "name": "bound",
                "labels": opted,
                "annotations": {ANNOTATION_PROMETHEUS_URL: url},
            },
            "data": {"token": b64("bound-token")},
        },
    )
    assert headers("bearer") == {"Authorization": "Bearer s3cret"}
    assert headers("basic") == {"Authorization": "Basic " + b64("u:p")}
    assert headers("bound") == {"Authorization": "Bearer bound-token"}
    with pytest.raises(AuthSecretError, match=f"Secret {namespace}/absent not found") as absent:
        headers("absent")
    with pytest.raises(AuthSecretError) as unlabelled:
        headers("unlabelled")
    assert str(unlabelled.value) == str(absent.value).replace("absent", "unlabelled")
    with pytest.raises(AuthSecretError, match=ANNOTATION_PROMETHEUS_URL) as bound:
        headers("bound", "http://listener.example:8080")
    assert "bound-token" not in str(bound.value)
