"""`spectune` as a script or a CI job meets it: help, exit codes, gates, completion.

Run through the entry point (``python -m spectune``, the same ``main`` as the installed
``spectune`` and ``kubectl-spectune`` scripts), in a subprocess where the exit status or
the shell's environment is what is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from rich.console import Console

from spectune.cli import build_parser
from spectune.diagnose.findings import Code
from spectune.exitcodes import ExitCode
from spectune.terminal import countdown

PAGES = Path(str(resources.files("spectune") / "examples" / "pages"))
REPO = Path(__file__).resolve().parents[3]


def pages(example: str, moment: str) -> list[str]:
    return sorted(str(p) for p in (PAGES / example / moment).glob("*.prom"))


def spectune(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {**os.environ, "PYTHONPATH": str(REPO / "operator"), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "spectune", *argv],
        capture_output=True, text=True, timeout=120, env={**base, **(env or {})},
    )  # fmt: skip


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    err = proc.stderr.strip()
    assert err.startswith("spectune: error: ") and "\n" not in err, proc.stderr
    assert "Traceback" not in err
    return err


def test_kubectl_spectune_is_the_same_entry_point_as_spectune() -> None:
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-spectune"] == scripts["spectune"] == "spectune.cli:main"


def test_help_lists_every_exit_code_by_number() -> None:
    proc = spectune("--help")
    assert proc.returncode == 0
    lines = proc.stdout.split("exit codes:")[1].splitlines()
    listed = {int(line.split()[0]) for line in lines if line.strip()}
    assert listed == {int(c) for c in ExitCode}
    assert "examples:" in proc.stdout


def _subcommands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.append(((*path, name), child))
                found += _subcommands(child, (*path, name))
    return found


def test_every_subcommand_has_a_description_and_an_example(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from spectune.cli import main

    subs = _subcommands(build_parser())
    assert {"whatif", "diagnose", "report", "completion", "status"} <= {p[0] for p, _ in subs}
    for path, _ in subs:
        with pytest.raises(SystemExit) as done:
            main([*path, "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        head = out.split("\n\n")
        # usage, then the description paragraph (not the options straight away)
        assert len(head) > 2 and not head[1].startswith(("options:", "positional")), path
        # an examples section with a command line that runs this very subcommand
        assert "examples:\n" in out, path
        assert "spectune " + " ".join(path) in out.split("examples:\n")[1], path


def test_usage_bad_input_and_unreachable_have_their_own_codes(tmp_path: Path) -> None:
    assert spectune("diagnose", "--no-such-flag").returncode == ExitCode.USAGE
    missing = spectune("diagnose", "--after", str(tmp_path / "nope.prom"))
    assert missing.returncode == ExitCode.BAD_INPUT
    assert "is not a readable file" in one_line_error(missing)
    down = spectune(
        "diagnose", "--prometheus", "http://127.0.0.1:1", "--selector", '{a="b"}', "--window", "1m"
    )
    assert down.returncode == ExitCode.UNREACHABLE
    err = one_line_error(down)
    assert "cannot reach Prometheus at http://127.0.0.1:1: cannot connect" in err
    # no library internals: connection pools, object reprs, the query string
    for internal in ("HTTPConnection", "object at 0x", "Max retries", "query=", "Errno"):
        assert internal not in err


def test_identical_pages_are_no_traffic_in_the_window() -> None:
    before = pages("vllm-eagle3-k7", "before")
    proc = spectune("diagnose", "--before", *before, "--after", *before)
    assert proc.returncode == ExitCode.NO_DATA
    assert "no traffic in the window" in one_line_error(proc)


def test_swapped_pages_are_refused() -> None:
    proc = spectune(
        "diagnose",
        "--before", *pages("vllm-eagle3-k7", "after"),
        "--after", *pages("vllm-eagle3-k7", "before"),
    )  # fmt: skip
    assert proc.returncode == ExitCode.BAD_INPUT
    assert "the pages look swapped; give the earlier pages as --before" in one_line_error(proc)


def test_fail_on_gates_a_ci_job_on_a_diagnosis_code() -> None:
    # The flagship example finds K_PAST_PEAK (its k = 7 is past the optimum), not LOW_ACCEPTANCE.
    gated = spectune("diagnose", "--example", "--fail-on", "K_PAST_PEAK", "--json")
    assert gated.returncode == ExitCode.FINDING == 6
    assert '"K_PAST_PEAK"' in gated.stdout  # the diagnosis is still printed
    assert "found K_PAST_PEAK (exit 6)" in gated.stderr
    passing = spectune("diagnose", "--example", "--fail-on", "LOW_ACCEPTANCE,KV_POOL_SHRANK")
    assert passing.returncode == 0, passing.stderr
    bad = spectune("diagnose", "--example", "--fail-on", "SLOW")
    assert bad.returncode == ExitCode.BAD_INPUT
    assert "SLOW is not a diagnosis code" in one_line_error(bad) and "K_PAST_PEAK" in bad.stderr


def test_bad_prometheus_connection_flags_are_bad_input() -> None:
    base = ("diagnose", "--prometheus", "http://127.0.0.1:1", "--selector", '{a="b"}')
    assert "write it as 'Name: value'" in one_line_error(
        spectune(*base, "--window", "1m", "--header", "X-Scope-OrgID")
    )
    secret = spectune(*base, "--window", "1m", "--header", "Authorization: Bearer x")
    assert secret.returncode == ExitCode.BAD_INPUT
    assert "credentials come from authSecretRef" in one_line_error(secret)


def test_shell_completion_completes_commands_and_diagnosis_codes(tmp_path: Path) -> None:
    script = spectune("completion", "bash")
    assert script.returncode == 0
    assert "complete " in script.stdout and "kubectl-spectune" in script.stdout
    assert spectune("completion", "zsh").returncode == 0

    def complete(line: str) -> list[str]:
        out = tmp_path / "completions"
        env = {
            "_ARGCOMPLETE": "1",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
        }
        proc = spectune(env=env)
        assert proc.returncode == 0, proc.stderr
        return out.read_text().split()

    assert complete("spectune dia") == ["diagnose"]
    assert complete("spectune diagnose --fail-on K_") == [Code.K_PAST_PEAK.value]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s + 0.25  # every tick wakes late


def test_a_long_scrape_window_counts_down_on_a_terminal() -> None:
    clock, out = FakeClock(), io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    asyncio.run(countdown(console, 5.0, "scraping again", clock.sleep, clock))
    # The wait ends by the clock: late ticks do not stretch the window.
    assert 5.0 <= clock.now - 100.0 < 5.0 + 0.25 + 1e-9
    assert "window of 5s, then scraping again" in out.getvalue() and "s left" in out.getvalue()


def test_no_countdown_is_drawn_into_a_pipe() -> None:
    clock, out = FakeClock(), io.StringIO()
    asyncio.run(countdown(Console(file=out), 5.0, "scraping again", clock.sleep, clock))
    assert clock.slept == [5.0] and out.getvalue() == ""
