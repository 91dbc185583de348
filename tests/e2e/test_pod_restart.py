"""A pod whose acceptance decays with its uptime is reported, replaced once, and is back.

The world of ``test_happy_path.py`` (chart installed with ``helm install``, the target
``llama-70b`` on kwok nodes, each pod a ``spectune sim serve`` of ``chat-e2e.yaml`` scraped
by a real Prometheus, time scaled 60x), except that the target already runs eagle3/2 and the
SpecTuning only watches it: eagle3 up to k = 2 and ``off`` not a candidate, so the search
keeps the running setting after one window and the loop monitors; ``retune.drift`` has
``podAction: restartPod`` and ``action: alert``.

The target's first pod runs the scenario with a ``pod_decay`` event: its eagle3 acceptance
is multiplied by :data:`ACCEPTANCE_PER_HOUR` per hour of its own uptime (an hour is a
minute of wall time here). After :data:`AGE_GAP_S` the target is scaled to two pods; the
second is younger and runs the plain scenario, so it holds the level. A user must see:

* the operator report the old pod by name (a ``PodAcceptanceDecay`` Warning and the
  ``PodsHoldAcceptance`` condition ``False``), as decay, not drift (no ``AcceptanceDrift``);
* exactly that pod deleted, exactly once (one ``PodRestarted`` event; the other pod keeps
  its UID; three pods ever ran: the two and one replacement);
* the replacement's acceptance back: the pod the ReplicaSet creates runs the same decaying
  scenario, so it starts afresh as a restarted engine does, and over its first ten seconds
  its P(L≥1) — read from Prometheus, the pods' own counters — is at its peer's, where the
  deleted pod's over its last ten seconds was well below; ``PodsHoldAcceptance`` back
  ``True``.

Everything is read with ``kubectl`` or from Prometheus' HTTP API.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spectune.bench.oracle import Oracle
from spectune.engines.args import SpecConfig, render_vllm_args
from spectune.sim.scenario import load_scenario
from tests.e2e.conftest import TIME_SCALE, InjectableSimPods, Install
from tests.e2e.test_happy_path import (
    EAGLE_MODEL,
    EXAMPLE,
    SCENARIO,
    TARGET,
    World,
    _deployment,
)
from tests.fixtures.cluster import Cluster, wait_for
from tests.fixtures.prometheus import Prometheus

ACCEPTANCE_PER_HOUR = 0.82
"""The decaying pod's eagle3 alpha is multiplied by this per hour of its uptime: about 0.81
of its peer's when it is deleted (an hour old), and about 0.98 of it over a replacement's
first ten minutes (ten seconds of wall time)."""
AGE_GAP_S = 30.0
"""Wall seconds the first pod runs alone before the second is added: its age when deleted,
less the operator's half minute to find it."""
WINDOW_S = 300.0 / TIME_SCALE
"""The example's 5 m window, in wall seconds."""
SPAN_S = 10
"""Wall seconds of counters each acceptance below is read over (two windows)."""
DECAYED_BELOW = 0.9
"""The deleted pod's P(L≥1) over its last ``SPAN_S`` is below this share of its peer's (the
line of the chart's SpecTunePodAcceptanceDecay alert)."""
BACK_ABOVE = 0.95
"""The replacement's over its first ``SPAN_S`` is above this share of its peer's (the
operator's own decay margin is 5 %)."""


def _decaying_scenario(path: Path) -> Path:
    """``chat-e2e.yaml`` with one ``pod_decay`` event on its one replica, written to ``path``."""
    doc = yaml.safe_load(SCENARIO.read_text())
    doc["name"] = f"{doc['name']}-pod-decay"
    doc["events"] = [
        {
            "at_s": 0,
            "kind": "pod_decay",
            "pod": 0,
            "drafter": "eagle3",
            "acceptance_per_hour": ACCEPTANCE_PER_HOUR,
        }
    ]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    load_scenario(path)  # a scenario sim serve would refuse fails here, not in a pod's log
    return path


class Slots:
    """Which scenario each pod's simulator runs (``SimPods.scenario_of``).

    The target's first pod decays; the pod the scale-up adds holds its level; any pod after
    those — the replacement of a deleted pod — decays again from its own start.
    """

    def __init__(self, decaying: Path, holding: Path) -> None:
        self.decaying = decaying
        self.holding = holding
        self.first: str | None = None
        self.peer: str | None = None

    def __call__(self, pod: str) -> Path:
        if self.first is None:
            self.first = pod
            return self.decaying
        if self.peer is None and pod != self.first:
            self.peer = pod
            return self.holding
        return self.decaying


def _target(replicas: int) -> dict[str, Any]:
    """The happy path's Deployment with ``replicas`` pods, already on eagle3/2."""
    doc = _deployment()
    doc["spec"]["replicas"] = replicas
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    container["args"] = render_vllm_args(
        container["args"], SpecConfig("eagle3", 2, model=EAGLE_MODEL)
    )
    return doc


def _spectuning() -> dict[str, Any]:
    """The shipped example, watching eagle3/2 with ``podAction: restartPod``."""
    doc: dict[str, Any] = yaml.safe_load(Path(EXAMPLE).read_text())
    spec = doc["spec"]
    spec["drafters"] = [{"name": "eagle3", "method": "eagle3", "model": EAGLE_MODEL, "maxK": 2}]
    spec["allowOff"] = False
    spec["search"]["schedule"] = "off"
    spec["retune"]["drift"] = {
        "threshold": 0.15,
        "for": "10m",
        "action": "alert",
        "podAction": "restartPod",
        "minReadyPods": 1,
    }
    return doc


@pytest.fixture(scope="module")
def world(
    cluster: Cluster,
    rules_prometheus: Prometheus,
    install: Install,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    work = tmp_path_factory.mktemp("pod-restart")
    slots = Slots(_decaying_scenario(work / "chat-e2e-pod-decay.yaml"), SCENARIO)
    scenario = load_scenario(SCENARIO)
    ns = install.watched_ns
    cluster.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(_target(1)))
    cluster.kubectl("-n", ns, "rollout", "status", f"deployment/{TARGET}", "--timeout=90s")
    sims = InjectableSimPods(
        cluster, rules_prometheus, ns, SCENARIO, TIME_SCALE, work,
        container="vllm", shared_clock=True, scenario_of=slots,
    )  # fmt: skip
    sims.start()
    w = World(cluster, rules_prometheus, install, sims, scenario, Oracle(scenario, 1), "", 0.0)
    try:
        yield w
    finally:
        sims.stop()


def _pods(world: World) -> dict[str, dict[str, Any]]:
    """The target's pods by name, as ``kubectl get pods`` lists them."""
    out = world.kubectl("get", "pods", "-l", f"app={TARGET}", "-o", "json")
    return {p["metadata"]["name"]: p for p in json.loads(out)["items"]}


def _condition(world: World) -> dict[str, Any] | None:
    conds = {c["type"]: c for c in world.status().get("conditions") or []}
    return conds.get("PodsHoldAcceptance")


def _p1(world: World, pod: str, at: float) -> float:
    """The pod's P(L≥1) over the ``SPAN_S`` seconds before ``at``, from its counters."""
    sel = f'namespace="{world.ns}",pod="{pod}"'
    rows = world.prom.query(
        f'sum(increase(vllm:spec_decode_num_accepted_tokens_per_pos_total{{{sel},position="0"}}'
        f"[{SPAN_S}s])) / sum(increase(vllm:spec_decode_num_drafts_total{{{sel}}}[{SPAN_S}s]))",
        at=at,
    )
    assert rows, f"no acceptance of {pod} at {at:.1f} in Prometheus"
    return float(rows[0]["value"][1])


def _scraped(world: World, pod: str) -> tuple[float, float]:
    """The first and last time Prometheus scraped the pod's drafts (the last two minutes)."""
    rows = world.prom.query(
        f'vllm:spec_decode_num_drafts_total{{namespace="{world.ns}",pod="{pod}"}}[2m]'
    )
    assert rows, f"Prometheus has no drafts of {pod}"
    stamps = [float(t) for row in rows for t, _ in row["values"]]
    return min(stamps), max(stamps)


def test_a_decayed_pod_is_reported_deleted_once_and_its_replacement_is_back(
    world: World,
) -> None:
    ns, prom = world.ns, world.prom
    (first,) = wait_for(
        lambda: list(world.sims.running()), timeout=60, message="the first pod's simulator"
    )
    prom.wait_for_series(f'vllm:spec_decode_num_drafts_total{{namespace="{ns}",pod="{first}"}}')
    time.sleep(AGE_GAP_S)  # the first pod runs alone: it is the older one, and decays
    world.kubectl("scale", "deployment", TARGET, "--replicas=2")
    world.kubectl("rollout", "status", f"deployment/{TARGET}", "--timeout=90s")
    (peer,) = wait_for(
        lambda: [p for p in world.sims.running() if p != first],
        timeout=60,
        message="the second pod's simulator",
    )
    prom.wait_for_series(f'vllm:spec_decode_num_drafts_total{{namespace="{ns}",pod="{peer}"}}')
    peer_uid = _pods(world)[peer]["metadata"]["uid"]
    world.kubectl("apply", "-f", "-", input=yaml.safe_dump(_spectuning()))

    # Reported: the decay event and the condition name the old pod.
    seen: list[dict[str, Any]] = []

    def reported() -> bool:
        cond = _condition(world)
        if cond is not None and (not seen or seen[-1] != cond):
            seen.append(cond)
        return any(e["reason"] == "PodAcceptanceDecay" for e in world.events()) and any(
            c["status"] == "False" for c in seen
        )

    wait_for(reported, timeout=240, message=lambda: f"the decay reported; {world.why()}")
    (decay,) = [e for e in world.events() if e["reason"] == "PodAcceptanceDecay"]
    assert decay["type"] == "Warning", decay
    assert f"pod {first}'s acceptance decayed with its uptime" in decay["message"], decay
    assert "so not drift" in decay["message"], decay
    low = next(c for c in seen if c["status"] == "False")
    assert low["reason"] == "PodAcceptanceDecay" and first in low["message"], seen

    # Deleted: exactly that pod; the other one keeps running (the same UID).
    def restarted() -> dict[str, Any] | None:
        found = [e for e in world.events() if e["reason"] == "PodRestarted"]
        return found[0] if found else None

    event = wait_for(restarted, timeout=120, message=lambda: f"a PodRestarted; {world.why()}")
    assert f"evicted pod {first} " in event["message"], event
    wait_for(
        lambda: first not in _pods(world) and len(world.sims.started) == 3,
        timeout=90,
        message=lambda: f"the replacement's simulator; started {world.sims.started}",
    )
    (replacement, scenario) = world.sims.started[2]
    slots = world.sims.scenario_of
    assert isinstance(slots, Slots) and (slots.first, slots.peer) == (first, peer)
    assert scenario == slots.decaying  # the replacement decays too, from its own start
    assert _pods(world)[peer]["metadata"]["uid"] == peer_uid

    # Back: the replacement's first SPAN_S seconds against the peer's, and the deleted pod's
    # last SPAN_S seconds against the peer's.
    _, last = _scraped(world, first)
    before = _p1(world, first, last) / _p1(world, peer, last)
    prom.wait_for_series(
        f'vllm:spec_decode_num_drafts_total{{namespace="{ns}",pod="{replacement}"}}'
    )
    start, _ = _scraped(world, replacement)
    wait_for(
        lambda: time.time() > start + SPAN_S + 1,
        timeout=SPAN_S + 30,
        message="the replacement's first seconds scraped",
    )
    after = _p1(world, replacement, start + SPAN_S) / _p1(world, peer, start + SPAN_S)
    assert before < DECAYED_BELOW, f"the deleted pod was at {before:.3f} of its peer's"
    assert after > BACK_ABOVE, (
        f"the replacement is at {after:.3f} of its peer's acceptance (the deleted pod was at "
        f"{before:.3f}); {world.why()}"
    )

    def even() -> dict[str, Any] | None:
        cond = _condition(world)
        return cond if cond is not None and cond["status"] == "True" else None

    cond = wait_for(even, timeout=60, message=lambda: f"PodsHoldAcceptance True; {world.why()}")
    assert cond["reason"] == "AcceptanceEven", cond

    # Once: the deletion's two-window hold is over by now; two more windows, and nothing else
    # is deleted or reported.
    time.sleep(2 * WINDOW_S)
    reasons = [e["reason"] for e in world.events()]
    assert reasons.count("PodRestarted") == 1, reasons
    assert reasons.count("PodAcceptanceDecay") == 1, reasons
    assert "AcceptanceDrift" not in reasons and "Retune" not in reasons, reasons
    assert set(_pods(world)) == {peer, replacement}, _pods(world)
    assert _pods(world)[peer]["metadata"]["uid"] == peer_uid
    assert [p for p, _ in world.sims.started] == [first, peer, replacement]
    assert not world.sims.errors, world.sims.errors
