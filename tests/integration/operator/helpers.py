"""Helpers shared by the operator's integration tests: objects, the cluster view, waits.

Everything here reads what a user would see with ``kubectl``: the SpecTuning's status,
conditions and events, and the Deployments.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client

from spectune.api.names import API_VERSION, GROUP, KIND, PLURAL, VERSION
from spectune.engines.args import parse_vllm_args
from spectune.search.arms import Arm
from tests.fixtures.cluster import Cluster, wait_for
from tests.fixtures.simpods import SimPods
from tests.integration.operator.conftest import OperatorProcess

TARGET = "llama"
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
EAGLE = "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"


def deployment(args: list[str], name: str = TARGET) -> dict[str, Any]:
    """A vLLM-like Deployment running ``args`` (one replica, surge 1)."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": args}
                    ]
                },
            },
        },
    }


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
