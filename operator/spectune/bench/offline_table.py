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
from spectune.sim.physics import ArmPhysics, arm_physics
from spectune.sim.scenario import Scenario

__all__ = ["BUCKETS", "offline_table_arm"]

#: The sweep's batch buckets: ``[lo, hi]`` up to 256, the range ``generate_config.py`` covers.
BUCKETS: tuple[tuple[int, int], ...] = tuple(
    (2**i, 2 ** (i + 1) - 1 if i < 7 else 256) for i in range(8)
)


def _tokens_per_s(
    scenario: Scenario, phys: ArmPhysics, drafter: str, k: int, batch: int, context: float
) -> float:
    step = phys.target.time(batch * (k + 1), batch * context)
    if k == 0:
        return batch / step
    if phys.draft is not None:
        step += k * phys.draft.time(batch, batch * context)
    step += phys.draft_cpu_s
    expected = 0.0
    for w, route in zip(scenario.route_weights(), scenario.routes, strict=True):
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
    physics = {0: arm_physics(scenario, Arm(None))}
    for k in range(1, d.max_k + 1):
        p = arm_physics(scenario, Arm(name, k))
        if p.failure is None:
            physics[k] = p
    if len(physics) == 1:
        return Arm(None)
    prompt, output = scenario.mean_lengths()
    context = prompt + output / 2.0

    def best(batch: int) -> int:
        rates = {k: _tokens_per_s(scenario, p, name, k, batch, context) for k, p in physics.items()}
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
