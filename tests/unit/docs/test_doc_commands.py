"""Every command in the README and docs/ is run by a test, and the offline ones run here.

``tests/doccommands.py`` extracts the commands from the docs' shell code blocks and holds the
registry of which tier runs each. Here: a command nobody runs fails with its text; the offline
commands (the simulator, the bench, the diagnosis on saved pages, the report, promtool) run as
a user would type them, in a scratch directory that holds the repository's example files, and
must exit 0 and print what the docs promise. Cluster and Prometheus commands run in
``tests/integration/docs``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.doccommands import COVERAGE, REPO, all_commands, commands_of

PAGES = REPO / "operator" / "spectune" / "examples" / "pages"


def test_every_doc_command_is_run_by_a_test() -> None:
    missing = sorted({str(c) for c in all_commands() if c.text not in COVERAGE})
    assert not missing, (
        "commands in the docs that no test runs (add each to COVERAGE in tests/doccommands.py "
        "and to the test of its tier):\n" + "\n".join(missing)
    )


def test_the_registry_lists_only_commands_the_docs_show() -> None:
    shown = {c.text for c in all_commands()}
    stale = sorted(set(COVERAGE) - shown)
    assert not stale, "COVERAGE lists commands no doc shows any more:\n" + "\n".join(stale)


def test_the_extractor_sees_continuations_comments_and_alternatives(tmp_path: Path) -> None:
    from tests import doccommands

    doc = tmp_path / "x.md"
    doc.write_text(
        "text `not-a-command`\n\n```sh\n# a comment line\nspectune diagnose --a 1 \\\n"
        "    --b '#not a comment'   # a comment\nfoo && bar\nspectune run   # or: python -m x\n"
        "```\n\n```\nNAME   PHASE\n```\n"
    )
    old = doccommands.REPO
    doccommands.REPO = tmp_path
    try:
        texts = [c.text for c in doccommands.extract(doc)]
    finally:
        doccommands.REPO = old
    assert texts == [
        "spectune diagnose --a 1 --b '#not a comment'",
        "foo",
        "bar",
        "spectune run",
        "python -m x",
    ]


def test_ci_commands_are_what_ci_runs() -> None:
    ci = commands_of("ci")
    assert set(ci) == {"python3 -m pip install -e '.[plot]'", "bash hack/test.sh"}
    assert "exec bash hack/test.sh" in (REPO / ".ci" / "run").read_text()
    assert re.search(r"pip install .*-e '\.\[test\]'", (REPO / "hack" / "test.sh").read_text())
    # the test extra brings the plot extra the README's command installs
    assert '"spectune[plot]"' in (REPO / "pyproject.toml").read_text().split("test = [", 1)[1]


def test_docker_build_is_replayed_by_the_dockerfile_test() -> None:
    """No container engine here: the Dockerfile test checks the image and replays its build."""
    source = (REPO / "tests" / "unit" / "packaging" / "test_dockerfile.py").read_text()
    assert "def test_wheel_installs_into_a_clean_venv_and_runs(" in source
    assert "def test_dockerfile_is_multi_stage_pinned_non_root_with_the_operator_entrypoint(" in (
        source
    )


# --- the offline commands, run --------------------------------------------------------------------


def _scratch(tmp_path: Path) -> Path:
    """A working directory with the repository's files the docs' commands name."""
    for name in ("examples", "deploy", "benchmarks", "charts", "crds", "tests"):
        (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def _save_pages(cwd: Path) -> None:
    """The README's page names: two speculating pods and one pod without, start and end."""
    spec, off = PAGES / "vllm-eagle3-k7", PAGES / "vllm-off"
    for dst, src in {
        "a0.prom": spec / "before" / "pod-0.prom",
        "b0.prom": spec / "before" / "pod-1.prom",
        "a1.prom": spec / "after" / "pod-0.prom",
        "b1.prom": spec / "after" / "pod-1.prom",
        "off0.prom": off / "before" / "pod-0.prom",
        "off1.prom": off / "after" / "pod-0.prom",
    }.items():
        shutil.copy(src, cwd / dst)


def _save_one_page(cwd: Path) -> None:
    """The README's single page: a public vLLM fragment (tests/fixtures/pages)."""
    src = REPO / "tests" / "fixtures" / "pages" / "vllm-v1-dgx-spark-spec-fragment.prom"
    shutil.copy(src, cwd / "pod0.prom")


def _diagnose_one_page(out: str, cwd: Path) -> None:
    assert "since its engine started" in out
    assert "INSUFFICIENT_DATA" in out  # no baseline and no --draft-cost: c is unknown


def _whatif(out: str, cwd: Path) -> None:
    # README: "best k = 3 (1.75×)"
    assert "Best k = 3" in out
    (row,) = [line for line in out.splitlines() if re.match(r"^\W*3\s+│", line)]
    assert "1.75×" in row and "best" in row, row


def _diagnose_pages(out: str, cwd: Path) -> None:
    assert "measured speedup vs baseline" in out
    assert "K_PAST_PEAK" in out


def _demo(out: str, cwd: Path) -> None:
    assert "Final setting:" in out
    assert (cwd / "spectune-demo" / "index.html").is_file()


def _json(keys: set[str]) -> Callable[[str, Path], None]:
    def check(out: str, cwd: Path) -> None:
        doc = json.loads(out)
        assert keys <= set(doc), f"missing {keys - set(doc)} in {doc}"

    return check


def _report(out: str, cwd: Path) -> None:
    for name in ("index.html", "acceptance.png", "speedup.png", "diagnosis.json"):
        assert (cwd / "report" / name).is_file(), name


def _bench_all(out: str, cwd: Path) -> None:
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["policy"] for r in rows] == ["spectune"]
    assert rows[0]["efficiency"] > 0


def _seeds(out: str, cwd: Path) -> None:
    # One run, in the per-scenario row and the total.
    assert re.search(r"chat-eagle3\s+│\s+1\s+│", out), out
    assert re.search(r"all\s+│\s+1\s+│", out), out


def _sample(out: str, cwd: Path) -> None:
    assert "wrote 5 worlds of family realistic (seed 1)" in out
    assert len(list((cwd / "worlds").glob("realistic-1-*.yaml"))) == 5


def _family(out: str, cwd: Path) -> None:
    assert re.search(r"spectune\s+│\s+2\s+│", out), out
    assert "spectune vs initial: efficiency b−a over 2 paired runs" in out
    assert (cwd / "family" / "runs.json").is_file()
    assert (cwd / "family" / "family.png").is_file()


def _promtool(out: str, cwd: Path) -> None:
    assert "SUCCESS" in out


def _usage(out: str, cwd: Path) -> None:
    assert "usage:" in out


# text -> (the command actually run, or None for the exact text; setup; check; timeout s)
Runner = tuple[str | None, Callable[[Path], None] | None, Callable[[str, Path], None], float]
OFFLINE: dict[str, Runner] = {
    "spectune demo": (None, None, _demo, 240),
    "spectune demo --scenario examples/scenarios/summarize-ngram.yaml": (None, None, _demo, 240),
    "spectune sim run --scenario examples/scenarios/chat-eagle3.yaml --arm eagle3/3 --json": (
        None,
        None,
        _json({"scenario", "arm", "tpot_p95"}),
        240,
    ),
    "spectune bench --scenario examples/scenarios/load-ramp.yaml --policy spectune --json": (
        None,
        None,
        _json({"scenario", "policy", "phases", "efficiency", "run_efficiency", "trials"}),
        600,
    ),
    "python3 benchmarks/bench_all.py": (
        "python3 benchmarks/bench_all.py --scenarios examples/scenarios/chat-eagle3.yaml "
        "--policies spectune --json",
        None,
        _bench_all,
        600,
    ),
    "python3 benchmarks/seeds.py": (
        "python3 benchmarks/seeds.py --only chat-eagle3 --seeds file --jobs 1",
        None,
        _seeds,
        600,
    ),
    "spectune sim sample --family benchmarks/families/realistic.yaml --seed 1 --count 5 "
    "--out worlds/": (None, None, _sample, 60),
    "python3 benchmarks/family.py --set quick --compare initial,spectune --out family/": (
        "python3 benchmarks/family.py --sets-file tests/unit/family/tiny-sets.yaml --set tiny "
        "--compare initial,spectune --out family/ --jobs 1",
        None,
        _family,
        600,
    ),
    "spectune whatif --acceptance 0.7 --draft-cost 0.15": (None, None, _whatif, 60),
    "spectune diagnose --before a0.prom b0.prom --after a1.prom b1.prom "
    "--baseline-before off0.prom --baseline-after off1.prom --window 10m": (
        None,
        _save_pages,
        _diagnose_pages,
        60,
    ),
    "spectune diagnose --after pod0.prom": (None, _save_one_page, _diagnose_one_page, 60),
    "spectune report --example --out report/": (None, None, _report, 120),
    "promtool test rules deploy/alerts/spectune-rules.test.yaml": (None, None, _promtool, 120),
    "python -m spectune.run": ("python -m spectune.run --help", None, _usage, 60),
}


def test_every_offline_command_has_a_runner() -> None:
    unit = set(commands_of("unit")) - {"docker build -t spectune:0.1.0 ."}
    assert set(OFFLINE) == unit, (
        f"registered as unit but not run here: {sorted(unit - set(OFFLINE))}; "
        f"run here but not registered: {sorted(set(OFFLINE) - unit)}"
    )


@pytest.mark.parametrize("text", sorted(OFFLINE))
def test_offline_doc_command(text: str, tmp_path: Path) -> None:
    command, setup, check, timeout = OFFLINE[text]
    cwd = _scratch(tmp_path)
    if setup is not None:
        setup(cwd)
    env = dict(os.environ)
    # `python3`, `python` and `spectune` are the test environment's, as after the README's
    # `pip install -e .`
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "100"
    proc = subprocess.run(
        ["bash", "-c", command or text],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"`{command or text}` exited {proc.returncode}:\n{out[-3000:]}"
    check(proc.stdout if "--json" in (command or text) else out, cwd)
