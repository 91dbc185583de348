"""The happy path, driven like a user: helm install, apply the example, watch it tune.

The chart is installed with ``helm install`` into the test cluster (the operator runs as a
local ``spectune run`` process with the installed Deployment's arguments, environment and
ServiceAccount; see ``conftest.py``). A vLLM-style Deployment ``llama-70b`` runs on kwok
nodes; each of its pods (and each canary pod the operator creates) is a
``spectune sim serve`` process of ``chat-e2e.yaml`` scraped by a real Prometheus that
evaluates the chart's rules. Every pod carries the scenario's whole load on one clock
(``--clock-epoch``): at any moment a canary gets the same requests as the target, as it
would behind one Service, instead of the first minutes of the scenario each time it starts.
The SpecTuning is ``examples/spectuning.yaml`` exactly as shipped, applied with ``kubectl
apply -f`` and nothing else (it needs no other object); its Prometheus URL stays as shipped
too: the chart's ``operator.prometheusUrl`` points the operator at the test's Prometheus.

Time is scaled: the simulator and the operator run 60x faster than the wall clock (the
example's 5 m window is 5 s) and the test's Prometheus evaluates the rules 120x faster.
Everything asserted is read with ``kubectl`` or from Prometheus' HTTP API; the bench's
oracle (``spectune.bench``) computes, on the same scenario, what the best setting is.

The tests share one installation and run in order; each waits for what a user would wait
for.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from spectune.bench.oracle import Oracle
from spectune.bench.runner import bench_objective
from spectune.bench.scoring import metric_value
from spectune.k8s.projection import decode_memory
from spectune.playground import target_deployment
from spectune.search.arms import Arm, parse_arm
from spectune.sim.scenario import Scenario, load_scenario
from tests.e2e.conftest import TIME_SCALE, InjectableSimPods, Install
from tests.fixtures.cluster import Cluster, wait_for
from tests.fixtures.prometheus import Prometheus

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "spectuning.yaml"
SCENARIO = Path(__file__).with_name("chat-e2e.yaml")
TARGET = "llama-70b"
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
EAGLE_MODEL = "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"
NEAR_ORACLE = 0.95
DRIFT_SCALE = 0.4


@dataclass
class World:
    """The installed product, the target, and views of it through kubectl and Prometheus."""

    cluster: Cluster
    prom: Prometheus
    install: Install
    sims: InjectableSimPods
    scenario: Scenario
    oracle: Oracle
    best_arm: str
    best_value: float
    shipped: dict[str, Any] = field(default_factory=dict)
    drift_alert_s: float | None = None

    @property
    def ns(self) -> str:
        return self.install.watched_ns

    def kubectl(self, *args: str, **kw: Any) -> str:
        return self.cluster.kubectl("-n", self.ns, *args, **kw).stdout

    def spt(self) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(self.kubectl("get", "spt", TARGET, "-o", "json"))
        return obj

    def status(self) -> dict[str, Any]:
        return dict(self.spt().get("status") or {})

    def target(self) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(self.kubectl("get", "deployment", TARGET, "-o", "json"))
        return obj

    def target_arm(self) -> str:
        (container,) = self.target()["spec"]["template"]["spec"]["containers"]
        return arm_of_args([str(a) for a in container.get("args", [])])

    def get_spt_columns(self) -> dict[str, str]:
        """``kubectl get spt TARGET`` as the user reads it: each header over its cell.

        A cell is read between its header's column and the next one's, not by splitting on
        blanks: a field the status does not hold (the acceptance of a window without drafts)
        prints as an empty cell, and splitting would shift every column after it one to the
        left.
        """
        header, row = self.kubectl("get", "spt", TARGET).rstrip("\n").splitlines()[:2]
        starts = [m.start() for m in re.finditer(r"\S+", header)]
        ends = [*starts[1:], max(len(row), len(header))]
        names = header.split()
        return {n: row[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)}

    def events(self) -> list[dict[str, Any]]:
        out = self.kubectl(
            "get", "events", "-o", "json",
            "--field-selector", f"involvedObject.kind=SpecTuning,involvedObject.name={TARGET}",
        )  # fmt: skip
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def value_of(self, arm: str) -> float:
        """The oracle's objective value of ``arm`` on the scenario (seconds of tpotP95)."""
        name = parse_arm(arm).name
        run = self.oracle.runs([name])[name]
        assert run.failure is None, run.failure
        metric = bench_objective(self.scenario).metric
        return metric_value(run.requests, metric, 0.0, float(self.scenario.duration_s))

    def trial_log(self) -> str:
        """The status's trials as the user reads them: each arm, its objective on the canary
        and on the incumbent, and the policy's reason, one per line (a failed near-oracle
        check names the trial whose evidence promoted the wrong arm)."""
        lines = []
        for t in self.status().get("trials") or []:
            lines.append(
                f"  {t.get('arm')} vs {t.get('incumbent')}: {t.get('outcome')}, "
                f"{t.get('windows')} windows, canary {t.get('canaryObjective')} / "
                f"incumbent {t.get('incumbentObjective')}; {str(t.get('reason'))[:400]}"
            )
        return "\n".join(lines)

    def why(self) -> str:
        s = self.status()
        trials = [(t.get("arm"), t.get("outcome")) for t in s.get("trials") or []]
        # The events say why the loop moved (a Retune names its cause): the applied arm at
        # the time of a failure may be one a later search chose.
        events = [f"{e.get('reason')}: {str(e.get('message'))[:160]}" for e in self.events()[-8:]]
        return (
            f"phase={s.get('phase')} applied={s.get('applied')} trials={trials} "
            f"conditions={json.dumps(s.get('conditions'))} sims={list(self.sims.running())} "
            f"sim errors={self.sims.errors}\nlast events: {events}\n"
            f"operator log:\n{self.install.operator.log()[-3000:]}"
        )


def arm_of_args(args: list[str]) -> str:
    """The arm a vLLM command line runs, read from its ``--speculative-config`` JSON."""
    raw = None
    for i, a in enumerate(args):
        if a == "--speculative-config" and i + 1 < len(args):
            raw = args[i + 1]
        elif a.startswith("--speculative-config="):
            raw = a.split("=", 1)[1]
    if raw is None:
        return "off"
    cfg = json.loads(raw)
    drafter = "eagle3" if cfg.get("model") == EAGLE_MODEL else str(cfg["method"])
    table = cfg.get("num_speculative_tokens_per_batch_size")
    if table:
        return Arm.scheduled(drafter, tuple(tuple(e) for e in table)).name
    return f"{drafter}/{cfg['num_speculative_tokens']}"


def _deployment() -> dict[str, Any]:
    return target_deployment(TARGET, MODEL)


@pytest.fixture(scope="module")
def world(
    cluster: Cluster,
    rules_prometheus: Prometheus,
    install: Install,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    scenario = load_scenario(SCENARIO)
    oracle = Oracle(scenario, scenario.seed)
    runs = oracle.runs([a.name for a in oracle.candidates()])
    metric = bench_objective(scenario).metric
    values = {
        arm: metric_value(r.requests, metric, 0.0, float(scenario.duration_s))
        for arm, r in runs.items()
        if r.failure is None
    }
    best = min(values, key=lambda a: values[a])
    ns = install.watched_ns
    cluster.kubectl("-n", ns, "apply", "-f", "-", input=yaml.safe_dump(_deployment()))
    cluster.kubectl("-n", ns, "rollout", "status", f"deployment/{TARGET}", "--timeout=90s")
    sims = InjectableSimPods(
        cluster,
        rules_prometheus,
        ns,
        SCENARIO,
        TIME_SCALE,
        tmp_path_factory.mktemp("e2e-sims"),
        container="vllm",
        shared_clock=True,  # a canary gets the incumbent's requests, as behind one Service
    )
    sims.start()
    w = World(cluster, rules_prometheus, install, sims, scenario, oracle, best, values[best])
    try:
        rules_prometheus.wait_for_series(
            f'vllm:num_requests_running{{namespace="{ns}"}}', timeout=60
        )
        # The example exactly as shipped, and no other object (no Secret: it names none). Its
        # Prometheus URL is overridden by the chart's operator.prometheusUrl, as a user whose
        # operator reaches Prometheus elsewhere does.
        cluster.kubectl("-n", ns, "apply", "-f", str(EXAMPLE))

        def settled() -> dict[str, Any] | None:
            s = w.status()
            conds = {c["type"]: c for c in s.get("conditions") or []}
            bad = [e for e in w.events() if e["type"] == "Warning"]
            if bad or s.get("phase") == "Failed" or "MetricsAvailable" in conds:
                return {"status": s, "warnings": [(e["reason"], e["message"]) for e in bad]}
            return None

        w.shipped = wait_for(settled, timeout=90, message=lambda: f"an outcome; {w.why()}")
        yield w
    finally:
        sims.stop()


def test_the_chart_installed_the_operator_and_prometheus_loaded_its_rules(world: World) -> None:
    release = json.loads(
        world.cluster.helm(
            "status", world.install.release, "-n", world.install.system_ns, "-o", "json"
        ).stdout
    )
    assert release["info"]["status"] == "deployed"
    world.cluster.kubectl("get", "crd", "spectunings.spectune.io")
    sa = f"system:serviceaccount:{world.install.system_ns}:{world.install.service_account}"
    can = world.kubectl("auth", "can-i", "patch", "deployments.apps", f"--as={sa}", check=False)
    assert can.strip() == "yes"
    groups = httpx.get(f"{world.prom.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert {"SpecTuneAcceptanceDrift", "spectune:first_position_acceptance:baseline"} <= set(rules)
    wait_for(
        lambda: all(r["health"] == "ok" for r in rules_now(world)),
        timeout=30,
        message=lambda: f"healthy rules: {[r for r in rules_now(world) if r['health'] != 'ok']}",
    )


def rules_now(world: World) -> list[dict[str, Any]]:
    groups = httpx.get(f"{world.prom.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    return [r for g in groups for r in g["rules"]]


def test_the_shipped_example_runs_as_shipped(world: World) -> None:
    status = world.shipped["status"]
    assert status.get("phase") != "Failed", status
    assert not world.shipped["warnings"], world.shipped["warnings"]


def _wait_converged(world: World, timeout: float) -> dict[str, Any]:
    def converged() -> dict[str, Any] | None:
        s = world.status()
        applied = (s.get("applied") or {}).get("arm")
        if s.get("phase") == "Monitoring" and applied and world.target_arm() == applied:
            return s
        return None

    status: dict[str, Any] = wait_for(
        converged, timeout=timeout, interval=1.0, message=lambda: f"Monitoring; {world.why()}"
    )
    return status


def _assert_near_oracle(world: World, arm: str) -> None:
    if arm == world.best_arm:
        return
    value = world.value_of(arm)
    ratio = world.best_value / value
    assert ratio >= NEAR_ORACLE, (
        f"promoted {arm} ({value * 1e3:.2f} ms tpotP95) is {ratio:.3f} of the oracle's "
        f"{world.best_arm} ({world.best_value * 1e3:.2f} ms); trials:\n{world.trial_log()}"
    )


def test_converges_to_the_oracle_arm_and_the_deployment_runs_it(world: World) -> None:
    status = _wait_converged(world, timeout=480)
    arm = status["applied"]["arm"]
    assert world.target_arm() == arm
    _assert_near_oracle(world, arm)
    reasons = [e["reason"] for e in world.events()]
    assert "TrialStarted" in reasons and "Promoted" in reasons, reasons
    # the canaries are gone once the search has finished
    wait_for(
        lambda: not world.kubectl("get", "deploy", "-l", "spectune.io/role=canary", "-o", "name"),
        timeout=60,
        message="canaries removed",
    )


def test_kubectl_get_spt_shows_phase_drafter_k_acceptance_and_speedup(world: World) -> None:
    lines = world.kubectl("get", "spt", TARGET).strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].split()[:6] == ["NAME", "PHASE", "DRAFTER", "K", "ACCEPTANCE", "SPEEDUP"]
    # A window without drafts (every pod restarting) leaves the acceptance cell empty; a
    # user waits one window for it.
    cols = wait_for(
        lambda: (c := world.get_spt_columns())["ACCEPTANCE"] and c,
        timeout=60,
        message=lambda: f"an ACCEPTANCE cell; status: {world.status().get('acceptance')}",
    )
    running = world.target_arm()
    assert cols["PHASE"] == "Monitoring", cols
    assert cols["DRAFTER"] == running.split("/")[0], cols
    if "/sched:" not in running:
        assert cols["K"] == running.split("/")[1], cols
    assert 0.0 < float(cols["ACCEPTANCE"]) <= 1.0, cols
    assert float(cols["SPEEDUP"]) > 1.0, cols  # off is ~1.6x slower on this scenario


def test_kubectl_acceptance_agrees_with_the_charts_recording_rule(world: World) -> None:
    # The two read different spans (the operator's last window, the rule's last 5 m at the
    # rules' scale), so right after a promotion one may still hold the old k's passes; on a
    # steady setting they must agree.
    seen: list[tuple[float, float]] = []

    def agree() -> bool:
        cols = world.get_spt_columns()
        rows = world.prom.query(
            f'spectune:acceptance_rate:ratio_rate5m{{namespace="{world.ns}",deployment="{TARGET}"}}'
        )
        if not rows or not cols["ACCEPTANCE"]:
            return False
        seen.append((float(rows[0]["value"][1]), float(cols["ACCEPTANCE"])))
        return abs(seen[-1][0] - seen[-1][1]) < 0.1

    wait_for(
        agree,
        timeout=60,
        interval=2.0,
        message=lambda: f"(rule, kubectl) acceptance agreeing within 0.1; last {seen[-5:]}",
    )


def test_a_model_version_bump_reopens_the_search_and_it_converges_again(world: World) -> None:
    before = len([e for e in world.events() if e["reason"] == "Retune"])
    world.kubectl("annotate", "deployment", TARGET, "spectune.io/model-version=v2", "--overwrite")
    phases: list[str] = []

    def reopened() -> bool:
        s = world.status()
        phase = s.get("phase")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        return any(p in ("Baseline", "Exploring") for p in phases)

    wait_for(reopened, timeout=60, interval=0.3, message=lambda: f"re-opened; {world.why()}")
    retunes = [e for e in world.events() if e["reason"] == "Retune"]
    assert len(retunes) > before and "model version" in retunes[-1]["message"], retunes
    status = _wait_converged(world, timeout=480)
    assert status.get("observedModelVersion") == "v2", status.get("observedModelVersion")
    _assert_near_oracle(world, status["applied"]["arm"])


def _drift_alerts(world: World) -> list[dict[str, Any]]:
    return world.prom.query(
        f'ALERTS{{alertname="SpecTuneAcceptanceDrift",alertstate="firing",'
        f'namespace="{world.ns}",deployment="{TARGET}"}}'
    )


def test_an_acceptance_drop_fires_the_drift_alert(world: World) -> None:
    drift = world.spt()["spec"]["retune"]["drift"]
    assert drift["action"] == "retune"  # as shipped
    assert not _drift_alerts(world), "the drift alert fired before any drop"
    # A user's drift alert needs its baseline (6 h of history, 3 min at the rules' scale);
    # the operator needs a reference window on the promoted setting. Wait for both.
    baseline = (
        f'spectune:first_position_acceptance:baseline{{namespace="{world.ns}",'
        f'deployment="{TARGET}"}}'
    )
    wait_for(
        lambda: world.prom.query(baseline),
        timeout=300,
        interval=2.0,
        message="the drift alert's baseline in Prometheus",
    )
    time.sleep(3 * 300 / TIME_SCALE)  # three of the example's 5 m windows
    assert _wait_converged(world, timeout=120)
    # The operator's drift reference is the first full window on the promoted setting
    # (kept in status.history with the loop's state): a drop before it would be the
    # reference itself.
    wait_for(
        lambda: (decode_memory(world.status().get("history")).get("state") or {}).get(
            "reference_acceptance"
        ),
        timeout=60,
        interval=0.5,
        message=lambda: f"the operator's drift reference; {world.why()}",
    )
    world.sims.inject(
        {"kind": "model_version", "version": "v2", "acceptance_scale": {"eagle3": DRIFT_SCALE}}
    )
    wait_for(world.sims.delivered, timeout=30, message="the drop reached every simulated pod")
    dropped_at = time.monotonic()
    wait_for(
        lambda: _drift_alerts(world),
        timeout=120,
        interval=1.0,
        message=lambda: f"SpecTuneAcceptanceDrift firing; {world.why()}",
    )
    world.drift_alert_s = time.monotonic() - dropped_at


def test_the_operator_records_the_drift_and_acts_per_drift_action(world: World) -> None:
    assert world.drift_alert_s is not None, "no acceptance drop was injected"

    def drifted() -> dict[str, Any] | None:
        found = [e for e in world.events() if e["reason"] == "AcceptanceDrift"]
        return found[-1] if found else None

    def retuned() -> list[dict[str, Any]]:
        retunes = [e for e in world.events() if e["reason"] == "Retune"]
        return [e for e in retunes if "acceptance" in e["message"]]

    event = wait_for(drifted, timeout=180, interval=1.0, message=lambda: f"drift; {world.why()}")
    assert event["type"] == "Warning"
    assert "below" in event["message"], event["message"]
    # drift.action retune (as shipped): the operator re-opened the search, naming the drift
    # (the new search may have re-opened again since, e.g. on a load move); the alert action
    # would hold the setting in phase Drifted instead. The Retune is emitted right after the
    # drift event, but kopf posts events one by one in the background: a listing can hold
    # the first and not yet the second, so it is waited for too.
    wait_for(
        retuned, timeout=30, interval=1.0,
        message=lambda: f"no Retune names the acceptance drop; {world.why()}",
    )  # fmt: skip
