"""Helpers shared by the operator's integration tests: objects, the cluster view, waits.

Everything here reads what a user would see with ``kubectl``: the SpecTuning's status,
conditions and events, and the Deployments.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from spectune.api.names import API_VERSION, GROUP, KIND, PLURAL, VERSION
from spectune.engines.args import parse_vllm_args
from spectune.playground import target_deployment
from spectune.search.arms import Arm
from tests.fixtures.cluster import Cluster, wait_for
from tests.fixtures.simpods import SimPods
from tests.integration.operator.conftest import OperatorProcess

TARGET = "llama"
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
EAGLE = "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"


def deployment(args: list[str], name: str = TARGET) -> dict[str, Any]:
    """A vLLM-like Deployment running ``args`` (one replica, surge 1, no annotations)."""
    return target_deployment(name, args=args, annotations={})


def spectuning(prom_url: str, name: str = "tune", **spec: Any) -> dict[str, Any]:
    """A SpecTuning of the target with one EAGLE-3 drafter and 5 m windows.

    The operator runs with ``SPECTUNE_TIME_SCALE=30`` (``conftest.start_operator``), as the
    simulated pods do, so a 5 m window of serving is 10 s of wall time.
    """
    body: dict[str, Any] = {
        "targetRef": {"name": TARGET, "container": "vllm"},
        "engine": "vllm",
        "metrics": {"prometheus": {"url": prom_url}},
        "drafters": [{"name": "eagle3", "method": "eagle3", "model": EAGLE, "maxK": 3}],
        "search": {"window": "5m", "maxTrials": 4},
    }
    body.update(spec)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": body}


class Env:
    """One test's cluster objects and views (as the admin, like a user's kubectl)."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.ns = namespace
        self.apps = client.AppsV1Api(cluster.api)
        self.core = client.CoreV1Api(cluster.api)
        self.custom = client.CustomObjectsApi(cluster.api)

    def create_target(self, args: list[str]) -> None:
        self.apps.create_namespaced_deployment(self.ns, deployment(args))
        wait_for(self.target_ready, timeout=90, message="the target rolled out")

    def target(self) -> Any:
        return self.apps.read_namespaced_deployment(TARGET, self.ns)

    def target_ready(self) -> bool:
        d = self.target()
        s = d.status
        return bool(
            s.observed_generation == d.metadata.generation
            and s.updated_replicas == 1
            and s.available_replicas == 1
            and (s.replicas or 0) == 1
        )

    def target_args(self) -> list[str]:
        return [str(a) for a in self.target().spec.template.spec.containers[0].args]

    def canaries(self) -> list[Any]:
        return list(
            self.apps.list_namespaced_deployment(
                self.ns, label_selector="spectune.io/role=canary"
            ).items
        )

    def create_spt(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body)

    def patch_spec(self, patch: dict[str, Any], name: str = "tune") -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name, {"spec": patch}
        )

    def spt(self, name: str = "tune") -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name
        )
        return obj

    def status(self, name: str = "tune") -> dict[str, Any]:
        return dict(self.spt(name).get("status") or {})

    def trials(self, name: str = "tune") -> list[dict[str, Any]]:
        return list(self.status(name).get("trials") or [])

    def running_trial(self, name: str = "tune") -> dict[str, Any] | None:
        trials = self.trials(name)
        return trials[-1] if trials and trials[-1]["outcome"] == "running" else None

    def condition(self, type_: str, name: str = "tune") -> dict[str, Any] | None:
        for c in self.status(name).get("conditions") or []:
            if c["type"] == type_:
                return dict(c)
        return None

    def events(self, name: str = "tune") -> list[Any]:
        return list(
            self.core.list_namespaced_event(
                self.ns, field_selector=f"involvedObject.name={name}"
            ).items
        )

    def reasons(self, name: str = "tune") -> set[str]:
        return {e.reason for e in self.events(name)}


def arm_of(args: list[str]) -> str:
    """The arm a vLLM command line runs (EAGLE-3 drafters only), a per-batch-size table too."""
    spec = parse_vllm_args(args).spec
    if spec is None:
        return "off"
    return Arm("eagle3", spec.num_speculative_tokens, spec.per_batch_size).name


def diagnostics(env: Env, op: OperatorProcess, sims: SimPods | None = None) -> Callable[[], str]:
    """A failure message: the status, the simulators and the operator's log tail."""

    def show() -> str:
        status = env.status()
        pods = (
            f" sims={list(sims.running())} exits={sims.exits} errors={sims.errors}" if sims else ""
        )
        return (
            f"phase={status.get('phase')} conditions={json.dumps(status.get('conditions'))} "
            f"trials={json.dumps(status.get('trials'))}{pods}\n"
            f"operator log:\n{op.log()[-3000:]}"
        )

    return show


RBAC = Path(__file__).resolve().parents[3] / "deploy" / "rbac.yaml"


@contextlib.contextmanager
def kubeconfig_without(
    cluster: Cluster, operator_kubeconfig: Path, tmp_path: Path, verb: str
) -> Iterator[tuple[Path, Callable[[], None]]]:
    """A ServiceAccount bound to a copy of ``deploy/rbac.yaml``'s ClusterRoles (their rules
    together) without ``verb`` on Deployments; yields its kubeconfig and a function that gives
    the verb back. Everything is removed on exit."""
    suffix = tmp_path.name[-20:].lower().replace("_", "-").strip("-")
    name = f"spectune-no{verb}-{suffix}"
    docs = list(yaml.safe_load_all(RBAC.read_text()))
    rules = [copy.deepcopy(r) for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    full = copy.deepcopy(rules)
    for rule in rules:
        if rule["apiGroups"] == ["apps"] and "deployments" in rule["resources"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    sa_ns = "spectune-system"
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_service_account(sa_ns, {"metadata": {"name": name}})
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": sa_ns}],
        }
    )
    token = core.create_namespaced_service_account_token(
        name,
        sa_ns,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        ),
    ).status.token
    doc = yaml.safe_load(operator_kubeconfig.read_text())
    doc["users"][0]["user"]["token"] = token
    path = tmp_path / f"kubeconfig-no{verb}"
    path.write_text(yaml.safe_dump(doc))

    def restore() -> None:
        rbac.patch_cluster_role(name, {"rules": full})

    try:
        yield path, restore
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)
        core.delete_namespaced_service_account(name, sa_ns)
