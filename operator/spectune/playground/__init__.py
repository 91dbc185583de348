"""``spectune playground up|down``: the operator at work on a local cluster, in one command.

``up`` starts, in the background, what the e2e tier runs (``tests/e2e``): the real control
plane of ``hack/cluster.sh`` (etcd, kube-apiserver, controller-manager, scheduler, kwok fake
nodes), the chart installed with ``helm install``, a vLLM-style Deployment ``llama-70b``
whose kwok pods each get a ``spectune sim serve`` body (:mod:`spectune.playground.pods`), a
real Prometheus scraping those simulators with the ``namespace`` and ``pod`` labels the
docs require, the operator, and ``examples/spectuning.yaml`` applied. kwok runs no
containers, so the operator runs as a local ``spectune run`` process with the installed
Deployment's arguments and environment, authenticated as the chart's ServiceAccount (the
API server enforces exactly the chart's RBAC).

Everything ``up`` starts is recorded, as it starts, in ``DIR/state.json`` (pids with their
start times, ports, the kubeconfig); ``down`` stops exactly those processes and runs
``hack/cluster.sh down`` on the cluster ``up`` started. A failed ``up`` does the same and
names the step that failed. It needs a checkout of the repository (``hack/``,
``charts/``) with the binaries of ``hack/cluster.sh build``, and Prometheus on ``PATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from spectune.errors import SpecTuneError
from spectune.exitcodes import ExitCode
from spectune.playground.pods import free_port

__all__ = [
    "PlaygroundError",
    "operator_command",
    "register",
    "service_account_kubeconfig",
    "target_deployment",
]

REPO = Path(__file__).resolve().parents[3]
NAMESPACE = "llm"
"""Where the target and the SpecTuning live (``examples/spectuning.yaml`` says ``-n llm``)."""
SYSTEM_NAMESPACE = "spectune-system"
RELEASE = "spectune"
TARGET = "llama-70b"
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
SCENARIO = "chat-eagle3.yaml"
STATE = "state.json"


class PlaygroundError(SpecTuneError):
    """A step of ``playground up`` failed (the message names it), or a checkout is missing."""


def target_deployment(
    name: str = TARGET,
    model: str = MODEL,
    *,
    args: list[str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A vLLM Deployment of one replica (surge 1), as ``examples/spectuning.yaml`` expects it.

    ``args`` default to serving ``model`` on port 8000, ``annotations`` to model version v1;
    the test tiers and the scale benchmark build their targets here too.
    """
    labels = {"app": name}
    if args is None:
        args = ["serve", model, "--port", "8000"]
    if annotations is None:
        annotations = {"spectune.io/model-version": "v1"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "args": args,
                        }
                    ]
                },
            },
        },
    }


def service_account_kubeconfig(
    admin: Path, token: str, namespace: str, service_account: str, path: Path
) -> Path:
    """Write a kubeconfig for ``service_account``'s ``token`` on ``admin``'s cluster."""
    doc = yaml.safe_load(admin.read_text())
    ctx = next(c for c in doc["contexts"] if c["name"] == doc["current-context"])["context"]
    cl = next(c for c in doc["clusters"] if c["name"] == ctx["cluster"])
    user = f"system:serviceaccount:{namespace}:{service_account}"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": cl["cluster"]}],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": "operator", "context": {"cluster": "local", "user": user}}],
                "current-context": "operator",
            }
        )
    )
    return path


def operator_command(deployment: Mapping[str, Any]) -> tuple[list[str], dict[str, str], str]:
    """The operator's command line, environment and ServiceAccount, read from its Deployment.

    kwok runs no container, so the operator the chart installed runs as a local process:
    ``python -m spectune.run`` with the container's args and env values.
    """
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    argv = [sys.executable, "-m", "spectune.run", *container.get("args", [])]
    return argv, env, str(pod["serviceAccountName"])


# -- the state file -------------------------------------------------------------------------


@dataclass
class Process:
    """A process ``up`` started: its pid and start time (which tell it from a reused pid)."""

    name: str
    pid: int
    started: int
    log: str


@dataclass
class State:
    """What ``up`` started, written to ``DIR/state.json`` after every step."""

    dir: str
    time_scale: float
    cluster_state: str
    kubeconfig: str = ""
    bin_dir: str = ""
    exports: list[str] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    processes: list[Process] = field(default_factory=list)

    def save(self) -> None:
        path = Path(self.dir) / STATE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.rename(path)

    @classmethod
    def load(cls, directory: Path) -> State | None:
        path = directory / STATE
        if not path.exists():
            return None
        doc = json.loads(path.read_text())
        doc["processes"] = [Process(**p) for p in doc.get("processes", [])]
        return cls(**doc)


def _start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot), or None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _alive(p: Process) -> bool:
    return _start_time(p.pid) == p.started


def _stop(processes: Sequence[Process], grace_s: float = 15.0) -> None:
    """SIGTERM each process group that is still the one recorded; SIGKILL it after the grace."""
    live = [p for p in processes if _alive(p)]
    for p in live:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in live:
        while _alive(p) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(p):
            _say(f"{p.name} (pid {p.pid}) still running {grace_s:g}s after SIGTERM; SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)


def _say(line: str) -> None:
    print(f"[playground] {line}", file=sys.stderr, flush=True)


# -- up -------------------------------------------------------------------------------------


class _Up:
    """The steps of ``up``, each recorded in the state file before the next one starts."""

    def __init__(self, state: State, scenario: Path, cluster_sh: Path) -> None:
        self.state = state
        self.dir = Path(state.dir)
        self.logs = self.dir / "logs"
        self.scenario = scenario
        self.cluster_sh = cluster_sh
        self.env = dict(os.environ)

    def run(self, tool: str, *args: str, input: str | None = None, timeout: float = 180) -> str:
        cmd = [str(Path(self.state.bin_dir) / tool), f"--kubeconfig={self.state.kubeconfig}"]
        out = subprocess.run(
            [*cmd, *args],
            input=input,
            env=self.env,
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if out.returncode != 0:
            raise PlaygroundError(
                f"{tool} {shlex.join(args)} failed (rc={out.returncode}): "
                f"{(out.stderr or out.stdout).strip()[-1500:]}"
            )
        return out.stdout

    def spawn(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> Process:
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env or self.env),
                start_new_session=True,  # its own group: down stops it and its children
            )
        started = _start_time(proc.pid)
        p = Process(name, proc.pid, started if started is not None else -1, str(log))
        self.state.processes.append(p)
        self.state.save()
        _say(f"started {name} (pid {proc.pid}, log {log})")
        return p

    def wait(self, what: str, ready: Callable[[], bool], timeout: float, proc: Process) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    _say(f"{what}: ok")
                    return
            except Exception:  # not yet: the server is still starting
                pass
            if not _alive(proc):
                raise PlaygroundError(f"{proc.name} exited while {what}:\n{_tail(proc.log)}")
            if time.monotonic() > deadline:
                raise PlaygroundError(
                    f"timed out after {timeout:g}s: {what}; log {proc.log}:\n{_tail(proc.log)}"
                )
            time.sleep(0.5)

    # -- the steps ------------------------------------------------------------------------

    def cluster(self) -> None:
        env = {**self.env, "SPECTUNE_CLUSTER_STATE": self.state.cluster_state}
        env["SPECTUNE_CLUSTER_DIR"] = str(self.dir / "cluster")
        env.pop("KUBECONFIG", None)
        for step in ("build", "up"):
            # the script's progress goes to our stderr; its stdout is the export lines
            out = subprocess.run(
                ["bash", str(self.cluster_sh), step],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
                check=False,
            )
            if out.returncode != 0:
                raise PlaygroundError(
                    f"hack/cluster.sh {step} failed (rc={out.returncode}): the control plane "
                    f"did not start; see its messages above and the logs in {self.dir}/cluster"
                )
        self.state.exports = [line for line in out.stdout.splitlines() if line.strip()]
        for line in self.state.exports:
            name, _, value = line.removeprefix("export ").partition("=")
            words = shlex.split(value.replace('"$PATH"', ""))
            if name == "KUBECONFIG":
                self.state.kubeconfig = words[0]
            elif name == "PATH":
                self.state.bin_dir = words[0].rstrip(":")
        if not self.state.kubeconfig:
            raise PlaygroundError(f"hack/cluster.sh up printed no KUBECONFIG: {out.stdout!r}")
        self.env["PATH"] = f"{self.state.bin_dir}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["KUBECONFIG"] = self.state.kubeconfig
        self.state.save()

    def prometheus(self) -> None:
        import httpx

        binary = shutil.which("prometheus")
        if binary is None:
            raise PlaygroundError(
                "prometheus is not on PATH (Debian: apt-get install -y prometheus)"
            )
        work = self.dir / "prometheus"
        (work / "targets").mkdir(parents=True, exist_ok=True)
        # A 15 s scrape at 1x; at the playground's time scale a window is seconds long.
        every = f"{max(250, min(15_000, round(15_000 / self.state.time_scale)))}ms"
        config = work / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {every}\n"
            f"  scrape_timeout: {every}\n"
            f"  evaluation_interval: {every}\n"
            "scrape_configs:\n"
            "  - job_name: engines\n"
            "    file_sd_configs:\n"
            f"      - files: ['{work}/targets/*.json']\n"
            "        refresh_interval: 1s\n"
        )
        port = free_port()
        self.state.ports["prometheus"] = port
        url = f"http://127.0.0.1:{port}"
        proc = self.spawn(
            "prometheus",
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
        )
        self.wait(
            f"Prometheus ready on {url}",
            lambda: httpx.get(f"{url}/-/ready", timeout=2).status_code == 200,
            60,
            proc,
        )

    def chart(self) -> None:
        for ns in (NAMESPACE, SYSTEM_NAMESPACE):
            self.run("kubectl", "create", "namespace", ns)
        self.state.ports["liveness"] = free_port()
        self.state.ports["metrics"] = free_port()
        self.state.save()
        self.run(
            "helm", "install", RELEASE, str(REPO / "charts" / "spectune"),
            "-n", SYSTEM_NAMESPACE,
            "--set", f"watchNamespaces={{{NAMESPACE}}}",
            "--set", f"operator.prometheusUrl=http://127.0.0.1:{self.state.ports['prometheus']}",
            "--set", "operator.pollSeconds=1",
            "--set", f"operator.timeScale={self.state.time_scale:g}",
            "--set", f"operator.livenessPort={self.state.ports['liveness']}",
            "--set", f"operator.metricsPort={self.state.ports['metrics']}",
            "--wait", "--timeout", "120s",
            timeout=180,
        )  # fmt: skip
        _say(f"helm install {RELEASE} -n {SYSTEM_NAMESPACE}: ok")

    def target(self) -> None:
        manifest = yaml.safe_dump(target_deployment())
        self.run("kubectl", "-n", NAMESPACE, "apply", "-f", "-", input=manifest)
        rollout = ("rollout", "status", f"deployment/{TARGET}", "--timeout=90s")
        self.run("kubectl", "-n", NAMESPACE, *rollout)
        sims = self.dir / "sims"
        sims.mkdir(exist_ok=True)
        self.spawn(
            "pods",
            [
                sys.executable, "-m", "spectune.playground.pods",
                "--kubeconfig", self.state.kubeconfig,
                "--namespace", NAMESPACE,
                "--scenario", str(self.scenario),
                "--time-scale", f"{self.state.time_scale:g}",
                "--targets", str(self.dir / "prometheus" / "targets"),
                "--logs", str(self.logs),
                "--record", str(sims / "running.json"),
                "--container", "vllm",
            ],
        )  # fmt: skip

    def operator(self) -> None:
        import httpx

        listed = self.run("kubectl", "-n", SYSTEM_NAMESPACE, "get", "deploy", "-o", "json")
        deployments = json.loads(listed)["items"]
        argv, env, sa = operator_command(deployments[0])
        token = self.run("kubectl", "-n", SYSTEM_NAMESPACE, "create", "token", sa, "--duration=24h")
        kubeconfig = service_account_kubeconfig(
            Path(self.state.kubeconfig),
            token.strip(),
            SYSTEM_NAMESPACE,
            sa,
            self.dir / "operator.kubeconfig",
        )
        proc = self.spawn("operator", argv, {**self.env, **env, "KUBECONFIG": str(kubeconfig)})
        url = f"http://127.0.0.1:{self.state.ports['liveness']}/healthz"
        self.wait(f"operator {url}", lambda: httpx.get(url, timeout=2).status_code == 200, 90, proc)

    def example(self) -> None:
        import httpx

        url = f"http://127.0.0.1:{self.state.ports['prometheus']}/api/v1/query"
        query = f'vllm:num_requests_running{{namespace="{NAMESPACE}"}}'
        pods = next(p for p in self.state.processes if p.name == "pods")
        self.wait(
            "Prometheus scrapes the simulated pods",
            lambda: bool(
                httpx.get(url, params={"query": query}, timeout=5).json()["data"]["result"]
            ),
            90,
            pods,
        )
        self.run(
            "kubectl", "-n", NAMESPACE, "apply", "-f", str(REPO / "examples" / "spectuning.yaml")
        )
        _say(f"kubectl apply -n {NAMESPACE} -f examples/spectuning.yaml: ok")


def _tail(path: str, lines: int = 20) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _checkout() -> Path:
    script = REPO / "hack" / "cluster.sh"
    if not script.exists() or not (REPO / "charts" / "spectune").is_dir():
        raise PlaygroundError(
            f"spectune playground needs a checkout of the repository (hack/cluster.sh, charts/); "
            f"{REPO} has none: clone it and `python3 -m pip install -e .` from there"
        )
    return script


def up(directory: Path, time_scale: float, scenario: Path | None = None) -> int:
    """Start the playground in ``directory``; return the exit code."""
    if time_scale <= 0:
        raise PlaygroundError(f"--time-scale must be > 0, got {time_scale:g}")
    cluster_sh = _checkout()
    if scenario is not None and not scenario.is_file():
        raise PlaygroundError(f"--scenario: {scenario} is not a readable file")
    directory = directory.resolve()
    old = State.load(directory)
    if old is not None:
        running = [p.name for p in old.processes if _alive(p)]
        if running or Path(old.cluster_state).exists():
            _say(
                f"a playground is already up in {directory} ({', '.join(running) or 'cluster'} "
                "running); nothing changed. Its exports:"
            )
            print("\n".join(old.exports))
            _say(f"stop it with: spectune playground down --dir {shlex.quote(str(directory))}")
            return int(ExitCode.FAILED)
        (directory / STATE).unlink()  # every process gone (a reboot): start afresh
    (directory / "logs").mkdir(parents=True, exist_ok=True)
    if (directory / "cluster").exists():
        shutil.rmtree(directory / "cluster")
    shutil.rmtree(directory / "prometheus", ignore_errors=True)
    state = State(str(directory), time_scale, str(directory / "cluster.state"))
    state.save()
    default = resources.files("spectune") / "examples" / "scenarios" / SCENARIO
    steps = _Up(state, scenario or Path(str(default)), cluster_sh)
    t0 = time.monotonic()
    for name, step in (
        ("the control plane (hack/cluster.sh up)", steps.cluster),
        ("Prometheus", steps.prometheus),
        ("helm install of charts/spectune", steps.chart),
        (f"the target Deployment {NAMESPACE}/{TARGET} and its simulated pods", steps.target),
        ("the operator", steps.operator),
        ("examples/spectuning.yaml", steps.example),
    ):
        try:
            step()
        except (PlaygroundError, OSError, subprocess.SubprocessError) as exc:
            _say(f"up FAILED at {name}: {exc}")
            _say(f"stopping what it had started (logs kept in {directory}/logs)")
            down(directory)
            return int(ExitCode.FAILED)
    _say(f"up in {time.monotonic() - t0:.0f}s ({time_scale:g}x time scale): {directory}")
    print("\n".join(state.exports))
    _say(
        "kwok runs no containers: the operator runs as a local `spectune run` process as the "
        "chart's ServiceAccount, and each pod of the Deployment is a `spectune sim serve`."
    )
    _say('next, with those exports (eval "$(spectune playground up)" sets them):')
    _say(f"  kubectl get spt -n {NAMESPACE} -w")
    _say(f"  spectune status {NAMESPACE}/{TARGET} -w")
    _say(f"  prometheus: http://127.0.0.1:{state.ports['prometheus']}")
    _say(f"  logs: {directory}/logs; stop it all with: spectune playground down --dir {directory}")
    return 0


def down(directory: Path) -> int:
    """Stop exactly what ``up`` recorded in ``directory``; a second call does nothing."""
    directory = directory.resolve()
    state = State.load(directory)
    if state is None:
        _say(f"no playground recorded in {directory}; nothing to do")
        return 0
    # The simulators are the pods process's children: read their pids before stopping it.
    sims: list[Process] = []
    record = directory / "sims" / "running.json"
    if record.exists():
        for name, s in json.loads(record.read_text() or "{}").items():
            started = _start_time(int(s["pid"]))
            if started is not None and "spectune.sim.command" in _cmdline(int(s["pid"])):
                sims.append(Process(f"sim serve {name}", int(s["pid"]), started, ""))
    _stop(list(reversed(state.processes)))  # operator first, Prometheus last
    _stop(sims, grace_s=5)
    rc = 0
    if Path(state.cluster_state).exists():
        env = {**os.environ, "SPECTUNE_CLUSTER_STATE": state.cluster_state}
        script = REPO / "hack" / "cluster.sh"
        out = subprocess.run(["bash", str(script), "down"], env=env, check=False)
        if out.returncode != 0:
            _say(f"hack/cluster.sh down failed (rc={out.returncode})")
            rc = int(ExitCode.FAILED)
    left = [p.name for p in [*state.processes, *sims] if _alive(p)]
    if left:
        _say(f"still running: {', '.join(left)}; the state file stays in {directory}")
        return int(ExitCode.FAILED)
    for path in ("prometheus", "sims", "operator.kubeconfig"):
        target = directory / path
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
    (directory / STATE).unlink()
    _say(f"down: stopped {len(state.processes) + len(sims)} process(es) and the cluster")
    return rc


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


# -- the command ----------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``spectune playground up|down``."""
    from spectune.cli import HELP_FORMAT, examples

    p = subparsers.add_parser(
        "playground",
        help="the operator tuning simulated vLLM pods on a local cluster (up / down)",
        description=(
            "Start, in the background, a local Kubernetes control plane (hack/cluster.sh), the "
            "chart, a vLLM Deployment whose kwok pods are simulated engines, a Prometheus "
            "scraping them, the operator (a local process: kwok runs no containers) and "
            "examples/spectuning.yaml; or stop exactly what `up` started. Needs a checkout "
            "of the repository."
        ),
        epilog=examples(
            'eval "$(spectune playground up)"',
            "kubectl get spt -n llm -w",
            "spectune playground down",
        ),
        formatter_class=HELP_FORMAT,
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    u = sub.add_parser(
        "up",
        help="start it all; stdout: the export lines of its kubeconfig and tools",
        description=(
            "Start the playground in the background; print the `export KUBECONFIG=... "
            "PATH=...` lines of its cluster on stdout, and what to run next on stderr. When "
            "one is already up in DIR, say so and change nothing."
        ),
        epilog=examples(
            'eval "$(spectune playground up)"',
            "spectune playground up --time-scale 60 --dir /tmp/pg",
        ),
        formatter_class=HELP_FORMAT,
    )
    u.add_argument(
        "--time-scale",
        type=float,
        default=30.0,
        metavar="N",
        help="simulated seconds per wall second, for the pods and the operator (default 30: "
        "a 5 m window lasts 10 s)",
    )
    u.add_argument("--scenario", help=f"the pods' scenario (default: the bundled {SCENARIO})")
    d = sub.add_parser(
        "down",
        help="stop exactly what `up` started (nothing if none)",
        description=(
            "Stop the processes `up` recorded in DIR's state file (the operator, the simulated "
            "pods, Prometheus) and its control plane; keep DIR/logs. Nothing to do is not an "
            "error."
        ),
        epilog=examples("spectune playground down", "spectune playground down --dir /tmp/pg"),
        formatter_class=HELP_FORMAT,
    )
    for q in (u, d):
        q.add_argument(
            "--dir",
            default=".playground",
            help="where the state, logs and cluster live (default ./.playground)",
        )
    p.set_defaults(func=_command)


def _command(ns: argparse.Namespace) -> int:
    if ns.action == "up":
        return up(Path(ns.dir), ns.time_scale, Path(ns.scenario) if ns.scenario else None)
    return down(Path(ns.dir))
