"""Fixtures of the operator's integration tier: the CRD, the RBAC manifest, the operator.

The operator runs as a subprocess (``python -m spectune.run``) with the credentials of the
ServiceAccount in ``deploy/rbac.yaml`` — a real token from the TokenRequest API, so the API
server enforces exactly the manifest's rules (never cluster-admin). The manifest grants its
namespaced rules in spectune-system only; each test's namespace gets the RoleBinding that
``deploy/rbac.yaml`` says to add for a watched namespace (``namespace`` below).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.fixtures.cluster import Cluster
from tests.fixtures.prometheus import free_port

REPO = Path(__file__).resolve().parents[3]
RBAC = REPO / "deploy" / "rbac.yaml"
CRD = REPO / "crds" / "spectune.io_spectunings.yaml"
SA, SA_NAMESPACE = "spectune-operator", "spectune-system"


def kubeconfig_for(cluster: Cluster, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig at ``path`` holding a real token of ServiceAccount ``namespace/sa``."""
    core = client.CoreV1Api(cluster.api)
    token = core.create_namespaced_service_account_token(
        sa,
        namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=7200)
        ),
    ).status.token
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    ctx_name = admin["current-context"]
    ctx = next(c for c in admin["contexts"] if c["name"] == ctx_name)["context"]
    cl = next(c for c in admin["clusters"] if c["name"] == ctx["cluster"])
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": cl["cluster"]}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "test", "user": sa}}],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="session")
def operator_kubeconfig(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CRD and RBAC applied; a kubeconfig holding the operator ServiceAccount's token."""
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRD))
    cluster.kubectl("apply", "-f", str(RBAC))
    return kubeconfig_for(
        cluster, SA_NAMESPACE, SA, tmp_path_factory.mktemp("operator") / "kubeconfig"
    )


def bind_operator(cluster: Cluster, namespace: str, sa: str = SA) -> None:
    """Grant ``deploy/rbac.yaml``'s namespaced rules (ClusterRole spectune-operator) to the
    operator's ServiceAccount in ``namespace``, as the manifest says to for a watched one."""
    client.RbacAuthorizationV1Api(cluster.api).create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="spectune-operator"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=SA
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=SA_NAMESPACE)],
        ),
    )


@pytest.fixture
def namespace(namespace: str, cluster: Cluster, operator_kubeconfig: Path) -> str:
    """The test's namespace (``tests/fixtures/cluster.py``), watched: the operator's rules are
    bound in it."""
    bind_operator(cluster, namespace)
    return namespace


class OperatorProcess:
    """A running ``spectune run`` and its log."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path, metrics_port: int) -> None:
        self.process = process
        self.log_path = log
        self.metrics_port = metrics_port

    def log(self) -> str:
        """The log so far (the tail)."""
        return self.log_path.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it hangs."""
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@pytest.fixture
def start_operator(
    operator_kubeconfig: Path, cluster: Cluster, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., OperatorProcess]]:
    """A factory: ``start_operator(namespace)`` runs the operator for that namespace."""
    started: list[OperatorProcess] = []

    def start(namespace: str, **env: str) -> OperatorProcess:
        metrics_port = free_port()
        environ = dict(os.environ)
        environ.update(
            {
                "KUBECONFIG": str(operator_kubeconfig),
                "SPECTUNE_NAMESPACES": namespace,
                "SPECTUNE_LIVENESS_PORT": str(free_port()),
                "SPECTUNE_METRICS_PORT": str(metrics_port),
                "SPECTUNE_POLL_SECONDS": "1",
                # Spec durations run 30x faster, as the simulated pods do (a 5 m window is
                # 10 s of wall time; the spec's window has a 30 s minimum); the readiness
                # timeout is scaled too: 120 s of wall time.
                "SPECTUNE_TIME_SCALE": "30",
                "SPECTUNE_READY_TIMEOUT_SECONDS": "3600",
                **env,
            }
        )
        log = tmp_path / f"operator-{len(started)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "spectune.run", "--verbose"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=environ,
                cwd=REPO,
                start_new_session=True,
            )
        op = OperatorProcess(proc, log, metrics_port)
        started.append(op)
        return op

    try:
        yield start
    finally:
        for op in started:
            op.stop()
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            for op in started:
                print(f"--- operator log ({op.log_path}) ---\n{op.log()}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Remember each phase's report on the item (the operator log is shown on failure)."""
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
