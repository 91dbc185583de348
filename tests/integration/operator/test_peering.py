"""Two operator replicas (chart value ``replicas: 2``): one acts, the other stands by, and takes
over when the one that acts is SIGKILLed mid-trial.

The chart is installed with ``replicas=2`` in its own namespace, watching the test's namespace:
that creates kopf's peering CRDs (from ``crds/``), the KopfPeering object in the watched
namespace and the peering rule of the operator's RBAC. Two ``spectune run`` processes then run
with the chart's ServiceAccount token and the environment its Deployment gives its pods
(``SPECTUNE_PEERING``, ``POD_ID``; kwok runs no containers, so the processes are the pods).
What is asserted is what ``kubectl`` shows: the KopfPeering's records, the SpecTuning's trials
and phase, and the canary Deployments.

kopf peering pauses, it does not fence: the standby resumes once the killed leader's record
is a lifetime old (``operator.peeringLifetimeSeconds``, 10 s here).
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cluster import Cluster, wait_for
from tests.fixtures.prometheus import Prometheus
from tests.fixtures.simpods import SimPods
from tests.integration.operator.conftest import REPO, OperatorProcess, kubeconfig_for
from tests.integration.operator.helpers import MODEL, Env, diagnostics, spectuning
from tests.integration.operator.test_faults import CanaryWatch, _mid_trial, carried_on

CHART = REPO / "charts" / "spectune"
LIFETIME_S = 10


class Install:
    """The chart installed with two replicas: its release, peering name and SA kubeconfig."""

    def __init__(self, release: str, system: str, kubeconfig: Path, env: dict[str, str]) -> None:
        self.release = release
        self.system = system
        self.kubeconfig = kubeconfig
        self.env = env


@pytest.fixture
def two_replicas(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Install]:
    """``helm install`` with replicas=2 watching ``namespace``; the operator env of its pods."""
    release = f"spt-{uuid.uuid4().hex[:6]}"
    system = f"{namespace[:50]}-sys"
    cluster.kubectl("create", "namespace", system)
    try:
        installed = cluster.helm(
            "install", release, str(CHART), "-n", system,
            "--set", "replicas=2",
            "--set", f"watchNamespaces={{{namespace}}}",
            "--set", f"operator.peeringLifetimeSeconds={LIFETIME_S}",
            timeout=180,
        )  # fmt: skip
        name = f"{release}-spectune"
        notes = installed.stdout.split("NOTES:", 1)[1]
        assert "2 replicas with kopf peering: one acts, the others stand by." in notes, notes
        assert f"kubectl get kopfpeering -n <namespace> {name} -o yaml" in notes, notes
        dep = json.loads(cluster.kubectl("get", "deploy", name, "-n", system, "-o", "json").stdout)
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        kubeconfig = kubeconfig_for(cluster, system, name, tmp_path / "kubeconfig-chart")
        yield Install(release, system, kubeconfig, env)
        cluster.helm("uninstall", release, "-n", system, "--wait", "--timeout", "60s")
    finally:
        cluster.kubectl("delete", "namespace", system, "--wait=false", check=False)


def _log(op: OperatorProcess) -> str:
    """The whole log (kopf's peering messages scroll out of the tail that ``log()`` keeps)."""
    return op.log_path.read_text(errors="replace")


def _peers(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """The KopfPeering's records: ``{identity: {priority, lifetime, lastseen}}``."""
    out = cluster.kubectl("get", "kopfpeering.kopf.dev", name, "-n", namespace, "-o", "json")
    return dict(json.loads(out.stdout).get("status") or {})


def test_the_standby_takes_over_when_the_leader_is_killed_mid_trial(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
    two_replicas: Install,
) -> None:
    """Replica a starts first and leads (the oldest replica has the highest priority);
    replica b joins mid-trial as a standby. SIGKILL a: b resumes the trial from the status and
    the search goes on to Monitoring; never more than one canary at once, every canary owned
    by the SpecTuning, no trial started twice, and a's dead record is cleaned up."""
    peering = two_replicas.env["SPECTUNE_PEERING"]
    assert two_replicas.env["SPECTUNE_NAMESPACES"] == namespace
    assert two_replicas.env["SPECTUNE_PEERING_LIFETIME_SECONDS"] == str(LIFETIME_S)
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    sims = sim_pods(namespace)

    def replica(pod: str) -> OperatorProcess:
        chart_env = {k: v for k, v in two_replicas.env.items() if k.startswith("SPECTUNE_PEERING")}
        return start_operator(
            namespace, KUBECONFIG=str(two_replicas.kubeconfig), POD_ID=pod, **chart_env
        )

    a = replica("replica-a")
    env.create_spt(spectuning(prometheus.url, search={"window": "5m", "maxTrials": 3}))
    why = diagnostics(env, a, sims)
    uid = env.spt()["metadata"]["uid"]
    with CanaryWatch(env) as watch:
        trial = _mid_trial(env, why)
        b = replica("replica-b")
        peers = wait_for(
            lambda: (p := _peers(cluster, namespace, peering)) and len(p) == 2 and p,
            timeout=60,
            message=lambda: f"both replicas in KopfPeering {peering}; {b.log()[-2000:]}",
        )
        assert peers["replica-a"]["priority"] > peers["replica-b"]["priority"], peers
        assert "Resuming operations" not in _log(b)  # b stands by while a is alive
        before = env.trials()

        os.killpg(a.process.pid, signal.SIGKILL)
        a.process.wait(timeout=10)
        why = diagnostics(env, b, sims)
        wait_for(
            lambda: "Resuming operations" in _log(b),
            timeout=LIFETIME_S * 3 + 30,
            message=lambda: f"replica b taking over; {why()}",
        )
        wait_for(
            lambda: env.status().get("phase") == "Monitoring",
            timeout=180,
            interval=0.5,
            message=lambda: f"Monitoring after the takeover; {why()}",
        )
        wait_for(lambda: not env.canaries(), timeout=30, message="canaries removed at the end")
    assert b.process.poll() is None, "the standby exited"
    assert "replica-a" not in _peers(cluster, namespace, peering)  # the dead record is cleaned
    carried_on(env, watch, uid, before, trial)
