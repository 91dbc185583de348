"""The tuning loop's status writes and refusals, turn by turn, over the fakes of ``fakes.py``.

What a user sees in the SpecTuning's status (and what the API server is asked to write):
a write with nothing new is never sent, a write with only new figures waits for
``SPECTUNE_STATUS_INTERVAL_SECONDS`` and lands with nothing lost, a concurrent writer's
resourceVersion makes the fake refuse the write as the API server does (409) and the loop
re-merges over the fresh status, and a drafter model a ``--trust-remote-code`` target may
not run fails the spec with nothing created (issue [O] items 5, 8 and 9).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from spectune.k8s import tuning
from spectune.k8s.projection import decode_memory
from tests.unit.operator.fakes import MODEL, FakeWorld, target
from tests.unit.operator.test_tuning_loop import (  # the same loop
    FakeClock,
    _body,
    _condition,
    _loop,
    _mid_trial,
)


async def test_a_suspended_loop_looking_again_writes_nothing_new(world: FakeWorld) -> None:
    """Suspended, the loop looks every poll (1 s) for 30 s, three status intervals; the
    status it would write is the same each time, so it is written once (it used to be
    written on every look)."""
    loop = _loop(world, _body(suspend=True))
    for _ in range(30):
        await loop.turn()
    assert world.status["phase"] == "Suspended"
    assert len(world.status_writes) == 1, [w.get("phase") for w in world.status_writes]


async def test_new_figures_wait_for_the_interval_and_land_whole(world: FakeWorld) -> None:
    """A second failed window changes only a message (same phase, same condition reasons):
    with a 100 s interval it is held back, then written at the next look once the interval
    has passed; the third failure ends the trial (an outcome changes) and is written at
    once."""
    body = _body()
    _mid_trial(body)
    world.failing = True
    loop = _loop(world, body, failures=3)
    loop._settings = dataclasses.replace(loop._settings, status_interval_s=100.0)
    await loop.turn()
    assert "1 window(s) in a row" in _condition(world, "MetricsAvailable")["message"]
    writes = len(world.status_writes)
    await loop.turn()
    assert len(world.status_writes) == writes, "written before the interval passed"
    assert "1 window(s) in a row" in _condition(world, "MetricsAvailable")["message"]
    clock = loop._clock
    assert isinstance(clock, FakeClock)
    clock.t += 100.0
    await loop._wait()  # the next look
    assert "2 window(s) in a row" in _condition(world, "MetricsAvailable")["message"]
    await loop.turn()
    assert world.status["trials"][-1]["outcome"] == "aborted"


async def test_a_concurrent_writers_condition_survives_the_retry(world: FakeWorld) -> None:
    """Someone else writes the status (a condition of their own) right before the loop's
    patch: the fake refuses the stale resourceVersion with 409 as the API server does, the
    loop reads again and its write keeps the other writer's condition and the history."""
    body = _body()
    _mid_trial(body)
    world.failing = True
    other = {"type": "Reviewed", "status": "True", "reason": "PolicyCheck", "message": "ok",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    world.status = {**copy.deepcopy(body["status"]), "conditions": [other]}
    world.conflicts = 1
    loop = _loop(world, body)
    await loop.turn()
    assert world.answered_409 == 1
    assert _condition(world, "Reviewed")["reason"] == "PolicyCheck"
    assert decode_memory(world.status["history"])["history"]["trials"], world.status


class _OneLook(FakeClock):
    """Virtual time that bumps the SpecTuning's generation at its first sleep (a user edits
    the spec), so the wait of an invalid spec ends."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__()
        self.body = body

    async def sleep(self, seconds: float) -> None:
        await super().sleep(seconds)
        self.body["metadata"]["generation"] += 1


async def test_a_drafter_model_a_trusting_target_may_not_run_fails_the_spec(
    world: FakeWorld,
) -> None:
    """The target runs with --trust-remote-code and the drafter's model is allowed by
    neither list: Failed, ``Ready=False, reason=InvalidSpec`` naming the drafter and both
    keys of the fix; no canary, the target untouched (not even adopted)."""
    world.target = target(["serve", MODEL, "--trust-remote-code"])
    before = copy.deepcopy(world.target)
    body = _body()
    loop = _loop(world, body)
    loop._clock = _OneLook(body)
    await loop.turn()
    assert world.status["phase"] == "Failed"
    ready = _condition(world, "Ready")
    assert ready["reason"] == "InvalidSpec", ready
    assert "drafter 'eagle3'" in ready["message"], ready
    assert "spec.trustRemoteCode.allowedDrafterModels" in ready["message"], ready
    assert "SPECTUNE_DRAFTER_MODEL_ALLOW_LIST" in ready["message"], ready
    assert not world.canaries
    assert world.target == before


async def test_both_keys_let_the_drafter_run(world: FakeWorld) -> None:
    world.target = target(["serve", MODEL, "--trust-remote-code"])
    from tests.unit.operator.fakes import EAGLE

    body = _body(trustRemoteCode={"allowedDrafterModels": [EAGLE]})
    loop = _loop(world, body)
    loop._settings = dataclasses.replace(loop._settings, drafter_model_allow_list=("yuhuili/*",))
    await loop.turn()
    assert _condition(world, "Ready")["reason"] == "Tuning"
    assert tuning.ANNOTATION_FINGERPRINT in world.target["metadata"]["annotations"]  # type: ignore[index]


async def test_an_edit_during_the_step_pauses_and_the_promotion_writes_nothing(
    world: FakeWorld,
) -> None:
    """A hand edit lands while a step runs (a FAKE step stands in for a window that ends in
    a promotion: it edits the target, then promotes through the loop's real actuator
    chain). The promotion's guarded write finds the edit and writes nothing; the loop
    pauses with ``Ready=False, reason=HumanEdit`` and a Warning, and the edit stays."""
    import json

    from spectune.search.arms import Arm
    from tests.unit.operator.fakes import EAGLE

    world.failing = True
    loop = _loop(world, _body())
    await loop.turn()  # builds, adopts the target, one failed window
    built = loop._built
    assert built is not None
    config = json.dumps({"method": "eagle3", "model": EAGLE, "num_speculative_tokens": 2})
    edited = ["serve", MODEL, "--speculative-config", config]

    async def window_then_promote() -> None:
        world.target["spec"]["template"]["spec"]["containers"][0]["args"] = list(edited)  # type: ignore[index]
        await built.actuator.promote(Arm("eagle3", 3))

    built.controller.step = window_then_promote  # type: ignore[method-assign]
    await loop.turn()
    assert world.target["spec"]["template"]["spec"]["containers"][0]["args"] == edited  # type: ignore[index]
    ready = _condition(world, "Ready")
    assert ready["reason"] == "HumanEdit", ready
    assert "HumanEdit" in world.reasons()


async def test_an_adopted_hand_edit_is_announced_and_searched_from(world: FakeWorld) -> None:
    """A hand edit pauses the loop; removing the fingerprint annotation adopts it. The
    adoption is an event, the recommendation names the adopted arm and says why, and the
    search re-opens from it (a new epoch, Baseline) instead of carrying on as if spectune's
    own arm still ran."""
    import json

    from tests.unit.operator.fakes import EAGLE

    world.failing = True
    loop = _loop(world, _body())
    await loop.turn()  # builds, adopts the target as found (off), one failed window
    assert world.status["applied"]["arm"] == "off"
    assert "EditAdopted" not in world.reasons()  # adopting what spectune saw is no news
    config = json.dumps({"method": "eagle3", "model": EAGLE, "num_speculative_tokens": 2})
    world.target["spec"]["template"]["spec"]["containers"][0]["args"] = [  # type: ignore[index]
        "serve", MODEL, "--speculative-config", config,
    ]  # fmt: skip
    await loop.turn()
    assert _condition(world, "Ready")["reason"] == "HumanEdit"
    built = loop._built
    assert built is not None
    epoch = built.controller.history.epoch
    del world.target["metadata"]["annotations"][tuning.ANNOTATION_FINGERPRINT]  # type: ignore[index]
    await loop.turn()
    adopted = [m for _, r, m in world.events if r == "EditAdopted"]
    assert adopted and "eagle3/2 was adopted (spectune had applied off)" in adopted[0], adopted
    rec = world.status["recommendation"]
    assert rec["arm"] == "eagle3/2" and "adopted" in rec["reason"], rec
    assert world.status["applied"]["arm"] == "eagle3/2"
    assert built.controller.history.epoch == epoch + 1
    assert built.controller.state.floor_arm == "eagle3/2"


async def test_a_target_another_controller_owns_is_refused_unless_allowed(
    world: FakeWorld,
) -> None:
    """A Deployment that KServe (or llm-d, Dynamo, an Argo Rollout) owns is reconciled from
    that controller's object: a patch of its args is reverted, or fights the owner. It is
    refused with Ready=False, ManagedTarget naming the owner, and not even annotated; with
    spec.targetRef.allowManaged it is tuned. Status writes name the field manager."""
    world.failing = True
    world.target["metadata"]["ownerReferences"] = [  # type: ignore[index]
        {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
         "name": "llama", "uid": "isvc-1", "controller": True},
    ]  # fmt: skip
    before = copy.deepcopy(world.target)
    loop = _loop(world, _body())
    await loop.turn()
    ready = _condition(world, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ManagedTarget"), ready
    assert "InferenceService/llama" in ready["message"] and "allowManaged" in ready["message"]
    assert world.target == before  # nothing patched, not even the fingerprint annotation
    assert not world.canaries
    assert world.status_managers == {"spectune"}
    allowed = _body(targetRef={"name": "llama", "container": "vllm", "allowManaged": True})
    loop = _loop(world, allowed)
    await loop.turn()
    assert _condition(world, "Ready")["reason"] != "ManagedTarget"
    assert tuning.ANNOTATION_FINGERPRINT in world.target["metadata"]["annotations"]  # type: ignore[index]
