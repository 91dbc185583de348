"""The operator's tuning loop turn by turn, over fakes of the cluster and of Prometheus.

The real :class:`~spectune.k8s.tuning.TuningLoop` runs here (its controller, policy, status
projection and events); only the Kubernetes actuator, the Prometheus source and the
SpecTuning's API are fakes (``fakes.py``), so each behaviour a user would see in the status
and the events is checked in milliseconds. The integration tier checks the same behaviours
on a real API server.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from spectune import handlers
from spectune.control.controller import ControllerState
from spectune.control.controller import Phase as LoopPhase
from spectune.engines import Dialect
from spectune.k8s import tuning
from spectune.k8s.deployments import model_version
from spectune.k8s.projection import Memory, decode_memory
from spectune.metrics import Observation, SpecCounts
from spectune.search.history import History, TrialRecord
from spectune.settings import Settings
from tests.unit.control.test_controller import QUEUE_BOUNDS, fake_hist
from tests.unit.operator.fakes import EAGLE, FakeCustom, FakeWorld, target

TRIAL = "eagle3/3"


class FakeClock:
    """Virtual time: sleeping advances it at once."""

    def __init__(self) -> None:
        self.t = 1_000_000.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


def _body(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "spectune.io/v1alpha1",
        "kind": "SpecTuning",
        "metadata": {"name": "tune", "namespace": "ns", "uid": "u-1", "generation": 1,
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "targetRef": {"name": "llama", "container": "vllm"},
            "engine": "vllm",
            "metrics": {"prometheus": {"url": "http://prometheus:9090"}},
            "drafters": [{"name": "eagle3", "method": "eagle3", "model": EAGLE, "maxK": 3}],
            "search": {"window": "30s"},
            **spec,
        },
    }  # fmt: skip
    return body


def _mid_trial(body: dict[str, Any]) -> None:
    """Give the SpecTuning a status whose history has a trial of eagle3/3 under way."""
    history = History().add_trial(TrialRecord(arm=TRIAL, incumbent="off", epoch=0, started_s=0))
    version = model_version(target(), "vllm", "vllm")
    state = ControllerState(phase=LoopPhase.EXPLORING, model_version=version, routes=None)
    body["status"] = {"phase": "Exploring", "history": Memory(history, state, "off").to_json()}


def _loop(
    world: FakeWorld,
    body: dict[str, Any],
    failures: int = 3,
    claims: tuning.Claims | None = None,
    time_scale: float = 1.0,
) -> tuning.TuningLoop:
    settings = Settings(
        poll_s=1.0, metrics_failures=failures, metrics_port=0, liveness_port=0,
        time_scale=time_scale,
    )  # fmt: skip

    def emit(kind: str, reason: str, message: str) -> None:
        world.events.append((kind, reason, message))

    loop = tuning.TuningLoop(None, body, settings, FakeClock(), None, emit, claims)  # type: ignore[arg-type]
    loop._custom = FakeCustom(world, body)  # type: ignore[assignment]
    return loop


def _condition(world: FakeWorld, type_: str) -> dict[str, Any]:
    return next(c for c in world.status["conditions"] if c["type"] == type_)


def _trials(world: FakeWorld) -> list[dict[str, Any]]:
    return list(world.status.get("trials") or [])


# -- metrics outage during a trial (issue E item 6) ---------------------------------------------


async def test_n_failed_windows_during_a_trial_end_it_and_return_traffic(world: FakeWorld) -> None:
    """With SPECTUNE_METRICS_FAILURES=3 and Prometheus refusing every query (a fake), the
    trial goes on through two failed windows, holding everything; the third ends it
    (aborted, with the reason), removes its canary so all traffic returns to the incumbent,
    and posts a TrialAborted warning. The target is never touched."""
    body = _body()
    _mid_trial(body)
    world.failing = True
    loop = _loop(world, body, failures=3)
    args = copy.deepcopy(world.target["spec"]["template"])  # type: ignore[index]

    await loop.turn()  # resumes the trial's canary, then a failed window
    assert world.canaries and world.canaries[0].name == TRIAL
    await loop.turn()
    cond = _condition(world, "MetricsAvailable")
    assert cond["status"] == "False" and "2 window(s) in a row" in cond["message"], cond
    assert _trials(world)[-1]["outcome"] == "running"
    assert world.canaries, "the canary went before N failures"
    assert "TrialAborted" not in world.reasons()

    await loop.turn()
    trial = _trials(world)[-1]
    assert trial["arm"] == TRIAL and trial["outcome"] == "aborted", trial
    assert "3 consecutive windows" in trial["reason"], trial
    assert not world.canaries and world.canary_stops == 1
    kind, _, message = next(e for e in world.events if e[1] == "TrialAborted")
    assert kind == "Warning" and "canary removed" in message, message
    cond = _condition(world, "MetricsAvailable")
    assert "ended and canary removed" in cond["message"], cond
    assert world.target["spec"]["template"] == args  # type: ignore[index]

    # Still down: the setting is held and no new trial starts.
    await loop.turn()
    assert not world.canaries
    assert _trials(world)[-1]["outcome"] == "aborted"


async def test_a_failed_window_before_n_keeps_the_trial(world: FakeWorld) -> None:
    """One failed window, then Prometheus answers nothing new to judge: the count of failures
    is per run of failures, and a single failure never ends a trial."""
    body = _body()
    _mid_trial(body)
    world.failing = True
    loop = _loop(world, body, failures=2)
    await loop.turn()
    assert _trials(world)[-1]["outcome"] == "running"
    assert world.canaries


# -- the target deleted while tuning (issue G) ---------------------------------------------------


async def test_target_deleted_removes_canaries_reports_it_and_resumes(world: FakeWorld) -> None:
    body = _body()
    _mid_trial(body)
    world.failing = True
    loop = _loop(world, body)
    await loop.turn()
    assert world.canaries

    saved = world.target
    world.target = None
    await loop.turn()
    assert not world.canaries, "the canary outlived its target"
    assert world.status["phase"] == "Degraded"
    ready = _condition(world, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "TargetMissing", ready
    assert "llama" in ready["message"] and "not found" in ready["message"], ready
    assert _trials(world)[-1]["outcome"] == "aborted"
    assert "deleted" in _trials(world)[-1]["reason"]
    await loop.turn()
    assert world.reasons().count("TargetMissing") == 1, "one event, not one per turn"

    world.target = saved
    await loop.turn()
    assert world.status["phase"] != "Degraded"
    assert _condition(world, "Ready")["reason"] == "Tuning"
    assert "TargetFound" in world.reasons()
    # Back on the same setting: the search goes on (no re-tune).
    assert "Retune" not in world.reasons()


async def test_target_back_on_another_setting_reopens_the_search(world: FakeWorld) -> None:
    body = _body()
    _mid_trial(body)
    world.failing = True
    loop = _loop(world, body)
    await loop.turn()
    saved = world.target
    world.target = None
    await loop.turn()
    model = saved["spec"]["template"]["spec"]["containers"][0]["args"][1]  # type: ignore[index]
    config = json.dumps({"method": "eagle3", "model": EAGLE, "num_speculative_tokens": 2})
    back = target(["serve", model, "--speculative-config", config])
    world.target = back
    await loop.turn()
    retune = [m for _, r, m in world.events if r == "Retune"]
    assert retune and "came back running eagle3/2" in retune[0], world.events


# -- a status write that conflicts (issue G) -----------------------------------------------------


async def test_status_conflict_is_retried_with_fresh_state(world: FakeWorld) -> None:
    """The API server answers the first status patch with 409 (a fake): the loop reads the
    SpecTuning again and writes once more; the trial history is all there."""
    body = _body()
    _mid_trial(body)
    world.failing = True
    world.status = copy.deepcopy(body["status"])
    world.conflicts = 1
    loop = _loop(world, body)
    await loop.turn()
    assert world.answered_409 == 1
    assert world.status_writes, "nothing was written after the conflict"
    trials = _trials(world)
    assert [t["arm"] for t in trials] == [TRIAL], trials
    assert decode_memory(world.status["history"])["history"]["trials"], world.status["history"]


# -- a route change from the traffic-mix query (issue E item 5) ----------------------------------


def _mix(chat: float, code: float) -> list[dict[str, Any]]:
    return [
        {"metric": {"route": "chat"}, "value": [0, str(chat)]},
        {"metric": {"route": "code"}, "value": [0, str(code)]},
    ]


async def test_traffic_mix_move_beyond_threshold_reopens_the_search(world: FakeWorld) -> None:
    body = _body(retune={"trafficMix": {"query": "sum by (route) (rate(x[5m]))",
                                        "threshold": 0.2}})  # fmt: skip
    _mid_trial(body)
    world.failing = False
    world.mix = _mix(8, 2)
    loop = _loop(world, body)
    await loop.turn()  # the reference mix is set; the window fails (no observation)
    assert world.status["observedRoutes"] == '{"route=chat":0.8,"route=code":0.2}'
    world.mix = _mix(7, 3)  # 0.1 away: the same routes
    await loop.turn()
    assert "RouteChange" not in world.reasons()
    assert _trials(world)[-1]["outcome"] == "running"

    world.mix = _mix(4, 6)  # 0.4 away
    await loop.turn()
    change = next(m for _, r, m in world.events if r == "RouteChange")
    assert "0.40" in change and "route=chat 0.80→0.40" in change, change
    assert "Retune" in world.reasons()
    assert world.status["observedRoutes"] == '{"route=chat":0.4,"route=code":0.6}'
    assert world.status["phase"] == "Baseline"
    assert _trials(world)[-1]["outcome"] == "aborted", "the trial on the old mix ended"
    assert not world.canaries

    # A failing traffic-mix query is not a route change.
    world.failing = True
    await loop.turn()
    assert world.reasons().count("RouteChange") == 1


async def test_route_change_off_ignores_the_mix(world: FakeWorld) -> None:
    body = _body(retune={"onRouteChange": False,
                         "trafficMix": {"query": "q", "threshold": 0.2}})  # fmt: skip
    _mid_trial(body)
    world.mix = _mix(8, 2)
    loop = _loop(world, body)
    await loop.turn()
    world.mix = _mix(1, 9)
    await loop.turn()
    assert "RouteChange" not in world.reasons() and "Retune" not in world.reasons()


# -- a model change during a window ----------------------------------------------------------


async def test_a_new_model_version_cuts_the_window_and_reopens_within_a_poll(
    world: FakeWorld,
) -> None:
    """The target's spectune.io/model-version annotation changes 5 s into a 60 s window:
    the operator notices at its next poll (1 s here), drops the rest of the window, and the
    next turn re-opens the search — a user waits a poll, not a window."""
    loop = _loop(world, _body(search={"window": "60s"}))
    clock = loop._clock
    start = clock.t
    plain_sleep = clock.sleep

    async def sleep(seconds: float) -> None:
        await plain_sleep(seconds)
        if clock.t - start >= 5:
            meta = world.target["metadata"]  # type: ignore[index]
            meta.setdefault("annotations", {})["spectune.io/model-version"] = "v2"

    clock.sleep = sleep  # type: ignore[method-assign]
    await loop.turn()
    assert clock.t - start < 10, "the window ran on after the model changed"
    assert "Retune" not in world.reasons()
    await loop.turn()
    retune = next(m for _, r, m in world.events if r == "Retune")
    assert "v2" in retune, retune
    assert clock.t - start < 10


# -- one SpecTuning per Deployment ----------------------------------------------------------------


async def test_the_oldest_spectuning_of_a_target_tunes_it_and_one_being_deleted_does_not_count(
    world: FakeWorld,
) -> None:
    """The operator's index of SpecTunings by target (``handlers.spectunings_by_target``, fed
    the objects directly instead of kopf's watch) names an older SpecTuning of the same
    Deployment: this one is refused with TargetConflict naming it, and touches nothing. Once
    the older one is being deleted it no longer counts, and this one tunes."""
    older = _body()
    older["metadata"].update(name="first", uid="u-0", creationTimestamp="2025-12-31T00:00:00Z")
    body = _body()

    def claims(target_name: str) -> list[tuple[str, str]]:
        index: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for b in (older, body):
            entry = handlers.spectunings_by_target(
                namespace="ns", name=b["metadata"]["name"], spec=b["spec"], meta=b["metadata"]
            )
            for key, value in (entry or {}).items():
                index.setdefault(key, []).append(value)
        return index.get(("ns", target_name), [])

    loop = _loop(world, body, claims=claims)
    before = copy.deepcopy(world.target)
    await loop.turn()
    ready = _condition(world, "Ready")
    assert ready["reason"] == "TargetConflict" and "first" in ready["message"], ready
    assert world.status["phase"] == "Failed"
    assert world.target == before and not world.canaries

    older["metadata"]["deletionTimestamp"] = "2026-01-02T00:00:00Z"
    await loop.turn()
    assert _condition(world, "Ready")["reason"] == "Tuning"


# -- the status right after a promotion ----------------------------------------------------------


def _window(tpot_s: float, accepted_first: float | None = None) -> Observation:
    """One group's window: 400 requests at ``tpot_s`` per token; with ``accepted_first``, a
    drafter at k = 1 whose first position was accepted at that rate."""
    spec = None
    if accepted_first is not None:
        drafts = 50_000.0
        spec = SpecCounts(drafts, drafts, accepted_first * drafts, (accepted_first * drafts,))
    return Observation(
        dialect=Dialect.VLLM_V1, window_s=10.0, pods=("p",), spec=spec, running=4.0,
        tpot=fake_hist(tpot_s), ttft=fake_hist(0.2), queue=fake_hist(0.01, bounds=QUEUE_BOUNDS),
        e2e=fake_hist(5.0), generation_tokens=4000.0,
    )  # fmt: skip


async def test_right_after_a_promotion_the_status_shows_the_promoted_arms_acceptance(
    world: FakeWorld,
) -> None:
    """The target runs off; eagle3/1 on the canary is 40 % faster and accepts 0.7, and is
    promoted. While the rollout runs, no window is measured, and the latest one's target
    group ran off: the status must show what the promoted arm measured on the canary, not
    off's window (which has no acceptance, so `kubectl get spt` printed an empty cell beside
    DRAFTER eagle3; after a drafter it would print the predecessor's rate)."""
    body = _body(drafters=[{"name": "eagle3", "method": "eagle3", "model": EAGLE, "maxK": 1}])
    world.observation = _window(0.030)
    world.canary_observation = _window(0.018, accepted_first=0.7)
    loop = _loop(world, body)
    for _ in range(40):
        await loop.turn()
        if "Promoted" in world.reasons():
            break
    assert "Promoted" in world.reasons(), world.events
    world.rolling = True
    await loop.turn()
    status = world.status
    assert (status["applied"]["drafter"], status["applied"]["k"]) == ("eagle3", 1), status
    assert status["acceptance"]["rate"] == pytest.approx(0.7, abs=0.005), status.get("acceptance")
    # The diagnosis is the promoted arm's too: its window shows a drafter that speculates.
    assert status["diagnosis"], status


@pytest.mark.parametrize("scale", [1.0, 30.0])
async def test_trial_rates_read_in_the_pods_own_units_under_a_time_scale(
    world: FakeWorld, scale: float
) -> None:
    """Against a simulator 30x faster than the operator's clock, a 30 s window of the pods'
    time passes in 1 s: the same requests must read as the same rate per pod second, not
    30x it (the pods serve 400 requests a window whatever the scale here)."""
    body = _body(drafters=[{"name": "eagle3", "method": "eagle3", "model": EAGLE, "maxK": 1}])
    world.observation = _window(0.030)
    world.canary_observation = _window(0.018, accepted_first=0.7)
    loop = _loop(world, body, time_scale=scale)
    for _ in range(40):
        await loop.turn()
        if any(t.get("windows") for t in _trials(world)):
            break
    trial = next(t for t in _trials(world) if t.get("windows"))
    finished = world.canary_observation.tpot.count  # type: ignore[union-attr]
    assert trial["canaryLoadPerPod"] == pytest.approx(finished / 30.0, rel=0.05), trial
