"""Canary clones, promotion patches, fingerprints and rollout verdicts on plain objects."""

from __future__ import annotations

import copy
import json

import pytest

from spectune.engines.args import parse_vllm_args
from spectune.errors import SpecError
from spectune.k8s.deployments import (
    ANNOTATION_FINGERPRINT,
    LABEL_ROLE,
    DrafterArgs,
    canary_deployment,
    canary_name,
    current_spec,
    fingerprint,
    human_edit,
    model_version,
    promote_patch,
)
from spectune.k8s.rollout import Readiness, classify_rollout
from spectune.search.arms import OFF, Arm

EAGLE = (
    '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.3-Instruct-70B","num_speculative_tokens":5}'
)
TARGET = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "llama-70b", "namespace": "llm", "generation": 3, "uid": "t-1"},
    "spec": {
        "replicas": 4,
        "selector": {"matchLabels": {"app": "llama-70b"}},
        "template": {
            "metadata": {"labels": {"app": "llama-70b", "tier": "gpu"}},
            "spec": {
                "containers": [
                    {"name": "sidecar", "image": "envoy:1", "args": ["--port", "9"]},
                    {
                        "name": "vllm",
                        "image": "vllm/vllm-openai:v0.32.0",
                        "args": ["serve", "meta-llama/Llama-3.3-70B-Instruct",
                                 "--tensor-parallel-size", "4", "--speculative-config", EAGLE],
                    },
                ]
            },
        },
    },
}  # fmt: skip
SPT = {"apiVersion": "spectune.io/v1alpha1", "kind": "SpecTuning",
       "metadata": {"name": "llama", "namespace": "llm", "uid": "spt-1"}}  # fmt: skip
DRAFTERS = {
    "eagle3": DrafterArgs("eagle3", "eagle3", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"),
    "ngram": DrafterArgs("ngram", "ngram", None, 2, 4),
}


def test_a_canary_keeps_the_service_labels_and_runs_the_arm() -> None:
    c = canary_deployment(TARGET, Arm("ngram", 3), DRAFTERS, SPT, 1, "vllm", "vllm")
    assert c["metadata"]["name"] == "llama-70b-spt-ngram-3"
    labels = c["spec"]["template"]["metadata"]["labels"]
    assert labels["app"] == "llama-70b" and labels["tier"] == "gpu"  # the Service selects it
    assert labels[LABEL_ROLE] == "canary"
    assert c["spec"]["selector"]["matchLabels"] == {"app": "llama-70b", LABEL_ROLE: "canary"}
    assert c["spec"]["replicas"] == 1
    owner = c["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("SpecTuning", "spt-1", True)
    vllm = c["spec"]["template"]["spec"]["containers"][1]
    spec = parse_vllm_args(vllm["args"]).spec
    assert spec is not None and (spec.method, spec.num_speculative_tokens) == ("ngram", 3)
    assert vllm["args"][:4] == ["serve", "meta-llama/Llama-3.3-70B-Instruct",
                                "--tensor-parallel-size", "4"]  # fmt: skip
    # The sidecar and the target itself are untouched.
    assert c["spec"]["template"]["spec"]["containers"][0]["args"] == ["--port", "9"]
    assert "--speculative-config" in TARGET["spec"]["template"]["spec"]["containers"][1]["args"]


def test_promotion_patches_only_the_engine_flags_and_records_the_fingerprint() -> None:
    patch = promote_patch(TARGET, OFF, DRAFTERS, "vllm", "vllm")
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "vllm"
    assert "--speculative-config" not in container["args"]
    assert patch["metadata"]["annotations"][ANNOTATION_FINGERPRINT] == fingerprint(None)
    patched = copy.deepcopy(TARGET)
    patched["spec"]["template"]["spec"]["containers"][1]["args"] = container["args"]
    patched["metadata"]["annotations"] = patch["metadata"]["annotations"]
    assert current_spec(patched, "vllm", "vllm") is None
    assert not human_edit(patched, "vllm", "vllm")


def test_a_human_edit_of_the_spec_args_is_detected_but_other_edits_are_not() -> None:
    applied = copy.deepcopy(TARGET)
    spec = current_spec(applied, "vllm", "vllm")
    applied["metadata"]["annotations"] = {ANNOTATION_FINGERPRINT: fingerprint(spec)}
    assert not human_edit(applied, "vllm", "vllm")
    other = copy.deepcopy(applied)
    other["spec"]["template"]["spec"]["containers"][1]["args"] += ["--max-num-seqs", "128"]
    assert not human_edit(other, "vllm", "vllm")
    edited = copy.deepcopy(applied)
    args = edited["spec"]["template"]["spec"]["containers"][1]["args"]
    args[-1] = json.dumps({**json.loads(EAGLE), "num_speculative_tokens": 2})
    assert human_edit(edited, "vllm", "vllm")


def test_model_version_follows_the_annotation_then_the_image_and_model() -> None:
    base = model_version(TARGET, "vllm", "vllm")
    new_image = copy.deepcopy(TARGET)
    new_image["spec"]["template"]["spec"]["containers"][1]["image"] = "vllm/vllm-openai:v0.33.0"
    assert model_version(new_image, "vllm", "vllm") != base
    k_only = copy.deepcopy(TARGET)
    k_only["spec"]["template"]["spec"]["containers"][1]["args"][-1] = EAGLE.replace("5}", "3}")
    assert model_version(k_only, "vllm", "vllm") == base  # k is ours, not a model change
    annotated = copy.deepcopy(TARGET)
    annotated["metadata"]["annotations"] = {"spectune.io/model-version": "2026-11-01"}
    assert model_version(annotated, "vllm", "vllm") == "2026-11-01"


def test_names_and_errors() -> None:
    long = canary_name("x" * 60, Arm("eagle3", 4))
    assert len(long) <= 63 and "-spt-" in long
    with pytest.raises(SpecError, match="no container 'engine'"):
        canary_deployment(TARGET, Arm("ngram", 3), DRAFTERS, SPT, 1, "engine", "vllm")
    with pytest.raises(SpecError, match="unknown drafter 'medusa'"):
        promote_patch(TARGET, Arm("medusa", 2), DRAFTERS, "vllm", "vllm")


def _deploy(**status: object) -> dict:
    d = copy.deepcopy(TARGET)
    d["status"] = {"observedGeneration": 3, "replicas": 4, "updatedReplicas": 4,
                   "availableReplicas": 4, **status}  # fmt: skip
    return d


def _pod(state: dict, last: dict | None = None, restarts: int = 0) -> dict:
    status = {"name": "vllm", "state": state, "lastState": last or {}, "restartCount": restarts}
    return {"metadata": {"name": "p-1"}, "status": {"containerStatuses": [status]}}


@pytest.mark.parametrize(
    ("deployment", "pods", "readiness", "reason"),
    [
        (_deploy(), [], Readiness.READY, "4/4 replicas ready"),
        (_deploy(observedGeneration=2), [], Readiness.WAITING, "not seen the new spec"),
        (_deploy(updatedReplicas=2), [], Readiness.WAITING, "2/4 replicas updated"),
        (_deploy(replicas=5), [], Readiness.WAITING, "1 old replica(s) terminating"),
        (_deploy(availableReplicas=3), [], Readiness.WAITING, "3/4 replicas available"),
        (
            _deploy(conditions=[{"type": "Progressing", "status": "False",
                                 "reason": "ProgressDeadlineExceeded",
                                 "message": "ReplicaSet has timed out progressing."}]),
            [], Readiness.STUCK, "timed out progressing",
        ),
        (_deploy(availableReplicas=0), [_pod({"waiting": {"reason": "CrashLoopBackOff"}})],
         Readiness.STUCK, "CrashLoopBackOff"),
        (_deploy(availableReplicas=0),
         [_pod({"running": {}}, {"terminated": {"reason": "OOMKilled"}}, restarts=1)],
         Readiness.STUCK, "OOMKilled"),
        (_deploy(availableReplicas=0), [_pod({"waiting": {"reason": "ContainerCreating"}})],
         Readiness.WAITING, "0/4 replicas available"),
    ],
)  # fmt: skip
def test_rollouts_are_classified(
    deployment: dict, pods: list, readiness: Readiness, reason: str
) -> None:
    state = classify_rollout(deployment, pods)
    assert state.readiness is readiness and reason in state.reason
