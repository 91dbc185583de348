"""Real controllers: rollouts onto kwok fake nodes, rolling updates, garbage collection."""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.rest import ApiException
from tests.fixtures.cluster import Cluster, wait_for


def _deployment(name: str, replicas: int, version: str) -> client.V1Deployment:
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            strategy=client.V1DeploymentStrategy(
                type="RollingUpdate",
                rolling_update=client.V1RollingUpdateDeployment(max_surge=1, max_unavailable=0),
            ),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    containers=[
                        client.V1Container(
                            name="server",
                            image=f"example.invalid/server:{version}",
                            env=[client.V1EnvVar(name="VERSION", value=version)],
                        )
                    ]
                ),
            ),
        ),
    )


def _ready_pods(core: client.CoreV1Api, namespace: str, app: str) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
    return [
        p
        for p in pods
        if p.metadata.deletion_timestamp is None
        and p.status.phase == "Running"
        and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
    ]


def _rolled_out(apps: client.AppsV1Api, namespace: str, name: str, replicas: int) -> bool:
    d = apps.read_namespaced_deployment(name, namespace)
    s = d.status
    return (
        s.observed_generation == d.metadata.generation
        and s.updated_replicas == replicas
        and s.ready_replicas == replicas
        and s.available_replicas == replicas
        and (s.replicas or 0) == replicas
    )


def test_deployment_rolls_out_and_rolling_update_replaces_pods(
    cluster: Cluster, namespace: str
) -> None:
    apps = client.AppsV1Api(cluster.api)
    core = client.CoreV1Api(cluster.api)
    apps.create_namespaced_deployment(namespace, _deployment("web", 3, "v1"))
    wait_for(
        lambda: _rolled_out(apps, namespace, "web", 3), timeout=90, message="web v1 rolled out"
    )

    old = _ready_pods(core, namespace, "web")
    assert len(old) == 3
    for p in old:
        assert p.spec.node_name and p.spec.node_name.startswith("kwok-node-"), p.spec.node_name
        assert p.status.pod_ip, "kwok assigns a pod IP"
        assert p.status.container_statuses[0].state.running is not None
    old_names = {p.metadata.name for p in old}
    old_hash = {p.metadata.labels["pod-template-hash"] for p in old}
    assert len(old_hash) == 1

    apps.patch_namespaced_deployment(
        "web",
        namespace,
        {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "server",
                                "image": "example.invalid/server:v2",
                                "env": [{"name": "VERSION", "value": "v2"}],
                            }
                        ]
                    }
                }
            }
        },
    )

    def replaced() -> bool:
        if not _rolled_out(apps, namespace, "web", 3):
            return False
        pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
        live = [p for p in pods if p.metadata.deletion_timestamp is None]
        return len(live) == 3 and not ({p.metadata.name for p in pods} & old_names)

    wait_for(replaced, timeout=120, message="rolling update to v2 to replace every pod")
    new = _ready_pods(core, namespace, "web")
    assert len(new) == 3
    assert {p.spec.containers[0].image for p in new} == {"example.invalid/server:v2"}
    assert {p.metadata.labels["pod-template-hash"] for p in new}.isdisjoint(old_hash)
    rs = apps.list_namespaced_replica_set(namespace, label_selector="app=web").items
    assert sorted(r.status.replicas for r in rs) == [0, 3]


def test_deleting_owner_garbage_collects_dependents(cluster: Cluster, namespace: str) -> None:
    core = client.CoreV1Api(cluster.api)
    apps = client.AppsV1Api(cluster.api)

    owner = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"), data={"k": "v"})
    )
    ref = client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
    )
    for i in range(3):
        core.create_namespaced_config_map(
            namespace,
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=f"owned-{i}", owner_references=[ref])
            ),
        )
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="bystander"))
    )
    core.delete_namespaced_config_map("owner", namespace)

    def collected() -> bool:
        names = {c.metadata.name for c in core.list_namespaced_config_map(namespace).items}
        return not any(n.startswith("owned-") for n in names)

    wait_for(collected, timeout=60, message="owned ConfigMaps to be garbage-collected")
    assert core.read_namespaced_config_map("bystander", namespace).metadata.name == "bystander"

    # cascading through the workload controllers: Deployment -> ReplicaSet -> Pods (foreground)
    apps.create_namespaced_deployment(namespace, _deployment("gc", 2, "v1"))
    wait_for(
        lambda: _rolled_out(apps, namespace, "gc", 2),
        timeout=90,
        message="gc deployment rolled out",
    )
    apps.delete_namespaced_deployment("gc", namespace, propagation_policy="Foreground")

    def all_gone() -> bool:
        try:
            apps.read_namespaced_deployment("gc", namespace)
            return False
        except ApiException as exc:
            if exc.status != 404:
                raise
        rs = apps.list_namespaced_replica_set(namespace, label_selector="app=gc").items
        pods = core.list_namespaced_pod(namespace, label_selector="app=gc").items
        return not rs and not pods

    wait_for(all_gone, timeout=90, message="Deployment gc, its ReplicaSet and Pods to be deleted")


def test_restart_pod_evicts_through_the_api_and_a_disruption_budget_holds_it(
    cluster: Cluster, namespace: str
) -> None:
    """``retune.drift.podAction: restartPod`` goes through the Eviction API: a
    PodDisruptionBudget that allows no disruption (computed by the real disruption
    controller) refuses it and the pod stays; with room in the budget the pod is evicted and
    the ReplicaSet replaces it."""
    import asyncio

    from spectune.k8s.pods import TargetPods

    apps = client.AppsV1Api(cluster.api)
    core = client.CoreV1Api(cluster.api)
    policy = client.PolicyV1Api(cluster.api)
    apps.create_namespaced_deployment(namespace, _deployment("decay", 2, "v1"))
    wait_for(lambda: _rolled_out(apps, namespace, "decay", 2), timeout=90, message="rolled out")

    async def listed() -> list[dict[str, object]]:
        pods = core.list_namespaced_pod(namespace, label_selector="app=decay").items
        return [cluster.api.sanitize_for_serialization(p) for p in pods]

    pods = TargetPods(cluster.api, namespace, listed)
    budget = client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name="decay"),
        spec=client.V1PodDisruptionBudgetSpec(
            min_available=2, selector=client.V1LabelSelector(match_labels={"app": "decay"})
        ),
    )
    policy.create_namespaced_pod_disruption_budget(namespace, budget)

    def budget() -> client.V1PodDisruptionBudgetStatus:
        return policy.read_namespaced_pod_disruption_budget("decay", namespace).status

    wait_for(
        lambda: budget().expected_pods == 2, timeout=60, message="the disruption controller ran"
    )
    first = sorted(p.metadata.name for p in _ready_pods(core, namespace, "decay"))[0]
    refused = asyncio.run(pods.evict(first))
    assert refused is not None and "PodDisruptionBudget" in refused, refused
    assert core.read_namespaced_pod(first, namespace).metadata.deletion_timestamp is None

    policy.patch_namespaced_pod_disruption_budget("decay", namespace, {"spec": {"minAvailable": 1}})
    wait_for(
        lambda: budget().disruptions_allowed == 1,
        timeout=60,
        message="the budget allows one disruption",
    )
    assert asyncio.run(pods.evict(first)) is None
    wait_for(
        lambda: (
            first not in {p.metadata.name for p in _ready_pods(core, namespace, "decay")}
            and len(_ready_pods(core, namespace, "decay")) == 2
        ),
        timeout=90,
        message="the evicted pod replaced",
    )
    assert asyncio.run(pods.evict(first)) is None  # already gone: no error
