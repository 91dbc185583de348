"""``spectune sim serve --service``: the pods of one service, as a real Prometheus sees them.

A canary is one more pod behind the Service. Its arrival does not add traffic: the
service's offered load (its pods' finished requests per second, summed, as a dashboard or
the operator sums them) stays where it was, and each pod's share falls.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.prometheus import Prometheus, free_port

REPO = Path(__file__).resolve().parents[3]
SCENARIO = REPO / "examples" / "scenarios" / "chat-eagle3.yaml"  # 1 request/s
TIME_SCALE = 60.0
WINDOW_S = 10  # wall seconds per rate window: about 600 simulated requests


class Pods:
    """``sim serve`` processes of one service on one clock, registered with Prometheus."""

    def __init__(self, prometheus: Prometheus, workdir: Path) -> None:
        self.prometheus = prometheus
        self.workdir = workdir
        self.namespace = f"svc-{uuid.uuid4().hex[:8]}"
        self.epoch = time.time()
        self.processes: list[subprocess.Popen[bytes]] = []

    def add(self, pod: str) -> None:
        port = free_port()
        log = (self.workdir / f"{pod}.log").open("wb")
        self.processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "spectune.sim.command", "serve",
                 "--scenario", str(SCENARIO), "--port", str(port),
                 "--time-scale", str(TIME_SCALE), "--clock-epoch", repr(self.epoch),
                 "--service", str(self.workdir / "service"),
                 "--", "serve", "meta-llama/Llama-3.1-70B-Instruct"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        )  # fmt: skip
        self.prometheus.register_target(
            f"127.0.0.1:{port}", {"namespace": self.namespace, "pod": pod}
        )

    def rates(self) -> dict[str, float]:
        """Each pod's finished requests per (wall) second over the last window."""
        answer = self.prometheus.query(
            f"sum by (pod) (rate(vllm:request_success_total"
            f'{{namespace="{self.namespace}"}}[{WINDOW_S}s]))'
        )
        return {r["metric"]["pod"]: float(r["value"][1]) for r in answer}

    def stop(self) -> None:
        for p in self.processes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)


@pytest.fixture
def pods(prometheus: Prometheus, tmp_path: Path) -> Iterator[Pods]:
    made = Pods(prometheus, tmp_path)
    try:
        yield made
    finally:
        made.stop()


def test_a_pod_added_to_a_service_splits_its_offered_load(pods: Pods) -> None:
    pods.add("incumbent")
    series = f'vllm:request_success_total{{namespace="{pods.namespace}",pod="incumbent"}}'
    pods.prometheus.wait_for_series(series)
    time.sleep(WINDOW_S + 2)  # a whole rate window of the incumbent alone
    before = pods.rates()
    pods.add("canary")
    series = f'vllm:request_success_total{{namespace="{pods.namespace}",pod="canary"}}'
    pods.prometheus.wait_for_series(series)
    time.sleep(WINDOW_S + 3)  # a whole window after the canary joined (1 s after it started)
    after = pods.rates()

    # 1 request/s at 60x: the service's load is 60 requests per wall second, with or without
    # the canary (when each pod drew the whole stream, the canary doubled it).
    assert set(before) == {"incumbent"} and set(after) == {"incumbent", "canary"}
    assert before["incumbent"] == pytest.approx(60.0, rel=0.25)
    assert sum(after.values()) == pytest.approx(before["incumbent"], rel=0.25)
    # round-robin over two pods: each takes about half
    assert after["incumbent"] < 0.7 * before["incumbent"]
    assert after["canary"] == pytest.approx(after["incumbent"], rel=0.3)
