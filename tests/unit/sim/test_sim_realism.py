"""The simulator's realism knobs (each off by default): per-pod speed spread, the CUDA-graph
step staircase and two-population acceptance."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import numpy as np

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
