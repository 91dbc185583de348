"""A real kube-apiserver: version, CRD schema validation, watch, conflicts, status subresource."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from tests.fixtures.cluster import SCRIPT, Cluster, wait_for


def test_server_and_kubectl_report_the_pinned_version(cluster: Cluster) -> None:
    want = cluster.versions["K8S_VERSION"]
    info = client.VersionApi(cluster.api).get_code()
    assert info.git_version == want
    out = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert out["clientVersion"]["gitVersion"] == want
    assert out["serverVersion"]["gitVersion"] == want


def test_all_components_listen_on_loopback_only(cluster: Cluster) -> None:
    pids = {pid for pid, _ in cluster.recorded_pids()}
    assert len(pids) == 5
    ss = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    ours = [line for line in ss.splitlines() if any(f"pid={pid}," in line for pid in pids)]
    assert ours, f"no listening sockets found for {pids}:\n{ss}"
    for line in ours:
        local = line.split()[3]
        assert local.startswith("127.0.0.1:"), f"a component listens beyond loopback: {line}"


def _crd(group: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "plural": "widgets",
                "singular": "widget",
                "kind": "Widget",
                "listKind": "WidgetList",
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["size"],
                                    "properties": {
                                        "size": {"type": "integer", "minimum": 1, "maximum": 10},
                                        "colour": {"type": "string", "enum": ["red", "blue"]},
                                    },
                                },
                                "status": {
                                    "type": "object",
                                    "properties": {"phase": {"type": "string"}},
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture
def widget_crd(cluster: Cluster) -> Any:
    group = f"t{uuid.uuid4().hex[:8]}.spectune.test"
    ext = client.ApiextensionsV1Api(cluster.api)
    body = _crd(group)
    ext.create_custom_resource_definition(body)

    def established() -> bool:
        crd = ext.read_custom_resource_definition(body["metadata"]["name"])
        return any(
            c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])
        )

    wait_for(established, timeout=60, message=f"CRD {body['metadata']['name']} Established")
    # discovery of the new group can lag behind Established by a moment
    custom = client.CustomObjectsApi(cluster.api)
    wait_for(
        lambda: custom.list_cluster_custom_object(group, "v1", "widgets") is not None,
        timeout=60,
        message="the new CRD to be served",
    )
    yield group
    ext.delete_custom_resource_definition(body["metadata"]["name"])


def _widget(group: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def test_crd_schema_rejects_bad_objects(cluster: Cluster, namespace: str, widget_crd: str) -> None:
    custom = client.CustomObjectsApi(cluster.api)
    ok = custom.create_namespaced_custom_object(
        widget_crd,
        "v1",
        namespace,
        "widgets",
        _widget(widget_crd, "good", {"size": 3, "colour": "red"}),
    )
    assert ok["metadata"]["uid"]

    for name, spec, needle in [
        ("too-big", {"size": 11}, "spec.size"),
        ("wrong-type", {"size": "three"}, "spec.size"),
        ("bad-enum", {"size": 2, "colour": "green"}, "spec.colour"),
        ("missing", {"colour": "red"}, "spec.size"),
    ]:
        with pytest.raises(ApiException) as err:
            custom.create_namespaced_custom_object(
                widget_crd, "v1", namespace, "widgets", _widget(widget_crd, name, spec)
            )
        assert err.value.status == 422, err.value.body
        assert needle in err.value.body
        assert "Invalid" in json.loads(err.value.body)["reason"]

    # kubectl goes through the same validation
    bad = json.dumps(_widget(widget_crd, "via-kubectl", {"size": 0}))
    proc = cluster.kubectl("-n", namespace, "create", "-f", "-", input=bad, check=False)
    assert proc.returncode != 0
    assert "spec.size" in proc.stderr


def test_patch_watch_conflict_and_status_subresource(
    cluster: Cluster, namespace: str, widget_crd: str
) -> None:
    custom = client.CustomObjectsApi(cluster.api)
    args = (widget_crd, "v1", namespace, "widgets")
    created = custom.create_namespaced_custom_object(*args, _widget(widget_crd, "w", {"size": 1}))
    rv0 = created["metadata"]["resourceVersion"]

    # a watch from the creation's resourceVersion sees our merge patch as MODIFIED
    patched = custom.patch_namespaced_custom_object(*args, "w", {"spec": {"size": 2}})
    assert patched["spec"]["size"] == 2
    assert patched["metadata"]["resourceVersion"] != rv0
    assert patched["metadata"]["generation"] == 2
    w = watch.Watch()
    events = []
    for ev in w.stream(
        custom.list_namespaced_custom_object, *args, resource_version=rv0, timeout_seconds=10
    ):
        events.append((ev["type"], ev["object"]["spec"]["size"]))
        if ev["type"] == "MODIFIED":
            w.stop()
    assert ("MODIFIED", 2) in events

    # optimistic concurrency: a replace with a stale resourceVersion is a 409 Conflict
    stale = dict(created)
    stale["spec"] = {"size": 5}
    with pytest.raises(ApiException) as err:
        custom.replace_namespaced_custom_object(*args, "w", stale)
    assert err.value.status == 409

    # status subresource: the main resource ignores status; /status sets it, generation unchanged
    custom.patch_namespaced_custom_object(*args, "w", {"status": {"phase": "Ignored"}})
    assert "status" not in custom.get_namespaced_custom_object(*args, "w")
    st = custom.patch_namespaced_custom_object_status(*args, "w", {"status": {"phase": "Ready"}})
    assert st["status"] == {"phase": "Ready"}
    assert st["metadata"]["generation"] == 2


def test_cluster_script_env_prints_only_exports(cluster: Cluster, tmp_path: Path) -> None:
    def env_out(state: Path) -> list[str]:
        env = dict(os.environ, SPECTUNE_CLUSTER_STATE=str(state))
        proc = subprocess.run(
            ["bash", str(SCRIPT), "env"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return proc.stdout.splitlines()

    up = env_out(cluster.state_file)
    assert all(line.startswith("export ") for line in up), up
    assert f"export KUBECONFIG={cluster.kubeconfig}" in up
    assert f'export PATH={cluster.bin_dir}:"$PATH"' in up
    # no cluster recorded: PATH only
    assert env_out(tmp_path / "no-such.state") == [f'export PATH={cluster.bin_dir}:"$PATH"']
