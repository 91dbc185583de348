"""Fixtures for the bench tests: a tiny two-replica scenario built in code, a shared oracle
cache, and memoised bench runs (the oracle of each variant is simulated once per session).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from spectune.bench.runner import BenchResult, run_bench
from spectune.sim import Scenario, scenario_from_mapping

#: Two replicas of a 70B target at low load: EAGLE pays, n-gram barely; 600 simulated
#: seconds, 20 s restarts, 60 s windows (the tests pass ``window_s=WINDOW``).
TINY: dict[str, Any] = {
    "version": 1,
    "name": "tiny",
    "seed": 3,
    "duration_s": 600,
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
        "restart_s": 20,
    },
    "drafters": [
        {
            "name": "eagle3",
            "method": "eagle3",
            "model": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
            "weights_gib": 1.6,
            "params_b": 0.85,
            "kv_bytes_per_token": 4096,
            "max_k": 3,
        },
        {"name": "ngram", "method": "ngram", "cpu_ms_per_step": 0.3, "max_k": 1},
    ],
    "routes": [
        {
            "name": "chat",
            "share": 1.0,
            "prompt_tokens": {"dist": "lognormal", "mean": 400, "sigma": 0.5, "max": 3000},
            "output_tokens": {"dist": "lognormal", "mean": 80, "sigma": 0.5, "max": 400},
            "acceptance": {
                "eagle3": {"alpha": 0.8, "decay": 0.97, "spread": 8},
                "ngram": {"alpha": 0.25, "decay": 0.9, "spread": 2},
            },
        }
    ],
    "load": [{"at_s": 0, "requests_per_s": 2.0}],
    "fleet": {"replicas": 2, "balancer": "round_robin"},
    "initial": {"drafter": "off"},
    "objective": {"metric": "tpotP95"},
}

WINDOW = 60.0

#: The tiny scenario's candidate arms.
TINY_ARMS = ["off", "eagle3/1", "eagle3/2", "eagle3/3", "ngram/1"]


def merged(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in (mappings recursively; anything else replaced)."""
    out = copy.deepcopy(dict(base))
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def tiny_scenario(**changes: Any) -> Scenario:
    """The tiny scenario with ``changes`` merged in."""
    return scenario_from_mapping(merged(TINY, changes))


#: A second phase at 300 s where a new checkpoint makes the EAGLE head nearly useless.
DRIFT = {
    "name": "tiny-drift",
    "events": [
        {"at_s": 300, "kind": "model_version", "version": "v2", "acceptance_scale": {"eagle3": 0.1}}
    ],
}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One oracle cache for the whole session."""
    return tmp_path_factory.mktemp("oracle-cache")


_RUNS: dict[tuple[str, str, int | None], BenchResult] = {}


@pytest.fixture(scope="session")
def bench(cache_dir: Path) -> Callable[..., BenchResult]:
    """``bench(policy, variant="tiny"|"drift", seed=None)``, memoised for the session."""

    def run(policy: str, variant: str = "tiny", seed: int | None = None) -> BenchResult:
        key = (policy, variant, seed)
        if key not in _RUNS:
            scenario = tiny_scenario(**DRIFT) if variant == "drift" else tiny_scenario()
            _RUNS[key] = run_bench(
                scenario, policy, seed=seed, window_s=WINDOW, cache_dir=cache_dir, jobs=1
            )
        return _RUNS[key]

    return run
