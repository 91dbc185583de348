"""A target an autoscaler scaled to zero: tuning waits, says so, and resumes (issue #28 item 6).

KEDA (``minReplicaCount: 0``) scales an idle serving Deployment to zero pods. No pod serves,
so a window measures nothing and a canary would be the only pod, with no incumbent under the
same traffic. The user reads ``Ready=False, reason=ScaledToZero``; the running trial ends,
its canary goes, the target is not touched, and tuning resumes once it has replicas.
"""

from __future__ import annotations

import copy

from spectune.k8s import tuning
from tests.unit.operator.fakes import FakeWorld, adopted, target
from tests.unit.operator.test_tuning_loop import _body, _condition, _loop, _mid_trial


def test_scaled_to_zero_is_spec_replicas_zero_only() -> None:
    t = target()
    assert not tuning.scaled_to_zero(t)
    t["spec"]["replicas"] = 0
    assert tuning.scaled_to_zero(t)
    del t["spec"]["replicas"]  # the API server's default is 1
    assert not tuning.scaled_to_zero(t)


async def test_a_target_scaled_to_zero_waits_and_resumes(world: FakeWorld) -> None:
    world.target = adopted(target())
    body = _body()
    _mid_trial(body)
    world.canaries.append(tuning.arm_from_spec(None, {}))  # the trial's canary is up
    loop = _loop(world, body)
    world.target["spec"]["replicas"] = 0
    before = copy.deepcopy(world.target)
    await loop.turn()
    ready = _condition(world, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ScaledToZero"), ready
    assert "Deployment llama has 0 replicas" in ready["message"]
    assert "resumes when the target has replicas again" in ready["message"]
    assert world.status["trials"][-1]["outcome"] == "aborted"
    assert not world.canaries, "the trial's canary is removed"
    assert world.target == before, "the target is not touched (never scaled up by spectune)"
    await loop.turn()
    assert world.reasons().count("ScaledToZero") == 1, "one event, not one per look"

    world.target["spec"]["replicas"] = 2  # traffic is back: KEDA scales it up
    await loop.turn()
    assert _condition(world, "Ready")["reason"] != "ScaledToZero"
