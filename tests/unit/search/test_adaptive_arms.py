"""In-engine adaptive modes are arms: their names, and how each engine spells them.

A user lists an adaptive mode as a candidate, the operator writes it into the engine's
arguments, and a deployment started (or edited) with those arguments is recognised as
that arm again.
"""

from __future__ import annotations

import pytest

from spectune.engines.args import (
    SpecConfig,
    parse_sglang_args,
    parse_vllm_args,
    render_sglang_args,
    render_vllm_args,
)
from spectune.errors import SpecError
from spectune.search.arms import AdaptiveMode, parse_arm
from spectune.search.spellings import arm_extra, arm_of_config

VLLM = ["vllm", "serve", "m", "--port", "8000"]
SGLANG = ["python", "-m", "sglang.launch_server", "--model-path", "m"]


def _spec(name: str, method: str = "eagle3") -> SpecConfig:
    arm = parse_arm(name)
    return SpecConfig(method, arm.k, model="d", per_batch_size=arm.schedule, extra=arm_extra(arm))


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("eagle3/4", None),
        ("eagle3/sched:1-64=3,65-512=0", AdaptiveMode.BATCH_TABLE),
        ("eagle3/verify:11:1-32=7,33-128=5,129-512=3", AdaptiveMode.VERIFY),
    ],
)
def test_a_vllm_arm_survives_render_and_parse(name: str, mode: AdaptiveMode | None) -> None:
    argv = render_vllm_args(VLLM, _spec(name))
    back = arm_of_config("eagle3", parse_vllm_args(argv).spec)  # type: ignore[arg-type]
    assert back.name == name
    assert back.adaptive is mode
    assert render_vllm_args(argv, _spec(name)) == argv


def test_adaptive_verification_is_written_as_vllm_documents_it() -> None:
    argv = render_vllm_args(VLLM, _spec("eagle3/verify:11:1-32=7,33-128=5,129-512=3"))
    config = argv[argv.index("--speculative-config") + 1]
    assert '"adaptive_verification":true' in config
    assert '"num_speculative_tokens":11' in config
    assert '"num_speculative_tokens_per_batch_size":[[1,32,7],[33,128,5],[129,512,3]]' in config


@pytest.mark.parametrize("name", ["eagle/tiers:1,3,7", "eagle/tiers:2,4:throughput_aware"])
def test_an_sglang_adaptive_arm_survives_render_and_parse(name: str) -> None:
    argv = render_sglang_args(SGLANG, _spec(name, "eagle"))
    assert "--speculative-adaptive" in argv
    back = arm_of_config("eagle", parse_sglang_args(argv).spec)  # type: ignore[arg-type]
    assert back.name == name and back.adaptive is AdaptiveMode.TIERS
    assert render_sglang_args(argv, _spec(name, "eagle")) == argv


def test_a_hand_started_sglang_adaptive_server_is_recognised() -> None:
    argv = [
        *SGLANG,
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d",
        "--speculative-adaptive", "--speculative-num-steps", "7",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8",
    ]  # fmt: skip
    arm = arm_of_config("eagle3", parse_sglang_args(argv).spec)  # type: ignore[arg-type]
    assert arm.name == "eagle3/tiers:1,3,7"  # SGLang's default candidate_steps


def test_turning_sglang_adaptive_off_removes_its_flags() -> None:
    argv = render_sglang_args(SGLANG, _spec("eagle/tiers:1,3,7", "eagle"))
    fixed = render_sglang_args(argv, SpecConfig("eagle", 3, model="d"))
    assert not any(token.startswith("--speculative-adaptive") for token in fixed)
    assert arm_of_config("eagle", parse_sglang_args(fixed).spec).name == "eagle/3"  # type: ignore[arg-type]


def test_an_adaptive_mode_on_the_wrong_engine_is_refused() -> None:
    with pytest.raises(SpecError, match="SGLang's --speculative-adaptive has no vLLM key"):
        render_vllm_args(VLLM, _spec("eagle/tiers:1,3,7"))
    with pytest.raises(SpecError, match="num_speculative_tokens_per_batch_size is a vLLM setting"):
        render_sglang_args(SGLANG, _spec("eagle3/verify:8:1-32=5", "eagle"))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("eagle3/verify:3:1-32=5", r"k=3 .* below the table's largest optimal_K \(5\)"),
        ("eagle3/verify:x:1-32=5", r"write '<drafter>/verify:<k>:<lo>-<hi>=<K>,...'"),
        ("eagle/tiers:3,1", "must be ascending"),
        ("eagle/tiers:1,a", "are not whole numbers"),
        ("eagle/tiers:1,3:fastest", "unknown strategy 'fastest'; use one of accept-length"),
    ],
)
def test_a_malformed_adaptive_arm_name_says_what_to_write(name: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_arm(name)


def test_the_default_strategy_has_one_name() -> None:
    assert parse_arm("eagle/tiers:1,3,7:accept-length").name == "eagle/tiers:1,3,7"
