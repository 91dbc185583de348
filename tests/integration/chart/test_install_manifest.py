"""deploy/install.yaml, the single-file install: what ``helm template`` renders, and it installs.

The file is a Namespace and then, byte for byte, the output of the ``helm template`` command its
header states (a real helm, built by hack/cluster.sh). Applied with ``kubectl apply
--server-side`` to the real API server, the operator's Deployment comes up (kwok runs the pod)
and its ServiceAccount may watch SpecTunings in spectune-system.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.fixtures.cluster import Cluster, wait_for

REPO = Path(__file__).resolve().parents[3]
INSTALL = REPO / "deploy" / "install.yaml"
ARGS = [
    "template", "spectune", "charts/spectune",
    "--namespace", "spectune-system", "--include-crds", "--skip-tests",
]  # fmt: skip


def _helm_template(bin_dir: Path) -> str:
    proc = subprocess.run(
        [str(bin_dir / "helm"), *ARGS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _split(text: str) -> tuple[str, str]:
    """(the header with the Namespace, the rest): the rest starts at the first helm Source."""
    head, sep, rest = text.partition("---\n# Source: ")
    assert sep, "deploy/install.yaml has no helm output"
    return head, sep + rest


def test_install_yaml_is_the_helm_template_output(cluster_bin: Path) -> None:
    head, rendered = _split(INSTALL.read_text())
    assert rendered == _helm_template(cluster_bin), (
        "deploy/install.yaml is stale: python hack/install-manifest.py"
    )
    assert f"helm {' '.join(ARGS)}" in head, "the header states the command"
    (ns,) = [d for d in yaml.safe_load_all(head) if d]
    assert ns["kind"] == "Namespace" and ns["metadata"]["name"] == "spectune-system"
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered) if d}
    assert {"CustomResourceDefinition", "Deployment", "ClusterRole", "ServiceAccount"} <= kinds
    assert "Pod" not in kinds, "no helm test hook in the plain install"


def test_install_yaml_applies_and_the_operator_comes_up(cluster: Cluster) -> None:
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(INSTALL.read_text()) if d]
    cluster.kubectl("apply", "--server-side", "-f", str(INSTALL), timeout=120)
    try:

        def ready() -> bool:
            out = cluster.kubectl(
                "get", "deploy", "spectune", "-n", "spectune-system", "-o", "json", check=False
            )
            return (
                out.returncode == 0 and json.loads(out.stdout)["status"].get("readyReplicas") == 1
            )

        wait_for(ready, timeout=120, message="the operator Deployment of install.yaml is ready")
        sa = "system:serviceaccount:spectune-system:spectune"
        for verb in ("watch", "patch"):
            can = cluster.kubectl(
                "auth", "can-i", verb, "spectunings.spectune.io", "-n", "spectune-system",
                f"--as={sa}",
                check=False,
            )  # fmt: skip
            assert can.stdout.strip() == "yes", (verb, can.stdout, can.stderr)
    finally:
        # everything but the CRDs, which other tests of the session share
        for d in reversed(docs):
            if d["kind"] == "CustomResourceDefinition":
                continue
            ns = ["-n", d["metadata"]["namespace"]] if d["metadata"].get("namespace") else []
            cluster.kubectl(
                "delete", d["kind"], d["metadata"]["name"], *ns, "--ignore-not-found",
                "--wait=false",
                check=False,
            )  # fmt: skip
