"""Every speculative method vLLM documents today reads and renders with its own keys."""

from __future__ import annotations

import json

import pytest

from spectune.engines.args import (
    DOCUMENTED_METHODS,
    SpecConfig,
    parse_sglang_args,
    parse_vllm_args,
    render_sglang_args,
    render_vllm_args,
)
from spectune.errors import SpecError

WEIGHTS = {"eagle", "eagle3", "draft_model", "dflash", "dspark", "mlp_speculator"}
VALUES = {
    "parallel_drafting": True,
    "disable_padded_drafter_batch": True,
    "speculative_token_tree": "[(0,), (0, 0)]",
    "max_model_len": 4096,
    "quantization": "fp8",
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 5,
    "suffix_decoding_max_tree_depth": 24,
    "suffix_decoding_max_cached_requests": 10000,
    "suffix_decoding_max_spec_factor": 1.0,
    "suffix_decoding_min_token_prob": 0.1,
    "adaptive_verification": True,
}


@pytest.mark.parametrize("method", sorted(DOCUMENTED_METHODS))
def test_each_documented_method_round_trips_with_its_keys_and_unknown_ones(method: str) -> None:
    config: dict[str, object] = {"method": method, "num_speculative_tokens": 3}
    if method in WEIGHTS:
        config["model"] = "org/drafter"
    config |= {key: VALUES[key] for key in DOCUMENTED_METHODS[method]}
    config["a_key_of_a_later_release"] = {"kept": [1, 2]}
    parsed = parse_vllm_args(["serve", "m", "--speculative-config", json.dumps(config)])
    assert parsed.spec is not None and parsed.spec.method == method
    rendered = render_vllm_args(["serve", "m"], parsed.spec)
    assert json.loads(rendered[rendered.index("--speculative-config") + 1]) == config


@pytest.mark.parametrize("method", sorted(WEIGHTS))
def test_a_method_with_draft_weights_needs_a_model(method: str) -> None:
    with pytest.raises(SpecError, match="needs draft weights"):
        SpecConfig(method, 3)


def test_an_unknown_method_is_kept_not_refused() -> None:
    parsed = parse_vllm_args(
        ["--speculative-config", '{"method":"lilicorr","num_speculative_tokens":2,"x":1}']
    )
    assert parsed.spec is not None and parsed.spec.method == "lilicorr"
    assert dict(parsed.spec.extra) == {"x": 1}


def test_sglang_dflash_reads_and_renders() -> None:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "m",
            "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "org/dflash",
            "--speculative-num-steps", "4", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "5"]  # fmt: skip
    parsed = parse_sglang_args(argv)
    assert parsed.spec is not None and parsed.spec.method == "dflash"
    assert parsed.spec.num_speculative_tokens == 4
    assert render_sglang_args(argv, parsed.spec) == argv


@pytest.mark.parametrize("method", ["dflash", "dspark", "mlp_speculator"])
def test_a_spectuning_drafter_may_name_the_new_methods_and_renders_them(method: str) -> None:
    from spectune.api.spec import parse_spec
    from spectune.api.validation import InvalidSpecError
    from spectune.k8s.deployments import DrafterArgs, spec_config_for
    from spectune.search.arms import parse_arm

    base = {"targetRef": {"name": "llama"}, "metrics": {"scrape": {"port": 8000}}}
    with pytest.raises(InvalidSpecError, match=f"required for method {method}"):
        parse_spec({**base, "drafters": [{"name": "d", "method": method}]})
    spec = parse_spec({**base, "drafters": [{"name": "d", "method": method, "model": "o/d"}]})
    d = spec.drafters[0]
    config = spec_config_for(parse_arm("d/3"), {"d": DrafterArgs(d.name, d.method.value, d.model)})
    assert config is not None
    rendered = render_vllm_args(["serve", "m"], config)
    assert json.loads(rendered[-1]) == {
        "method": method,
        "model": "o/d",
        "num_speculative_tokens": 3,
    }
