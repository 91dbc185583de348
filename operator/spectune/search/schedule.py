"""Per-batch-size draft lengths learned across load regimes (vLLM's Dynamic SD table).

Load, not acceptance, is the main switch (reference/engines.md §6; vLLM #26504): the
same drafter that pays at batch 4 slows decoding at batch 200, because verification over
``b·(k+1)`` tokens stops being near-free past the compute knee. When the search has
settled the best arm at more than one load (one epoch each: a load move re-opens the
search), those answers make a table ``batch range → k`` that vLLM applies per step
(``num_speculative_tokens_per_batch_size``), so the next load move needs no restart.

Called by the spectune policy at a final promotion. Pure: the history in, an arm out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from spectune.search.arms import Arm, parse_arm
from spectune.search.history import History
from spectune.search.objective import same_load

__all__ = ["MAX_BATCH", "epoch_batch", "learned_schedule"]

#: Upper end of the last range: vLLM's largest max_num_seqs in practice (batch sizes above
#: a table fall back to the static k, so the last range must reach them).
MAX_BATCH = 1024


def epoch_batch(history: History, epoch: int) -> float:
    """Median running batch per pod of the incumbent over one epoch's windows (NaN if none;
    an epoch whose windows the history dropped keeps it: :meth:`History.epoch_batch`)."""
    return history.epoch_batch(epoch)


def learned_schedule(
    history: History, leader: Arm, now_batch: float, load_factor: float
) -> Arm | None:
    """A schedule arm for ``leader``'s drafter from every load regime settled so far.

    Each earlier epoch of the same model and traffic (opened by a load move:
    :meth:`History.acceptance_epochs`) whose final promotion is ``off`` or the leader's
    drafter at a fixed k, and whose load differs from every other point's, contributes
    ``(batch, k)``; the current epoch contributes ``(now_batch, leader.k)``. Range edges sit
    at the geometric means between neighbouring batches. Returns None when there is one load
    regime only, the leader is ``off``, the draft lengths do not differ (a static arm says
    the same), or k grows with the batch somewhere: verification over ``b·(k+1)`` tokens
    only gets dearer as the batch grows, so such answers differ by something other than the
    load, and a table would carry that into batches it was never measured at.
    """
    if leader.drafter is None or leader.adaptive is not None or math.isnan(now_batch):
        return None
    finals: dict[int, str] = {}
    for epoch, name in history.promotions:
        finals[epoch] = name  # the last promotion of an epoch is its answer
    points: list[tuple[float, int]] = [(max(now_batch, 1.0), leader.k)]
    same_model = set(history.acceptance_epochs())
    for epoch, name in sorted(finals.items()):
        if epoch == history.epoch or epoch not in same_model:
            continue
        arm = parse_arm(name)
        if arm.adaptive is not None or arm.drafter not in (None, leader.drafter):
            continue
        b = epoch_batch(history, epoch)
        if math.isnan(b) or any(same_load(b, p, load_factor) for p, _ in points):
            continue
        points.append((max(b, 1.0), arm.k))
    if len(points) < 2 or len({k for _, k in points}) < 2:
        return None
    ordered = sorted(points)
    if any(k1 < k2 for (_, k1), (_, k2) in itertools.pairwise(ordered)):
        return None
    return Arm.scheduled(leader.drafter, _ranges(ordered))


def _ranges(points: Sequence[tuple[float, int]]) -> tuple[tuple[int, int, int], ...]:
    out: list[tuple[int, int, int]] = []
    lo = 1
    for i, (b, k) in enumerate(points):
        if i + 1 < len(points):
            edge = max(lo, math.floor(math.sqrt(b * points[i + 1][0])))
        else:
            edge = MAX_BATCH
        if out and out[-1][2] == k:
            out[-1] = (out[-1][0], edge, k)  # merge neighbours with the same k
        else:
            out.append((lo, edge, k))
        lo = edge + 1
    return tuple(out)
