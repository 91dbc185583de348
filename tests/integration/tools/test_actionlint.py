"""The release workflow, checked by actionlint (built from Go modules by hack/cluster.sh).

actionlint really parses the workflow (a broken copy is refused), and the workflow does what
the release promises: a linux/amd64 + linux/arm64 image with the OCI labels source, version and
revision, the chart pushed as an OCI artefact, and deploy/install.yaml checked and attached.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
WORKFLOWS = REPO / ".github" / "workflows"
RELEASE = WORKFLOWS / "release.yaml"


def _actionlint(bin_dir: Path, *files: Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "actionlint"), "-no-color", "-oneline", *map(str, files)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_actionlint_passes_every_workflow(cluster_bin: Path) -> None:
    files = sorted(WORKFLOWS.glob("*.y*ml"))
    assert RELEASE in files
    proc = _actionlint(cluster_bin, *files)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_refuses_a_broken_workflow(cluster_bin: Path, tmp_path: Path) -> None:
    broken = RELEASE.read_text().replace("needs: verify\n", "needs: verfiy\n", 1)
    assert broken != RELEASE.read_text()
    (tmp_path / "release.yaml").write_text(broken)
    proc = _actionlint(cluster_bin, tmp_path / "release.yaml", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "verfiy" in proc.stdout


def _steps(wf: dict[str, Any], job: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = wf["jobs"][job]["steps"]
    return steps


def test_release_workflow_builds_and_publishes_what_the_release_promises() -> None:
    wf = yaml.safe_load(RELEASE.read_text())
    # PyYAML reads the key `on` as True
    assert wf[True]["push"]["tags"], "runs on version tags"
    (build,) = [s for s in _steps(wf, "image") if s.get("uses", "").startswith("docker/build-push")]
    assert set(build["with"]["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert build["with"]["push"] is True
    args = build["with"]["build-args"]
    for arg in ("VERSION=", "REVISION=${{ github.sha }}", "SOURCE="):
        assert arg in args, arg
    (meta,) = [s for s in _steps(wf, "image") if s.get("uses", "").startswith("docker/metadata")]
    for key in ("source", "version", "revision"):
        assert f"org.opencontainers.image.{key}=" in meta["with"]["labels"], key
    chart = " ".join(s.get("run", "") for s in _steps(wf, "chart"))
    assert "helm package charts/spectune" in chart
    assert 'helm push "dist/spectune-$VERSION.tgz" "oci://' in chart
    manifest = " ".join(s.get("run", "") for s in _steps(wf, "install-manifest"))
    assert "hack/install-manifest.py --check" in manifest
    assert "gh release upload" in manifest and "deploy/install.yaml" in manifest
    # the Dockerfile reads the build args the workflow passes
    dockerfile = (REPO / "Dockerfile").read_text()
    for arg in ("VERSION", "REVISION", "SOURCE"):
        assert f"ARG {arg}" in dockerfile and f"${{{arg}}}" in dockerfile, arg
