"""The target's pods for per-pod decay: which serve, and a start time for every pod."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes import client as k8s

from spectune.control.ports import Group
from spectune.engines import Dialect
from spectune.k8s.pods import PodStarts, TargetPods, start_times
from spectune.metrics import Observation, PodCounts

Obj = dict[str, Any]


def pod(name: str, started: str | None, ready: bool = True, deleting: bool = False) -> Obj:
    meta: Obj = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T10:00:00Z"
    status: Obj = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if started is not None:
        status["startTime"] = started
    return {"metadata": meta, "status": status}


PODS = [
    pod("a", "2026-12-04T08:00:00Z"),
    pod("b", "2026-12-04T09:00:00Z", ready=False),
    pod("c", "2026-12-04T09:30:00Z", deleting=True),
    pod("d", None),
]


async def fake_list() -> list[Obj]:
    """A FAKE pod list, as the API returns it."""
    return PODS


def test_only_running_ready_pods_not_being_deleted_count_as_ready() -> None:
    pods = TargetPods(k8s.ApiClient(), "llm", fake_list)
    assert asyncio.run(pods.ready()) == ["a", "d"]


def test_start_times_are_unix_seconds_and_pods_without_one_are_left_out() -> None:
    starts = start_times(PODS)
    assert set(starts) == {"a", "b", "c"}
    assert starts["b"] - starts["a"] == 3600.0


class FakeMetrics:
    """FAKE group metrics: one pod's page had a process start time, the other none."""

    async def observe(self, window_s: float) -> dict[Group, Observation]:
        per_pod = {"a": PodCounts(1000, 800, 1600, None), "b": PodCounts(1000, 800, 1600, 5.0)}
        obs = Observation(Dialect.VLLM_V1, window_s, ("a", "b"), None, per_pod=per_pod)
        return {Group.INCUMBENT: obs}


def test_a_pod_without_a_process_start_gets_its_pods_start_time_and_no_other() -> None:
    async def starts() -> dict[str, float]:
        return {"a": 100.0, "b": 200.0}

    out = asyncio.run(PodStarts(FakeMetrics(), starts).observe(60))
    per_pod = out[Group.INCUMBENT].per_pod
    assert per_pod["a"].started_s == 100.0  # from the pod
    assert per_pod["b"].started_s == 5.0  # the engine's own start wins
