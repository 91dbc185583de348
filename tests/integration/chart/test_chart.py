"""The Helm chart against a real helm and the real test API server (kwok runs the pods).

Offline (``cluster_bin``): ``helm lint --strict``; ``helm template`` with the default values
(the release namespace only, the objects of deploy/rbac.yaml), with a namespace list,
cluster-wide, with Prometheus credentials, with more than one replica (peering) and with every
optional object; the schema and the templates refuse bad or contradictory values.
On the cluster: ``helm install`` in each mode creates the CRD, the RBAC and the Deployment
(ready under kwok), the ServiceAccount may do exactly what :data:`CAN_I` says (asked with
``kubectl auth can-i --as``), an example SpecTuning is accepted, and ``helm uninstall`` leaves
none of the release's objects behind.
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


_RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def _rbac_view(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The RBAC objects keyed by (kind, namespace, name): their rules, roleRef and subjects."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for d in docs:
        if d["kind"] in _RBAC_KINDS:
            meta = d["metadata"]
            key = (d["kind"], meta.get("namespace", ""), meta["name"])
            out[key] = {k: d[k] for k in ("rules", "roleRef", "subjects") if k in d}
    return out


def _env(dep: dict[str, Any]) -> dict[str, Any]:
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def _all_rules(kinds: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [r for kind in ("ClusterRole", "Role") for d in kinds.get(kind, []) for r in d["rules"]]


def test_helm_lint_strict(cluster_bin: Path) -> None:
    for extra in (
        [],
        ALL_OPTIONAL,
        ["--set", "watchNamespaces={llm,llm-b}"],
        ["--set", "clusterWide=true", "--set", "replicas=2"],
        ["--set", "replicas=3", "--set", "rbac.prometheusCredentials=true"],
    ):
        out = _helm(cluster_bin, "lint", "--strict", str(CHART), *extra).stdout
        assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_template_default_is_the_release_namespace_with_the_rbac_of_deploy(
    cluster_bin: Path,
) -> None:
    """The default install watches only its own namespace, reads no Secret, and its RBAC is
    object for object deploy/rbac.yaml (named as the plain manifest names them)."""
    kinds = _by_kind(_template(cluster_bin))
    assert set(kinds) == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "RoleBinding",
        "Deployment",
        "Service",
    }
    plain = _rbac_view([d for d in yaml.safe_load_all(RBAC.read_text()) if d])
    rendered = _rbac_view(_template(cluster_bin, "--set", "fullnameOverride=spectune-operator"))
    assert rendered == plain
    # Cluster-wide, only the CRD watch; everything else is bound in spectune-system alone.
    (binding,) = kinds["ClusterRoleBinding"]
    (cluster_role,) = [
        r for r in kinds["ClusterRole"] if r["metadata"]["name"] == "spectune-cluster"
    ]
    assert binding["roleRef"]["name"] == "spectune-cluster"
    assert [r["resources"] for r in cluster_role["rules"]] == [["customresourcedefinitions"]]
    (rb,) = kinds["RoleBinding"]
    assert rb["metadata"]["namespace"] == "spectune-system"
    assert rb["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "spectune",
    }
    assert rb["subjects"] == [
        {"kind": "ServiceAccount", "name": "spectune", "namespace": "spectune-system"}
    ]
    assert not [r for r in _all_rules(kinds) if "secrets" in r["resources"]]
    # the rules keep their Framework/Application comments
    rbac_src = (CHART / "templates" / "rbac.yaml").read_text()
    for line in RBAC.read_text().splitlines():
        if line.strip().startswith("# Framework") or line.strip().startswith("# Application"):
            assert line.strip() in rbac_src, line

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
    env = _env(dep)
    assert env["SPECTUNE_NAMESPACES"] == "spectune-system"
    assert "SPECTUNE_PEERING" not in env
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


def test_template_namespaced_binds_the_rules_in_each_listed_namespace_only(
    cluster_bin: Path,
) -> None:
    kinds = _by_kind(_template(cluster_bin, "--set", "watchNamespaces={llm,llm-b}"))
    assert "Role" not in kinds
    bindings = kinds["RoleBinding"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["llm", "llm-b"]
    assert {b["roleRef"]["name"] for b in bindings} == {"spectune"}
    (crb,) = kinds["ClusterRoleBinding"]
    assert crb["roleRef"]["name"] == "spectune-cluster"
    roles = {r["metadata"]["name"]: r["rules"] for r in kinds["ClusterRole"]}
    # cluster-wide, only the CRD observation is left; namespaces are not listed at all
    assert [r["resources"] for r in roles["spectune-cluster"]] == [["customresourcedefinitions"]]
    plain = _rbac_view([d for d in yaml.safe_load_all(RBAC.read_text()) if d])
    assert roles["spectune"] == plain[("ClusterRole", "", "spectune-operator")]["rules"]
    assert _env(kinds["Deployment"][0])["SPECTUNE_NAMESPACES"] == "llm,llm-b"


def test_template_cluster_wide_is_an_explicit_choice(cluster_bin: Path) -> None:
    kinds = _by_kind(_template(cluster_bin, "--set", "clusterWide=true"))
    assert "RoleBinding" not in kinds
    refs = sorted(b["roleRef"]["name"] for b in kinds["ClusterRoleBinding"])
    assert refs == ["spectune", "spectune-cluster"]
    roles = {r["metadata"]["name"]: r["rules"] for r in kinds["ClusterRole"]}
    assert [r["resources"] for r in roles["spectune-cluster"]] == [
        ["customresourcedefinitions"],
        ["namespaces"],
    ]
    assert _env(kinds["Deployment"][0])["SPECTUNE_NAMESPACES"] == ""


def test_cluster_wide_with_a_namespace_list_is_refused(cluster_bin: Path) -> None:
    proc = _helm(
        cluster_bin, "template", "x", str(CHART),
        "--set", "clusterWide=true", "--set", "watchNamespaces={llm}",
        check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "clusterWide: true and watchNamespaces: [llm] are both set" in proc.stderr, proc.stderr


def test_template_secrets_rule_only_with_prometheus_credentials(cluster_bin: Path) -> None:
    def secret_rules(*extra: str) -> list[dict[str, Any]]:
        kinds = _by_kind(_template(cluster_bin, *extra))
        return [r for r in _all_rules(kinds) if "secrets" in r["resources"]]

    assert secret_rules() == []
    assert secret_rules("--set", "rbac.prometheusCredentials=true") == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
    ]
    assert secret_rules(
        "--set", "rbac.prometheusCredentials=true",
        "--set", "rbac.prometheusCredentialNames={prom-auth,prom-b}",
    ) == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "verbs": ["get"],
            "resourceNames": ["prom-auth", "prom-b"],
        }
    ]  # fmt: skip


def test_template_replicas_turn_peering_on(cluster_bin: Path) -> None:
    """Above one replica: kopf peering (its object in each watched namespace and the rule to
    use it), a rolling update instead of Recreate, and a PodDisruptionBudget."""
    kinds = _by_kind(
        _template(cluster_bin, "--set", "replicas=2", "--set", "watchNamespaces={a,b}")
    )
    (dep,) = kinds["Deployment"]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    env = _env(dep)
    assert env["SPECTUNE_PEERING"] == "spectune"
    assert env["SPECTUNE_PEERING_LIFETIME_SECONDS"] == "60"
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    peerings = kinds["KopfPeering"]
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings) == [
        ("a", "spectune"),
        ("b", "spectune"),
    ]
    roles = {r["metadata"]["name"]: r["rules"] for r in kinds["ClusterRole"]}
    assert {
        "apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"],
        "verbs": ["get", "list", "watch", "patch"],
    } in roles["spectune"]  # fmt: skip
    (pdb,) = kinds["PodDisruptionBudget"]
    assert pdb["spec"] == {
        "minAvailable": 1,
        "selector": {"matchLabels": dep["spec"]["selector"]["matchLabels"]},
    }
    wide = _by_kind(_template(cluster_bin, "--set", "replicas=2", "--set", "clusterWide=true"))
    assert [p["metadata"]["name"] for p in wide["ClusterKopfPeering"]] == ["spectune"]
    assert "KopfPeering" not in wide
    roles = {r["metadata"]["name"]: r["rules"] for r in wide["ClusterRole"]}
    assert ["clusterkopfpeerings"] in [r["resources"] for r in roles["spectune-cluster"]]
    assert ["kopfpeerings"] not in [r["resources"] for r in roles["spectune"]]
    # one replica: none of it
    single = _by_kind(_template(cluster_bin))
    assert not {"KopfPeering", "ClusterKopfPeering", "PodDisruptionBudget"} & set(single)
    assert "kopf.dev" not in json.dumps(single["ClusterRole"])
    proc = _helm(
        cluster_bin, "template", "x", str(CHART),
        "--set", "replicas=2", "--set", "podDisruptionBudget.minAvailable=2",
        check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "must be below replicas" in proc.stderr, proc.stderr


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
            "deployments,services,serviceaccounts,roles,rolebindings,configmaps,pods,"
            "poddisruptionbudgets,kopfpeerings.kopf.dev",
            "-n",
            ns,
            "-l",
            selector,
            "-o",
            "name",
        ).stdout
        found += [f"{ns}/{n}" for n in out.split()]
    cluster_wide = cluster.kubectl(
        "get",
        "clusterroles,clusterrolebindings,clusterkopfpeerings.kopf.dev",
        "-l",
        selector,
        "-o",
        "name",
    ).stdout
    return found + cluster_wide.split()


#: What the operator's ServiceAccount may do, asked of the real API server with
#: ``kubectl auth can-i --as``: (verb, resource, where, allowed in the namespaced modes, allowed
#: cluster-wide). ``where``: the watched namespace, an unwatched one, kube-system, every
#: namespace at once (``-A``), or a cluster-scoped resource.
CAN_I: list[tuple[str, str, str, bool, bool]] = [
    # what tuning needs, in a watched namespace
    ("get", "spectunings.spectune.io", "watched", True, True),
    ("watch", "spectunings.spectune.io", "watched", True, True),
    ("patch", "spectunings.spectune.io", "watched", True, True),
    ("patch", "spectunings.spectune.io/status", "watched", True, True),
    ("create", "deployments.apps", "watched", True, True),
    ("patch", "deployments.apps", "watched", True, True),
    ("delete", "deployments.apps", "watched", True, True),
    ("list", "pods", "watched", True, True),
    ("create", "events", "watched", True, True),
    ("watch", "customresourcedefinitions.apiextensions.k8s.io", "cluster", True, True),
    # never: Secrets by default, other verbs, RBAC, the CRDs themselves
    ("get", "secrets", "watched", False, False),
    ("list", "secrets", "watched", False, False),
    ("watch", "secrets", "watched", False, False),
    ("get", "secrets", "kube-system", False, False),
    ("update", "deployments.apps", "watched", False, False),
    ("delete", "pods", "watched", False, False),
    ("create", "rolebindings.rbac.authorization.k8s.io", "watched", False, False),
    ("create", "customresourcedefinitions.apiextensions.k8s.io", "cluster", False, False),
    # outside the watched namespaces: only with clusterWide=true
    ("list", "pods", "kube-system", False, True),
    ("delete", "deployments.apps", "kube-system", False, True),
    ("patch", "deployments.apps", "unwatched", False, True),
    ("list", "spectunings.spectune.io", "unwatched", False, True),
    ("list", "deployments.apps", "all", False, True),
    ("list", "namespaces", "cluster", False, True),
]


def _can(cluster: Cluster, sa: str, verb: str, resource: str, where: str | None) -> bool:
    """``kubectl auth can-i`` as ``sa``; ``where``: a namespace, "all" (``-A``) or "cluster"."""
    args = ["auth", "can-i", verb]
    if resource.endswith("/status"):
        args += [resource.removesuffix("/status"), "--subresource=status"]
    else:
        args.append(resource)
    if where == "all":
        args.append("--all-namespaces")
    elif where not in (None, "cluster"):
        args += ["-n", where]
    proc = cluster.kubectl(*args, f"--as={sa}", check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), proc.stdout + proc.stderr
    return answer == "yes"


def _matrix(cluster: Cluster, sa: str, places: dict[str, str]) -> dict[tuple[str, str, str], bool]:
    return {
        (verb, resource, where): _can(cluster, sa, verb, resource, places.get(where, where))
        for verb, resource, where, _, _ in CAN_I
    }


@pytest.mark.parametrize("mode", ["default", "namespaced", "cluster-wide"])
def test_install_example_and_uninstall(cluster: Cluster, namespace: str, mode: str) -> None:
    """Install in each mode; the ServiceAccount may do exactly what CAN_I says there (the
    default watches the release namespace); an example SpecTuning is accepted; uninstall
    leaves nothing of the release behind."""
    release = f"spt-{uuid.uuid4().hex[:6]}"
    watched = namespace if mode == "default" else f"{namespace}-w"
    unwatched = f"{namespace}-u"
    cluster.kubectl("create", "namespace", unwatched)
    if watched != namespace:
        cluster.kubectl("create", "namespace", watched)
    try:
        extra = {
            "default": [],
            "namespaced": ["--set", f"watchNamespaces={{{watched}}}"],
            "cluster-wide": ["--set", "clusterWide=true"],
        }[mode]
        installed = cluster.helm(
            "install", release, str(CHART), "-n", namespace, *extra,
            "--wait", "--timeout", "120s",
            timeout=180,
        )  # fmt: skip
        name = f"{release}-spectune"
        notes = installed.stdout.split("NOTES:", 1)[1]  # the next commands
        assert f"kubectl -n {namespace} rollout status deployment/{name}" in notes
        # Helm cannot know whether the pod starts: the notes say what to look at, and the signs.
        pods = f"-l app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"
        assert f"kubectl -n {namespace} get pods {pods}" in notes, notes
        assert f"kubectl -n {namespace} logs deployment/{name}" in notes, notes
        for sign in ("ImagePullBackOff", "OOMKilled", "403 Forbidden", "is not found"):
            assert sign in notes, notes
        pod = cluster.kubectl("get", "pods", "-n", namespace, *pods.split(" ", 1), "-o", "name")
        assert pod.stdout.strip().startswith("pod/"), "the selector in the notes finds the pod"
        assert "kubectl apply -n <namespace> -f examples/spectuning.yaml" in notes
        if mode == "cluster-wide":
            assert "every namespace" in notes, notes
        else:
            assert f"It watches SpecTunings only in: {watched}." in notes, notes
        assert "It may read no Secret" in notes, notes
        cluster.kubectl("get", "crd", "spectunings.spectune.io")
        dep = json.loads(
            cluster.kubectl("get", "deploy", name, "-n", namespace, "-o", "json").stdout
        )
        assert dep["status"].get("readyReplicas") == 1
        sa = f"system:serviceaccount:{namespace}:{name}"
        got = _matrix(cluster, sa, {"watched": watched, "unwatched": unwatched})
        wide = mode == "cluster-wide"
        want = {(v, r, w): (all_ns if wide else ns) for v, r, w, ns, all_ns in CAN_I}
        assert got == want, {k: v for k, v in got.items() if want[k] != v}

        # an example SpecTuning is accepted by the CRD's schema (server-side)
        cluster.kubectl("apply", "-n", watched, "-f", str(EXAMPLE))
        got_spt = cluster.kubectl("get", "spt", "-n", watched, "-o", "name").stdout.split()
        assert got_spt == ["spectuning.spectune.io/llama-70b"]
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
        for ns in {watched, unwatched} - {namespace}:
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_prometheus_credentials_grant_get_on_the_named_secrets_only(
    cluster: Cluster, namespace: str
) -> None:
    """rbac.prometheusCredentials with resourceNames: ``get`` on those Secrets in the watched
    namespace, nothing on any other Secret, never ``list``, and nothing outside."""
    release = f"spt-{uuid.uuid4().hex[:6]}"
    cluster.helm(
        "install", release, str(CHART), "-n", namespace,
        "--set", "rbac.prometheusCredentials=true",
        "--set", "rbac.prometheusCredentialNames={prom-auth}",
        timeout=180,
    )  # fmt: skip
    try:
        sa = f"system:serviceaccount:{namespace}:{release}-spectune"
        assert _can(cluster, sa, "get", "secrets/prom-auth", namespace)
        assert not _can(cluster, sa, "get", "secrets/other", namespace)
        assert not _can(cluster, sa, "list", "secrets", namespace)
        assert not _can(cluster, sa, "get", "secrets/prom-auth", "kube-system")
    finally:
        cluster.helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "60s")


def test_template_operator_bounds_and_the_drafter_allow_list(cluster_bin: Path) -> None:
    """The status interval and the cleanup timeout reach the operator with their defaults;
    the drafter allow-list (the authority over models run with --trust-remote-code) is
    absent by default (nothing allowed) and joined with commas when set."""
    env = _env(_by_kind(_template(cluster_bin))["Deployment"][0])
    assert env["SPECTUNE_STATUS_INTERVAL_SECONDS"] == "10"
    assert env["SPECTUNE_CLEANUP_TIMEOUT_SECONDS"] == "300"
    assert "SPECTUNE_DRAFTER_MODEL_ALLOW_LIST" not in env
    allowed = "operator.drafterModelAllowList={yuhuili/*,meta-llama/Llama-3.2-1B}"
    env = _env(_by_kind(_template(cluster_bin, "--set", allowed))["Deployment"][0])
    assert env["SPECTUNE_DRAFTER_MODEL_ALLOW_LIST"] == "yuhuili/*,meta-llama/Llama-3.2-1B"
