"""``spectune playground up|down``, run as a user runs it (docs/try-it.md).

``up`` starts its own control plane (``hack/cluster.sh``), so these tests use none of the
tier's fixtures: the command line, its stdout (the export lines), the SpecTuning read
through the real API server with ``kubectl``, Prometheus' HTTP API and ``/proc`` are all
they look at. A playground that cannot start fails the test with its messages (never a
skip). The time scale is high (60x: a 5 m window is 5 s) to keep it short.

``down`` must stop exactly what ``up`` started: every process of its state file, every
simulated pod, every component of the control plane, with their ports free again; a second
``down`` does nothing, a second ``up`` changes nothing, and an ``up`` that fails half-way
stops what it had started and names the step.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.doccommands import commands_of
from tests.fixtures.cluster import wait_for

REPO = Path(__file__).resolve().parents[2]
TIME_SCALE = 60


def playground(
    action: str, directory: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spectune", "playground", action, "--dir", str(directory), *extra],
        cwd=REPO,
        env=env or dict(os.environ),
        text=True,
        capture_output=True,
        timeout=600,
        check=False,
    )


def exports(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        out[name] = shlex.split(value.replace('"$PATH"', ""))[0].rstrip(":")
    return out


def pid_runs(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def port_free(port: int) -> bool:
    """Nothing listens on ``port`` (connections of the stopped servers may sit in TIME_WAIT,
    which SO_REUSEADDR allows, as a server that restarts sets it)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


def started(directory: Path) -> tuple[dict[int, str], dict[int, str]]:
    """Every process (pid → name) and port (→ owner) the playground in ``directory`` runs."""
    state = json.loads((directory / "state.json").read_text())
    pids = {p["pid"]: p["name"] for p in state["processes"]}
    ports = {port: name for name, port in state["ports"].items()}
    sims = json.loads((directory / "sims" / "running.json").read_text())
    pids.update({s["pid"]: f"sim serve {pod}" for pod, s in sims.items()})
    ports.update({s["port"]: f"sim serve {pod}" for pod, s in sims.items()})
    cluster = directory / "cluster"
    for line in (cluster / "pids").read_text().splitlines():
        pid, name = line.split()
        pids[int(pid)] = name
    for line in (cluster / "ports.env").read_text().splitlines():
        name, _, port = line.partition("=")
        ports[int(port)] = name
    return pids, ports


def fail(what: str, proc: subprocess.CompletedProcess[str]) -> None:
    pytest.fail(
        f"{what} (rc={proc.returncode})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}",
        pytrace=False,
    )


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "playground"
    try:
        yield d
    finally:
        if (d / "state.json").exists():  # the test failed before its own `down`
            playground("down", d)


def test_up_tunes_the_example_and_down_stops_exactly_what_up_started(directory: Path) -> None:
    t0 = time.monotonic()
    up = playground("up", directory, "--time-scale", str(TIME_SCALE))
    if up.returncode != 0:
        fail("spectune playground up failed (is hack/cluster.sh build done?)", up)
    env = exports(up.stdout)
    assert set(env) == {"KUBECONFIG", "PATH"}, up.stdout
    kubectl = [str(Path(env["PATH"]) / "kubectl"), f"--kubeconfig={env['KUBECONFIG']}", "-n", "llm"]
    assert "kubectl get spt -n llm -w" in up.stderr and "spectune status llm/llama-70b" in up.stderr
    pids, ports = started(directory)
    assert {"prometheus", "pods", "operator", "kube-apiserver", "etcd", "kwok"} <= set(
        pids.values()
    )

    def spt() -> dict[str, Any]:
        out = subprocess.run(
            [*kubectl, "get", "spt", "llama-70b", "-o", "json"],
            capture_output=True,
            text=True,
            check=True,
        )
        obj: dict[str, Any] = json.loads(out.stdout)
        return obj

    status = wait_for(
        lambda: (s := spt().get("status") or {}).get("phase") and s.get("trials") and s,
        timeout=120,
        interval=1.0,
        message=lambda: (
            f"a phase and a trial; {spt().get('status')}\n"
            f"operator log:\n{(directory / 'logs' / 'operator.log').read_text()[-3000:]}"
        ),
    )
    assert status["phase"] != "Failed", status

    # Prometheus scrapes every Running pod of the Deployment, labelled as the docs require.
    state = json.loads((directory / "state.json").read_text())
    query = httpx.get(
        f"http://127.0.0.1:{state['ports']['prometheus']}/api/v1/query",
        params={"query": 'vllm:num_requests_running{namespace="llm"}'},
        timeout=10,
    ).json()
    scraped = {r["metric"]["pod"] for r in query["data"]["result"]}
    pods = subprocess.run(
        [*kubectl, "get", "pods", "-o", "jsonpath={.items[*].metadata.name}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert scraped and scraped <= set(pods), (scraped, pods)

    # docs/try-it.md's status command, with up's exports
    shown = subprocess.run(
        [sys.executable, "-m", "spectune", "status", "llm/llama-70b"],
        cwd=REPO,
        env={**os.environ, "KUBECONFIG": env["KUBECONFIG"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0 and "llm/llama-70b" in shown.stdout, shown.stderr
    assert "Trials" in shown.stdout, shown.stdout

    again = playground("up", directory)
    assert again.returncode != 0 and "already up" in again.stderr, again.stderr
    assert json.loads((directory / "state.json").read_text())["processes"] == state["processes"]

    pids, ports = started(directory)  # the simulators of the trials too
    down = playground("down", directory)
    if down.returncode != 0:
        fail("spectune playground down failed", down)
    running = {pid: name for pid, name in pids.items() if pid_runs(pid)}
    assert not running, f"still running after down: {running}"
    busy = {port: name for port, name in ports.items() if not port_free(port)}
    assert not busy, f"ports still taken after down: {busy}"
    assert not (directory / "state.json").exists() and not (directory / "cluster").exists()
    twice = playground("down", directory)
    assert twice.returncode == 0 and "nothing to do" in twice.stderr, twice.stderr
    ran = {'eval "$(spectune playground up)"', "spectune status llm/llama-70b"}
    assert set(commands_of("e2e")) == ran | {"spectune playground down"}
    print(f"playground up, tuning, down in {time.monotonic() - t0:.0f}s")


def test_a_failed_up_stops_what_it_started_and_names_the_step(
    directory: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "bin"
    broken.mkdir()
    (broken / "prometheus").write_text("#!/bin/sh\necho 'cannot bind' >&2\nexit 1\n")
    (broken / "prometheus").chmod(0o755)
    env = {**os.environ, "PATH": f"{broken}{os.pathsep}{os.environ['PATH']}"}
    up = playground("up", directory, "--time-scale", str(TIME_SCALE), env=env)
    assert up.returncode != 0, up.stderr
    assert "up FAILED at Prometheus" in up.stderr and "cannot bind" in up.stderr, up.stderr
    # the control plane had started before Prometheus: down ran on it
    assert "[cluster] cluster up" in up.stderr and "[cluster] cluster down" in up.stderr
    assert not (directory / "state.json").exists() and not (directory / "cluster").exists()
    leftovers = subprocess.run(
        ["pgrep", "-f", str(directory)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert not leftovers, f"processes of the failed playground still run: {leftovers}"
