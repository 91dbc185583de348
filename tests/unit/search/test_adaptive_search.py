"""A listed in-engine adaptive arm races fixed-k arms in the same search, on its own trial.

The counterfactual that reads every shorter k off one measured k does not hold for an arm
whose k moves per step, per request or per tier: the search must never price such an arm
from another arm's counters, and must run it before it can promote it.
"""

from __future__ import annotations

from dataclasses import replace

from spectune.bench.oracle import search_space
from spectune.bench.runner import drive, sim_controller
from spectune.search.arms import parse_arm
from spectune.search.history import Outcome
from spectune.search.model import build_beliefs
from spectune.search.spectune_policy import SpectunePolicy
from spectune.sim import load_scenario

VERIFY = "eagle3/verify:5:1-16=4,17-1024=2"


def _search(adaptive: str) -> tuple[object, object]:
    scenario = load_scenario("operator/spectune/examples/scenarios/chat-eagle3.yaml")
    space = replace(search_space(scenario), adaptive=(parse_arm(adaptive),))
    controller, _, clock = sim_controller(scenario, SpectunePolicy(), space, seed=1)
    drive(controller, clock, scenario.duration_s)
    return controller, space


def test_an_adaptive_arm_gets_its_own_measured_trial() -> None:
    controller, _ = _search(VERIFY)
    history = controller.history  # type: ignore[attr-defined]
    trials = [t for t in history.trials if t.arm == VERIFY]
    assert trials and trials[0].outcome is Outcome.MEASURED and trials[0].windows
    # ...and fixed-k arms of the same drafter ran beside it in the same search
    assert any(t.arm.startswith("eagle3/") and t.arm != VERIFY for t in history.trials)


def test_an_adaptive_arm_is_never_read_off_another_arms_counters() -> None:
    controller, space = _search(VERIFY)
    history = controller.history  # type: ignore[attr-defined]
    before = replace(history, trials=tuple(t for t in history.trials if t.arm != VERIFY))
    beliefs = build_beliefs(space, before, parse_arm("eagle3/3"), True, 30)  # type: ignore[arg-type]
    # eagle3's shorter k are predicted from its measured ones; the adaptive arm is not
    assert any(not b.measured for b in beliefs.arms.values() if b.arm.drafter == "eagle3")
    assert VERIFY not in beliefs.arms
    after = build_beliefs(space, history, parse_arm("eagle3/3"), True, 30)  # type: ignore[arg-type]
    assert VERIFY not in after.arms or after.arms[VERIFY].measured
