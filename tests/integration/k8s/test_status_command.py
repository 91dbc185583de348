"""``spectune status NS/NAME [-w]`` against the real API server (issue [M] item 11).

A SpecTuning is created with the generated CRD, and its status is written through the status
subresource as the operator writes it (``build_status``: the trials, the applied and
recommended arms, the gzipped history). The command is run through its entry point
(``python -m spectune``) with the test cluster's kubeconfig, as a user would.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.fixtures.cluster import Cluster
from tests.unit.api.bad_specs import BASE
from tests.unit.operator.test_status_projection import status_stats

from spectune.api.crd import CRD_PATH
from spectune.api.names import API_VERSION, CRD_NAME, GROUP, KIND, PLURAL, VERSION
from spectune.api.status import Acceptance, Interval, Phase, Recommendation, SpecTuningStatus
from spectune.control.controller import ControllerState
from spectune.core import predict_speedup
from spectune.exitcodes import ExitCode
from spectune.k8s.projection import Memory, StatusInputs, build_status, decode_memory
from spectune.search.arms import parse_arm
from spectune.search.history import History, Outcome, TrialRecord, WindowRecord
from spectune.search.objective import WindowStats

REPO = Path(__file__).resolve().parents[3]
NAN = math.nan
NAME = "llama-8b"


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> Iterator[None]:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / CRD_PATH))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD_NAME}")
    yield


def _stats(objective: float, **kw: Any) -> WindowStats:
    return status_stats(objective, accepted_length=2.8, **kw)


def _status() -> dict[str, Any]:
    """A status as the operator writes it: one measured trial (eagle3/3: p95 TPOT 30 ms on
    the incumbent, 20 ms on the canary, 80/60/40 % of drafts accepted at positions 1-3) and
    one running, eagle3/3 applied and recommended."""
    now = datetime.now(UTC).timestamp()
    w = WindowRecord(
        now - 600, now - 300, _stats(0.030),
        _stats(0.020, k=3, drafts=1000, per_pos=(800, 600, 400)), "off",
    )  # fmt: skip
    measured = TrialRecord("eagle3/3", "off", 0, now - 600, Outcome.MEASURED, "promoted", (w,))
    history = History().add_trial(measured).add_trial(TrialRecord("ngram/2", "eagle3/3", 0, now))
    doc = build_status(
        SpecTuningStatus(),
        StatusInputs(
            phase=Phase.EXPLORING, generation=1, now=datetime.now(UTC),
            memory=Memory(history, ControllerState(), original="off"),
            applied=parse_arm("eagle3/3"), fingerprint="abc123",
            recommendation=Recommendation(arm="eagle3/3", drafter="eagle3", k=3,
                                          expected_speedup=1.48,
                                          interval=Interval(low=1.31, high=1.62),
                                          reason="best of 2 arms measured"),
            acceptance=Acceptance(rate=0.6, per_position=(0.8, 0.6, 0.4),
                                  mean_accepted_length=2.8, window="5m"),
        ),
    )  # fmt: skip
    doc["conditions"] = [
        {"type": "Ready", "status": "True", "reason": "Tuning", "message": "trial 2 running",
         "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    ]  # fmt: skip
    return doc


def _spectune(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {**os.environ, "PYTHONPATH": str(REPO / "operator"), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "spectune", *argv], capture_output=True, text=True, timeout=120,
        env={**base, **(env or {})},
    )  # fmt: skip


@pytest.fixture
def spt(cluster: Cluster, namespace: str, crd: None) -> client.CustomObjectsApi:
    custom = client.CustomObjectsApi(cluster.api)
    body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": NAME}, "spec": BASE}
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, NAME, {"status": _status()}
    )
    return custom


def test_status_shows_phase_settings_curve_and_trials_measured_and_predicted(
    spt: client.CustomObjectsApi, namespace: str
) -> None:
    stored = spt.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
    assert isinstance(stored["status"]["history"], str)  # gzipped, as the operator writes it
    assert decode_memory(stored["status"]["history"])["history"]["trials"][0]["arm"] == "eagle3/3"

    proc = _spectune("status", f"{namespace}/{NAME}", "--json")
    assert proc.returncode == 0, proc.stderr
    v = json.loads(proc.stdout)
    assert v["phase"] == "Exploring" and v["ready"]["status"] == "True"
    assert v["applied"]["arm"] == "eagle3/3" and v["recommendation"]["arm"] == "eagle3/3"
    assert v["recommendation"]["interval"] == [1.31, 1.62]
    assert v["acceptance"]["per_position"] == [0.8, 0.6, 0.4]
    first, running = v["trials"]
    assert first["arm"] == "eagle3/3" and running["outcome"] == "running"
    assert math.isclose(first["measured_gain"], 0.030 / 0.020)  # a latency: incumbent / canary
    # From the canary's counters in status.history: P(L>=i) = 0.8, 0.6, 0.4 at cost 0.1.
    expected = float(predict_speedup([0.8, 0.6, 0.4], 0.1).speedup[3])
    assert math.isclose(first["predicted_speedup"], expected)
    assert math.isclose(first["acceptance"], 1800 / 3000)
    assert running["measured_gain"] is None and running["predicted_speedup"] is None
    assert v["last_decision"] == "eagle3/3 measured: promoted"

    costly = json.loads(_spectune("status", NAME, "-n", namespace, "--json", "--draft-cost",
                                  "0.3").stdout)  # fmt: skip
    assert costly["trials"][0]["predicted_speedup"] < first["predicted_speedup"]

    shown = _spectune("status", f"{namespace}/{NAME}")
    assert shown.returncode == 0, shown.stderr
    for text in ("Exploring", "Ready=True", "eagle3/3 (applied)", "expected 1.48× [1.31, 1.62]",
                 "Acceptance of the applied arm", "1.50×", f"{expected:.2f}×", "ngram/2",
                 "Last decision", "Conditions"):  # fmt: skip
        assert text in shown.stdout, (text, shown.stdout)


def test_watch_prints_each_change_until_stopped(
    spt: client.CustomObjectsApi, namespace: str
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "spectune", "status", f"{namespace}/{NAME}", "-w", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["phase"] == "Exploring"
        spt.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, NAME, {"status": {"phase": "Converged"}}
        )
        while (line := proc.stdout.readline()) and json.loads(line)["phase"] != "Converged":
            pass
        assert line, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_missing_spectuning_or_an_unreachable_api_server_has_its_exit_code(
    cluster: Cluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    missing = _spectune("status", f"{namespace}/nope")
    assert missing.returncode == ExitCode.BAD_INPUT
    err = missing.stderr.strip()
    assert "\n" not in err and f"SpecTuning {namespace}/nope not found" in err
    kubeconfig = tmp_path / "down.yaml"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: down\n"
        "clusters: [{name: down, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: down, context: {cluster: down, user: u}}]\n"
    )
    down = _spectune("status", f"{namespace}/{NAME}", env={"KUBECONFIG": str(kubeconfig)})
    assert down.returncode == ExitCode.UNREACHABLE, down.stderr
    assert "cannot reach the API server" in down.stderr and "Traceback" not in down.stderr
    assert len(down.stderr.strip().splitlines()) == 1
    bad = _spectune("status", "a/b/c")
    assert bad.returncode == ExitCode.BAD_INPUT and "NAMESPACE/NAME" in bad.stderr
