r"""The cost model of one replica: how long a forward takes and how big the KV pool is.

DESIGN.md §4 in code. A forward over ``n`` tokens with total context ``C`` costs

.. math:: t = t_0 + \max(W / BW,\; 2 P n / F) + \kappa C / BW

(``t_0`` fixed overhead, ``W`` weight bytes, ``P`` parameters, ``F`` FLOP/s, ``κ`` KV bytes
per token): memory-bound at small ``n``, compute-bound past the knee ``n = W F / (2 P BW)``.
The KV pool is what memory is left after weights and the activation reserve, in blocks:

.. math:: blocks = \lfloor (M u - W_t - W_d - R) / (b (\kappa_t + \kappa_d)) \rfloor

The engine (:mod:`spectune.sim.engine`) calls these per step; the fleet calls
:func:`arm_physics` at every (re)start to learn whether an arm can start at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from spectune.search.arms import Arm
from spectune.sim.scenario import Scenario

__all__ = ["GIB", "ArmPhysics", "Forward", "arm_physics", "slowed"]

GIB = float(2**30)


@dataclass(frozen=True)
class Forward:
    """Cost coefficients of one forward pass of one model on this replica (seconds)."""

    overhead_s: float
    weights_s: float
    per_token_s: float
    per_context_s: float

    def time(self, n_tokens: float, context: float) -> float:
        """Seconds for a forward over ``n_tokens`` new tokens with ``context`` tokens of KV."""
        return (
            self.overhead_s
            + max(self.weights_s, self.per_token_s * n_tokens)
            + self.per_context_s * context
        )


@dataclass(frozen=True)
class ArmPhysics:
    """Everything the engine needs to know about running one arm on one replica."""

    target: Forward
    draft: Forward | None
    """The drafter's forward, for model drafters (EAGLE/MTP heads, draft models)."""
    draft_cpu_s: float
    """CPU seconds an n-gram/suffix proposer spends per engine step."""
    num_gpu_blocks: int
    block_size: int
    max_model_len: int
    failure: str | None
    """Why the engine cannot start with this arm (vLLM's own message), or ``None``."""

    @property
    def kv_tokens(self) -> int:
        """KV pool capacity in tokens."""
        return max(self.num_gpu_blocks, 0) * self.block_size


def arm_physics(scenario: Scenario, arm: Arm) -> ArmPhysics:
    """Cost coefficients, KV pool size and start-up verdict of ``arm`` on ``scenario``'s replica.

    Raises :class:`~spectune.errors.SpecError` if the arm names an unknown drafter or a k
    above its ``max_k``; an arm that is valid but does not fit in memory is *not* an error
    here: it comes back with ``failure`` set, as vLLM fails at start-up.
    """
    scenario.check_arm(arm)
    hw, tg = scenario.hardware, scenario.target
    bandwidth = hw.bandwidth_tbs * 1e12
    flops = hw.tflops * 1e12
    target = Forward(
        overhead_s=hw.step_overhead_ms / 1e3,
        weights_s=tg.weights_gib * GIB / bandwidth,
        per_token_s=2.0 * tg.params_b * 1e9 / flops,
        per_context_s=tg.kv_bytes_per_token / bandwidth,
    )
    draft: Forward | None = None
    cpu_s = 0.0
    draft_weights = 0.0
    draft_kv = 0
    if arm.drafter is not None:
        d = scenario.drafter(arm.drafter)
        if d.on_gpu:
            draft = Forward(
                overhead_s=hw.draft_step_overhead_ms / 1e3,
                weights_s=d.weights_gib * GIB / bandwidth,
                per_token_s=2.0 * d.params_b * 1e9 / flops,
                per_context_s=d.kv_bytes_per_token / bandwidth,
            )
            draft_weights = d.weights_gib * GIB
            draft_kv = d.kv_bytes_per_token
        cpu_s = d.cpu_ms_per_step / 1e3
    free = (
        hw.memory_gib * GIB * hw.gpu_memory_utilization
        - tg.weights_gib * GIB
        - draft_weights
        - hw.activation_reserve_gib * GIB
    )
    per_block = tg.block_size * (tg.kv_bytes_per_token + draft_kv)
    blocks = math.floor(free / per_block) if free > 0 else 0
    max_len = scenario.max_model_len
    failure: str | None = None
    if blocks <= 0:
        failure = (
            "No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine."
        )
    elif blocks * tg.block_size < max_len:
        failure = (
            f"The model's max seq len ({max_len}) is larger than the maximum number of tokens "
            f"that can be stored in KV cache ({blocks * tg.block_size}). Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
        )
    return ArmPhysics(
        target=target,
        draft=draft,
        draft_cpu_s=cpu_s,
        num_gpu_blocks=max(blocks, 0),
        block_size=tg.block_size,
        max_model_len=max_len,
        failure=failure,
    )


def slowed(phys: ArmPhysics, factor: float) -> ArmPhysics:
    """``phys`` on a replica whose forwards take ``factor`` times as long (a slower GPU of
    the same model: every term of the forward's cost scales with its clocks alike)."""

    def scale(f: Forward) -> Forward:
        return Forward(
            f.overhead_s * factor,
            f.weights_s * factor,
            f.per_token_s * factor,
            f.per_context_s * factor,
        )

    return replace(
        phys,
        target=scale(phys.target),
        draft=None if phys.draft is None else scale(phys.draft),
    )
