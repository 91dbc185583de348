"""Post-promotion verification's comparison (``search/verify.py``) on hand-built windows."""

from __future__ import annotations

from dataclasses import replace

from spectune.search.arms import parse_arm
from spectune.search.objective import Metric, Objective, saturated
from spectune.search.verify import Reference, regression
from tests.unit.search.test_spectune_policy import WORLDS

WORLD = WORLDS["chat: eagle3 wins at a small k"]


def ref(arm: str, rate: float, **changes: float) -> Reference:
    return Reference(replace(WORLD.stats(parse_arm(arm)), **changes), rate, False, 300.0)


def test_a_window_worse_with_confidence_at_the_same_load_is_a_regression() -> None:
    before = [ref("off", 2.0)]
    slow = ref("eagle3/4", 2.1, objective=0.06, objective_low=0.055, objective_high=0.065)
    verdict = regression(slow, before, Objective(), 1.6)
    assert verdict.judged and verdict.why is not None and "tpotP95" in verdict.why
    # Within the noise of the reference: judged, holds.
    same = ref("off", 2.1)
    verdict = regression(same, before, Objective(), 1.6)
    assert verdict.judged and verdict.why is None


def test_a_window_at_another_load_is_not_judged_unless_the_target_saturated_below_it() -> None:
    before = [ref("off", 2.0)]
    slow = ref("eagle3/4", 4.0, objective=0.06, objective_low=0.055, objective_high=0.065)
    assert not regression(slow, before, Objective(), 1.6).judged  # twice the load: no verdict
    # Fewer requests finished than before, but the pods are full (requests queue for a
    # minute): the arm is slow, not the load lighter. Judged, and a regression.
    full = ref("eagle3/4", 0.8, objective=0.06, objective_low=0.055, objective_high=0.065,
               queue_p95=60.0, queue_p95_low=50.0, queue_p95_high=70.0)  # fmt: skip
    assert saturated(full.stats)
    verdict = regression(full, before, Objective(), 1.6)
    assert verdict.judged and verdict.why is not None
    # The same lighter load without saturation is a load the reference did not see.
    light = replace(full, stats=replace(full.stats, queue_p95=0.0, queue_p95_low=0.0,
                                        queue_p95_high=0.0))  # fmt: skip
    assert not regression(light, before, Objective(), 1.6).judged


def test_a_p95_hidden_under_the_first_bucket_is_judged_by_the_mean_per_token_latency() -> None:
    # Every per-token latency under 10 ms: the histogram bounds the p95 and cannot place
    # it, but it holds the mean exactly. 20 % slower on the mean is a regression; 2 % is not.
    hidden = {"objective_bound": 0.01, "objective_low": 0.002, "objective_high": 0.01}
    before = [ref("off", 2.0, tpot_mean=0.005, **hidden)]
    slower = ref("eagle3/4", 2.0, tpot_mean=0.006, **hidden)
    verdict = regression(slower, before, Objective(), 1.6)
    assert verdict.judged and verdict.why is not None and "mean per-token" in verdict.why
    alike = ref("eagle3/4", 2.0, tpot_mean=0.0051, **hidden)
    assert regression(alike, before, Objective(), 1.6).why is None
    # At 30 % more requests per pod (inside the load band) the mean rises with the
    # prefills beside each decode: not the arm's doing, no verdict on the objective.
    busier = ref("eagle3/4", 2.6, tpot_mean=0.006, **hidden)
    assert regression(busier, before, Objective(), 1.6).why is None


def test_a_saturated_target_slower_than_its_saturated_predecessor_is_a_regression() -> None:
    # Both queue for a minute. The promoted arm's backlog is younger (it restarted), so
    # its e2e p95 is the lower one; it serves 30 % fewer tokens per pod, so at this load
    # its queue grows faster: a regression, on the service rate.
    objective = Objective(Metric.E2E_P95)
    queue = {"queue_p95": 60.0, "queue_p95_low": 50.0, "queue_p95_high": 70.0}
    base = WORLD.stats(parse_arm("off"))
    before = [ref("off", 2.0, **queue, objective=90.0, objective_low=85.0, objective_high=95.0)]
    slow = ref("eagle3/4", 1.4, **queue, objective=40.0, objective_low=38.0, objective_high=42.0,
               tokens_per_s=base.tokens_per_s * 0.7)  # fmt: skip
    assert saturated(slow.stats) and saturated(before[0].stats)
    verdict = regression(slow, before, objective, 1.6)
    assert verdict.judged and verdict.why is not None and "tokens/s" in verdict.why
    # Serving as many tokens: the younger backlog's lower latency is no regression.
    level = replace(slow, stats=replace(slow.stats, tokens_per_s=base.tokens_per_s))
    assert regression(level, before, objective, 1.6).why is None
