"""The Helm chart against a real helm and the real test API server (kwok runs the pods).

Offline (``cluster_bin``): ``helm lint --strict``; ``helm template`` with the default values,
with namespaced values and with every optional object; the schema refuses bad values.
On the cluster: ``helm install`` creates the CRD, the RBAC and the Deployment (ready under
kwok), the ServiceAccount's permissions are what deploy/rbac.yaml grants, an example
SpecTuning is accepted, and ``helm uninstall`` leaves none of the release's objects behind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.cluster import Cluster, wait_for

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "spectune"
RBAC = REPO / "deploy" / "rbac.yaml"
RULES = REPO / "deploy" / "alerts" / "spectune-rules.yaml"
RULE_TESTS = REPO / "deploy" / "alerts" / "spectune-rules.test.yaml"
EXAMPLE = REPO / "examples" / "spectuning.yaml"

ALL_OPTIONAL = [
    "--set", "serviceMonitor.enabled=true",
    "--set", "prometheusRule.enabled=true",
    "--set", "dashboard.enabled=true",
    "--set", "crds.manage=true",
]  # fmt: skip


def _helm(bin_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(bin_dir / "helm"), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _template(bin_dir: Path, *args: str) -> list[dict[str, Any]]:
    out = _helm(bin_dir, "template", "spectune", str(CHART), "-n", "spectune-system", *args)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def _reference_rules() -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def test_helm_lint_strict(cluster_bin: Path) -> None:
    for extra in ([], ALL_OPTIONAL, ["--set", "watchNamespaces={llm,llm-b}"]):
        out = _helm(cluster_bin, "lint", "--strict", str(CHART), *extra).stdout
        assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_template_default_is_cluster_wide_with_the_rbac_of_deploy(cluster_bin: Path) -> None:
    kinds = _by_kind(_template(cluster_bin))
    assert set(kinds) == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
    }
    (role,) = kinds["ClusterRole"]
    assert role["rules"] == _reference_rules()
    # the rules keep their Framework/Application comments
    rbac_src = (CHART / "templates" / "rbac.yaml").read_text()
    for line in RBAC.read_text().splitlines():
        if line.strip().startswith("# Framework") or line.strip().startswith("# Application"):
            assert line.strip() in rbac_src, line
    (binding,) = kinds["ClusterRoleBinding"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "spectune", "namespace": "spectune-system"}
    ]

    (dep,) = kinds["Deployment"]
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert dep["spec"]["replicas"] == 1
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/spectune/spectune:0.1.0"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["SPECTUNE_NAMESPACES"] == ""
    assert int(env["SPECTUNE_LIVENESS_PORT"]) == ports["healthz"] == 8080
    assert int(env["SPECTUNE_METRICS_PORT"]) == ports["metrics"] == 8081
    assert "SPECTUNE_PROMETHEUS_URL" not in env
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]

    (svc,) = kinds["Service"]
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]

    for kind_docs in kinds.values():
        for d in kind_docs:
            labels = d["metadata"]["labels"]
            for key in ("name", "instance", "version", "managed-by", "component"):
                assert f"app.kubernetes.io/{key}" in labels, (d["kind"], key)


def test_template_namespaced_uses_roles_in_each_namespace(cluster_bin: Path) -> None:
    kinds = _by_kind(_template(cluster_bin, "--set", "watchNamespaces={llm,llm-b}"))
    roles = kinds["Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["llm", "llm-b"]
    assert sorted(b["metadata"]["namespace"] for b in kinds["RoleBinding"]) == ["llm", "llm-b"]
    (cluster_role,) = kinds["ClusterRole"]
    # cluster-wide, only the CRD observation is left; namespaces are not listed at all
    assert [r["resources"] for r in cluster_role["rules"]] == [["customresourcedefinitions"]]
    reference = [r for r in _reference_rules() if r["resources"] != ["namespaces"]]
    for role in roles:
        assert cluster_role["rules"] + role["rules"] == reference
    (dep,) = kinds["Deployment"]
    env = {
        e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["SPECTUNE_NAMESPACES"] == "llm,llm-b"


def test_template_optional_objects(cluster_bin: Path) -> None:
    kinds = _by_kind(
        _template(cluster_bin, *ALL_OPTIONAL, "--set", "prometheusRule.runbookBaseUrl=https://x/rb")
    )
    assert {"ServiceMonitor", "PrometheusRule", "ConfigMap", "CustomResourceDefinition"} <= set(
        kinds
    )
    (rule,) = kinds["PrometheusRule"]
    plain = yaml.safe_load(
        RULES.read_text().replace(
            "https://github.com/spectune/spectune/blob/main/docs/runbooks.md", "https://x/rb"
        )
    )
    assert rule["spec"]["groups"] == plain["groups"]
    (cm,) = kinds["ConfigMap"]
    dashboard = json.loads(cm["data"]["spectune.json"])
    assert dashboard["panels"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (crd,) = kinds["CustomResourceDefinition"]
    assert crd["metadata"]["name"] == "spectunings.spectune.io"
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    source = yaml.safe_load((REPO / "crds" / "spectune.io_spectunings.yaml").read_text())
    assert crd["spec"] == source["spec"]
    (sm,) = kinds["ServiceMonitor"]
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"


def test_promtool_unit_tests_pass_on_the_rendered_prometheusrule(
    cluster_bin: Path, tmp_path: Path
) -> None:
    """The rules as the chart renders them (through Helm's YAML round trip) still pass the
    promtool unit tests of deploy/alerts/: the PrometheusRule alerts exactly as the plain file."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install Debian's prometheus package (hack/test.sh does)"
    (rule,) = _by_kind(_template(cluster_bin, "--set", "prometheusRule.enabled=true"))[
        "PrometheusRule"
    ]
    (tmp_path / "spectune-rules.yaml").write_text(
        yaml.safe_dump({"groups": rule["spec"]["groups"]})
    )
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    proc = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_schema_refuses_bad_values(cluster_bin: Path) -> None:
    for bad in ("service.type=Foo", "operator.metricsFailures=0", "typo=1"):
        proc = _helm(cluster_bin, "template", "x", str(CHART), "--set", bad, check=False)
        assert proc.returncode != 0, bad
        assert "schema" in proc.stderr, proc.stderr


def _release_objects(cluster: Cluster, release: str, namespaces: list[str]) -> list[str]:
    selector = f"app.kubernetes.io/instance={release}"
    found: list[str] = []
    for ns in namespaces:
        out = cluster.kubectl(
            "get",
            "deployments,services,serviceaccounts,roles,rolebindings,configmaps,pods",
            "-n",
            ns,
            "-l",
            selector,
            "-o",
            "name",
        ).stdout
        found += [f"{ns}/{n}" for n in out.split()]
    cluster_wide = cluster.kubectl(
        "get", "clusterroles,clusterrolebindings", "-l", selector, "-o", "name"
    ).stdout
    return found + cluster_wide.split()


def _can(cluster: Cluster, sa: str, verb: str, resource: str, ns: str) -> bool:
    proc = cluster.kubectl("auth", "can-i", verb, resource, "-n", ns, f"--as={sa}", check=False)
    return proc.stdout.strip() == "yes"


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_install_example_and_uninstall(cluster: Cluster, namespace: str, mode: str) -> None:
    release = f"spt-{uuid.uuid4().hex[:6]}"
    watched = f"{namespace}-w"
    cluster.kubectl("create", "namespace", watched)
    try:
        extra = ["--set", f"watchNamespaces={{{watched}}}"] if mode == "namespaced" else []
        installed = cluster.helm(
            "install", release, str(CHART), "-n", namespace, *extra,
            "--wait", "--timeout", "120s",
            timeout=180,
        )  # fmt: skip
        name = f"{release}-spectune"
        notes = installed.stdout.split("NOTES:", 1)[1]  # the next commands
        assert f"kubectl -n {namespace} rollout status deployment/{name}" in notes
        assert "kubectl apply -n <namespace> -f examples/spectuning.yaml" in notes
        cluster.kubectl("get", "crd", "spectunings.spectune.io")
        dep = json.loads(
            cluster.kubectl("get", "deploy", name, "-n", namespace, "-o", "json").stdout
        )
        assert dep["status"].get("readyReplicas") == 1
        sa = f"system:serviceaccount:{namespace}:{name}"
        assert _can(cluster, sa, "watch", "spectunings.spectune.io", watched)
        assert _can(cluster, sa, "patch", "spectunings.spectune.io/status", watched)
        assert _can(cluster, sa, "create", "deployments.apps", watched)
        assert not _can(cluster, sa, "update", "deployments.apps", watched)
        # authSecretRef reads one named Secret; listing or watching them is never granted.
        assert _can(cluster, sa, "get", "secrets", watched)
        assert not _can(cluster, sa, "list", "secrets", watched)
        assert not _can(cluster, sa, "watch", "secrets", watched)
        other = "kube-system"
        assert _can(cluster, sa, "list", "spectunings.spectune.io", other) is (
            mode == "cluster-wide"
        )

        # an example SpecTuning is accepted by the CRD's schema (server-side)
        cluster.kubectl("apply", "-n", watched, "-f", str(EXAMPLE))
        got = cluster.kubectl("get", "spt", "-n", watched, "-o", "name").stdout.split()
        assert got == ["spectuning.spectune.io/llama-70b"]
        cluster.kubectl("delete", "-n", watched, "-f", str(EXAMPLE), "--wait=true")

        cluster.helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "60s")
        wait_for(
            lambda: not _release_objects(cluster, release, [namespace, watched]),
            timeout=60,
            message=lambda: (
                f"no objects left: {_release_objects(cluster, release, [namespace, watched])}"
            ),
        )
        # the CRD stays (Helm never deletes crds/), as the README says
        cluster.kubectl("get", "crd", "spectunings.spectune.io")
    finally:
        cluster.kubectl("delete", "namespace", watched, "--wait=false", check=False)
