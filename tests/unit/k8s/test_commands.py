"""Engine command lines inside shell scripts, and which container is the engine's.

A container run as ``sh -c "… vllm serve … --speculative-config …"`` (the LeaderWorkerSet
recipe, many charts) used to read as "speculation off", and the canary's new config was
appended after the script, where the shell ignores it: the canary ran the incumbent while
the search believed it tried another arm. These tests read and write such targets as the
operator does (``k8s/deployments.py``) and check what the engine would receive.
"""

from __future__ import annotations

import copy
import json
import shlex
from typing import Any

import pytest

from spectune.engines.args import parse_sglang_args, parse_vllm_args
from spectune.errors import SpecError
from spectune.k8s.commands import engine_command
from spectune.k8s.deployments import (
    DrafterArgs,
    canary_deployment,
    current_spec,
    promote_patch,
)
from spectune.search.arms import OFF, Arm

EAGLE_MODEL = "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"
DRAFTERS = {
    "eagle3": DrafterArgs("eagle3", "eagle3", EAGLE_MODEL),
    "ngram": DrafterArgs("ngram", "ngram", None, 2, 4),
}
SPT = {"apiVersion": "spectune.io/v1alpha1", "kind": "SpecTuning",
       "metadata": {"name": "llama", "namespace": "llm", "uid": "spt-1"}}  # fmt: skip
CONFIG = json.dumps({"method": "eagle3", "model": EAGLE_MODEL, "num_speculative_tokens": 4})
SCRIPT = (
    "set -e\n"
    "export HF_HOME=/cache; nvidia-smi || true\n"
    f"exec vllm serve meta-llama/Llama-3.3-70B-Instruct --port 8000 --speculative-config '{CONFIG}'"
    " --tensor-parallel-size $(TP_SIZE)"
)
# The LeaderWorkerSet leader (vLLM docs, "LWS"): the script is the args of `sh -c`.
LWS = (
    "bash /vllm-workspace/examples/online_serving/multi-node-serving.sh leader "
    "--ray_cluster_size=$(LWS_GROUP_SIZE); python3 -m vllm.entrypoints.openai.api_server "
    "--port 8080 --model meta-llama/Meta-Llama-3.1-405B-Instruct \\\n"
    "    --tensor-parallel-size 8 --pipeline_parallel_size 2"
)


def _target(*containers: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llama-70b", "namespace": "llm", "uid": "t-1"},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "llama-70b"}},
            "template": {
                "metadata": {"labels": {"app": "llama-70b"}},
                "spec": {"containers": list(containers)},
            },
        },
    }


def _shell_argv(container: dict[str, Any]) -> list[str]:
    """What the engine receives: the script's engine statement, split as the shell does."""
    full = list(container.get("command") or []) + list(container.get("args") or [])
    script = full[full.index("-c") + 1] if "-c" in full else full[-1]
    line = [s for s in script.replace("\\\n", " ").replace(";", "\n").splitlines() if "vllm" in s]
    return shlex.split(line[-1].replace("exec ", "", 1))


def _vllm(container: dict[str, Any]) -> tuple[str | None, int | None]:
    spec = parse_vllm_args(_shell_argv(container)).spec
    return (None, None) if spec is None else (spec.method, spec.num_speculative_tokens)


def test_a_shell_wrapped_target_reads_as_what_its_script_runs() -> None:
    target = _target({"name": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                      "command": ["sh", "-c", SCRIPT]})  # fmt: skip
    spec = current_spec(target, None, "vllm")
    assert spec is not None and (spec.method, spec.num_speculative_tokens) == ("eagle3", 4)


def test_a_canary_of_a_shell_wrapped_target_runs_the_arm_inside_the_script() -> None:
    target = _target({"name": "vllm", "image": "vllm/vllm-openai:v0.32.0",
                      "command": ["sh", "-c", SCRIPT]})  # fmt: skip
    canary = canary_deployment(target, Arm("ngram", 3), DRAFTERS, SPT, 1, "vllm", "vllm")
    (c,) = canary["spec"]["template"]["spec"]["containers"]
    assert c["command"][:2] == ["sh", "-c"] and len(c["command"]) == 3  # nothing after it
    assert _vllm(c) == ("ngram", 3)
    script = c["command"][2]
    # Everything but the speculative flag is as the user wrote it, expansions included.
    assert script.startswith("set -e\nexport HF_HOME=/cache; nvidia-smi || true\nexec vllm serve")
    assert script.endswith(" --tensor-parallel-size $(TP_SIZE)")
    assert CONFIG not in script
    # The operator reads the canary back as the arm it meant.
    spec = current_spec(canary, None, "vllm")
    assert spec is not None and (spec.method, spec.num_speculative_tokens) == ("ngram", 3)


def test_the_lws_leader_gets_the_config_in_its_engine_command_not_after_the_script() -> None:
    target = _target({"name": "vllm-leader", "image": "vllm/vllm-openai:v0.32.0",
                      "command": ["/bin/sh", "-c"], "args": [LWS]})  # fmt: skip
    assert current_spec(target, None, "vllm") is None
    patch = promote_patch(target, Arm("eagle3", 2), DRAFTERS, None, "vllm")
    (c,) = patch["spec"]["template"]["spec"]["containers"]
    assert set(c) == {"name", "args"} and len(c["args"]) == 1
    script = c["args"][0]
    assert script.startswith(LWS.split(";")[0] + ";")  # the Ray bootstrap untouched
    assert "\\\n    --tensor-parallel-size 8" in script  # its line continuation too
    assert _vllm({"command": ["/bin/sh", "-c"], "args": [script]}) == ("eagle3", 2)
    # ... and back to off: the flag leaves the engine statement, the script stays whole.
    rolled = copy.deepcopy(target)
    rolled["spec"]["template"]["spec"]["containers"][0]["args"] = [script]
    off = promote_patch(rolled, OFF, DRAFTERS, None, "vllm")["spec"]["template"]["spec"]
    assert off["containers"][0]["args"] == [LWS]


def test_bash_lc_and_sglang_are_read_and_written_in_place() -> None:
    script = (
        "source /etc/profile && python3 -m sglang.launch_server --model-path m --port 30000 "
        "--speculative-algorithm EAGLE --speculative-draft-model-path d "
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
    )
    cmd = engine_command({"name": "sgl", "command": ["bash", "-lc", script]})
    assert cmd.field == "command" and cmd.argv[:3] == ("python3", "-m", "sglang.launch_server")
    spec = parse_sglang_args(list(cmd.argv)).spec
    assert spec is not None and spec.num_speculative_tokens == 3
    items = cmd.render([*cmd.argv[:5], "--port", "30000"])
    assert items[:2] == ["bash", "-lc"]
    assert (
        items[2]
        == "source /etc/profile && python3 -m sglang.launch_server --model-path m --port 30000"
    )


@pytest.mark.parametrize(
    ("command", "args", "says"),
    [
        (["sh", "-c", "/opt/start-server.sh"], [], "finds no vllm, sglang or trtllm-serve"),
        (["sh", "-c", "vllm serve a --port 1 & vllm serve b --port 2"], [], "2 engine commands"),
        (
            ["sh", "-c", 'vllm serve m --num-speculative-tokens "$K" --speculative-model x'],
            [],
            "shell expansions",
        ),
    ],
)
def test_what_cannot_be_rewritten_safely_is_refused_naming_the_container(
    command: list[str], args: list[str], says: str
) -> None:
    target = _target({"name": "engine", "image": "vllm/vllm-openai:v0.32.0",
                      "command": command, "args": args})  # fmt: skip
    before = copy.deepcopy(target)
    with pytest.raises(SpecError) as err:
        canary_deployment(target, Arm("ngram", 3), DRAFTERS, SPT, 1, None, "vllm")
    assert "container 'engine'" in str(err.value) and says in str(err.value)
    assert target == before


def test_with_several_containers_the_engine_is_the_one_that_runs_it() -> None:
    sidecar = {"name": "envoy", "image": "envoyproxy/envoy:v1.31", "args": ["--port", "9"]}
    engine = {"name": "server", "image": "registry.local/llm:7", "command": ["sh", "-c", SCRIPT]}
    target = _target(sidecar, engine)  # the sidecar comes first
    spec = current_spec(target, None, "vllm")
    assert spec is not None and spec.method == "eagle3"
    patch = promote_patch(target, OFF, DRAFTERS, None, "vllm")
    assert [c["name"] for c in patch["spec"]["template"]["spec"]["containers"]] == ["server"]
    # The vLLM image with flags only (its entrypoint is the engine) counts as running it.
    image_only = {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "args": ["serve", "m"]}
    assert current_spec(_target(sidecar, image_only), None, "vllm") is None
    two = _target(sidecar, {"name": "other", "image": "busybox", "args": ["sleep", "1d"]})
    with pytest.raises(SpecError, match=r"containers envoy, other and none of them runs"):
        current_spec(two, None, "vllm")
