"""The container image, without a container engine: the Dockerfile's properties, and its build
step replayed on this machine (the wheel built from exactly what the image's build stage
copies installs into a clean virtual environment, and ``spectune run --help`` works)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "Dockerfile"
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|clang|make|build-essential|apt-get install|apk add|pip wheel|python -m build|"
    r"uv build|git)\b"
)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages of a Dockerfile (continuations joined)."""
    joined = re.sub(r"\\\n", " ", text)
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op = op.upper()
        rest = rest.strip()
        if op == "ARG" and not stages:
            key, _, default = rest.partition("=")
            args[key] = default
        elif op == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest, flags=re.I)
            assert m, line
            base = re.sub(r"\$\{(\w+)\}", lambda g: args[g[1]], m[1])
            stages.append(Stage(base=base, name=m[2]))
        else:
            assert stages, f"instruction before FROM: {line}"
            stages[-1].instructions.append((op, rest))
    return args, stages


def test_dockerfile_is_multi_stage_pinned_non_root_with_the_operator_entrypoint() -> None:
    _, stages = parse(DOCKERFILE.read_text())
    assert len(stages) >= 2, "multi-stage: a build stage and a final stage"
    build, final = stages[0], stages[-1]
    for stage in stages:
        # pinned: python:<major>.<minor>.<patch>-<variant>, or a digest
        assert re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", stage.base), (
            stage.base
        )
    assert build.name, "the build stage is named (COPY --from=<name>)"
    build_runs = " ".join(rest for op, rest in build.instructions if op == "RUN")
    assert "pip wheel" in build_runs and "-w /wheels" in build_runs, "the wheel is built first"
    assert re.search(r"pip install .*spectune-\*\.whl", build_runs), "...and installed from it"
    assert re.search(r"pip install .*-c constraints\.txt .*spectune-\*\.whl", build_runs), (
        "...at the versions of constraints.txt"
    )

    ops = [op for op, _ in final.instructions]
    final_runs = " ".join(rest for op, rest in final.instructions if op == "RUN")
    assert not BUILD_TOOLS.search(final_runs), f"build tools in the final stage: {final_runs}"
    assert "pip" not in final_runs
    copies = [rest for op, rest in final.instructions if op == "COPY"]
    assert copies and all(c.startswith(f"--from={build.name} ") for c in copies), copies

    users = [rest for op, rest in final.instructions if op == "USER"]
    assert users, "the final stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, "a numeric non-root USER (runAsNonRoot can check it)"
    assert ops.index("USER") < ops.index("ENTRYPOINT")
    (entrypoint,) = [rest for op, rest in final.instructions if op == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["spectune", "run"]
    labels = " ".join(rest for op, rest in final.instructions if op == "LABEL")
    for key in ("source", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in labels
    exposed = " ".join(rest for op, rest in final.instructions if op == "EXPOSE").split()
    assert {"8080", "8081"} <= set(exposed), "the liveness and metrics ports of the chart"


def test_chart_runs_the_image_as_the_images_user() -> None:
    values = (REPO / "charts" / "spectune" / "values.yaml").read_text()
    _, stages = parse(DOCKERFILE.read_text())
    uid = [rest for op, rest in stages[-1].instructions if op == "USER"][-1].split(":")[0]
    assert f"runAsUser: {uid}" in values


def test_dockerignore_keeps_the_context_to_what_the_build_copies() -> None:
    lines = [
        x.strip()
        for x in (REPO / ".dockerignore").read_text().splitlines()
        if x.strip() and not x.startswith("#")
    ]
    assert lines[0] == "*", "ignore everything, then allow what the build stage copies"
    allowed = {x[1:].rstrip("/") for x in lines if x.startswith("!")}
    _, stages = parse(DOCKERFILE.read_text())
    copied = {
        src.rstrip("/")
        for op, rest in stages[0].instructions
        if op == "COPY" and not rest.startswith("--from")
        for src in rest.split()[:-1]
    }
    assert copied == allowed


def test_wheel_installs_into_a_clean_venv_and_runs(tmp_path: Path) -> None:
    """The build stage's steps: only what it copies, ``pip wheel --no-deps``, a fresh venv."""
    _, stages = parse(DOCKERFILE.read_text())
    src = tmp_path / "src"
    src.mkdir()
    for op, rest in stages[0].instructions:
        if op == "COPY" and not rest.startswith("--from"):
            for item in rest.split()[:-1]:
                path = REPO / item.rstrip("/")
                if path.is_dir():
                    shutil.copytree(
                        path,
                        src / path.name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
                    )
                else:
                    shutil.copy2(path, src / path.name)
    wheels = tmp_path / "wheels"

    # a clean environment: the worktree on PYTHONPATH would pass for an installed spectune
    clean_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*cmd: str | Path, timeout: float = 300) -> str:
        proc = subprocess.run(
            [str(c) for c in cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=clean_env,
        )
        assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout

    run(sys.executable, "-m", "pip", "wheel", src, "--no-deps", "-w", wheels, "-q")
    (wheel,) = wheels.glob("spectune-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, clear=True)
    bindir = env_dir / "bin"
    constraints = src / "constraints.txt"
    assert constraints.is_file(), "the build stage copies the constraints file"
    run(
        bindir / "python", "-m", "pip", "install", "-q", "--only-binary=:all:",
        "-c", constraints, wheel,
        timeout=600,
    )  # fmt: skip
    # every package the image carries is pinned by constraints.txt, at that version, and the
    # plotting extra (matplotlib) is not among them
    pinned = {
        line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
        for line in constraints.read_text().splitlines()
        if line and not line.startswith("#")
    }
    frozen = run(bindir / "python", "-m", "pip", "freeze", "--exclude", "spectune").split()
    installed = {
        line.split("==")[0].lower().replace("_", "-"): line.split("==")[1] for line in frozen
    }
    assert installed == pinned, set(installed.items()) ^ set(pinned.items())
    assert "matplotlib" not in installed
    out = run(bindir / "spectune", "run", "--help")
    assert "usage: spectune run" in out and "SPECTUNE_NAMESPACES" in out
    # the operator's modules import (kopf and the kubernetes client are installed), and the
    # bundled demo scenarios are in the wheel
    run(bindir / "python", "-c", "import spectune.handlers, spectune.k8s.telemetry")
    listing = run(bindir / "python", "-m", "pip", "show", "-f", "spectune")
    assert "spectune/py.typed" in listing
    assert "spectune/examples/" in listing
    assert "tests/" not in listing
    # without the plot extra, `spectune report` says which extra to install, in one line
    proc = subprocess.run(
        [str(bindir / "spectune"), "report", "--example", "--out", str(tmp_path / "report")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=clean_env,
    )
    assert proc.returncode != 0
    assert "pip install 'spectune[plot]'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
