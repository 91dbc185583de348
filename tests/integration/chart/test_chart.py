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

#: What `helm template` is told the cluster serves (the Prometheus Operator's kinds), as
#: Argo CD and `helm install` do from the cluster itself.
MONITORING_APIS = [
    "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
    "--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
]  # fmt: skip
ALL_OPTIONAL = [
    "--set", "serviceMonitor.enabled=true",
    "--set", "prometheusRule.enabled=true",
    "--set", "dashboard.enabled=true",
    "--set", "crds.manage=true",
    *MONITORING_APIS,
]  # fmt: skip
#: The optional objects `helm lint` can render: it has no --api-versions, so no monitoring kind.
LINTABLE_OPTIONAL = ["--set", "dashboard.enabled=true", "--set", "crds.manage=true"]


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
        LINTABLE_OPTIONAL,
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
        "Job",  # the `helm test` hook
    }
    plain = _rbac_view([d for d in yaml.safe_load_all(RBAC.read_text()) if d])
    rendered = _rbac_view(
        _template(
            cluster_bin,
            "--set", "fullnameOverride=spectune-operator",
            "--set", "rbac.aggregateToDefaultRoles=false",
        )
    )  # fmt: skip
    assert rendered == plain
    # Cluster-wide, only the CRD watch; everything else is bound in spectune-system alone.
    (binding,) = kinds["ClusterRoleBinding"]
    (cluster_role,) = [
        r for r in kinds["ClusterRole"] if r["metadata"]["name"] == "spectune-cluster"
    ]
    # besides the operator's own, the two aggregated roles (tested on the cluster below)
    assert sorted(r["metadata"]["name"] for r in kinds["ClusterRole"]) == [
        "spectune",
        "spectune-cluster",
        "spectune-edit",
        "spectune-view",
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
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["--log-level=info", "--log-format=full"]
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
    (rule,) = _by_kind(
        _template(cluster_bin, "--set", "prometheusRule.enabled=true", *MONITORING_APIS)
    )["PrometheusRule"]
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
    # retune.drift.podAction: restartPod evicts one decayed pod at a time (the Eviction API,
    # so PodDisruptionBudgets hold); a plain delete, which would skip them, is not granted
    ("create", "pods/eviction", "watched", True, True),
    ("delete", "pods", "watched", False, False),
    ("create", "events", "watched", True, True),
    ("watch", "customresourcedefinitions.apiextensions.k8s.io", "cluster", True, True),
    # never: Secrets by default, other verbs, RBAC, the CRDs themselves
    ("get", "secrets", "watched", False, False),
    ("list", "secrets", "watched", False, False),
    ("watch", "secrets", "watched", False, False),
    ("get", "secrets", "kube-system", False, False),
    ("update", "deployments.apps", "watched", False, False),
    ("update", "pods", "watched", False, False),
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
    base, _, sub = resource.partition("/")
    if sub in ("status", "eviction"):  # a subresource; "secrets/NAME" names one object
        args += [base, f"--subresource={sub}"]
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


# --- item 8: a chart that fits a platform's conventions --------------------------------------


def test_monitoring_kinds_need_the_prometheus_operator(cluster_bin: Path) -> None:
    """Asking for a ServiceMonitor or PrometheusRule on a cluster without the Prometheus
    Operator's CRDs is refused before anything is applied, naming the value and the fix."""
    for kind, value in (("ServiceMonitor", "serviceMonitor"), ("PrometheusRule", "prometheusRule")):
        proc = _helm(
            cluster_bin, "template", "x", str(CHART), "--set", f"{value}.enabled=true", check=False
        )
        assert proc.returncode != 0
        assert (
            f"{value}.enabled=true but the cluster serves no monitoring.coreos.com/v1 {kind}"
            in proc.stderr
        ), proc.stderr
        assert f"--api-versions monitoring.coreos.com/v1/{kind}" in proc.stderr
        kinds = _by_kind(
            _template(
                cluster_bin, "--set", f"{value}.enabled=true",
                "--api-versions", f"monitoring.coreos.com/v1/{kind}",
            )
        )  # fmt: skip
        assert kind in kinds


def test_servicemonitor_honours_labels_and_takes_namespace_and_relabelings(
    cluster_bin: Path, tmp_path: Path
) -> None:
    (sm,) = _by_kind(_template(cluster_bin, *ALL_OPTIONAL))["ServiceMonitor"]
    (endpoint,) = sm["spec"]["endpoints"]
    # the operator's series carry the SpecTuning's namespace: kept, not exported_namespace
    assert endpoint["honorLabels"] is True
    assert "relabelings" not in endpoint and "metricRelabelings" not in endpoint
    assert sm["metadata"]["namespace"] == "spectune-system"
    values = tmp_path / "values.yaml"
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]
    drop = [{"sourceLabels": ["__name__"], "regex": "spectune_drift_ratio", "action": "drop"}]
    values.write_text(
        yaml.safe_dump(
            {
                "serviceMonitor": {
                    "namespace": "monitoring",
                    "relabelings": relabel,
                    "metricRelabelings": drop,
                },
                "prometheusRule": {"namespace": "monitoring"},
            }
        )
    )
    kinds = _by_kind(_template(cluster_bin, *ALL_OPTIONAL, "-f", str(values)))
    (sm,) = kinds["ServiceMonitor"]
    (endpoint,) = sm["spec"]["endpoints"]
    assert sm["metadata"]["namespace"] == "monitoring"
    # ...and still selects the Service where it is, in the release namespace
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["spectune-system"]}
    assert endpoint["relabelings"] == relabel
    assert endpoint["metricRelabelings"] == drop
    assert kinds["PrometheusRule"][0]["metadata"]["namespace"] == "monitoring"


def _alerts(rule_doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_doc["spec"]["groups"] for r in g["rules"] if "alert" in r}


def test_alert_thresholds_are_values(cluster_bin: Path, tmp_path: Path) -> None:
    """Each threshold and duration of prometheusRule.alerts reaches its alert's expression,
    its `for` and its description; the operator-down alert selects this release's Service."""
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "prometheusRule": {
                    "enabled": True,
                    "alerts": {
                        "acceptanceDrift": {"ratio": 0.7, "for": "1h"},
                        "speculationRegressed": {"speedup": 0.9, "for": "45m"},
                        "metricsSourceDown": {"failedWindows": 5, "for": "20m"},
                        "tuningStuck": {"for": "3h"},
                        "operatorDown": {"for": "5m"},
                        "drafterBroken": {"level": 0.05, "for": "20m"},
                        "podAcceptanceDecay": {"ratio": 0.8, "for": "2h"},
                    },
                }
            }
        )
    )
    (doc,) = _by_kind(_template(cluster_bin, "-f", str(values), *MONITORING_APIS))["PrometheusRule"]
    a = _alerts(doc)
    drift = a["SpecTuneAcceptanceDrift"]
    assert drift["for"] == "1h" and ") < 0.7\n" in drift["expr"]
    assert (
        "baseline for 1h: below the drift threshold of 0.7 " in drift["annotations"]["description"]
    )
    reg = a["SpecTuneSpeculationRegressed"]
    assert reg["for"] == "45m" and reg["expr"].count("< 0.9\n") == 2
    assert "(below 0.9x for 45m)" in reg["annotations"]["description"]
    down = a["SpecTuneMetricsSourceDown"]
    assert down["for"] == "20m" and ">= 5\n" in down["expr"]
    assert "scraped for 20m" in down["annotations"]["description"]
    assert a["SpecTuneTuningStuck"]["for"] == "3h"
    broken = a["SpecTuneDrafterBroken"]
    assert broken["for"] == "20m" and broken["expr"].count("< 0.05\n") == 2
    assert "for 20m: below 0.05," in " ".join(broken["annotations"]["description"].split())
    decay = a["SpecTunePodAcceptanceDecay"]
    assert decay["for"] == "2h" and decay["expr"].count("< 0.8\n") == 2
    assert "for 2h, below 0.8 of theirs" in " ".join(decay["annotations"]["description"].split())
    op = a["SpecTuneOperatorDown"]
    assert op["for"] == "5m"
    # release "spectune": its Service is spectune-metrics, the plain file's job
    assert 'up{job="spectune-metrics"}' in op["expr"]
    blue = _helm(
        cluster_bin, "template", "blue", str(CHART), "-n", "spectune-system",
        "--set", "prometheusRule.enabled=true", *MONITORING_APIS,
    ).stdout  # fmt: skip
    (other,) = _by_kind([d for d in yaml.safe_load_all(blue) if d])["PrometheusRule"]
    expr = _alerts(other)["SpecTuneOperatorDown"]["expr"]
    assert 'up{job="blue-spectune-metrics"}' in expr and 'job="spectune-metrics"' not in expr

    # promtool: the rendered operator-down alert fires 5 minutes after the last good scrape
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install Debian's prometheus package (hack/test.sh does)"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}))
    annotations = {
        k: v.replace("{{ $labels.job }}", "spectune-metrics") for k, v in op["annotations"].items()
    }
    assert "has succeeded for 5m:" in annotations["description"]
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump(
            {
                "rule_files": ["rules.yaml"],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": [
                            {"series": 'up{job="spectune-metrics"}', "values": "1x10 0x20"}
                        ],
                        "alert_rule_test": [
                            {"alertname": "SpecTuneOperatorDown", "eval_time": "14m",
                             "exp_alerts": []},
                            {"alertname": "SpecTuneOperatorDown", "eval_time": "16m",
                             "exp_alerts": [
                                 {"exp_labels": {"severity": "warning", "job": "spectune-metrics"},
                                  "exp_annotations": annotations}
                             ]},
                        ],
                    }
                ],
            }
        )
    )  # fmt: skip
    proc = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_global_log_format_and_extra_volumes(cluster_bin: Path, tmp_path: Path) -> None:
    """An umbrella chart's global registry and pull secrets; the log flags; a CA bundle
    mounted from a ConfigMap (for an HTTPS Prometheus with a private CA)."""
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "global": {
                    "imageRegistry": "mirror.example.com",
                    "imagePullSecrets": [{"name": "mirror-pull"}],
                    "storageClass": "ignored-by-spectune",
                },
                "imagePullSecrets": [{"name": "own-pull"}],
                "operator": {"logLevel": "warning", "logFormat": "json"},
                "extraVolumes": [{"name": "prometheus-ca", "configMap": {"name": "prom-ca"}}],
                "extraVolumeMounts": [
                    {"name": "prometheus-ca", "mountPath": "/etc/spectune/ca", "readOnly": True}
                ],
            }
        )
    )
    kinds = _by_kind(_template(cluster_bin, "-f", str(values)))
    (dep,) = kinds["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "mirror.example.com/spectune/spectune:0.1.0"
    assert pod["imagePullSecrets"] == [{"name": "own-pull"}, {"name": "mirror-pull"}]
    assert c["args"] == ["--log-level=warning", "--log-format=json"]
    assert {"name": "prometheus-ca", "configMap": {"name": "prom-ca"}} in pod["volumes"]
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert {
        "name": "prometheus-ca", "mountPath": "/etc/spectune/ca", "readOnly": True
    } in c["volumeMounts"]  # fmt: skip
    (job,) = kinds["Job"]
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == c["image"]
    # verbose still means debug
    (dep,) = _by_kind(_template(cluster_bin, "--set", "operator.verbose=true"))["Deployment"]
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"][0] == "--log-level=debug"
    for bad in ("operator.logFormat=xml", "operator.logLevel=loud"):
        proc = _helm(cluster_bin, "template", "x", str(CHART), "--set", bad, check=False)
        assert proc.returncode != 0 and "schema" in proc.stderr, (bad, proc.stderr)


def test_helm_test_job_never_carries_the_operator_selector(cluster_bin: Path) -> None:
    kinds = _by_kind(_template(cluster_bin))
    (job,) = kinds["Job"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "test"
    labels = job["spec"]["template"]["metadata"]["labels"]
    selector = kinds["Service"][0]["spec"]["selector"]
    assert not set(selector.items()) <= set(labels.items()), "the Service would route to it"
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["METRICS_URL"] == "http://spectune-metrics.spectune-system.svc:8081/metrics"
    off = _by_kind(_template(cluster_bin, "--set", "tests.enabled=false"))
    assert "Job" not in off


def test_artifact_hub_annotations(cluster: Cluster, namespace: str) -> None:
    """The Artifact Hub annotations parse; the image they list is the chart's; the example
    SpecTuning they show is accepted by the real API server."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    ann = chart["annotations"]
    assert ann["artifacthub.io/license"] == "Apache-2.0"
    assert ann["artifacthub.io/operator"] == "true"
    (image,) = yaml.safe_load(ann["artifacthub.io/images"])
    assert image["image"] == f"ghcr.io/spectune/spectune:{chart['appVersion']}"
    (crd,) = yaml.safe_load(ann["artifacthub.io/crds"])
    source = yaml.safe_load((REPO / "crds" / "spectune.io_spectunings.yaml").read_text())
    assert crd["name"] == source["metadata"]["name"]
    assert crd["version"] in [v["name"] for v in source["spec"]["versions"]]
    for link in yaml.safe_load(ann["artifacthub.io/links"]):
        assert link["url"].startswith("https://")
    (example,) = yaml.safe_load(ann["artifacthub.io/crdsExamples"])
    cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(example)
    )


def _umbrella(tmp_path: Path) -> Path:
    """An umbrella chart that depends on spectune (file://) and sets global values."""
    umbrella = tmp_path / "platform"
    (umbrella / "templates").mkdir(parents=True)
    (umbrella / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "version": "1.0.0",
                "dependencies": [
                    {"name": "spectune", "version": "0.1.0", "repository": f"file://{CHART}"}
                ],
            }
        )
    )
    (umbrella / "values.yaml").write_text(
        yaml.safe_dump(
            {
                "global": {"imageRegistry": "mirror.example.com", "team": "llm-platform"},
                "spectune": {"operator": {"logFormat": "json"}},
            }
        )
    )
    return umbrella


def test_installs_as_a_subchart_and_passes_helm_test(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """From an umbrella chart with `global` values (keys of its own among them): installed on
    the real API server the operator comes up with the global registry, `helm test` runs the
    chart's test Job to completion (kwok completes the pod), and the aggregated roles give the
    namespace's viewers read access and its editors write access to SpecTunings."""
    umbrella = _umbrella(tmp_path)
    cluster.helm("dependency", "update", str(umbrella))
    release = f"plat-{uuid.uuid4().hex[:6]}"
    cluster.helm(
        "install", release, str(umbrella), "-n", namespace, "--wait", "--timeout", "120s",
        timeout=180,
    )  # fmt: skip
    try:
        name = f"{release}-spectune"
        dep = json.loads(
            cluster.kubectl("get", "deploy", name, "-n", namespace, "-o", "json").stdout
        )
        assert dep["status"].get("readyReplicas") == 1
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert c["image"] == "mirror.example.com/spectune/spectune:0.1.0"
        assert "--log-format=json" in c["args"]

        tested = cluster.helm("test", release, "-n", namespace, "--timeout", "120s", timeout=180)
        assert f"TEST SUITE:     {name}-test" in tested.stdout, tested.stdout
        assert "Phase:          Succeeded" in tested.stdout, tested.stdout

        # the built-in view/edit roles aggregate spectune's rules
        for user, role in (("alice", "view"), ("bob", "edit")):
            cluster.kubectl(
                "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}",
                f"--user={user}", "-n", namespace,
            )  # fmt: skip

        def can(user: str, verb: str, resource: str = "spectunings.spectune.io") -> bool:
            args = ["auth", "can-i", verb]
            if resource.endswith("/status"):
                args += [resource.removesuffix("/status"), "--subresource=status"]
            else:
                args.append(resource)
            out = cluster.kubectl(*args, "-n", namespace, f"--as={user}", check=False)
            return out.stdout.strip() == "yes"

        wait_for(
            lambda: can("alice", "list") and can("bob", "create"),
            timeout=60,
            message="the clusterrole-aggregation controller to extend view and edit",
        )
        assert can("alice", "watch") and can("alice", "get")
        assert not can("alice", "create") and not can("alice", "delete")
        assert can("bob", "patch") and can("bob", "delete")
        assert not can("bob", "patch", "spectunings.spectune.io/status"), "the operator's"
    finally:
        cluster.helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "60s")


def test_helm_test_script_reads_a_real_operator_metrics_page(cluster_bin: Path) -> None:
    """kwok completes the test Job without running it, so its script runs here: against the
    operator's real /metrics server it passes; against another server it fails, saying why."""
    import socket
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from threading import Thread

    from spectune.k8s.telemetry import OperatorMetrics

    (job,) = _by_kind(_template(cluster_bin))["Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["python", "-c"]
    script = container["command"][2]

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def run(url: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", script],
            env={"METRICS_URL": url},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    port = free_port()
    OperatorMetrics().serve(port)
    ok = run(f"http://127.0.0.1:{port}/metrics")
    assert ok.returncode == 0, ok.stderr
    assert "spectune's metrics are served" in ok.stdout

    class Other(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"# TYPE up gauge\nup 1\n")

        def log_message(self, *args: object) -> None:
            pass

    other = HTTPServer(("127.0.0.1", 0), Other)
    Thread(target=other.serve_forever, daemon=True).start()
    try:
        bad = run(f"http://127.0.0.1:{other.server_address[1]}/metrics")
    finally:
        other.shutdown()
    assert bad.returncode != 0
    assert "not with spectune's metrics" in bad.stderr, bad.stderr
