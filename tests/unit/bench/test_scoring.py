"""Scoring from request records: phase objectives and guardrail breaches."""

from __future__ import annotations

import math

import numpy as np

from spectune.bench.scoring import (
    ABSOLUTE_SLACK_S,
    GuardrailLimit,
    RequestTable,
    breach_seconds,
    metric_value,
    p95_interval,
    recovery_seconds,
    score_windows,
    worse_seconds,
)
from spectune.search.objective import Metric


def table(
    finish: list[float], ttft: float, queue: float = 0.01, tokens: float = 10
) -> RequestTable:
    n = len(finish)
    f = np.asarray(finish, dtype=np.float64)
    return RequestTable(
        finish_s=f,
        tpot_s=np.full(n, 0.02),
        ttft_s=np.full(n, ttft),
        queue_s=np.full(n, queue),
        e2e_s=np.full(n, 1.0),
        output_tokens=np.full(n, tokens),
    )


LIMITS = [GuardrailLimit("ttftP95", "ttft_s", 0.2), GuardrailLimit("queueP95", "queue_s", 0.2)]


def test_objectives_read_the_requests_finished_in_the_span():
    t = table([float(i) for i in range(100)], ttft=0.1)
    assert metric_value(t, Metric.TTFT_P95, 0, 100) == 0.1
    assert metric_value(t, Metric.OUTPUT_TOKENS_PER_SECOND, 0, 50) == 10.0
    assert math.isnan(metric_value(t, Metric.TPOT_P95, 200, 300))


def test_windows_are_aligned_to_each_phase():
    assert score_windows([(0, 250), (250, 400)], 100) == [
        (0, 100, 0), (100, 200, 0), (200, 250, 0), (250, 350, 1), (350, 400, 1),
    ]  # fmt: skip


def concat(*parts: RequestTable) -> RequestTable:
    return RequestTable(
        *(np.concatenate([getattr(p, f) for p in parts]) for f in RequestTable.__dataclass_fields__)
    )


def test_breach_counts_the_windows_past_tolerance_and_slack():
    ref = table([i * 0.5 for i in range(800)], ttft=0.1)
    run = concat(
        table([i * 0.5 for i in range(200)], ttft=0.1),  # 0-100 s: as the oracle
        table([100 + i * 0.5 for i in range(200)], ttft=0.15),  # TTFT 50 % worse
        table([200 + i * 0.5 for i in range(200)], ttft=0.12 + ABSOLUTE_SLACK_S / 2),  # within
        table([300 + i * 0.5 for i in range(200)], ttft=0.1, queue=0.5),  # queue 50x worse
    )
    assert breach_seconds(run, lambda p: [ref], [(0, 400)], 100, LIMITS) == 200
    assert breach_seconds(run, lambda p: [ref], [(0, 400)], 100, LIMITS[:1]) == 100
    assert breach_seconds(run, lambda p: [ref], [(0, 400)], 100, []) == 0


def test_a_run_is_charged_only_where_it_is_worse_than_both_the_untuned_arm_and_the_oracle():
    oracle = table([i * 0.5 for i in range(400)], ttft=0.1)
    untuned = table([i * 0.5 for i in range(400)], ttft=0.3)  # the initial arm: 3x the oracle
    run = concat(
        table([i * 0.5 for i in range(200)], ttft=0.3),  # 0-100 s: still untuned, as before
        table([100 + i * 0.5 for i in range(200)], ttft=0.6),  # a trial twice as bad as that
    )
    assert breach_seconds(run, lambda p: [oracle], [(0, 200)], 100, LIMITS) == 200
    assert breach_seconds(run, lambda p: [untuned, oracle], [(0, 200)], 100, LIMITS) == 100
    # A reference without enough requests in a window is left out; with none, no judgement.
    thin = table([1.0], ttft=0.1)
    assert breach_seconds(run, lambda p: [untuned, thin], [(0, 200)], 100, LIMITS) == 100
    assert breach_seconds(run, lambda p: [thin], [(0, 200)], 100, LIMITS) == 0


def test_a_window_with_too_few_requests_is_not_judged():
    ref = table([float(i) for i in range(100)], ttft=0.1)
    run = table([1.0, 2.0, 3.0], ttft=5.0)
    assert breach_seconds(run, lambda p: [ref], [(0, 100)], 100, LIMITS) == 0


def test_two_samples_of_one_distribution_do_not_breach_but_a_real_shift_does():
    rng = np.random.default_rng(0)

    def bursty(scale: float) -> RequestTable:
        t = table([i * 0.5 for i in range(600)], ttft=0.1)
        return RequestTable(
            t.finish_s, t.tpot_s, t.ttft_s, rng.lognormal(-4, 1.2, 600) * scale, t.e2e_s,
            t.output_tokens,
        )  # fmt: skip

    ref = bursty(1.0)
    refs = [ref]
    same = [breach_seconds(bursty(1.0), lambda p: refs, [(0, 300)], 100, LIMITS) for _ in range(20)]
    assert sum(same) == 0
    assert breach_seconds(bursty(5.0), lambda p: [ref], [(0, 300)], 100, LIMITS) == 300


def test_the_p95_interval_brackets_the_estimate_and_narrows_with_more_requests():
    rng = np.random.default_rng(1)
    small = p95_interval(rng.exponential(1.0, 100))
    large = p95_interval(rng.exponential(1.0, 10_000))
    assert small[1] <= small[0] <= small[2]
    assert large[2] - large[1] < small[2] - small[1]
    assert all(math.isnan(x) for x in p95_interval(np.zeros(0)))


def test_recovery_is_the_time_until_the_served_arms_stay_within_the_threshold():
    eff = {"old": 0.6, "good": 0.97, "near": 0.96, "bad": 0.8}
    # Served at the event already good enough: recovered at once.
    assert recovery_seconds(1800, 3600, [(0, "good")], eff) == 0
    # Back once the rollout of a good arm ended, not at the promotion's start.
    assert recovery_seconds(1800, 3600, [(0, "old"), (2400, "good")], eff) == 600
    # A later, worse arm undoes it; the return after that is what counts.
    served = [(0, "old"), (2000, "good"), (2500, "bad"), (3000, "near")]
    assert recovery_seconds(1800, 3600, served, eff) == 1200
    # Never back by the phase's end (a rollout ending after it does not count).
    assert recovery_seconds(1800, 3600, [(0, "old"), (3700, "good")], eff) is None
    assert recovery_seconds(1800, 3600, [(0, "old"), (2000, "good"), (3000, "bad")], eff) is None


def spread_table(start: float, end: float, tpot: float, n: int = 300) -> RequestTable:
    """n requests finished evenly over [start, end), TPOTs spread ±20 % around ``tpot``."""
    f = np.linspace(start, end, n, endpoint=False)
    values = tpot * (0.8 + 0.4 * ((np.arange(n) * 7919) % n) / n)
    return RequestTable(f, values, np.full(n, 0.2), np.full(n, 0.01), np.full(n, 1.0),
                        np.full(n, 10.0))  # fmt: skip


def test_seconds_worse_than_initial_count_only_what_was_served_worse_after_a_promotion():
    runs = {
        "initial": spread_table(0, 1200, 0.020),
        "worse": spread_table(0, 1200, 0.030),
        "better": spread_table(0, 1200, 0.015),
        "alike": spread_table(0, 1200, 0.0201),
    }
    phases = [(0.0, 1200.0)]

    def worse(served: list[tuple[float, str]], first: float | None) -> float:
        return worse_seconds(served, first, runs.__getitem__, "initial", Metric.TPOT_P95,
                             phases, 300)  # fmt: skip

    assert worse([(0.0, "initial")], None) == 0
    # Promoted at 450 s, rolled back at 900 s.
    served = [(0.0, "initial"), (450.0, "worse"), (900.0, "initial")]
    assert worse(served, 450.0) == 450.0
    assert worse([(0.0, "initial"), (450.0, "better")], 450.0) == 0
    # Within the noise of the same requests: not worse with confidence.
    assert worse([(0.0, "initial"), (450.0, "alike")], 450.0) == 0


def tokens_table(finish: np.ndarray) -> RequestTable:
    """Requests of 100 output tokens each, finished at ``finish``."""
    n = finish.size
    return RequestTable(np.sort(finish), np.full(n, 0.02), np.full(n, 0.2), np.full(n, 0.01),
                        np.full(n, 1.0), np.full(n, 100.0))  # fmt: skip


def test_a_throughput_is_worse_only_where_the_arm_fell_behind_not_where_the_other_caught_up():
    # The same 2,400 requests arrive over 1,200 s. The initial arm, slower, leaves 200 of
    # those of the first 600 s unfinished until 600-660 s (its backlog once the load drops):
    # in the window 600-900 s it finishes more tokens than the faster arm, which finished
    # them on time. The faster arm was ahead all along, and is not worse there. An arm
    # that never finishes the last 200 requests fell behind, and is.
    arrivals = np.linspace(0.0, 1200.0, 2400, endpoint=False)
    late = np.where((arrivals >= 400) & (arrivals < 600), 600 + (arrivals - 400) * 0.3, arrivals)
    runs = {
        "initial": tokens_table(late),
        "faster": tokens_table(arrivals),
        "behind": tokens_table(arrivals[arrivals < 1100]),
    }

    def worse(arm: str) -> float:
        served = [(0.0, "initial"), (300.0, arm)]
        return worse_seconds(served, 300.0, runs.__getitem__, "initial",
                             Metric.OUTPUT_TOKENS_PER_SECOND, [(0.0, 1200.0)], 300)  # fmt: skip

    assert float(runs["initial"].between(600, 900).output_tokens.sum()) > 1.1 * float(
        runs["faster"].between(600, 900).output_tokens.sum()
    )
    assert worse("faster") == 0
    assert worse("behind") == 300
