"""The in-place strategy: trials patch the target, a stuck one is rolled back, windows pair.

The actuator runs over a fake Kubernetes actuator (``tests/unit/operator/fakes.py``) whose
Deployment rolls out at once unless a test says otherwise; the metrics adapter over a fake
windowed source. What is asserted is what a user sees on the target: its arguments, its
annotations, and which windows the trial was compared with.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from spectune.control.ports import Group
from spectune.engines import Dialect
from spectune.k8s.deployments import ANNOTATION_FINGERPRINT, DrafterArgs
from spectune.k8s.inplace import (
    ANNOTATION_INCUMBENT,
    ANNOTATION_TRIAL,
    InPlaceActuator,
    InPlaceMetrics,
)
from spectune.metrics.observation import Observation
from spectune.search.arms import Arm
from spectune.search.history import History, WindowRecord
from spectune.search.objective import WindowStats
from tests.unit.operator.fakes import EAGLE, FakeKube, FakeWorld, adopted

DRAFTERS = {"eagle3": DrafterArgs("eagle3", "eagle3", EAGLE)}


def _actuator(world: FakeWorld) -> InPlaceActuator:
    if world.target is not None:
        adopted(world.target)  # the tuning loop adopts the target before any trial
    FakeKube.world = world
    kube = FakeKube(None, {}, "llama", "vllm", "vllm", DRAFTERS)
    return InPlaceActuator(kube)  # type: ignore[arg-type]


def _args(world: FakeWorld) -> list[str]:
    return list(world.target["spec"]["template"]["spec"]["containers"][0]["args"])  # type: ignore[index]


def _notes(world: FakeWorld) -> dict[str, str]:
    return dict(world.target["metadata"]["annotations"])  # type: ignore[index]


def _stick(world: FakeWorld) -> None:
    """The rollout passes its progress deadline (as the Deployment controller reports it)."""
    world.target["status"]["conditions"] = [  # type: ignore[index]
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
         "message": 'ReplicaSet "llama-7d" has timed out progressing.'}
    ]  # fmt: skip


def _unstick(world: FakeWorld) -> None:
    world.target["status"].pop("conditions", None)  # type: ignore[index]


async def test_a_trial_patches_the_target_and_promotion_keeps_it_without_a_restart() -> None:
    world = FakeWorld()
    act = _actuator(world)
    dep = await act.deployment()
    assert dep.incumbent.name == "off" and dep.canary is None

    await act.start_canary(Arm("eagle3", 3))
    assert "--speculative-config" in _args(world)
    assert _notes(world)[ANNOTATION_TRIAL] == "eagle3/3"
    assert _notes(world)[ANNOTATION_INCUMBENT] == "off"
    dep = await act.deployment()
    assert dep.incumbent.name == "off"
    assert dep.canary is not None and dep.canary.name == "eagle3/3" and dep.canary_ready
    assert not dep.rolling

    generation = world.target["metadata"]["generation"]  # type: ignore[index]
    # The controller's promotion of the trial's arm: stop, then promote, in one step.
    await act.stop_canary()
    await act.promote(Arm("eagle3", 3))
    await act.settle()
    assert world.target["metadata"]["generation"] == generation, "restarted the pods"  # type: ignore[index]
    assert ANNOTATION_TRIAL not in _notes(world) and ANNOTATION_INCUMBENT not in _notes(world)
    dep = await act.deployment()
    assert dep.incumbent.name == "eagle3/3" and dep.canary is None


async def test_ending_a_trial_rolls_the_target_back_to_the_incumbent() -> None:
    world = FakeWorld()
    act = _actuator(world)
    before = _args(world)
    await act.start_canary(Arm("eagle3", 2))
    await act.start_canary(Arm("eagle3", 3))  # the next arm: straight from one to the other
    assert _notes(world)[ANNOTATION_INCUMBENT] == "off"
    await act.stop_canary()
    assert "--speculative-config" in _args(world), "rolled back before the step ended"
    await act.settle()
    assert _args(world) == before
    assert ANNOTATION_TRIAL not in _notes(world)
    fp = _notes(world)[ANNOTATION_FINGERPRINT]
    assert fp  # the rollback is recorded as the operator's own setting, not a human edit


async def test_a_stuck_trial_is_reported_rolled_back_and_the_next_waits_for_it() -> None:
    world = FakeWorld()
    act = _actuator(world)
    before = _args(world)
    await act.start_canary(Arm("eagle3", 3))
    _stick(world)
    dep = await act.deployment()
    assert dep.canary_failure is not None and "timed out progressing" in dep.canary_failure
    assert not dep.canary_ready

    # The controller marks it infeasible, stops it and picks the next arm in the same step.
    await act.stop_canary()
    await act.start_canary(Arm("eagle3", 1))
    assert _args(world) == before, "the stuck arm was not rolled back first"
    assert _notes(world)[ANNOTATION_TRIAL] == "eagle3/1"
    _stick(world)  # the rollback is still rolling
    dep = await act.deployment()
    assert dep.canary is not None and dep.canary.name == "eagle3/1" and not dep.canary_ready
    assert _args(world) == before
    _unstick(world)  # the incumbent is back and ready: the next trial starts
    await act.deployment()
    assert '"num_speculative_tokens":1' in " ".join(_args(world)).replace(" ", "")
    dep = await act.deployment()
    assert dep.canary is not None and dep.canary_ready


async def test_a_hand_edit_during_a_trial_is_not_rolled_back() -> None:
    world = FakeWorld()
    act = _actuator(world)
    await act.start_canary(Arm("eagle3", 3))
    c = world.target["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    c["args"] = ["serve", c["args"][1], "--max-num-seqs", "64"]  # a human removes speculation
    edited = list(c["args"])
    await act.stop_canary()
    await act.settle()
    assert _args(world) == edited
    assert ANNOTATION_TRIAL not in _notes(world)


# -- metrics --------------------------------------------------------------------------------------


def _obs(running: float, tag: str) -> Observation:
    return Observation(Dialect.VLLM_V1, 10.0, (tag,), None, running=running)


class FakeSource:
    """A fake windowed source: the target's next observations, in order."""

    def __init__(self) -> None:
        self.next: list[Observation] = []
        self.past: list[tuple[float, float]] = []

    async def observe(self, window_s: float) -> Observation:
        return self.next.pop(0)


def _metrics(
    src: FakeSource, arms: list[tuple[str | None, str | None]], history: History, past: Any
) -> InPlaceMetrics:
    t = [100.0]

    async def sleep(s: float) -> None:
        t[0] += s

    return InPlaceMetrics(
        src, lambda: arms[0], lambda: history, lambda: t[0], sleep, False, past, 1.6
    )


async def test_trial_windows_pair_with_the_incumbents_latest_window_at_the_same_load() -> None:
    src = FakeSource()
    arms: list[tuple[str | None, str | None]] = [("off", None)]
    m = _metrics(src, arms, History(), None)
    src.next = [_obs(4, "off-low"), _obs(20, "off-high"), _obs(4.5, "off-low-2")]
    for _ in range(3):
        out = await m.observe(10)
        assert set(out) == {Group.INCUMBENT}
    arms[0] = ("off", "eagle3/3")
    src.next = [_obs(4.2, "trial-low"), _obs(19, "trial-high"), _obs(4.1, "trial-low-2")]
    out = await m.observe(10)
    assert out[Group.CANARY].pods == ("trial-low",)
    assert out[Group.INCUMBENT].pods == ("off-low-2",)  # the most recent at this load
    out = await m.observe(10)
    assert out[Group.INCUMBENT].pods == ("off-high",)
    out = await m.observe(10)
    assert out[Group.INCUMBENT].pods == ("off-low",), "a fresh incumbent window is preferred"


async def test_no_incumbent_window_at_the_load_leaves_the_trial_window_unpaired() -> None:
    src = FakeSource()
    arms: list[tuple[str | None, str | None]] = [("off", None)]
    m = _metrics(src, arms, History(), None)
    src.next = [_obs(4, "off")]
    await m.observe(10)
    arms[0] = ("off", "eagle3/3")
    src.next = [_obs(30, "trial")]
    out = await m.observe(10)
    assert set(out) == {Group.CANARY}


def _stats(running: float) -> WindowStats:
    n = math.nan
    return WindowStats(
        objective=0.03, objective_low=n, objective_high=n, requests=100, tpot_mean=0.03,
        tpot_p95=0.03, ttft_p95=0.2, ttft_p95_low=n, ttft_p95_high=n, queue_p95=0.0,
        queue_p95_low=n, queue_p95_high=n, e2e_p95=n, tokens_per_s=n, running=running, pods=1,
        k=0, drafts=0.0, accepted_per_pos=(), mean_accepted_length=n, num_gpu_blocks=None,
        preemptions=0.0,
    )  # fmt: skip


async def test_after_a_restart_the_incumbent_window_is_read_again_from_prometheus() -> None:
    """A new operator process has no windows in memory: the history says when the
    incumbent's windows ran, and Prometheus is asked for the one at the trial's load."""
    history = (
        History()
        .add_baseline(WindowRecord(0.0, 10.0, _stats(4.0), None, "off"))
        .add_baseline(WindowRecord(10.0, 20.0, _stats(25.0), None, "off"))
    )
    asked: list[tuple[float, float]] = []

    async def past(window_s: float, end_s: float) -> Observation:
        asked.append((window_s, end_s))
        return _obs(4.0, f"off@{end_s:g}")

    src = FakeSource()
    m = _metrics(src, [("off", "eagle3/3")], history, past)
    src.next = [_obs(4.3, "trial")]
    out = await m.observe(10)
    assert asked == [(10.0, 10.0)], "asked for the window at another load"
    assert out[Group.INCUMBENT].pods == ("off@10",)


@pytest.mark.parametrize("running", [None, math.nan])
async def test_unknown_load_counts_as_the_same(running: float | None) -> None:
    src = FakeSource()
    arms: list[tuple[str | None, str | None]] = [("off", None)]
    m = _metrics(src, arms, History(), None)
    src.next = [Observation(Dialect.VLLM_V1, 10.0, ("off",), None, running=running)]
    await m.observe(10)
    arms[0] = ("off", "eagle3/3")
    src.next = [_obs(8, "trial")]
    assert Group.INCUMBENT in await m.observe(10)
