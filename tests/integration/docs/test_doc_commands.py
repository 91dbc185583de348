"""The docs' cluster and Prometheus commands, run as written against the real components.

``tests/doccommands.py`` registers each command of README.md and docs/*.md with the tier that
runs it. Here:

* ``prometheus``: simulated vLLM pods (``spectune sim serve``) labelled as the README's
  selectors expect, scraped by the real Prometheus fixture; the ``spectune diagnose`` commands
  of the README and docs/diagnosis.md run against it (the docs' Prometheus URL is replaced by
  the fixture's, the ``--scrape`` URLs by the simulated pods').
* ``cluster``: the install, walkthrough and status commands, in the order a user types them,
  against the real test API server (kwok runs the pods), with the operator started by the
  README's ``spectune run``. The ``kubectl get spt`` output the walkthrough shows is compared
  with what the API server really prints.

Each test ends by checking that it ran every command of its tier: a command registered for a
tier and not run fails with its text.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.doccommands import REPO, commands_of, output_blocks
from tests.fixtures.cluster import Cluster, wait_for
from tests.fixtures.prometheus import Prometheus, free_port

SCENARIO = REPO / "examples" / "scenarios" / "chat-eagle3.yaml"
EAGLE = "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"
MODEL = "meta-llama/Llama-3.3-70B-Instruct"
DOC_PROMETHEUS = "http://prometheus.monitoring:9090"
WALKTHROUGH = REPO / "docs" / "walkthrough.md"
# The simulated pods' namespace: the docs' "llm", renamed because other tests of the session
# register pods labelled namespace="llm" with the same shared Prometheus.
NS = "docs-llm"


def _spec_args(k: int) -> list[str]:
    spec = {"method": "eagle3", "model": EAGLE, "num_speculative_tokens": k}
    return ["serve", MODEL, "--speculative-config", json.dumps(spec)]


class DocShell:
    """Runs doc commands with ``bash -c`` and remembers which it ran."""

    def __init__(self, tier: str, cwd: Path, env: dict[str, str]) -> None:
        self.expected = commands_of(tier)
        self.cwd = cwd
        self.env = env
        self.ran: set[str] = set()

    def run(
        self, text: str, *, variant: str | None = None, timeout: float = 120, ok: bool = True
    ) -> subprocess.CompletedProcess[str]:
        assert text in self.expected, f"not a registered doc command of this tier: {text}"
        self.ran.add(text)
        proc = subprocess.run(
            ["bash", "-c", variant or text],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if ok:
            assert proc.returncode == 0, (
                f"`{variant or text}` exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                f"{proc.stderr[-3000:]}"
            )
        return proc

    def check_all_ran(self) -> None:
        missing = sorted(set(self.expected) - self.ran)
        assert not missing, "doc commands this test did not run:\n" + "\n".join(missing)


def _env(extra_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    path = [str(Path(sys.executable).parent)]
    if extra_path is not None:
        path.insert(0, str(extra_path))
    env["PATH"] = os.pathsep.join([*path, env.get("PATH", "")])
    env["COLUMNS"] = "100"
    return env


# --- Prometheus ---------------------------------------------------------------------------------


@pytest.fixture
def sims(prometheus: Prometheus, tmp_path: Path) -> Iterator[dict[str, int]]:
    """Three simulated vLLM pods in namespace llm: two speculating, one without speculation."""
    pods = {
        "llama-7d9f8b6c4-abcde": _spec_args(3),
        "llama-7d9f8b6c4-fghij": _spec_args(3),
        "nospec-llama-5c6b7d8f9-klmno": ["serve", MODEL],
    }
    procs: list[subprocess.Popen[bytes]] = []
    targets: list[Path] = []
    ports: dict[str, int] = {}
    try:
        for pod, args in pods.items():
            port = free_port()
            with (tmp_path / f"{pod}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "spectune.sim.command", "serve",
                         "--scenario", str(SCENARIO), "--port", str(port),
                         "--time-scale", "5", "--", *args],
                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    )
                )  # fmt: skip
            targets.append(
                prometheus.register_target(f"127.0.0.1:{port}", {"namespace": NS, "pod": pod})
            )
            ports[pod] = port
        yield ports
    finally:
        for t in targets:
            t.unlink(missing_ok=True)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=20)


def test_diagnose_commands_against_prometheus_and_live_pods(
    prometheus: Prometheus, sims: dict[str, int], tmp_path: Path
) -> None:
    shell = DocShell("prometheus", tmp_path, _env())
    prometheus.wait_for_series(f'vllm:spec_decode_num_drafts_total{{namespace="{NS}"}}', count=2)
    prometheus.wait_for_series('vllm:generation_tokens_total{pod=~"nospec-llama-.*"}')
    time.sleep(10)  # a few scrapes of traffic, so the window has increases to read

    scrape = next(t for t in shell.expected if "--scrape" in t)
    urls = [f"http://127.0.0.1:{p}/metrics" for pod, p in sims.items() if pod.startswith("llama")]
    variant = re.sub(r"http://\S+ http://\S+", " ".join(urls), scrape).replace(
        "--window 60s", "--window 5s"
    )
    out = shell.run(scrape, variant=variant, timeout=120).stdout
    assert "engine vllm · 2 pod(s)" in out and "current k = 3" in out, out

    for text in (t for t in shell.expected if "--prometheus" in t):
        variant = text.replace(DOC_PROMETHEUS, prometheus.url).replace(
            'namespace="llm"', f'namespace="{NS}"'
        )
        out = shell.run(text, variant=variant).stdout
        assert "engine vllm · 2 pod(s)" in out, out  # the selector does not take the baseline pod
        assert "current k = 3" in out, out
        if "--baseline-selector" in text:
            assert "measured speedup vs baseline" in out, out
    shell.check_all_ran()


# --- the cluster ----------------------------------------------------------------------------------


def _columns(line: str) -> list[str]:
    return line.split()


def _walkthrough_tables() -> list[list[str]]:
    return [body for _, body in output_blocks(WALKTHROUGH) if body and body[0].startswith("NAME")]


def _target(namespace: str) -> dict[str, object]:
    labels = {"app": "llama-70b"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llama-70b", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": _spec_args(4)}
                    ]
                },
            },
        },
    }


def _edited_example(cwd: Path, prometheus_url: str) -> None:
    """examples/spectuning.yaml edited as the walkthrough's step 1 says."""
    doc = yaml.safe_load((REPO / "examples" / "spectuning.yaml").read_text())
    assert set(doc["spec"]["metrics"]["prometheus"]) == {"url"}, "the example needs no Secret"
    doc["spec"]["metrics"]["prometheus"]["url"] = prometheus_url
    # Shorter than the example's 5m, so that the suspension (which takes effect when the
    # current window ends) is seen within the test.
    doc["spec"]["search"]["window"] = "30s"
    (cwd / "examples").mkdir()
    (cwd / "examples" / "spectuning.yaml").write_text(yaml.safe_dump(doc))
    for name in ("crds", "deploy", "charts"):
        (cwd / name).symlink_to(REPO / name)


def test_install_walkthrough_and_status_commands_on_the_cluster(
    cluster: Cluster, prometheus: Prometheus, tmp_path: Path
) -> None:
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    _edited_example(cwd, prometheus.url)
    env = _env(cluster.bin_dir)
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    shell = DocShell("cluster", cwd, env)
    expected = shell.expected

    def one(pattern: str) -> str:
        (text,) = [t for t in expected if re.fullmatch(pattern, t)]
        return text

    operator: subprocess.Popen[bytes] | None = None
    try:
        # install.md, README: plain manifests, then the chart (both spellings), then uninstall
        shell.run("kubectl apply -f crds/ -f deploy/rbac.yaml")
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        "crd/spectunings.spectune.io")  # fmt: skip
        for install in (
            "helm install spectune charts/spectune --namespace spectune-system --create-namespace",
            "helm install spectune charts/spectune -n spectune-system --create-namespace",
        ):
            out = shell.run(install, timeout=180).stdout
            assert "STATUS: deployed" in out, out
            rollout = shell.run(
                "kubectl -n spectune-system rollout status deployment/spectune",
                variant="kubectl -n spectune-system rollout status deployment/spectune"
                " --timeout=120s",
                timeout=150,
            ).stdout
            assert "successfully rolled out" in rollout, rollout
            shell.run("helm uninstall spectune -n spectune-system", timeout=120)

        # README "Run the operator": the operator from a checkout, with the admin kubeconfig
        cluster.kubectl("create", "namespace", "llm")
        cluster.kubectl("apply", "-f", "-", input=json.dumps(_target("llm")))
        op_env = dict(env)
        op_env.update(
            SPECTUNE_NAMESPACES="llm,default",
            SPECTUNE_LIVENESS_PORT=str(free_port()),
            SPECTUNE_METRICS_PORT=str(free_port()),
            SPECTUNE_POLL_SECONDS="1",
        )
        shell.ran.add("spectune run")
        with (tmp_path / "operator.log").open("wb") as log:
            operator = subprocess.Popen(
                ["bash", "-c", "exec spectune run"], cwd=cwd, env=op_env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

        def op_log() -> str:
            return (tmp_path / "operator.log").read_text(errors="replace")[-4000:]

        # walkthrough 1: apply, watch
        shell.run("kubectl apply -n llm -f examples/spectuning.yaml")
        tables = _walkthrough_tables()
        assert len(tables) == 3, tables
        header = _columns(tables[0][0])
        baseline_row = _columns(tables[0][1])

        last = [""]

        def baseline_shown() -> str | None:
            out = last[0] = shell.run(
                "kubectl get spt -n llm -w",
                variant="timeout 4 kubectl get spt -n llm -w",
                ok=False,
                timeout=30,
            ).stdout
            lines = out.splitlines()
            if len(lines) >= 2 and _columns(lines[-1])[:2] == baseline_row[:2]:
                return out
            return None

        out = wait_for(
            baseline_shown,
            timeout=90,
            message=lambda: (
                f"the walkthrough's Baseline row {baseline_row[:2]}; kubectl printed:\n{last[0]}\n"
                f"operator log:\n{op_log()}"
            ),
        )
        got = out.splitlines()
        assert _columns(got[0]) == header, "the walkthrough's header is not what kubectl prints"
        for table in tables:
            assert _columns(table[0]) == header, table[0]
        for table in tables[1:]:  # measured by then: every column filled
            assert len(_columns(table[1])) == len(header), table[1]
        # The first window is still running: the incumbent's drafter and k (the target runs
        # eagle3 at k = 4, as in the walkthrough), acceptance and speedup still empty, and
        # READY True with the reason Tuning.
        shown = ["llama-70b", "Baseline", "eagle3", "4", "True", "Tuning"]
        assert _columns(got[-1])[:6] == baseline_row[:6] == shown, (got[-1], baseline_row)
        assert len(_columns(got[-1])) == len(baseline_row) == 7, (got[-1], baseline_row)

        status = yaml.safe_load(shell.run("kubectl get spt -n llm llama-70b -o yaml").stdout)[
            "status"
        ]
        assert status["phase"] == "Baseline"
        # status.md: applied is what the target runs, with the fingerprint on the target.
        notes = json.loads(
            cluster.kubectl("get", "deploy", "-n", "llm", "llama-70b", "-o", "json").stdout
        )["metadata"]["annotations"]
        assert status["applied"]["arm"] == "eagle3/4", status["applied"]
        assert status["applied"]["fingerprint"] == notes["spectune.io/fingerprint"], notes
        described = shell.run("kubectl describe spt -n llm llama-70b").stdout
        assert "Phase:" in described and "Baseline" in described and "Events:" in described
        shell.run("kubectl get events -n llm --field-selector involvedObject.name=llama-70b")
        canaries = shell.run("kubectl get deploy -n llm -l spectune.io/role=canary")
        assert "No resources found in llm namespace." in canaries.stderr  # no trial in Baseline

        # README and status.md: the columns their comments name
        shell.run("kubectl apply -f examples/spectuning.yaml")  # into default: no target there
        readme_get = shell.run("kubectl get spt").stdout.splitlines()[0]
        assert _columns(readme_get) == ["NAME", "PHASE", "DRAFTER", "K", "ACCEPTANCE", "SPEEDUP",
                                        "READY", "REASON", "AGE"], readme_get  # fmt: skip
        all_get = shell.run("kubectl get spt -A").stdout.splitlines()
        assert _columns(all_get[0])[2:7] == ["PHASE", "DRAFTER", "K", "ACCEPTANCE", "SPEEDUP"]
        assert any(line.startswith("llm ") for line in all_get), all_get
        cluster.kubectl("delete", "spt", "-n", "default", "llama-70b", "--wait=true")

        # walkthrough: pause, resume, remove
        shell.run(one(r"kubectl patch .*\"suspend\":true.*"))

        def phase() -> str:
            return str(
                cluster.kubectl(
                    "get", "spt", "-n", "llm", "llama-70b", "-o", "jsonpath={.status.phase}"
                ).stdout
            )

        wait_for(
            lambda: phase() == "Suspended", timeout=60, message=lambda: f"Suspended\n{op_log()}"
        )
        shell.run(one(r"kubectl patch .*\"suspend\":false.*"))
        wait_for(lambda: phase() not in ("Suspended", ""), timeout=60, message="resumed")
        shell.run("kubectl delete spt -n llm llama-70b", timeout=120)
        args = json.loads(
            cluster.kubectl("get", "deploy", "-n", "llm", "llama-70b", "-o", "json").stdout
        )["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args == _spec_args(4), "the target kept its setting"
        shell.check_all_ran()
    finally:
        if operator is not None and operator.poll() is None:
            os.killpg(operator.pid, signal.SIGTERM)
            try:
                operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(operator.pid, signal.SIGKILL)
        cluster.kubectl("delete", "spt", "-n", "default", "llama-70b", "--ignore-not-found",
                        check=False)  # fmt: skip
        cluster.helm("uninstall", "spectune", "-n", "spectune-system", check=False)
        cluster.kubectl("delete", "namespace", "llm", "--wait=false", check=False)
        shutil.rmtree(cwd, ignore_errors=True)
