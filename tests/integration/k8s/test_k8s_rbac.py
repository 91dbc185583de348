"""RBAC is on: an impersonated ServiceAccount with a narrow Role gets only what it grants."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from tests.fixtures.cluster import Cluster


def test_narrow_role_denies_what_it_does_not_grant(cluster: Cluster, namespace: str) -> None:
    core = client.CoreV1Api(cluster.api)
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="narrow"))
    )
    rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="read-configmaps"),
            rules=[
                client.V1PolicyRule(
                    api_groups=[""], resources=["configmaps"], verbs=["get", "list", "watch"]
                )
            ],
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="narrow-reads"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="read-configmaps"
            ),
            subjects=[
                client.RbacV1Subject(kind="ServiceAccount", name="narrow", namespace=namespace)
            ],
        ),
    )
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm"))
    )

    user = f"system:serviceaccount:{namespace}:narrow"
    api = cluster.impersonating(user)
    try:
        as_sa = client.CoreV1Api(api)
        # granted
        assert [
            c.metadata.name
            for c in as_sa.list_namespaced_config_map(namespace).items
            if c.metadata.name == "cm"
        ]
        assert as_sa.read_namespaced_config_map("cm", namespace).metadata.name == "cm"
        # denied: other verbs, other resources, other namespaces, cluster scope
        denied = [
            lambda: as_sa.create_namespaced_config_map(
                namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="nope"))
            ),
            lambda: as_sa.delete_namespaced_config_map("cm", namespace),
            lambda: as_sa.list_namespaced_secret(namespace),
            lambda: as_sa.list_namespaced_config_map("default"),
            lambda: as_sa.list_namespace(),
        ]
        for call in denied:
            with pytest.raises(ApiException) as err:
                call()
            assert err.value.status == 403, err.value.body
            assert user in err.value.body
    finally:
        api.close()

    # the same answers through kubectl's impersonation and the authorization API
    def can_i(*args: str) -> str:
        proc = cluster.kubectl("auth", "can-i", f"--as={user}", "-n", namespace, *args, check=False)
        return proc.stdout.strip()

    assert can_i("list", "configmaps") == "yes"
    assert can_i("create", "configmaps") == "no"
    assert can_i("get", "secrets") == "no"
    assert can_i("create", "deployments.apps") == "no"
