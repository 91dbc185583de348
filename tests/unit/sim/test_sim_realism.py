"""The simulator's realism knobs (each off by default): per-pod speed spread, the CUDA-graph
step staircase, two-population acceptance and scrape offsets between pods."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable

import numpy as np
import pytest

from spectune.control.ports import Group
from spectune.search.arms import Arm, parse_arm
from spectune.sim import Scenario
from spectune.sim.engine import Engine
from spectune.sim.fleet import Fleet
from spectune.sim.physics import arm_physics


def _tpot_by_replica(fleet: Fleet) -> dict[int, float]:
    by: dict[int, list[float]] = {}
    for r in fleet.records():
        if r.tpot_s == r.tpot_s:  # not NaN
            by.setdefault(r.replica, []).append(r.tpot_s)
    return {i: statistics.median(v) for i, v in by.items()}


def test_off_by_default_every_pod_is_as_fast(make_scenario: Callable[..., Scenario]) -> None:
    s = make_scenario(fleet={"replicas": 2}, load=[{"at_s": 0, "requests_per_s": 0.4}])
    fleet = Fleet(s, arms=Arm(None))
    assert fleet._physics_of(Arm(None), 0) == fleet._physics_of(Arm(None), 1)


def test_a_speed_spread_makes_pods_differ_and_keeps_each_pod_as_fast_under_every_arm(
    make_scenario: Callable[..., Scenario],
) -> None:
    s = make_scenario(
        hardware={"speed_spread": 0.2},
        fleet={"replicas": 4},
        load=[{"at_s": 0, "requests_per_s": 0.4}],
    )
    fleet = Fleet(s, arms=Arm(None))
    fleet.advance(300.0)
    tpot = _tpot_by_replica(fleet)
    assert max(tpot.values()) / min(tpot.values()) > 1.05
    speeds = [
        fleet._physics_of(Arm(None), i).target.weights_s
        / arm_physics(s, Arm(None)).target.weights_s
        for i in range(4)
    ]
    assert all(0.8 <= m <= 1.2 for m in speeds)
    again = Fleet(s, arms=parse_arm("eagle3/3"))
    for i in range(4):
        ratio = again._physics_of(parse_arm("eagle3/3"), i).target.weights_s / (
            arm_physics(s, parse_arm("eagle3/3")).target.weights_s
        )
        assert abs(ratio - speeds[i]) < 1e-12


def test_cuda_graphs_pad_a_decode_step_to_its_captured_size(
    make_scenario: Callable[..., Scenario],
) -> None:
    s = make_scenario(hardware={"cuda_graph_max_batch": 512})
    e = Engine(s, Arm(None), arm_physics(s, Arm(None)), np.random.default_rng(0), 0.0)
    assert [e._padded(n, True) for n in (1, 2, 3, 5, 8, 9, 17, 512, 513)] == [
        1, 2, 4, 8, 8, 16, 24, 512, 513,
    ]  # fmt: skip
    assert e._padded(9, False) == 9  # a step with prefill runs eagerly
    plain = make_scenario()
    e0 = Engine(plain, Arm(None), arm_physics(plain, Arm(None)), np.random.default_rng(0), 0.0)
    assert e0._padded(9, True) == 9


def test_cuda_graph_padding_costs_time_where_the_step_is_compute_bound(
    make_scenario: Callable[..., Scenario],
) -> None:
    """A verification over b·(k+1) tokens past the compute knee pays for its padding."""
    knobs = {"tflops": 40.0}  # a compute-bound replica: the knee at a few tokens
    s0 = make_scenario(hardware=knobs)
    s1 = make_scenario(hardware={**knobs, "cuda_graph_max_batch": 512})
    arm = parse_arm("eagle3/4")
    e0 = Engine(s0, arm, arm_physics(s0, arm), np.random.default_rng(0), 0.0)
    e1 = Engine(s1, arm, arm_physics(s1, arm), np.random.default_rng(0), 0.0)
    a0, _ = e0._coefficients(3, 4)  # 15 tokens
    a1, _ = e1._coefficients(3, 4)  # padded to 16
    assert a1 > a0


def test_a_second_population_splits_the_requests_acceptance_in_two_modes(
    make_scenario: Callable[..., Scenario], base_mapping: dict[str, object]
) -> None:
    routes = base_mapping["routes"]
    assert isinstance(routes, list)
    routes[0]["acceptance"]["eagle3"] = {
        "alpha": 0.85,
        "decay": 0.97,
        "spread": 40,
        "second": {"share": 0.3, "alpha": 0.1, "spread": 40},
    }
    s = make_scenario(routes=routes, load=[{"at_s": 0, "requests_per_s": 2.0}])
    fleet = Fleet(s, arms=parse_arm("eagle3/3"))
    fleet.advance(300.0)
    alphas = np.array([r.alpha for r in fleet.records() if r.route == "chat"])
    low = float(np.mean(alphas < 0.4))
    assert 0.2 < low < 0.4  # about the second population's share
    assert not np.any((alphas > 0.4) & (alphas < 0.6))  # two modes, nothing between


def test_scrape_offsets_read_each_pod_at_its_own_phase_and_span_the_window(
    make_scenario: Callable[..., Scenario], monkeypatch: pytest.MonkeyPatch
) -> None:
    from spectune.bench.adapters import SimGroupMetrics, SimStage

    s = make_scenario(
        fleet={"replicas": 3, "balancer": "round_robin", "scrape_offset_s": 20.0},
        load=[{"at_s": 0, "requests_per_s": 1.0}],
        duration_s=1200,
    )
    fleet = Fleet(s, arms=Arm(None), replicas=4, parked=[3])
    offsets = [fleet.scrape_offset(i) for i in range(4)]
    assert len(set(offsets)) == 4 and all(0 <= x <= 20 for x in offsets)
    assert offsets == [Fleet(s, arms=Arm(None), replicas=4, parked=[3]).scrape_offset(i)
                       for i in range(4)]  # fixed per slot and seed  # fmt: skip
    stage = SimStage(fleet, end_s=1200.0, placement="beside")
    stage.advance_to(100.0)
    read_at: dict[int, float] = {}
    real = fleet.metrics_text

    def text(i: int) -> str:
        read_at.setdefault(i, stage.now)
        return real(i)

    monkeypatch.setattr(fleet, "metrics_text", text)
    obs = asyncio.run(SimGroupMetrics(stage).observe(300.0))
    # Each serving pod's first read is at the window's start plus its own offset.
    assert read_at == {i: pytest.approx(100.0 + offsets[i], abs=1.0) for i in range(3)}
    assert obs[Group.INCUMBENT].window_s == 300.0
    # The window ends after the last pod's read, not at its nominal end.
    assert stage.now == pytest.approx(400.0 + max(offsets), abs=1.0)


def test_without_scrape_offsets_every_pod_is_read_at_the_same_instant(
    make_scenario: Callable[..., Scenario],
) -> None:
    s = make_scenario(fleet={"replicas": 2})
    fleet = Fleet(s, arms=Arm(None))
    assert fleet.max_scrape_offset == 0.0
