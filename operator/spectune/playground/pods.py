"""Pods that behave like vLLM: one ``spectune sim serve`` per Running kwok pod.

kwok runs the pods of the local cluster (``hack/cluster.sh``) on fake nodes: they reach
``Running`` but no process starts. :class:`SimPods` gives each of them a body: for every
Running pod of a Deployment in a namespace it starts ``spectune sim serve`` with that pod's
container args on a free 127.0.0.1 port, registers it as a Prometheus ``file_sd`` target
labelled ``{namespace, pod}`` (the labels the chart's rules and the operator's queries
need), and stops it (and unregisters it) when the pod goes away. So a patch of the
Deployment really changes what Prometheus measures once the rollout has replaced the pods.

``spectune playground up`` runs this module as a background process (:func:`main`: ``python
-m spectune.playground.pods``) that records its simulators' pids for ``playground down``;
the test tiers' ``sim_pods`` fixture (``tests/fixtures/simpods.py``) runs the same class in a
thread.

A ``sim serve`` that exits early (e.g. an arm whose KV pool cannot hold a sequence, as vLLM
fails at start-up) is recorded in :attr:`SimPods.exits` with its stderr, and (unless
``crash_pods=False``) shown on its pod as the kubelet would show a container that keeps
failing: the container waiting in ``CrashLoopBackOff`` with its last termination ``Error``
(exit code 1, the simulator's stderr as the message) and the pod not Ready. The time of that
write is in :attr:`SimPods.crashed_at`.

Every pod's simulator runs the harness's scenario, unless ``scenario_of`` (pod name →
scenario file) chooses one per pod when its simulator starts: e.g. one pod whose acceptance
decays with its uptime (a ``pod_decay`` event) beside pods that hold theirs. A pod deleted
and replaced by its ReplicaSet is a new pod with a new name, so its simulator starts afresh
(uptime 0) with whatever ``scenario_of`` says for the new name. :attr:`SimPods.started`
lists every pod given a simulator, in order, with the scenario it ran.

On a shared clock (``shared_clock=True``, as the playground and the e2e tier run) the pods
the harness follows are the pods behind one Service, the target's and its canaries': they
split one arrival stream as a load balancer does (``sim serve --service``, see
:mod:`spectune.sim.service`), so a canary takes its share of the offered load instead of
adding a whole stream to it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from spectune.sim.service import leave

__all__ = ["SimPods", "TargetFiles", "TargetRegistry", "free_port", "main"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TargetRegistry(Protocol):
    """Where a simulator is announced to Prometheus (a ``file_sd`` directory)."""

    def register_target(self, address: str, labels: dict[str, str]) -> Path:
        """Add one scrape target; return the file that holds it (unlink it to remove)."""
        ...


class TargetFiles:
    """A ``file_sd`` directory: one JSON file per target, written atomically."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._count = 0

    def register_target(self, address: str, labels: dict[str, str]) -> Path:
        """Add one scrape target (``host:port`` on loopback) with extra labels."""
        host = address.split(":")[0]
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError(f"simulated pods serve on loopback, got {address}")
        self._count += 1
        path = self.directory / f"target-{self._count}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": [address], "labels": labels}]))
        tmp.rename(path)  # atomic, so Prometheus never reads half a file
        return path


@dataclass
class _Sim:
    pod: str
    port: int
    args: list[str]
    process: subprocess.Popen[bytes]
    target_file: Path
    log: Path
    scenario: Path


class SimPods:
    """Keeps one simulator process per Running pod of a namespace (see the module docstring)."""

    def __init__(
        self,
        api_client: Callable[[], Any],
        targets: TargetRegistry,
        namespace: str,
        scenario: Path,
        time_scale: float,
        workdir: Path,
        container: str | None = None,
        interval_s: float = 0.5,
        crash_pods: bool = True,
        shared_clock: bool = False,
        scenario_of: Callable[[str], Path] | None = None,
    ) -> None:
        self.targets = targets
        self.namespace = namespace
        self.scenario = scenario
        self.time_scale = time_scale
        self.workdir = workdir
        self.container = container
        self.interval_s = interval_s
        self.sims: dict[str, _Sim] = {}
        self.exits: dict[str, str] = {}
        self.crashed_at: dict[str, float] = {}
        self.crash_pods = crash_pods
        self.clock_epoch = time.time() if shared_clock else None
        """With ``shared_clock``, every pod's simulated time 0 is this moment: pods of the
        namespace get the same requests at the same moment, as pods behind one Service
        do, and a canary is measured on the incumbent's traffic (``sim serve
        --clock-epoch``). Without it each pod serves the scenario from its own start."""
        self.service_dir = workdir / f"service-{namespace}" if shared_clock else None
        """With ``shared_clock``, the directory where the pods register as members of one
        service and split its arrival stream (``sim serve --service``): the service's
        offered load stays the scenario's however many pods serve it."""
        if self.service_dir is not None:
            # Members of an earlier run count on another clock: start the service empty.
            shutil.rmtree(self.service_dir, ignore_errors=True)
        self.scenario_of = scenario_of
        """The scenario of the pod of that name (None: :attr:`scenario` for every pod)."""
        self.started: list[tuple[str, Path]] = []
        """Every pod given a simulator, in the order they started, and its scenario."""
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"simpods-{namespace}", daemon=True)
        self._api = api_client()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> SimPods:
        """Start following the namespace's pods in a thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following and stop every simulator."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=10)
        for name in list(self.sims):
            self._end(name)
        self._api.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # kept for the caller to see; the loop goes on
                self.errors.append(exc)
            self._stop.wait(self.interval_s)

    # -- one pass -----------------------------------------------------------------------------

    def _pods(self) -> list[Any]:
        from kubernetes import client

        core = client.CoreV1Api(self._api)
        return list(core.list_namespaced_pod(self.namespace).items)

    def sync(self) -> None:
        """Start simulators for new Running pods; stop those whose pod went away."""
        live: dict[str, list[str]] = {}
        pods = {p.metadata.name: p for p in self._pods()}
        for p in pods.values():
            owners = p.metadata.owner_references or []
            if not any(o.kind == "ReplicaSet" for o in owners):
                continue
            if p.metadata.deletion_timestamp is not None or p.status.phase != "Running":
                continue
            if not (p.spec.node_name or "").startswith("kwok-"):
                continue
            live[p.metadata.name] = self._args(p)
        for name in list(self.sims):
            if name not in live:
                self._end(name)
        for name, args in live.items():
            if name not in self.sims and name not in self.exits:
                self._begin(name, args)
        for name, sim in list(self.sims.items()):
            if sim.process.poll() is not None:
                self.exits[name] = sim.log.read_text(errors="replace")[-2000:]
                code = sim.process.returncode
                self._end(name)
                if self.crash_pods and name in pods:
                    self._crash(pods[name], code, self.exits[name])

    def _crash(self, pod: Any, code: int, output: str) -> None:
        """Write the status the kubelet would show for a container that keeps exiting."""
        from kubernetes import client

        now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        statuses = []
        for c in pod.spec.containers:
            statuses.append(
                {
                    "name": c.name,
                    "image": c.image,
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 1,
                    "state": {
                        "waiting": {
                            "reason": "CrashLoopBackOff",
                            "message": f"back-off 10s restarting failed container={c.name} "
                            f"pod={pod.metadata.name}",
                        }
                    },
                    "lastState": {
                        "terminated": {
                            "exitCode": code,
                            "reason": "Error",
                            "message": output[-1000:],
                            "startedAt": now,
                            "finishedAt": now,
                        }
                    },
                }
            )
        not_ready = {"status": "False", "reason": "ContainersNotReady", "lastTransitionTime": now}
        body = {
            "status": {
                "containerStatuses": statuses,
                "conditions": [
                    {"type": "Ready", **not_ready},
                    {"type": "ContainersReady", **not_ready},
                ],
            }
        }
        core = client.CoreV1Api(self._api)
        core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, body)
        self.crashed_at[pod.metadata.name] = time.monotonic()

    def _args(self, pod: Any) -> list[str]:
        containers = pod.spec.containers
        chosen = containers[0]
        for c in containers:
            if c.name == self.container:
                chosen = c
        return [str(a) for a in (chosen.args or [])]

    def _begin(self, pod: str, args: list[str]) -> None:
        port = free_port()
        log = self.workdir / f"{pod}.log"
        scenario = self.scenario if self.scenario_of is None else self.scenario_of(pod)
        cmd = [
            sys.executable,
            "-m",
            "spectune.sim.command",
            "serve",
            "--scenario",
            str(scenario),
            "--port",
            str(port),
            "--time-scale",
            str(self.time_scale),
            *(["--clock-epoch", repr(self.clock_epoch)] if self.clock_epoch is not None else []),
            *(["--service", str(self.service_dir)] if self.service_dir is not None else []),
            "--",
            *args,
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        target = self.targets.register_target(
            f"127.0.0.1:{port}", {"namespace": self.namespace, "pod": pod}
        )
        self.sims[pod] = _Sim(pod, port, args, proc, target, log, scenario)
        self.started.append((pod, scenario))

    def _end(self, pod: str) -> None:
        sim = self.sims.pop(pod, None)
        if sim is None:
            return
        sim.target_file.unlink(missing_ok=True)
        if sim.process.poll() is None:
            try:
                os.killpg(sim.process.pid, signal.SIGTERM)
                sim.process.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(sim.process.pid, signal.SIGKILL)
                sim.process.wait(timeout=5)
        if self.service_dir is not None and self.clock_epoch is not None:
            # A simulator that crashed or was killed never announced its leave: the others
            # take its share from now on (a leave it announced itself stands).
            now_s = (time.time() - self.clock_epoch) * self.time_scale
            leave(self.service_dir, f"127.0.0.1:{sim.port}", now_s)

    def running(self) -> dict[str, list[str]]:
        """Pod name → the args its simulator runs with."""
        return {name: s.args for name, s in self.sims.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Follow one namespace's pods until SIGTERM (the playground's background process).

    After every pass it writes ``--record`` (JSON: pod → ``{"pid", "port"}`` of its
    simulator), so ``spectune playground down`` can check that each one is gone.
    """
    p = argparse.ArgumentParser(prog="python -m spectune.playground.pods")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--scenario", required=True)
    p.add_argument("--time-scale", type=float, required=True)
    p.add_argument("--targets", required=True, help="the Prometheus file_sd directory")
    p.add_argument("--logs", required=True, help="directory of the simulators' logs")
    p.add_argument("--record", required=True, help="JSON file of the running simulators")
    p.add_argument("--container", default=None)
    ns = p.parse_args(argv)
    from kubernetes import config

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    pods = SimPods(
        lambda: config.new_client_from_config(config_file=ns.kubeconfig),  # type: ignore[no-untyped-call]
        TargetFiles(Path(ns.targets)),
        ns.namespace,
        Path(ns.scenario),
        ns.time_scale,
        Path(ns.logs),
        container=ns.container,
        shared_clock=True,  # a canary gets the incumbent's requests, as behind one Service
    )
    record = Path(ns.record)
    try:
        while not stop.is_set():
            try:
                pods.sync()
            except Exception as exc:  # the API server restarting, say: log it, go on
                print(f"spectune playground: following pods: {exc!r}", file=sys.stderr, flush=True)
            doc = {n: {"pid": s.process.pid, "port": s.port} for n, s in pods.sims.items()}
            tmp = record.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc))
            tmp.rename(record)
            stop.wait(pods.interval_s)
    finally:
        pods.stop()
        record.write_text("{}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
