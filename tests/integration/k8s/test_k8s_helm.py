"""A real helm: lint and template a tiny chart offline, then install it into the test cluster."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from kubernetes import client
from tests.fixtures.cluster import Cluster, pinned_versions, wait_for

CHART = Path(__file__).parent / "data" / "tinychart"


def _helm(bin_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(bin_dir / "helm"), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check:
        assert proc.returncode == 0, f"helm {args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_helm_version_is_pinned(cluster_bin: Path) -> None:
    out = _helm(cluster_bin, "version", "--short").stdout
    assert out.startswith(pinned_versions()["HELM_VERSION"]), out


def test_helm_lint_and_template(cluster_bin: Path, tmp_path: Path) -> None:
    """Offline: no cluster needed."""
    lint = _helm(cluster_bin, "lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in lint.stdout

    rendered = _helm(
        cluster_bin, "template", "demo", str(CHART), "--namespace", "ns1", "--set", "replicas=2"
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"ConfigMap", "Deployment"}
    assert kinds["Deployment"]["metadata"]["name"] == "demo-tinychart"
    assert kinds["Deployment"]["spec"]["replicas"] == 2
    assert kinds["ConfigMap"]["data"]["greeting"] == "hello"

    # a broken chart fails lint
    broken = tmp_path / "broken"
    (broken / "templates").mkdir(parents=True)
    (broken / "Chart.yaml").write_text("apiVersion: v2\nname: broken\nversion: 0.1.0\n")
    (broken / "templates" / "cm.yaml").write_text(
        "kind: ConfigMap\nmetadata:\n  name: {{ .Values.missing.key }}\n"
    )
    proc = _helm(cluster_bin, "lint", str(broken), check=False)
    assert proc.returncode != 0
    assert "missing" in proc.stdout + proc.stderr


def test_helm_install_into_cluster(cluster: Cluster, namespace: str) -> None:
    cluster.helm(
        "install",
        "demo",
        str(CHART),
        "--namespace",
        namespace,
        "--set",
        "replicas=1",
        "--wait",
        "--timeout",
        "90s",
        timeout=150,
    )
    status = json.loads(
        cluster.helm("status", "demo", "--namespace", namespace, "-o", "json").stdout
    )
    assert status["info"]["status"] == "deployed"
    apps = client.AppsV1Api(cluster.api)
    d = apps.read_namespaced_deployment("demo-tinychart", namespace)
    assert d.status.ready_replicas == 1
    cluster.helm(
        "uninstall", "demo", "--namespace", namespace, "--wait", "--timeout", "60s", timeout=90
    )
    wait_for(
        lambda: not apps.list_namespaced_deployment(namespace).items,
        timeout=60,
        message="helm uninstall to remove the Deployment",
    )
