"""The loop over fake ports when a setting perishes: a drafter that stops accepting, a pod
whose acceptance decays with its uptime.

The fleet, clock and world are the fakes of ``test_controller.py``; the loop is the real one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

from spectune.control.controller import Controller, Event, Phase, PodAction
from spectune.k8s.projection import Memory, encode_memory, load_memory
from spectune.metrics import Observation, PodCounts, SpecCounts
from spectune.search.arms import Arm, parse_arm
from spectune.search.history import Outcome
from tests.unit.control.test_controller import WORLD, FakeClock, FakeFleet, make, run_until


@dataclass
class BreakingFleet(FakeFleet):
    """The FAKE fleet where the drafters in ``broken`` land (almost) none of their drafts
    (weights not loaded, a wrong algorithm flag): accepted length 1.0001."""

    broken: set[str] = field(default_factory=set)

    def _obs(
        self, arm: Arm, window: float, share: float = 1.0, queue_s: float | None = None
    ) -> Observation:
        obs = super()._obs(arm, window, share, queue_s)
        if arm.drafter in self.broken and obs.spec is not None and obs.spec.drafts:
            d = obs.spec.drafts
            per_pos = (d * 1e-4, *(0.0 for _ in range(arm.k - 1)))
            obs = replace(obs, spec=SpecCounts(d, d * arm.k, sum(per_pos), per_pos))
        return obs


def test_a_drafter_that_stops_accepting_falls_back_to_off_at_once_and_says_so() -> None:
    clock = FakeClock()
    fleet = BreakingFleet(WORLD, clock, parse_arm("eagle3/8"))
    c, events = make(fleet, clock)
    run_until(c, lambda: c.state.phase is Phase.MONITORING)
    before = list(fleet.promotions)
    assert fleet.incumbent.drafter == "eagle3"
    fleet.broken = {"eagle3"}
    asyncio.run(c.step())  # one window: the fallback is in the same step
    assert fleet.promotions == [*before, "off"] and fleet.incumbent.is_off
    (e,) = [e for e in events if e.reason == "DrafterBroken"]
    assert "fell back to off" in e.message and "drafts" in e.message
    assert c.state.drafter_status == "False" and c.state.drafter_reason == "DrafterBroken"
    assert c.state.drafter_message is not None and "fell back to off" in c.state.drafter_message
    assert c.state.phase is Phase.MONITORING and c.state.reference_acceptance is None
    # No arm of the broken drafter is tried or promoted again for this model version.
    for _ in range(20):
        asyncio.run(c.step())
    assert fleet.incumbent.is_off
    assert [e.reason for e in events].count("DrafterBroken") == 1


def test_the_fallback_is_the_last_good_setting_of_another_drafter() -> None:
    clock = FakeClock()
    fleet = BreakingFleet(WORLD, clock, parse_arm("ngram/2"))  # the setting the run began on
    c, events = make(fleet, clock)
    run_until(c, lambda: c.state.phase is Phase.MONITORING)
    assert fleet.incumbent.drafter == "eagle3"
    fleet.broken = {"eagle3"}
    asyncio.run(c.step())
    assert fleet.incumbent.name == "ngram/2"
    assert any(e.reason == "DrafterBroken" and "fell back to ngram/2" in e.message for e in events)


def test_a_low_but_working_acceptance_is_drift_not_a_broken_drafter() -> None:
    clock = FakeClock()
    fleet = BreakingFleet(WORLD, clock, parse_arm("eagle3/8"))
    c, events = make(fleet, clock)
    run_until(c, lambda: c.state.phase is Phase.MONITORING)
    promoted = list(fleet.promotions)
    fleet.acceptance_scale = 0.1  # P(L>=1) 0.08: very poor, yet the drafter works
    for _ in range(3):
        asyncio.run(c.step())
    assert not [e for e in events if e.reason == "DrafterBroken"]
    assert fleet.promotions == promoted and c.state.drafter_status is None


def test_a_broken_drafter_on_the_target_ends_a_running_trial_first() -> None:
    clock = FakeClock()
    fleet = BreakingFleet(WORLD, clock, parse_arm("eagle3/8"))
    c, events = make(fleet, clock)
    run_until(c, lambda: bool(c.history.in_epoch()) and bool(c.history.in_epoch()[-1].windows))
    fleet.broken = {"eagle3"}
    run_until(c, lambda: any(e.reason == "DrafterBroken" for e in events), limit=10)
    assert fleet.canary is None and fleet.incumbent.drafter != "eagle3"
    assert c.history.in_epoch()[-1].outcome is not Outcome.RUNNING


# -- a pod whose acceptance decays with its uptime --------------------------------------------


@dataclass
class AgeingFleet(BreakingFleet):
    """The FAKE fleet with several target pods, each with its own acceptance and start time,
    and the ``Pods`` port: an evicted pod is replaced by a new one, started now, at the level
    of the arm (``acceptance`` is per pod: 1.0 at the arm's level). While ``budget_refuses``
    is set, eviction is refused as a PodDisruptionBudget allowing no disruption refuses it."""

    acceptance: dict[str, float] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    not_ready: set[str] = field(default_factory=set)
    generation: int = 0
    budget_refuses: bool = False

    def __post_init__(self) -> None:
        for i, name in enumerate(("pod-a", "pod-b", "pod-c")):
            self.acceptance.setdefault(name, 1.0)
            self.started.setdefault(name, -3600.0 * (3 - i))

    def _target(self, window_s: float, share: float, queue_s: float | None = None) -> Observation:
        obs = super()._target(window_s, share, queue_s)
        if obs.spec is None or not obs.spec.accepted_per_pos or not obs.spec.drafts:
            return obs
        n = obs.spec.drafts / len(self.acceptance)
        p1 = obs.spec.accepted_per_pos[0] / obs.spec.drafts
        per_pod = {
            pod: PodCounts(n, n * p1 * scale, n * p1 * scale * 2.0, self.started[pod])
            for pod, scale in self.acceptance.items()
        }
        return replace(obs, pods=tuple(per_pod), per_pod=per_pod)

    async def ready(self) -> list[str]:
        return [p for p in self.acceptance if p not in self.not_ready]

    async def evict(self, pod: str) -> str | None:
        if self.budget_refuses:
            return f"a PodDisruptionBudget allows no disruption of {pod} now"
        self.deleted.append(pod)
        del self.acceptance[pod], self.started[pod]
        self.generation += 1
        fresh = f"pod-new{self.generation}"
        self.acceptance[fresh], self.started[fresh] = 1.0, self.clock.t
        return None


def converged(**cfg: object) -> tuple[AgeingFleet, Controller, list[Event]]:
    clock = FakeClock()
    fleet = AgeingFleet(WORLD, clock, parse_arm("eagle3/8"))
    c, events = make(fleet, clock, **{"drift_for_s": 900, **cfg})
    c.pods = fleet
    run_until(c, lambda: c.state.phase is Phase.MONITORING)
    asyncio.run(c.step())  # the reference window
    return fleet, c, events


def steps(c: Controller, n: int) -> None:
    for _ in range(n):
        asyncio.run(c.step())


def test_an_old_pod_falling_below_its_younger_peers_is_reported_once_with_its_numbers() -> None:
    fleet, c, events = converged()
    fleet.acceptance["pod-a"] = 0.8  # the oldest pod: 0.8 → 0.64 while b and c hold 0.8
    steps(c, 6)
    (e,) = [e for e in events if e.reason == "PodAcceptanceDecay"]
    assert "pod pod-a" in e.message and "0.640" in e.message and "0.800" in e.message
    assert c.state.pods_status == "False" and c.state.pods_reason == "PodAcceptanceDecay"
    assert not fleet.deleted  # podAction alert: reported only
    assert not [e for e in events if e.reason == "AcceptanceDrift"]


def test_a_decay_shorter_than_drift_for_is_not_reported() -> None:
    fleet, c, events = converged()
    fleet.acceptance["pod-a"] = 0.8
    steps(c, 2)  # 600 s of the 900 s
    fleet.acceptance["pod-a"] = 1.0
    steps(c, 4)
    assert not [e for e in events if e.reason == "PodAcceptanceDecay"]


def test_traffic_drift_moves_every_pod_and_is_not_pod_decay() -> None:
    fleet, c, events = converged(pod_action=PodAction.RESTART_POD)
    fleet.acceptance_scale = 0.7  # the traffic changed: every pod falls together
    steps(c, 6)
    assert not [e for e in events if e.reason in ("PodAcceptanceDecay", "PodRestarted")]
    assert not fleet.deleted


def test_restart_pod_deletes_exactly_the_decayed_pod_once_and_its_replacement_is_back() -> None:
    fleet, c, events = converged(pod_action=PodAction.RESTART_POD)
    fleet.acceptance["pod-a"] = 0.8
    steps(c, 8)
    assert fleet.deleted == ["pod-a"]
    (e,) = [e for e in events if e.reason == "PodRestarted"]
    assert "evicted pod pod-a (P(L≥1) 0.640 against 0.800 on the pods started after it)" in (
        e.message
    )
    assert c.state.pods_status == "True" and c.state.pods_reason == "AcceptanceEven"


def test_a_disruption_budget_that_refuses_the_eviction_holds_the_restart_until_it_allows() -> None:
    fleet, c, events = converged(pod_action=PodAction.RESTART_POD)
    fleet.budget_refuses = True
    fleet.acceptance["pod-a"] = 0.8
    steps(c, 6)
    assert not fleet.deleted and not [e for e in events if e.reason == "PodRestarted"]
    assert c.state.pods_message is not None
    assert "restart held: a PodDisruptionBudget allows no disruption of pod-a now" in (
        c.state.pods_message
    )
    fleet.budget_refuses = False
    steps(c, 2)
    assert fleet.deleted == ["pod-a"]


def test_a_restart_waits_for_enough_ready_pods_and_never_runs_beside_a_trial() -> None:
    fleet, c, _ = converged(pod_action=PodAction.RESTART_POD, min_ready_pods=2)
    fleet.not_ready = {"pod-c"}  # only pod-b would serve while pod-a restarts
    fleet.acceptance["pod-a"] = 0.8
    steps(c, 6)
    assert not fleet.deleted
    assert c.state.pods_message is not None and "restart held" in c.state.pods_message
    fleet.not_ready = set()
    fleet.canary = parse_arm("ngram/2")  # a canary beside the target: a trial runs
    steps(c, 2)
    assert not fleet.deleted and "a trial runs" in (c.state.pods_message or "")
    fleet.canary = None
    steps(c, 1)
    assert fleet.deleted == ["pod-a"]


def test_two_decayed_pods_go_one_at_a_time_two_windows_apart() -> None:
    fleet, c, events = converged(pod_action=PodAction.RESTART_POD, drift_for_s=0)
    fleet.acceptance["pod-a"] = 0.7
    fleet.acceptance["pod-b"] = 0.8
    steps(c, 1)
    assert fleet.deleted == ["pod-a"]
    steps(c, 1)  # the replacement's first window: nothing more is deleted
    assert fleet.deleted == ["pod-a"]
    steps(c, 1)
    assert fleet.deleted == ["pod-a", "pod-b"]
    assert [e.reason for e in events].count("PodRestarted") == 2


def test_pods_that_all_decay_are_reported_though_the_worst_changes_every_window() -> None:
    # Every pod ages: pod-a and pod-b both sit below pod-c, and which of them is the worst
    # changes from window to window. Each keeps its own clock, so drift.for (900 s) is
    # reached and the decay is reported, not restarted from zero at every change.
    fleet, c, events = converged()
    for i in range(6):
        fleet.acceptance["pod-a"], fleet.acceptance["pod-b"] = (0.7, 0.8) if i % 2 else (0.8, 0.7)
        steps(c, 1)
    assert [e.reason for e in events].count("PodAcceptanceDecay") >= 1
    assert c.state.pods_status == "False"
    assert {pod for pod, _ in c.state.decay_since} == {"pod-a", "pod-b"}
    # The clocks survive an operator restart through the status memory.
    memory = load_memory(encode_memory(Memory(c.history, c.state).to_json()))
    assert memory.state.decay_since == c.state.decay_since
