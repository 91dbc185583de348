"""Restart safety in the simulator: a controller killed mid-trial resumes from its history.

The operator keeps only `status.history` (the trial history and the loop's state, as
JSON). Here the controller is dropped in the middle of a trial while the simulated fleet
runs on; a new controller built from that JSON over the same fleet must reach the same
decision as an uninterrupted run, without repeating a trial that had finished.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from importlib import resources
from pathlib import Path

from spectune.bench.oracle import search_space
from spectune.bench.runner import sim_controller
from spectune.control.controller import Controller, ControllerState, Phase
from spectune.search.history import History, Outcome
from spectune.search.spectune_policy import SpectunePolicy
from spectune.sim.scenario import load_scenario

SCENARIO = Path(str(resources.files("spectune") / "examples/scenarios/chat-eagle3.yaml"))


def _run(c: Controller, until: float, stop: object = None) -> None:
    async def drive() -> None:
        while c.clock.now() < until:
            await c.step()
            if stop is not None and stop():  # type: ignore[operator]
                return

    asyncio.run(drive())


def test_a_controller_killed_mid_trial_resumes_to_the_same_decision() -> None:
    # Longer than the file's 2400 s, so that the search ends on whole windows.
    scenario = load_scenario(SCENARIO).model_copy(update={"duration_s": 3600})
    end = float(scenario.duration_s)
    space = search_space(scenario)

    fresh, fresh_stage, _ = sim_controller(scenario, SpectunePolicy(), space, seed=1)
    _run(fresh, end)
    assert fresh.state.phase is Phase.MONITORING

    first, stage, clock = sim_controller(scenario, SpectunePolicy(), space, seed=1)

    def mid_trial() -> bool:
        trials = first.history.in_epoch()
        finished = [t for t in trials if t.outcome is not Outcome.RUNNING]
        return len(finished) >= 2 and trials[-1].outcome is Outcome.RUNNING

    _run(first, end, stop=mid_trial)
    assert mid_trial(), "the run never reached a second trial"
    saved = first.history.to_json()
    state: ControllerState = first.state
    done_before = [t.arm for t in first.history.in_epoch() if t.outcome is not Outcome.RUNNING]

    # The operator dies; the fleet (the cluster) runs on for a while without it.
    asyncio.run(clock.sleep(120))
    resumed = Controller(
        SpectunePolicy(), first.actuator, first.metrics, clock, space, first.objective,
        first.config, history=History.from_json(saved), state=replace(state),
    )  # fmt: skip
    _run(resumed, end)

    assert resumed.state.phase is Phase.MONITORING
    assert stage.incumbent == fresh_stage.incumbent
    started_after = [t.arm for t in resumed.history.in_epoch()][len(done_before) + 1 :]
    # No arm is measured again that the uninterrupted run did not measure again too.
    fresh_arms = [t.arm for t in fresh.history.in_epoch()]
    retried = {a for a in fresh_arms if fresh_arms.count(a) > 1}
    assert not (set(started_after) & set(done_before)) - retried
    assert [t.arm for t in resumed.history.in_epoch()][: len(done_before)] == done_before
