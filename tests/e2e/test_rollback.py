"""A promoted arm that regresses on the target is rolled back, on a real API server.

The world of ``test_happy_path.py`` (chart installed with ``helm install``, the target
``llama-70b`` on kwok nodes, each pod a ``spectune sim serve`` of ``chat-e2e.yaml`` scraped
by a real Prometheus, time scaled 60x), with the shipped example SpecTuning plus
``search.verifyWindows: 4``. The target starts on ``off``; eagle3 wins its trials and is
promoted. The moment the target's Deployment is patched onto eagle3, the simulator's EAGLE
acceptance drops to a tenth (a scenario ``model_version`` event injected into every pod
under the same version, so the operator sees no model change): on the target the promoted
arm is then slower per token than ``off`` was before it. The operator must roll the
Deployment back to ``off`` within the verification windows and say so in an event and the
``Verified`` condition. Everything is read with ``kubectl``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spectune.bench.oracle import Oracle
from spectune.k8s.projection import decode_memory
from spectune.sim.scenario import load_scenario
from tests.e2e.conftest import TIME_SCALE, InjectableSimPods, Install
from tests.e2e.test_happy_path import EXAMPLE, SCENARIO, TARGET, World, _deployment
from tests.fixtures.cluster import Cluster, wait_for
from tests.fixtures.prometheus import Prometheus

VERIFY_WINDOWS = 4
#: EAGLE's acceptance falls to about 0.06: every drafted position now costs more than it
#: lands, so the promoted arm is slower per token than ``off``, while its first token still
#: lands in thousands of passes per window: a regression, not a broken drafter (acceptance
#: near 0, which ``DRAFTER_BROKEN`` reports and falls back from, tests/unit/control).
DROP = {"kind": "model_version", "version": "v1", "acceptance_scale": {"eagle3": 0.08}}


def _spectuning() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(Path(EXAMPLE).read_text())
    doc["spec"]["search"]["verifyWindows"] = VERIFY_WINDOWS
    return doc


@pytest.fixture(scope="module")
def world(
    cluster: Cluster,
    rules_prometheus: Prometheus,
    install: Install,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    scenario = load_scenario(SCENARIO)
    ns = install.watched_ns
    cluster.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(_deployment()))
    cluster.kubectl("-n", ns, "rollout", "status", f"deployment/{TARGET}", "--timeout=90s")
    sims = InjectableSimPods(
        cluster, rules_prometheus, ns, SCENARIO, TIME_SCALE,
        tmp_path_factory.mktemp("rollback-sims"), container="vllm", shared_clock=True,
    )  # fmt: skip
    sims.start()
    w = World(cluster, rules_prometheus, install, sims, scenario, Oracle(scenario, 1), "", 0.0)
    try:
        rules_prometheus.wait_for_series(
            f'vllm:num_requests_running{{namespace="{ns}"}}', timeout=60
        )
        cluster.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(_spectuning()))
        yield w
    finally:
        sims.stop()


def _windows_on_target(memory: dict[str, Any], arm: str) -> int:
    """Windows of the operator's restart-safe history in which the target ran ``arm``."""
    history = memory["history"]
    windows = [w for _, w in history.get("baseline", [])]
    windows += [w for t in history.get("trials", []) for w in t.get("windows", [])]
    return sum(1 for w in windows if w.get("incumbent_arm") == arm)


def test_a_promoted_arm_that_regresses_on_the_target_is_rolled_back(world: World) -> None:
    def promoted() -> str | None:
        arm = world.target_arm()
        return arm if arm.startswith("eagle3/") else None

    bad = wait_for(promoted, timeout=600, message=lambda: f"a promotion of eagle3; {world.why()}")
    world.sims.inject(DROP)  # the acceptance drops right after the promotion

    def rolled_back() -> dict[str, Any] | None:
        conds = {c["type"]: c for c in world.status().get("conditions") or []}
        v = conds.get("Verified")
        return v if v is not None and v["status"] == "False" else None

    verified = wait_for(rolled_back, timeout=600, message=lambda: f"a rollback; {world.why()}")
    assert verified["reason"] == "RegressedAfterPromotion", verified
    assert f"rolled back to off: {bad} on the target" in verified["message"]
    assert "tpotP95" in verified["message"] or "p95" in verified["message"]
    events = [e for e in world.events() if e["reason"] == "RolledBack"]
    assert events and events[0]["type"] == "Warning"
    assert f"rolled back to off: {bad}" in events[0]["message"]

    def back_on_off() -> bool:
        return world.target_arm() == "off"

    wait_for(back_on_off, timeout=120, message=lambda: f"the target on off; {world.why()}")
    # Within the verification windows: no more windows of the bad arm on the target than
    # the verification takes.
    memory = decode_memory(world.status()["history"])
    assert 1 <= _windows_on_target(memory, bad) <= VERIFY_WINDOWS
    assert any(f[1] == bad for f in memory["history"]["failures"])
