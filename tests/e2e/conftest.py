"""Fixtures of the e2e tier: the whole product installed and run as a user would run it.

* ``rules_prometheus`` (module): a real Prometheus (Debian's package) that scrapes the
  simulated pods every 250 ms and evaluates the chart's recording and alerting rules — the
  ``PrometheusRule`` that ``helm template --set prometheusRule.enabled=true`` renders, with
  every duration divided by :data:`RULE_SCALE` (range selectors, ``offset``, ``for`` and the
  group ``interval``; counts such as "360 evaluations" stay, since the evaluation interval
  scales with them). That mechanical rewrite is the only difference from the shipped rules:
  the drift alert's six-hour baseline becomes three minutes.
* ``install`` (module): ``helm install`` of charts/spectune (CRD, RBAC, the operator
  Deployment — kwok runs no process in its pod), and the operator itself as a local
  ``spectune run`` process with the installed Deployment's container args and environment,
  authenticated with a TokenRequest token of the chart's ServiceAccount, so the API server
  enforces exactly the chart's RBAC.
* :class:`InjectableSimPods`: the simulated-pods harness (``tests/fixtures/simpods.py``)
  that can also apply a scenario event to every pod of the namespace — now and to every pod
  started later — through ``sim serve``'s ``POST /sim/events``.

A component that cannot start fails the tests (never skips).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client

from spectune.playground import operator_command, service_account_kubeconfig
from tests.fixtures.cluster import Cluster
from tests.fixtures.prometheus import Prometheus, _spawn, _wait_ready, free_port
from tests.fixtures.simpods import SimPods
from tests.integration.operator.conftest import OperatorProcess

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "spectune"

TIME_SCALE = 60.0
"""Simulated (and spec) seconds per wall second: sim serve and SPECTUNE_TIME_SCALE."""
RULE_SCALE = 120.0
"""Every duration of the chart's rules is divided by this for the test's Prometheus."""

_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_UNIT_MS["y"] = 365 * _UNIT_MS["d"]


def _scaled(duration: str, factor: float) -> str:
    """A Prometheus duration divided by ``factor``, in milliseconds (``5m``/120 → ``2500ms``)."""
    parts = _DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    ms = sum(int(n) * _UNIT_MS[u] for n, u in parts)
    return f"{max(1, round(ms / factor))}ms"


def scale_rules(groups: list[dict[str, Any]], factor: float) -> list[dict[str, Any]]:
    """The rule groups with every duration divided by ``factor`` (see the module docstring)."""
    dur = r"((?:\d+(?:ms|[smhdwy]))+)"

    def expr(text: str) -> str:
        text = re.sub(r"\[" + dur + r"\]", lambda m: f"[{_scaled(m.group(1), factor)}]", text)
        return re.sub(r"offset " + dur, lambda m: f"offset {_scaled(m.group(1), factor)}", text)

    out = []
    for g in groups:
        g = dict(g)
        g["interval"] = _scaled(str(g.get("interval", "1m")), factor)
        rules = []
        for r in g["rules"]:
            r = dict(r)
            r["expr"] = expr(str(r["expr"]))
            if "for" in r:
                r["for"] = _scaled(str(r["for"]), factor)
            rules.append(r)
        g["rules"] = rules
        out.append(g)
    return out


def chart_rules(cluster: Cluster) -> list[dict[str, Any]]:
    """The rule groups of the chart's PrometheusRule, as ``helm template`` renders them."""
    out = cluster.run(
        "helm", "template", "spectune", str(CHART),
        "--set", "prometheusRule.enabled=true",
        "--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
        "--show-only", "templates/prometheusrule.yaml",
    ).stdout  # fmt: skip
    doc = yaml.safe_load(out)
    assert doc["kind"] == "PrometheusRule", doc
    groups: list[dict[str, Any]] = doc["spec"]["groups"]
    return groups


@pytest.fixture(scope="module")
def rules_prometheus(cluster: Cluster) -> Iterator[Prometheus]:
    """A real Prometheus with the chart's rules (time-scaled), scraping file_sd targets."""
    binary = shutil.which("prometheus")
    if binary is None or shutil.which("promtool") is None:
        pytest.fail("prometheus and promtool must be on PATH (apt-get install -y prometheus)")
    workdir = Path(tempfile.mkdtemp(prefix="spectune-e2e-prom-"))
    (workdir / "targets").mkdir()
    rules = workdir / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": scale_rules(chart_rules(cluster), RULE_SCALE)}))
    check = subprocess.run(
        ["promtool", "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    if check.returncode != 0:
        pytest.fail(f"promtool refused the time-scaled chart rules:\n{check.stdout}{check.stderr}")
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 250ms\n"
        "  scrape_timeout: 250ms\n"
        "  evaluation_interval: 500ms\n"
        f"rule_files: ['{rules}']\n"
        "scrape_configs:\n"
        "  - job_name: engines\n"
        "    file_sd_configs:\n"
        f"      - files: ['{workdir}/targets/*.json']\n"
        "        refresh_interval: 1s\n"
    )
    port = free_port()
    command = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    server = Prometheus(f"http://127.0.0.1:{port}", workdir, _spawn(command, workdir), command)
    if not _wait_ready(server, 60):
        server.stop()
        pytest.fail(f"Prometheus did not become ready on port {port}:\n{server.log()}")
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


class InjectableSimPods(SimPods):
    """:class:`SimPods` that can apply scenario events to every pod (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._events: list[dict[str, Any]] = []
        self._delivered: dict[str, int] = {}
        self._events_lock = threading.Lock()

    def inject(self, event: dict[str, Any]) -> None:
        """Apply ``event`` to every running pod and to every pod started from now on."""
        with self._events_lock:
            self._events.append(event)

    def delivered(self) -> bool:
        """Whether every running pod has received every injected event."""
        with self._events_lock:
            wanted = len(self._events)
        pods = list(self.sims)
        return bool(pods) and all(self._delivered.get(p, 0) == wanted for p in pods)

    def sync(self) -> None:
        super().sync()
        with self._events_lock:
            events = list(self._events)
        for name, sim in list(self.sims.items()):
            done = self._delivered.get(name, 0)
            for event in events[done:]:
                try:
                    resp = httpx.post(
                        f"http://127.0.0.1:{sim.port}/sim/events", json=event, timeout=5
                    )
                except httpx.TransportError:
                    break  # not listening yet; the next pass tries again
                if resp.status_code != 200:
                    raise AssertionError(f"sim serve refused {event}: {resp.text}")
                done += 1
            self._delivered[name] = done


@dataclass
class Install:
    """A helm release of the chart, and the operator running with its identity."""

    release: str
    system_ns: str
    watched_ns: str
    operator: OperatorProcess
    service_account: str
    deployment: dict[str, Any]


def _kubeconfig_for(cluster: Cluster, namespace: str, sa: str, path: Path) -> Path:
    core = client.CoreV1Api(cluster.api)
    token = core.create_namespaced_service_account_token(
        sa,
        namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=7200)
        ),
    ).status.token
    return service_account_kubeconfig(cluster.kubeconfig, token, namespace, sa, path)


@pytest.fixture(scope="module")
def install(
    cluster: Cluster, rules_prometheus: Prometheus, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Install]:
    """``helm install`` the chart watching a fresh namespace; run the operator as its SA."""
    suffix = uuid.uuid4().hex[:6]
    watched, system = f"e2e-{suffix}", f"e2e-{suffix}-system"
    release = "spectune"
    for ns in (watched, system):
        cluster.kubectl("create", "namespace", ns)
    liveness, metrics = free_port(), free_port()
    work = tmp_path_factory.mktemp("e2e-operator")
    op: OperatorProcess | None = None
    try:
        cluster.helm(
            "install", release, str(CHART), "-n", system,
            "--set", f"watchNamespaces={{{watched}}}",
            "--set", f"operator.prometheusUrl={rules_prometheus.url}",
            "--set", "operator.pollSeconds=1",
            "--set", f"operator.timeScale={TIME_SCALE:g}",
            "--set", f"operator.livenessPort={liveness}",
            "--set", f"operator.metricsPort={metrics}",
            "--set", "operator.verbose=true",
            "--wait", "--timeout", "120s",
            timeout=180,
        )  # fmt: skip
        dep = json.loads(cluster.kubectl("get", "deployment", "-n", system, "-o", "json").stdout)[
            "items"
        ][0]
        argv, container_env, sa = operator_command(dep)
        env = {**os.environ, **container_env}
        env["KUBECONFIG"] = str(_kubeconfig_for(cluster, system, sa, work / "kubeconfig"))
        log = work / "operator.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                start_new_session=True,
            )
        op = OperatorProcess(proc, log, metrics)
        yield Install(release, system, watched, op, sa, dep)
    finally:
        if op is not None:
            op.stop()
            print(f"--- operator log ({op.log_path}) ---\n{op.log()}")
        cluster.helm("uninstall", release, "-n", system, "--wait", check=False)
        for ns in (watched, system):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
