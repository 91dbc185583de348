"""Fixtures for the simulator tests: a small, fast scenario built in code, and its variants."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from spectune.sim import Scenario, scenario_from_mapping

BASE: dict[str, Any] = {
    "version": 1,
    "name": "unit",
    "seed": 11,
    "duration_s": 300,
    "engine": "vllm",
    "hardware": {
        "memory_gib": 320,
        "gpu_memory_utilization": 0.9,
        "bandwidth_tbs": 13.4,
        "tflops": 2400,
        "step_overhead_ms": 4.0,
        "draft_step_overhead_ms": 1.0,
        "activation_reserve_gib": 8,
    },
    "target": {
        "name": "llama-70b",
        "weights_gib": 131,
        "params_b": 70,
        "kv_bytes_per_token": 327680,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
        "block_size": 16,
        "restart_s": 30,
    },
    "drafters": [
        {
            "name": "eagle3",
            "method": "eagle3",
            "model": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
            "weights_gib": 1.6,
            "params_b": 0.85,
            "kv_bytes_per_token": 4096,
            "max_k": 8,
        },
        {"name": "ngram", "method": "ngram", "cpu_ms_per_step": 0.3, "max_k": 8},
        {
            "name": "draft8b",
            "method": "draft_model",
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "weights_gib": 15,
            "params_b": 8,
            "kv_bytes_per_token": 131072,
            "max_k": 6,
        },
    ],
    "routes": [
        {
            "name": "chat",
            "share": 0.8,
            "prompt_tokens": {"dist": "lognormal", "mean": 500, "sigma": 0.6, "max": 4000},
            "output_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.5, "max": 1000},
            "acceptance": {
                "eagle3": {"alpha": 0.78, "decay": 0.97, "spread": 8},
                "ngram": {"alpha": 0.25, "decay": 0.9, "spread": 2},
                "draft8b": {"alpha": 0.8, "decay": 0.98, "spread": 10},
            },
        },
        {
            "name": "summarize",
            "share": 0.2,
            "prompt_tokens": {"dist": "lognormal", "mean": 2000, "sigma": 0.5, "max": 6000},
            "output_tokens": {"dist": "fixed", "value": 150},
            "acceptance": {
                "eagle3": {"alpha": 0.8, "decay": 0.98, "spread": 8},
                "ngram": {"alpha": 0.7, "decay": 0.97, "spread": 3},
            },
        },
    ],
    "load": [{"at_s": 0, "requests_per_s": 1.0}],
    "fleet": {"replicas": 1, "balancer": "least_outstanding"},
    "initial": {"drafter": "eagle3", "k": 3},
}


def merged(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in (mappings recursively; anything else replaced)."""
    out = copy.deepcopy(dict(base))
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture
def base_mapping() -> dict[str, Any]:
    """A fresh copy of the base scenario mapping."""
    return copy.deepcopy(BASE)


@pytest.fixture
def make_scenario() -> Callable[..., Scenario]:
    """Build the base scenario with changes merged in: ``make_scenario(load=[...])``."""

    def build(**changes: Any) -> Scenario:
        return scenario_from_mapping(merged(BASE, changes))

    return build
