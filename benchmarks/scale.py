"""Scale benchmark: one operator process managing N SpecTunings on N Deployments (not a test).

    python benchmarks/scale.py [--count 200] [--auto 5] [--window 30] [--windows 4]

What is real and what is synthetic
----------------------------------
* Real: the Kubernetes control plane (kube-apiserver, etcd, controller-manager, scheduler,
  and kwok nodes, started with ``hack/cluster.sh up`` in a private state dir), the generated
  CRD, N Deployments with one pod each (kwok marks them Running; no process runs in them),
  N SpecTunings, the operator (``python -m spectune.run``, one process, watching one
  namespace, with the cluster-admin kubeconfig — RBAC is not what is measured here), and a
  real Prometheus (Debian's package) that the operator queries.
* Synthetic: the serving engines. No simulator runs per pod. One small exposition server in
  this script serves, for every Running pod of the namespace (canaries included), a copy of
  the bundled vLLM page ``examples/pages/vllm-eagle3-k7/after/pod-0.prom`` with
  ``namespace``/``pod`` labels added and every counter scaled linearly with the pod's age, so
  acceptance and latency are constant and identical for every pod and arm. Prometheus
  scrapes it every 5 s with ``honor_labels``. The figures therefore measure the operator's
  own cost (memory, CPU, queries, reaction time), not tuning quality.
* Counting: the operator reaches Prometheus through a counting proxy in this script (every
  HTTP request to ``/api/v1/*`` counted); the figure is cross-checked against Prometheus'
  own ``prometheus_http_requests_total`` delta, read directly (not through the proxy).

Phases: (1) baseline — the operator with 0 SpecTunings for two windows; (2) N SpecTunings
(``--auto`` of them in ``mode: auto``, the rest ``mode: recommend``), a warm-up window, then
``--windows`` windows measured: resident memory (max of 1 s samples of VmRSS), CPU seconds
per window (utime+stime from /proc), Prometheus queries per SpecTuning per window; (3) the
model-version annotation of one auto-mode target is bumped and the time until the
SpecTuning's status shows the new ``observedModelVersion`` with a ``Retune`` event is
measured. A table is printed with the targets (<= 300 MB RSS, <= 4 queries per SpecTuning
per window, re-open within one window) and the ratios to the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import httpx

from spectune.playground import target_deployment

REPO = Path(__file__).resolve().parents[1]
CRD = REPO / "crds" / "spectune.io_spectunings.yaml"
TEMPLATE = REPO / "operator" / "spectune" / "examples" / "pages" / "vllm-eagle3-k7" / "after"
NS = "scale"
EAGLE = "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
TEMPLATE_AGE_S = 600.0  # the bundled page is a pod 600 s after start


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the synthetic engines --------------------------------------------------------------


class Exposition:
    """Serves every Running pod's synthetic vLLM series on one /metrics page."""

    _LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")

    def __init__(self) -> None:
        page = (TEMPLATE / "pod-0.prom").read_text()
        self.header: list[str] = []
        self.lines: list[tuple[str, str, float, bool]] = []
        for line in page.splitlines():
            if line.startswith("#"):
                if line.startswith("# TYPE"):
                    self.header.append(line)
                continue
            m = self._LINE.match(line.strip())
            if not m:
                continue
            name, labels, value = m.group(1), (m.group(2) or "{}")[1:-1], float(m.group(3))
            counter = name.endswith(("_total", "_bucket", "_sum", "_count"))
            self.lines.append((name, labels, value, counter))
        self.pods: dict[str, float] = {}  # pod -> start time (monotonic)
        self.lock = threading.Lock()

    def set_pods(self, pods: list[str]) -> None:
        """The Running pods to serve series for (a new pod starts its counters at 0)."""
        now = time.monotonic()
        with self.lock:
            self.pods = {p: self.pods.get(p, now) for p in pods}

    def render(self) -> str:
        """The /metrics page: every pod's copy of the template, counters scaled by age."""
        now = time.monotonic()
        out = list(self.header)
        with self.lock:
            pods = dict(self.pods)
        for pod, start in pods.items():
            f = max(now - start, 0.001) / TEMPLATE_AGE_S
            extra = f'namespace="{NS}",pod="{pod}"'
            for name, labels, value, counter in self.lines:
                v = value * f if counter else value
                lab = f"{labels},{extra}" if labels else extra
                out.append(f"{name}{{{lab}}} {v:.6g}")
        return "\n".join(out) + "\n"


def serve(handler_cls: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, int]:
    """Serve ``handler_cls`` on a free loopback port in a daemon thread."""
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), handler_cls)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, port


def exposition_server(expo: Exposition) -> int:
    """Serve ``expo`` as a metrics page; returns its port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = expo.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    return serve(Handler)[1]


class CountingProxy:
    """Forwards to Prometheus and counts the requests by API path."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                path = self.path.split("?", 1)[0]
                with proxy.lock:
                    proxy.counts[path] += 1
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")
                }
                try:
                    resp = httpx.request(
                        method,
                        proxy.upstream + self.path,
                        content=body,
                        headers=headers,
                        timeout=30,
                    )
                    data, code = resp.content, resp.status_code
                    ctype = resp.headers.get("content-type", "application/json")
                except httpx.HTTPError as exc:
                    data, code, ctype = str(exc).encode(), 502, "text/plain"
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

            def log_message(self, *args: object) -> None:
                return

        self.port = serve(Handler)[1]

    def api_queries(self) -> int:
        """Requests to ``/api/v1/*`` so far."""
        with self.lock:
            return sum(n for p, n in self.counts.items() if p.startswith("/api/v1/"))


# --- the cluster and the processes -------------------------------------------------------


def cluster_up(work: Path) -> dict[str, str]:
    """Start a private cluster (``hack/cluster.sh up``); returns the environment to reach it."""
    env = dict(os.environ)
    env["SPECTUNE_CLUSTER_STATE"] = str(work / "cluster.state")
    env["SPECTUNE_CLUSTER_DIR"] = str(work / "cluster")
    env.pop("KUBECONFIG", None)
    up = subprocess.run(
        ["bash", str(REPO / "hack" / "cluster.sh"), "up"],
        env=env, text=True, capture_output=True, timeout=600, check=False,
    )  # fmt: skip
    if up.returncode != 0:
        sys.exit(f"hack/cluster.sh up failed:\n{up.stderr[-3000:]}")
    exports = {}
    for line in up.stdout.splitlines():
        m = re.match(r"^export ([A-Z_]+)=(.*)$", line)
        if m:
            words = shlex.split(m.group(2).replace('"$PATH"', ""))
            exports[m.group(1)] = words[0].rstrip(":") if words else ""
    env["KUBECONFIG"] = exports["KUBECONFIG"]
    env["PATH"] = f"{exports['PATH']}{os.pathsep}{os.environ.get('PATH', '')}"
    return env


def cluster_down(env: dict[str, str]) -> None:
    """Stop the cluster that ``env`` names."""
    subprocess.run(
        ["bash", str(REPO / "hack" / "cluster.sh"), "down"],
        env=env, text=True, capture_output=True, timeout=180, check=False,
    )  # fmt: skip


def start_prometheus(work: Path, target_port: int) -> tuple[subprocess.Popen[bytes], str]:
    """Start Prometheus scraping the exposition port every 5 s; returns it and its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        sys.exit("prometheus is not on PATH (apt-get install -y prometheus)")
    cfg = work / "prometheus.yml"
    cfg.write_text(
        "global: {scrape_interval: 5s, evaluation_interval: 5s}\n"
        "scrape_configs:\n"
        "  - job_name: engines\n"
        "    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n"
    )
    port = free_port()
    log = (work / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={cfg}", f"--storage.tsdb.path={work / 'prom-data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    sys.exit("Prometheus did not become ready")


def prom_requests_total(url: str) -> float:
    """Prometheus' own count of /api/v1/* requests, read from its /metrics (not a query)."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


class Sampler:
    """Samples a process' RSS and CPU time once a second."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.tick = os.sysconf("SC_CLK_TCK")
        self.max_rss = 0.0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def rss_mb(self) -> float:
        """Resident memory now, MB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self) -> float:
        """CPU seconds used so far (user + system)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick

    def reset_max(self) -> None:
        """Start a new maximum from the RSS now."""
        self.max_rss = self.rss_mb()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.max_rss = max(self.max_rss, self.rss_mb())
            except OSError:
                return

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()


# --- the objects --------------------------------------------------------------------------


def deployment(name: str) -> dict[str, Any]:
    """A one-replica vLLM Deployment on EAGLE-3 k=7."""
    spec = json.dumps({"method": "eagle3", "model": EAGLE, "num_speculative_tokens": 7})
    return target_deployment(name, args=["serve", MODEL, "--speculative-config", spec])


def spectuning(name: str, mode: str, window_s: int, prom_url: str) -> dict[str, Any]:
    """A SpecTuning of Deployment ``name`` in ``mode``."""
    return {
        "apiVersion": "spectune.io/v1alpha1",
        "kind": "SpecTuning",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"name": name, "container": "vllm"},
            "engine": "vllm",
            "metrics": {"prometheus": {"url": prom_url}},
            "drafters": [{"name": "eagle3", "method": "eagle3", "model": EAGLE, "maxK": 7}],
            "search": {"window": f"{window_s}s", "minDrafts": 100, "maxTrials": 6},
            "mode": mode,
        },
    }


def main() -> int:
    """Run the benchmark (see the module docstring) and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=200, help="SpecTunings and Deployments")
    ap.add_argument("--auto", type=int, default=5, help="how many in mode: auto (rest recommend)")
    ap.add_argument("--window", type=int, default=30, help="spec.search.window, seconds")
    ap.add_argument("--windows", type=int, default=4, help="windows measured")
    ap.add_argument("--keep", action="store_true", help="leave the cluster up (debugging)")
    ap.add_argument(
        "--memray",
        metavar="FILE",
        help="run the operator under memray (pip install memray), writing its capture to FILE; "
        "memray's own bookkeeping raises the RSS figure",
    )
    args = ap.parse_args()

    from kubernetes import client, config

    work = Path(tempfile.mkdtemp(prefix="spectune-scale-"))
    print(f"work dir {work}", file=sys.stderr)
    env = cluster_up(work)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        kubectl = Path(env["PATH"].split(os.pathsep)[0]) / "kubectl"
        subprocess.run([str(kubectl), "apply", "-f", str(CRD)], env=env, check=True,
                       capture_output=True)  # fmt: skip
        subprocess.run([str(kubectl), "wait", "--for=condition=Established", "-f", str(CRD)],
                       env=env, check=True, capture_output=True)  # fmt: skip
        api = config.new_client_from_config(config_file=env["KUBECONFIG"])  # type: ignore[no-untyped-call]
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        custom = client.CustomObjectsApi(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))

        expo = Exposition()
        expo_port = exposition_server(expo)
        prom, prom_url = start_prometheus(work, expo_port)
        procs.append(prom)
        proxy = CountingProxy(prom_url)

        def follow_pods() -> None:
            while True:
                try:
                    running = []
                    for p in core.list_namespaced_pod(NS).items:
                        meta, status = p.metadata, p.status
                        if meta is None or status is None or meta.name is None:
                            continue
                        if status.phase == "Running" and meta.deletion_timestamp is None:
                            running.append(meta.name)
                    expo.set_pods(running)
                except Exception as exc:  # keep following; report
                    print(f"pod listing failed: {exc}", file=sys.stderr)
                time.sleep(2)

        threading.Thread(target=follow_pods, daemon=True).start()

        op_env = dict(env)
        op_env.update(
            {
                "SPECTUNE_NAMESPACES": NS,
                "SPECTUNE_PROMETHEUS_URL": f"http://127.0.0.1:{proxy.port}",
                "SPECTUNE_LIVENESS_PORT": str(free_port()),
                "SPECTUNE_METRICS_PORT": str(free_port()),
                "SPECTUNE_POLL_SECONDS": "5",
            }
        )
        op_log = (work / "operator.log").open("wb")
        profile = (
            ["-m", "memray", "run", "-q", "--aggregate", "-f", "-o", args.memray]
            if args.memray
            else []
        )
        op = subprocess.Popen(
            [sys.executable, *profile, "-m", "spectune.run"], env=op_env, cwd=REPO,
            stdout=op_log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        procs.append(op)
        sampler = Sampler(op.pid)
        w = args.window

        # (1) baseline: the idle operator
        time.sleep(10)
        sampler.reset_max()
        cpu0, q0 = sampler.cpu_s(), proxy.api_queries()
        time.sleep(2 * w)
        base = {
            "rss": sampler.max_rss,
            "cpu_per_window": (sampler.cpu_s() - cpu0) / 2,
            "queries": proxy.api_queries() - q0,
        }
        print(f"baseline: {base}", file=sys.stderr)

        # (2) N Deployments and N SpecTunings
        names = [f"llm-{i:03d}" for i in range(args.count)]
        t_create = time.monotonic()
        for n in names:
            manifest: Any = deployment(n)  # the client takes a plain manifest too
            apps.create_namespaced_deployment(NS, manifest)
        for i, n in enumerate(names):
            mode = "auto" if i < args.auto else "recommend"
            body = spectuning(n, mode, w, "http://prometheus.monitoring:9090")
            custom.create_namespaced_custom_object(
                "spectune.io", "v1alpha1", NS, "spectunings", body
            )
        create_s = time.monotonic() - t_create

        def phases() -> Counter[str]:
            listed = cast(
                "dict[str, Any]",
                custom.list_namespaced_custom_object("spectune.io", "v1alpha1", NS, "spectunings"),
            )
            items = listed["items"]
            return Counter((o.get("status") or {}).get("phase", "-") for o in items)

        # warm-up: every SpecTuning has a status
        deadline = time.monotonic() + 20 * w
        while time.monotonic() < deadline and phases().get("-", 0) > 0:
            time.sleep(2)
        time.sleep(w)
        print(f"phases after warm-up: {dict(phases())}", file=sys.stderr)
        sampler.reset_max()
        cpu1, q1, pq1 = sampler.cpu_s(), proxy.api_queries(), prom_requests_total(prom_url)
        t1 = time.monotonic()
        time.sleep(args.windows * w)
        span_windows = (time.monotonic() - t1) / w
        loaded = {
            "rss": sampler.max_rss,
            "cpu_per_window": (sampler.cpu_s() - cpu1) / span_windows,
            "queries": proxy.api_queries() - q1,
            "prom_side": prom_requests_total(prom_url) - pq1,
        }
        per_spt_window = loaded["queries"] / (args.count * span_windows)
        prom_per_spt_window = loaded["prom_side"] / (args.count * span_windows)
        print(f"loaded: {loaded}; phases {dict(phases())}", file=sys.stderr)

        # (3) a model-version bump on an auto-mode target
        reopen_s = float("nan")
        if args.auto:
            victim = names[0]
            apps.patch_namespaced_deployment(
                victim, NS, {"metadata": {"annotations": {"spectune.io/model-version": "v2"}}}
            )
            t_bump = time.monotonic()
            while time.monotonic() - t_bump < 5 * w:
                obj = cast(
                    "dict[str, Any]",
                    custom.get_namespaced_custom_object(
                        "spectune.io", "v1alpha1", NS, "spectunings", victim
                    ),
                )
                events = core.list_namespaced_event(
                    NS, field_selector=f"involvedObject.name={victim},reason=Retune"
                ).items
                if (obj.get("status") or {}).get("observedModelVersion") == "v2" and any(
                    "model version" in (e.message or "") for e in events
                ):
                    reopen_s = time.monotonic() - t_bump
                    break
                time.sleep(0.5)

        rows = [
            ("SpecTunings / Deployments", f"{args.count}", "", "0", ""),
            ("  of which mode: auto", f"{args.auto}", "", "", ""),
            ("window", f"{w} s", "", "", ""),
            ("create all objects", f"{create_s:.1f} s", "", "", ""),
            ("operator RSS (max)", f"{loaded['rss']:.0f} MB", "<= 300 MB",
             f"{base['rss']:.0f} MB", f"{loaded['rss'] / base['rss']:.2f}x"),
            ("operator CPU per window (all SpecTunings)", f"{loaded['cpu_per_window']:.2f} s",
             "", f"{base['cpu_per_window']:.2f} s",
             f"{loaded['cpu_per_window'] / max(base['cpu_per_window'], 1e-3):.1f}x"),
            ("  per SpecTuning per window", f"{loaded['cpu_per_window'] / args.count * 1e3:.1f} ms",
             "", "", ""),
            ("Prometheus queries / SpecTuning / window (proxy)", f"{per_spt_window:.2f}",
             "<= 4", f"{base['queries'] / 2:.0f} total/window", ""),
            ("  same, Prometheus' own counter", f"{prom_per_spt_window:.2f}", "<= 4", "", ""),
            ("model-version bump -> search re-opened", f"{reopen_s:.1f} s",
             f"<= {w} s (one window)", "", ""),
        ]  # fmt: skip
        head = ("figure", "measured", "target", "baseline (0 SpecTunings)", "ratio")
        widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(5)]
        for r in [head, *rows]:
            print("  ".join(str(c).ljust(widths[i]) for i, c in enumerate(r)))
        print(f"\nphases at the end: {dict(phases())}")
        print(f"queries by path: {dict(proxy.counts)}")
        verdict = (
            loaded["rss"] <= 300 and per_spt_window <= 4 and reopen_s == reopen_s and reopen_s <= w
        )
        print(f"all targets met: {verdict}")
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, 15)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)
        if not args.keep:
            cluster_down(env)
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
