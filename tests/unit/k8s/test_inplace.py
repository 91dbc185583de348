"""The in-place strategy: trials patch the target, a stuck one is rolled back, and a trial
is a switchback: the target alternates A/B/A/B, each stretch after a wash-out, in pairs.

The actuator runs over a fake Kubernetes actuator (``tests/unit/operator/fakes.py``) whose
Deployment rolls out at once unless a test says otherwise; the metrics adapter over a fake
windowed source and a fake clock. What is asserted is what a user sees on the target: its
arguments, its annotations, its restarts, and which stretches each window compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spectune.control.ports import Group
from spectune.engines import Dialect
from spectune.errors import NoDataError
from spectune.k8s.deployments import (
    ANNOTATION_FINGERPRINT,
    DrafterArgs,
    arm_from_spec,
    current_spec,
)
from spectune.k8s.inplace import (
    ANNOTATION_INCUMBENT,
    ANNOTATION_STRETCH,
    ANNOTATION_TRIAL,
    InPlaceActuator,
    Stretch,
    SwitchbackMetrics,
)
from spectune.metrics.observation import Observation
from spectune.search.arms import Arm
from tests.unit.operator.fakes import EAGLE, FakeKube, FakeWorld, adopted

DRAFTERS = {"eagle3": DrafterArgs("eagle3", "eagle3", EAGLE)}


def _actuator(world: FakeWorld, restarts: list[tuple[str, str]] | None = None) -> InPlaceActuator:
    if world.target is not None:
        adopted(world.target)  # the tuning loop adopts the target before any trial
    FakeKube.world = world
    kube = FakeKube(None, {}, "llama", "vllm", "vllm", DRAFTERS)
    act = InPlaceActuator(kube)  # type: ignore[arg-type]
    if restarts is not None:
        act.on_restart = lambda trial, to, _stretch: restarts.append((trial, to))
    return act


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


# -- the switchback ------------------------------------------------------------------------------

WINDOW = 300.0
WASHOUT = 60.0
ROLLOUT = 45.0
POLL = 15.0


def _arm_of(world: FakeWorld) -> str:
    assert world.target is not None
    return arm_from_spec(current_spec(world.target, "vllm", "vllm"), DRAFTERS).name


@dataclass
class FakeRollouts:
    """A fake clock over a fake world whose every restart of the target takes ``ROLLOUT``
    seconds to become ready (the Deployment's status says so meanwhile)."""

    world: FakeWorld
    now: float = 1000.0
    ready_at: float = 0.0
    arms: list[str] = field(default_factory=list)
    """The arm of the target's pod template after every change of it (what kubectl shows)."""
    ready: list[tuple[float, str]] = field(default_factory=list)
    """(when, arm) each rollout became ready."""

    def __post_init__(self) -> None:
        patch = self.world.patch_target
        self.arms.append(_arm_of(self.world))

        def patched(body: dict[str, object]) -> None:
            before = _arm_of(self.world)
            patch(body)  # type: ignore[arg-type]
            if _arm_of(self.world) != before:
                self.arms.append(_arm_of(self.world))
                self.ready_at = self.now + ROLLOUT
                self.world.target["status"]["updatedReplicas"] = 0  # type: ignore[index]

        self.world.patch_target = patched  # type: ignore[method-assign]

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        status = self.world.target["status"]  # type: ignore[index]
        if status["updatedReplicas"] == 0 and self.now >= self.ready_at:
            status["updatedReplicas"] = 1
            self.ready.append((self.ready_at, _arm_of(self.world)))


class FakeTargetSource:
    """A fake source of the target's pods: each window is tagged with the arm the target runs
    and when it ended (the fake clock's time)."""

    def __init__(self, clock: FakeRollouts) -> None:
        self.clock = clock
        self.windows: list[tuple[float, str]] = []
        self.empty = False

    async def observe(self, window_s: float) -> Observation:
        arm = _arm_of(self.clock.world)
        if self.empty:
            raise NoDataError("no series (a fake)")
        self.windows.append((self.clock.now, arm))
        return Observation(Dialect.VLLM_V1, window_s, (f"{arm}@{self.clock.now:g}",), None)


def _switchback(
    world: FakeWorld, trial: Arm | None
) -> tuple[InPlaceActuator, SwitchbackMetrics, FakeRollouts, FakeTargetSource, list[str]]:
    restarts: list[tuple[str, str]] = []
    act = _actuator(world, restarts)
    clock = FakeRollouts(world)
    src = FakeTargetSource(clock)

    def arms() -> tuple[str | None, str | None]:
        return "off", None if trial is None else trial.name

    m = SwitchbackMetrics(src, act, arms, clock.sleep, False, WASHOUT, POLL, 1800.0)
    return act, m, clock, src, [to for _, to in restarts]


async def test_a_trial_window_is_an_a_b_pair_and_the_target_alternates_a_b_a_b() -> None:
    world = FakeWorld()
    trial = Arm("eagle3", 3)
    act, m, clock, src, _ = _switchback(world, trial)
    restarts: list[str] = []
    act.on_restart = lambda _t, to, _s: restarts.append(to)
    await act.start_canary(trial)
    await clock.sleep(ROLLOUT)  # the controller polls until the trial's rollout is ready
    dep = await act.deployment()
    assert dep.canary == trial and dep.canary_ready

    out = await m.observe(WINDOW)
    assert out[Group.CANARY].pods[0].startswith("eagle3/3@")
    assert out[Group.INCUMBENT].pods[0].startswith("off@")
    assert _arm_of(world) == "off", "a pair ends on the incumbent"
    assert _notes(world)[ANNOTATION_TRIAL] == "eagle3/3", "the trial goes on"
    assert _notes(world)[ANNOTATION_STRETCH] == "incumbent"

    # Between pairs the trial is under way, not waiting for a rollback: its arm is ready.
    dep = await act.deployment()
    assert dep.canary == trial and dep.canary_ready and dep.incumbent.name == "off"
    assert _arm_of(world) == "off", "deployment() restarted the target"
    out = await m.observe(WINDOW)
    assert [arm for _, arm in src.windows] == ["eagle3/3", "off", "eagle3/3", "off"]
    assert clock.arms == ["off", "eagle3/3", "off", "eagle3/3", "off"]
    assert restarts == ["eagle3/3", "off", "eagle3/3", "off"], "two restarts per pair"
    # The trial ends where the last pair left it, on the incumbent: no restart to roll back.
    generation = world.target["metadata"]["generation"]  # type: ignore[index]
    await act.stop_canary()
    await act.settle()
    assert world.target["metadata"]["generation"] == generation  # type: ignore[index]
    assert not {ANNOTATION_TRIAL, ANNOTATION_INCUMBENT, ANNOTATION_STRETCH} & set(_notes(world))
    assert restarts == ["eagle3/3", "off", "eagle3/3", "off"]


async def test_no_window_is_measured_during_a_rollout_or_its_washout() -> None:
    world = FakeWorld()
    trial = Arm("eagle3", 2)
    act, m, clock, src, _ = _switchback(world, trial)
    await act.start_canary(trial)
    await clock.sleep(ROLLOUT)
    for _ in range(2):
        await m.observe(WINDOW)
        await act.deployment()
    assert len(src.windows) == 4
    for end, arm in src.windows:
        ready = max(at for at, a in clock.ready if a == arm and at <= end)
        assert end - WINDOW >= ready + WASHOUT, (
            f"{arm}'s window starting {end - WINDOW:g} began within the wash-out after its "
            f"rollout was ready at {ready:g}"
        )
    # The whole wash-out, and no more than a poll past it: the window follows at once.
    starts = [end - WINDOW for end, _ in src.windows]
    readies = [at for at, _ in clock.ready]
    assert all(s - r <= WASHOUT + POLL for s, r in zip(starts[1:], readies[1:], strict=False))


async def test_outside_a_trial_a_window_is_the_targets_alone_and_nothing_restarts() -> None:
    world = FakeWorld()
    _, m, clock, src, _ = _switchback(world, None)
    out = await m.observe(WINDOW)
    assert set(out) == {Group.INCUMBENT}
    assert clock.arms == ["off"] and len(src.windows) == 1


async def test_a_restart_that_gets_stuck_ends_the_pair_with_the_trial_stretch_alone() -> None:
    world = FakeWorld()
    trial = Arm("eagle3", 3)
    act, m, clock, src, _ = _switchback(world, trial)
    await act.start_canary(trial)
    await clock.sleep(ROLLOUT)
    patch = world.patch_target

    def stuck(body: dict[str, object]) -> None:
        patch(body)  # type: ignore[arg-type]
        _stick(world)

    world.patch_target = stuck  # type: ignore[method-assign]
    out = await m.observe(WINDOW)
    assert set(out) == {Group.CANARY}, "an incumbent stretch that never ran was paired"
    assert [arm for _, arm in src.windows] == ["eagle3/3"]


async def test_a_trial_stretch_without_data_pairs_nothing_and_keeps_the_target_on_it() -> None:
    world = FakeWorld()
    trial = Arm("eagle3", 3)
    act, m, clock, src, _ = _switchback(world, trial)
    await act.start_canary(trial)
    await clock.sleep(ROLLOUT)
    src.empty = True
    assert await m.observe(WINDOW) == {}
    assert _arm_of(world) == "eagle3/3" and clock.arms == ["off", "eagle3/3"]


async def test_a_trial_ended_on_its_trial_stretch_rolls_back_and_counts_the_restart() -> None:
    world = FakeWorld()
    restarts: list[tuple[str, str]] = []
    act = _actuator(world, restarts)
    await act.start_canary(Arm("eagle3", 3))
    await act.stop_canary()
    await act.settle()
    assert restarts == [("eagle3/3", "eagle3/3"), ("eagle3/3", "off")]


async def test_switching_to_the_stretch_the_target_is_on_restarts_nothing() -> None:
    world = FakeWorld()
    restarts: list[tuple[str, str]] = []
    act = _actuator(world, restarts)
    await act.start_canary(Arm("eagle3", 3))
    assert not await act.switch(Stretch.TRIAL)
    assert await act.switch(Stretch.INCUMBENT)
    assert not await act.switch(Stretch.INCUMBENT)
    assert restarts == [("eagle3/3", "eagle3/3"), ("eagle3/3", "off")]
