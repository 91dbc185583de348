"""Each baseline behaves as its name says when the bench runs it on the tiny scenario."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from spectune.bench.runner import BenchResult
from tests.unit.bench.conftest import TINY_ARMS


def started(result: BenchResult) -> list[str]:
    return [e.message.split(" ")[0] for e in result.events if e.reason == "TrialStarted"]


def test_oracle_follows_the_best_arm_of_every_phase(bench: Callable[..., BenchResult]):
    result = bench("oracle", "drift")
    assert [p.chosen_arm for p in result.phases] == [p.oracle_arm for p in result.phases]
    assert result.efficiency == 1.0
    assert started(result) == []  # it never needs a canary


def test_a_static_arm_loses_the_phase_it_does_not_fit(bench: Callable[..., BenchResult]):
    first = bench("oracle", "drift").phases[0].oracle_arm
    result = bench(f"static:{first}", "drift")
    assert result.phases[0].efficiency == 1.0
    assert result.phases[1].efficiency < 1.0
    assert result.efficiency == result.phases[1].efficiency


def test_acceptance_threshold_moves_k_in_place_and_never_judges_latency(
    bench: Callable[..., BenchResult],
):
    result = bench("acceptance-threshold", "drift")
    assert started(result) == []  # in place: promotions only
    arms = [arm for _, arm in result.promotions]
    assert arms[0] == "eagle3/3"
    # After the EAGLE head's acceptance collapses, k steps down one promotion at a time.
    ks = [int(a.split("/")[1]) if a != "off" else 0 for a in arms]
    assert ks == sorted(ks, reverse=True) and len(ks) >= 2
    assert all(b == a - 1 for a, b in itertools.pairwise(ks))
    assert result.trials == len(arms)


def test_ucb1_and_egreedy_explore_on_the_canary_without_a_model(
    bench: Callable[..., BenchResult],
):
    ucb = started(bench("ucb1"))
    # UCB1 pulls every non-incumbent arm once, in order, before its bonus ranks them.
    assert ucb[:4] == [a for a in TINY_ARMS if a != "off"]
    greedy = bench("egreedy")
    assert set(started(greedy)) <= set(TINY_ARMS) - {"off"}
    assert greedy.trials >= 1
