"""Each finding code fires on the evidence it names, and stays silent without it."""

from __future__ import annotations

import math

import pytest

from spectune.core import flat_survival
from spectune.diagnose import Code, Thresholds, diagnose
from spectune.engines import Dialect
from spectune.errors import InputError
from spectune.metrics import Histogram, Observation, SpecCounts

BOUNDS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.1, math.inf)


def hist(values: list[float], n_each: float = 100.0) -> Histogram:
    """A histogram of ``n_each`` observations at each value."""
    cum = tuple(float(sum(n_each for v in values if v <= b)) for b in BOUNDS)
    return Histogram(BOUNDS, cum, sum(values) * n_each, n_each * len(values))


def spec_obs(
    survival: list[float],
    drafts: float = 100_000,
    tpot: float | None = 0.015,
    running: float = 4.0,
    blocks: int | None = 1000,
    queue: Histogram | None = None,
    e2e: Histogram | None = None,
    preemptions: float = 0.0,
    waiting: float = 0.0,
) -> Observation:
    per_pos = tuple(drafts * s for s in survival)
    return Observation(
        dialect=Dialect.VLLM_V1,
        window_s=600,
        pods=("p",),
        spec=SpecCounts(drafts, drafts * len(survival), sum(per_pos), per_pos),
        running=running,
        waiting=waiting,
        preemptions=preemptions,
        num_gpu_blocks=blocks,
        tpot=hist([tpot]) if tpot else None,
        queue=queue,
        e2e=e2e,
    )


def off_obs(tpot: float = 0.03, blocks: int = 1000, queue: Histogram | None = None) -> Observation:
    return Observation(
        dialect=Dialect.VLLM_V1, window_s=600, pods=("b",), spec=None, running=4.0,
        num_gpu_blocks=blocks, tpot=hist([tpot]), queue=queue,
    )  # fmt: skip


def tpot_for(survival: list[float], c: float, tpot_off: float = 0.03) -> float:
    """The TPOT a deployment with this curve and draft cost would measure."""
    k = len(survival)
    return tpot_off * (1 + c * k) / (1 + sum(survival))


def test_a_good_drafter_at_the_right_k_is_healthy_with_a_measured_interval() -> None:
    curve = [float(x) for x in flat_survival(0.8, 3)]
    d = diagnose(spec_obs(curve, tpot=tpot_for(curve, 0.05)), off_obs())
    assert d.codes == (Code.HEALTHY,)
    assert d.draft_cost.source == "measured"
    assert d.draft_cost.value == pytest.approx(0.05, abs=1e-6)
    assert d.measured_speedup_interval is not None and d.measured_speedup_interval.low > 1


def test_k_past_the_optimum_names_the_better_k_and_the_break_even() -> None:
    curve = [float(x) for x in flat_survival(0.7, 8)]
    d = diagnose(spec_obs(curve, tpot=tpot_for(curve, 0.15)), off_obs())
    assert d.best_k == 3
    (f,) = [f for f in d.findings if f.code is Code.K_PAST_PEAK]
    assert f.evidence["k"] == 8 and f.evidence["best_k"] == 3
    assert f.evidence["p_len_ge_k"] < f.evidence["break_even"]
    assert "num_speculative_tokens to 3" in f.action
    assert Code.HEALTHY not in d.codes


def test_a_small_gain_from_changing_k_is_not_worth_a_finding() -> None:
    # a = 0.7, c = 0.15: k = 4 gives 1.733 against 1.747 at k = 3, under 1 %.
    curve = [float(x) for x in flat_survival(0.7, 4)]
    d = diagnose(spec_obs(curve, tpot=tpot_for(curve, 0.15)), off_obs())
    assert d.best_k == 3 and Code.K_PAST_PEAK not in d.codes


@pytest.mark.parametrize("curve", [[0.35, 0.1, 0.03], [0.9, 0.3, 0.1]])
def test_a_mismatched_drafter_is_low_acceptance(curve: list[float]) -> None:
    d = diagnose(spec_obs(curve), draft_cost=0.05)
    assert Code.LOW_ACCEPTANCE in d.codes


def test_an_accurate_drafter_that_costs_its_gain_is_branch_b() -> None:
    # First position 0.85, c = 0.9: a cheap head at this acceptance would give ~2.5×.
    curve = [0.85, 0.7, 0.55, 0.4]
    d = diagnose(spec_obs(curve, tpot=tpot_for(curve, 0.9)), off_obs())
    assert Code.LOW_ACCEPTANCE not in d.codes
    (f,) = [f for f in d.findings if f.code is Code.DRAFTER_TOO_EXPENSIVE]
    assert f.evidence["draft_cost"] == pytest.approx(0.9, rel=1e-3)
    assert f.evidence["speedup_source"] == "measured"
    assert f.evidence["speedup"] < 1 < f.evidence["speedup_at_cheap_cost"]
    assert all(w in f.action for w in ("shrink", "quantize", "replace"))


def test_an_accurate_costly_drafter_at_too_long_a_k_gets_both_findings() -> None:
    # a = 0.9 flat at k = 8 with c = 0.3: k = 2 is better, and even that gains little
    # against the ~4× a cheap drafter would give at this acceptance.
    curve = [float(x) for x in flat_survival(0.9, 8)]
    d = diagnose(spec_obs(curve, tpot=tpot_for(curve, 0.3)), off_obs())
    assert {Code.K_PAST_PEAK, Code.DRAFTER_TOO_EXPENSIVE} <= set(d.codes)


def test_moderate_acceptance_is_not_blamed_on_the_drafter_cost() -> None:
    # First position 0.75 is under 0.8: a small gain is not the cost's fault alone.
    curve = [0.75, 0.55, 0.4, 0.3]
    d = diagnose(spec_obs(curve, tpot=tpot_for(curve, 0.9)), off_obs())
    assert Code.DRAFTER_TOO_EXPENSIVE not in d.codes and d.best_k == 0


def test_a_cheap_accurate_drafter_is_not_too_expensive() -> None:
    curve = [0.85, 0.7, 0.55, 0.4]
    d = diagnose(spec_obs(curve, tpot=tpot_for(curve, 0.05)), off_obs())
    assert Code.DRAFTER_TOO_EXPENSIVE not in d.codes and Code.HEALTHY in d.codes


def test_low_acceptance_waits_for_as_many_drafts_as_insufficient_data_asks() -> None:
    few = diagnose(spec_obs([0.3, 0.1, 0.03], drafts=300), draft_cost=0.05)
    many = diagnose(spec_obs([0.3, 0.1, 0.03], drafts=20_000), draft_cost=0.05)
    assert Code.LOW_ACCEPTANCE not in few.codes and Code.INSUFFICIENT_DATA in few.codes
    assert Code.LOW_ACCEPTANCE in many.codes


def test_a_big_batch_times_k_is_the_large_batch_regime() -> None:
    curve = [0.8, 0.6, 0.45, 0.3]
    quiet = diagnose(spec_obs(curve, running=8), draft_cost=0.1)
    busy = diagnose(spec_obs(curve, running=96), draft_cost=0.1)
    assert Code.LARGE_BATCH_REGIME not in quiet.codes
    (f,) = [f for f in busy.findings if f.code is Code.LARGE_BATCH_REGIME]
    assert f.evidence["tokens_per_pass"] == 96 * 5


def test_a_shrunken_kv_pool_with_waiting_requests_is_reported() -> None:
    curve = [0.8, 0.6, 0.45]
    slow_queue, fast_queue = hist([0.1]), hist([0.005])
    d = diagnose(
        spec_obs(curve, tpot=tpot_for(curve, 0.1), blocks=700, queue=slow_queue, waiting=12),
        off_obs(blocks=1000, queue=fast_queue),
    )
    (f,) = [f for f in d.findings if f.code is Code.KV_POOL_SHRANK]
    assert f.evidence["num_gpu_blocks"] == 700 and f.evidence["baseline_num_gpu_blocks"] == 1000
    # The same shrink without any pressure is not a problem worth reporting.
    calm = diagnose(spec_obs(curve, tpot=tpot_for(curve, 0.1), blocks=700), off_obs(blocks=1000))
    assert Code.KV_POOL_SHRANK not in calm.codes


def test_waiting_that_dominates_latency_is_queueing() -> None:
    curve = [0.8, 0.6, 0.45]
    d = diagnose(spec_obs(curve, queue=hist([0.05]), e2e=hist([0.1])), draft_cost=0.1)
    (f,) = [f for f in d.findings if f.code is Code.QUEUEING]
    assert f.evidence["queue_share"] == pytest.approx(0.5)


def test_few_drafts_or_an_unknown_cost_is_insufficient_data() -> None:
    d = diagnose(spec_obs([0.8, 0.6], drafts=300))
    messages = [f.message for f in d.findings if f.code is Code.INSUFFICIENT_DATA]
    assert any("300 drafts" in m for m in messages)
    assert any("draft cost c is unknown" in m for m in messages)
    assert d.best_k is None and all(r.speedup is None for r in d.prediction)
    assert d.to_json()["draft_cost"]["value"] is None


def test_a_custom_threshold_changes_the_verdict() -> None:
    curve = [0.55, 0.35, 0.2]
    assert Code.LOW_ACCEPTANCE not in diagnose(spec_obs(curve), draft_cost=0.05).codes
    strict = Thresholds(low_acceptance=0.6)
    assert (
        Code.LOW_ACCEPTANCE in diagnose(spec_obs(curve), draft_cost=0.05, thresholds=strict).codes
    )


def test_sglang_gauges_give_a_modelled_curve_and_the_k_they_imply() -> None:
    obs = Observation(
        dialect=Dialect.SGLANG, window_s=60, pods=("s",), spec=None,
        acceptance_rate_gauge=0.6, accept_length_gauge=2.8, running=3.0,
    )  # fmt: skip
    d = diagnose(obs, draft_cost=0.1)
    assert d.current_k == 3  # (2.8 − 1) / 0.6
    assert d.acceptance.per_position_source == "modelled"
    assert d.prediction[3].expected_tokens == pytest.approx(2.8, abs=1e-6)
    assert any("no per-position acceptance" in n for n in d.notes)


def test_pods_without_speculation_cannot_be_diagnosed() -> None:
    with pytest.raises(InputError, match="speculation is off"):
        diagnose(off_obs(), current_k=3)
