"""spectune-v2's performance model (search/perf.py) on windows drawn from known physics."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from spectune.search.arms import OFF, Arm
from spectune.search.history import History, Outcome, TrialRecord, WindowRecord
from spectune.search.objective import Metric, WindowStats
from spectune.search.perf import (
    Acceptance,
    GroupWindow,
    StepModel,
    batch_at_load,
    predict,
)

THETA0, THETA1, PHI = 0.010, 0.0002, 0.0012  # plain step, per verified token, per draft step
ALPHA = 0.75
DRAFTS = 50_000.0


def survival(alpha: float, k: int) -> list[float]:
    return [alpha**i for i in range(1, k + 1)]


def step(arm: Arm, batch: float) -> float:
    return THETA0 + THETA1 * batch * (arm.k + 1) + arm.k * PHI


def fake_stats(arm: Arm, batch: float, alpha: float = ALPHA, tail: float = 1.25) -> WindowStats:
    """One group's window from the fake physics above (a fake, not the simulator)."""
    surv = survival(alpha, arm.k) if arm.drafter else []
    e = 1 + sum(surv)
    tpot = step(arm, batch) / e
    p95 = tail * tpot
    return WindowStats(
        objective=p95, objective_low=p95 * 0.97, objective_high=p95 * 1.03,
        requests=300, tpot_mean=tpot, tpot_p95=p95,
        ttft_p95=0.2, ttft_p95_low=0.19, ttft_p95_high=0.21,
        queue_p95=0.0, queue_p95_low=0.0, queue_p95_high=0.0, e2e_p95=5.0,
        tokens_per_s=batch / tpot, running=batch, pods=1, k=len(surv),
        drafts=DRAFTS if surv else 0.0, accepted_per_pos=tuple(DRAFTS * s for s in surv),
        mean_accepted_length=e, num_gpu_blocks=1000, preemptions=0.0,
    )  # fmt: skip


def objective_at_load(arm: Arm, load: float) -> float:
    """The fake physics' p95 at ``load`` tokens/s per pod: Little's law gives the batch
    (a faster arm serves the same load with fewer requests in flight)."""
    return fake_stats(arm, batch_at(arm, load)).objective


def batch_at(arm: Arm, load: float) -> float:
    e = 1 + sum(survival(ALPHA, arm.k)) if arm.drafter else 1.0
    return load * (THETA0 + arm.k * PHI) / (e - load * THETA1 * (arm.k + 1))


def history_of(pairs: list[tuple[Arm, Arm, float]]) -> History:
    """A history of one-window trials: (incumbent, canary arm, incumbent's batch) each; the
    canary serves the incumbent's load per pod (a load-matched trial)."""
    h = History()
    for i, (inc, can, b) in enumerate(pairs):
        load = fake_stats(inc, b).tokens_per_s
        w = WindowRecord(300.0 * i, 300.0 * (i + 1), fake_stats(inc, b),
                         fake_stats(can, batch_at(can, load)), inc.name)  # fmt: skip
        t = TrialRecord(can.name, inc.name, 0, 300.0 * i).with_window(w)
        h = h.add_trial(t.ended(Outcome.MEASURED, "measured"))
    return h


def test_acceptance_prices_every_shorter_k_from_one_trial() -> None:
    s = fake_stats(Arm("eagle3", 6), 8.0)
    draws = Acceptance.of([s], (2.0, 2.0)).draws([1, 3, 6], np.random.default_rng(0), 4000)
    for k in (1, 3, 6):
        assert draws[k].mean() == pytest.approx(1 + sum(survival(ALPHA, k)), rel=0.01)


def test_acceptance_without_per_position_counters_uses_the_mean_length() -> None:
    # An SGLang window: only the mean accepted length at k = 4.
    s = fake_stats(Arm("eagle3", 4), 8.0)
    sglang = WindowStats(**{**s.__dict__, "accepted_per_pos": ()})
    draws = Acceptance.of([sglang], (2.0, 2.0)).draws([4], np.random.default_rng(0), 2000)
    assert draws[4].mean() == pytest.approx(s.mean_accepted_length, rel=0.02)


def test_an_unmeasured_drafter_draws_from_its_method_prior() -> None:
    weak = Acceptance.of([], (2.0, 3.0)).draws([3], np.random.default_rng(0), 4000)[3]
    strong = Acceptance.of([], (7.5, 2.5)).draws([3], np.random.default_rng(0), 4000)[3]
    assert weak.mean() < strong.mean()
    assert weak.std() > 0.1  # a prior, not a measurement


def test_step_model_recovers_the_physics_from_windows_at_two_loads() -> None:
    arms = [OFF, Arm("d", 2), Arm("d", 5)]
    gws = [
        GroupWindow(a, i, fake_stats(a, b))
        for i, (a, b) in enumerate((a, b) for a in arms for b in (2.0, 16.0, 48.0))
    ]
    model = StepModel.fit(gws, ["d"], draft_cost=0.1)
    for arm in (OFF, Arm("d", 3), Arm("d", 4)):  # d/3, d/4 never measured
        for b in (4.0, 32.0):
            got = float(model.mean @ model.features(arm, b)[0])
            assert got == pytest.approx(step(arm, b), rel=0.03)


def test_an_arm_that_cannot_keep_up_with_the_load_saturates() -> None:
    model = StepModel(("d",), np.array([THETA0, THETA1, PHI, 0.0]), np.eye(4) * 1e-12)
    coef = model.mean[None, :]
    e = np.array([1.0])
    light, sat_light = batch_at_load(coef, model, OFF, e, load=100.0)
    # Little's law: b = Λ·s(b) = 100·(0.010 + 0.0002 b) → b = 1/0.98.
    assert light[0] == pytest.approx(1.0 / 0.98, rel=1e-6) and not sat_light[0]
    _, sat_heavy = batch_at_load(coef, model, OFF, e, load=1.0 / THETA1)
    assert sat_heavy[0]


def test_prediction_at_the_target_load_puts_the_interior_k_first() -> None:
    d = [Arm("d", k) for k in range(1, 9)]
    # d/2 measured at one load, then off and d/8 at another: the rest are predictions, all
    # at the load of the latest window (off's batch of 8).
    h = history_of([(OFF, Arm("d", 2), 24.0), (OFF, Arm("d", 8), 8.0)])
    load = fake_stats(OFF, 8.0).tokens_per_s
    p = predict(h, [OFF, *d], Metric.TPOT_P95, load, {}, 0.1, np.random.default_rng(1), 2000)
    med = {a.name: float(np.median(p.column(a))) for a in p.arms}
    truth = {a.name: math.log(objective_at_load(a, load)) for a in p.arms}
    chosen = min(med, key=med.__getitem__)
    assert truth[chosen] - min(truth.values()) < 0.01  # within 1 % of the best arm
    for a in ("d/3", "d/4", "d/5"):
        assert med[a] == pytest.approx(truth[a], abs=0.04)
    # d/2 was seen at three times the load: a prediction here, not a measurement.
    assert p.measured == {"off", "d/8"}


def test_a_canary_the_balancer_gave_a_smaller_share_is_not_measured_at_the_load() -> None:
    # d/3 on the canary beside off: in the first history it carried the same load per pod as
    # off's pods (a matched pair); in the second the balancer sent it 0.6 of that (it held
    # its requests longer), a smaller batch than the target runs: the model's extrapolation,
    # not a measurement there, and no decision may rest on it.
    d3 = Arm("d", 3)
    for share, measured in ((1.0, True), (0.6, False)):
        inc = fake_stats(OFF, 16.0)
        load = inc.tokens_per_s * share
        can = fake_stats(d3, batch_at(d3, load))
        w = WindowRecord(0.0, 300.0, inc, can, OFF.name)
        t = TrialRecord(d3.name, OFF.name, 0, 0.0).with_window(w).ended(Outcome.MEASURED, "")
        h = History().add_trial(t)
        rng = np.random.default_rng(1)
        p = predict(h, [OFF, d3], Metric.TPOT_P95, inc.tokens_per_s, {}, 0.1, rng, 500)
        assert ("d/3" in p.measured) is measured, share
        assert "off" in p.measured


def test_throughput_at_an_offered_load_is_that_load_unless_the_arm_saturates() -> None:
    def tput(arm: Arm, batch: float) -> WindowStats:
        s = fake_stats(arm, batch)
        return replace(s, objective=s.tokens_per_s, objective_low=math.nan, objective_high=math.nan)

    load = fake_stats(OFF, 8.0).tokens_per_s
    t = TrialRecord("d/3", "off", 0, 0.0)
    for i, b in enumerate((8.0, 30.0)):  # two loads: the cost of a verified token is known
        at = fake_stats(OFF, b).tokens_per_s
        can = tput(Arm("d", 3), batch_at(Arm("d", 3), at))
        t = t.with_window(WindowRecord(300.0 * i, 300.0 * (i + 1), tput(OFF, b), can, "off"))
    h = History().add_trial(t)
    arms = [OFF, Arm("d", 3), Arm("d", 1)]
    rng = np.random.default_rng(0)
    p = predict(h, arms, Metric.OUTPUT_TOKENS_PER_SECOND, load, {}, 0.1, rng, 1000)
    assert np.median(p.column(Arm("d", 1))) == pytest.approx(np.median(p.column(OFF)), abs=0.05)
    # Past what every arm can serve, each saturates.
    heavy = predict(h, arms, Metric.OUTPUT_TOKENS_PER_SECOND, 50 * load, {}, 0.1, rng, 1000)
    assert heavy.saturated.min() > 0.9
