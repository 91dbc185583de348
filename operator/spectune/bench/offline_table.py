r"""The ``offline-table`` baseline: a per-batch-size k table from an idle-box sweep, never changed.

What a user gets from vLLM's ``generate_config.py`` (engines.md, Dynamic SD): before going
live, a sweep on an idle box measures, for each batch size from 1 to 256, which draft length
gives the most tokens per second, and ships the table as
``num_speculative_tokens_per_batch_size``. It is computed once, for one drafter, on the
prompts the sweep had — here, charitably, the deployment's own route mix at its start — and
never re-measured: a model release, a route-mix shift or a cost the sweep did not see
(a queue, the KV pool a drafter takes) never changes it. SGLang has no per-batch table, so
there the sweep's batch-1 answer is shipped as a fixed k (the "set k once on an idle box"
habit).

The sweep is computed from the replica's physics (DESIGN.md §4) rather than simulated: at
batch :math:`b` and draft length :math:`k`, with mean context :math:`C` per sequence, a
speculative step costs one verification over :math:`b(k+1)` tokens plus :math:`k` draft
steps over :math:`b`, and emits :math:`b\,E_k` tokens, where
:math:`E_k = 1 + \sum_{i \le k} \prod_{j \le i} \alpha\,d^{\,j-1}` with the routes' mean
first-position acceptance :math:`\alpha` and decay :math:`d`. The table keeps, per
power-of-two batch bucket, the :math:`k` (0 for none) with the most tokens per second.
"""

from __future__ import annotations

import numpy as np

from spectune.search.arms import Arm
from spectune.sim.physics import arm_physics
from spectune.sim.scenario import FixedTokens, LogNormalTokens, Scenario, TokenDist

__all__ = ["BUCKETS", "offline_table_arm"]

#: The sweep's batch buckets: ``[lo, hi]`` up to 256, the range ``generate_config.py`` covers.
BUCKETS: tuple[tuple[int, int], ...] = tuple(
    (2**i, 2 ** (i + 1) - 1 if i < 7 else 256) for i in range(8)
)


def _mean(d: TokenDist) -> float:
    if isinstance(d, LogNormalTokens):
        return float(min(d.mean, d.max))
    if isinstance(d, FixedTokens):
        return float(d.value)
    return float(d.low + d.high) / 2.0


def _tokens_per_s(scenario: Scenario, drafter: str, k: int, batch: int, context: float) -> float:
    phys = arm_physics(scenario, Arm(drafter, k) if k > 0 else Arm(None))
    step = phys.target.time(batch * (k + 1), batch * context)
    if k > 0:
        if phys.draft is not None:
            step += k * phys.draft.time(batch, batch * context)
        step += phys.draft_cpu_s
    if k == 0:
        return batch / step
    shares = np.array([r.share for r in scenario.routes], dtype=float)
    shares = shares / shares.sum()
    expected = 0.0
    for w, route in zip(shares, scenario.routes, strict=True):
        acc = route.acceptance.get(drafter)
        alpha, decay = (acc.alpha, acc.decay) if acc is not None else (0.0, 1.0)
        q = alpha * decay ** np.arange(k)
        expected += w * (1.0 + float(np.cumprod(q).sum()))
    return batch * expected / step


def offline_table_arm(scenario: Scenario) -> Arm:
    """The arm the sweep ships: a per-batch table (vLLM) or the batch-1 k (SGLang)."""
    if not scenario.drafters:
        return Arm(None)
    initial = scenario.initial_arm
    name = initial.drafter if initial.drafter is not None else scenario.drafters[0].name
    d = scenario.drafter(name)
    feasible = [
        k for k in range(1, d.max_k + 1) if arm_physics(scenario, Arm(name, k)).failure is None
    ]
    if not feasible:
        return Arm(None)
    shares = np.array([r.share for r in scenario.routes], dtype=float)
    shares = shares / shares.sum()
    context = float(
        sum(
            w * (_mean(r.prompt_tokens) + _mean(r.output_tokens) / 2.0)
            for w, r in zip(shares, scenario.routes, strict=True)
        )
    )

    def best(batch: int) -> int:
        rates = {k: _tokens_per_s(scenario, name, k, batch, context) for k in [0, *feasible]}
        return max(rates, key=lambda k: rates[k])

    if scenario.engine != "vllm":
        k = best(1)
        return Arm(name, k) if k > 0 else Arm(None)
    table: list[tuple[int, int, int]] = []
    for lo, hi in BUCKETS:
        k = best(lo)
        if table and table[-1][2] == k:
            table[-1] = (table[-1][0], hi, k)
        else:
            table.append((lo, hi, k))
    if all(k == 0 for _, _, k in table):
        return Arm(None)
    if len(table) == 1:
        return Arm(name, table[0][2])
    return Arm.scheduled(name, tuple(table))
