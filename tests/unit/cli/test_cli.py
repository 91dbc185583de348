"""The `spectune` command as a user runs it: numbers, golden outputs and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from spectune.cli import main

PAGES = Path(str(resources.files("spectune") / "examples" / "pages"))
GOLDEN = Path(__file__).parent / "golden"


def pages(example: str, moment: str) -> list[str]:
    return sorted(str(p) for p in (PAGES / example / moment).glob("*.prom"))


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_whatif_reproduces_the_textbook_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "whatif", "--acceptance", "0.7", "--draft-cost", "0.15", "--json")
    by_k = {r["k"]: round(r["speedup"], 2) for r in doc["rows"]}
    assert [by_k[k] for k in (1, 3, 5, 8)] == [1.48, 1.75, 1.68, 1.45]
    assert doc["best_k"] == 3
    assert [r["k"] for r in doc["rows"]] == list(range(1, 9))


def test_whatif_terminal_table_marks_the_best_k(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", "--acceptance", "0.7", "--draft-cost", "0.15"]) == 0
    out = capsys.readouterr().out
    assert "◀ best" in out and "Best k = 3" in out


GOLDEN_CASES = {
    "vllm-eagle3-k7": ["--before", *pages("vllm-eagle3-k7", "before"),
                       "--after", *pages("vllm-eagle3-k7", "after"),
                       "--baseline-before", *pages("vllm-off", "before"),
                       "--baseline-after", *pages("vllm-off", "after"), "--window", "10m"],
    "vllm-ngram-k4-low": ["--before", *pages("vllm-ngram-k4-low", "before"),
                          "--after", *pages("vllm-ngram-k4-low", "after"),
                          "--baseline-before", *pages("vllm-off", "before"),
                          "--baseline-after", *pages("vllm-off", "after"), "--window", "600"],
    "vllm-v0-k4": ["--example", "vllm-v0-k4", "--draft-cost", "0.1"],
    "sglang-eagle3": ["--example", "sglang-eagle3", "--draft-cost", "0.1"],
    "trtllm-eagle3-k3": ["--example", "trtllm-eagle3-k3"],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_diagnose_json_matches_the_reviewed_golden(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_json(capsys, "diagnose", *GOLDEN_CASES[name], "--json")
    path = GOLDEN / f"{name}.json"
    if os.environ.get("SPECTUNE_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    assert doc == json.loads(path.read_text())


def test_the_flagship_example_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "diagnose", "--example", "--json")
    assert doc["engine"] == "vllm" and doc["current"] == {"k": 7}
    assert doc["draft_cost"]["source"] == "measured"
    assert 0.10 < doc["draft_cost"]["value"] < 0.14  # the pages were made with c = 0.12
    assert doc["best_k"] == 4
    assert [f["code"] for f in doc["findings"]] == ["K_PAST_PEAK"]
    assert doc["acceptance"]["per_position"][:2] == pytest.approx([0.78, 0.59], abs=0.002)


def test_a_copy_drafter_on_chat_is_low_acceptance_and_slower(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = run_json(capsys, "diagnose", *GOLDEN_CASES["vllm-ngram-k4-low"], "--json")
    assert "LOW_ACCEPTANCE" in [f["code"] for f in doc["findings"]]
    assert doc["measured_speedup"] < 1.0


def test_report_writes_plots_and_a_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--example", "--out", str(tmp_path)]) == 0
    for name in ("acceptance.png", "speedup.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    html = (tmp_path / "index.html").read_text()
    assert 'src="acceptance.png"' in html and "K_PAST_PEAK" in html
    assert json.loads((tmp_path / "diagnosis.json").read_text())["best_k"] == 4


def _write(tmp_path: Path, name: str, text: str | bytes) -> str:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(p)


@pytest.fixture
def good(tmp_path: Path) -> tuple[str, str]:
    return pages("vllm-eagle3-k7", "before")[0], pages("vllm-eagle3-k7", "after")[0]


NODE_PAGE = "# TYPE node_load1 gauge\nnode_load1 0.5\n"
OFF = [*pages("vllm-off", "before")[:1], "--after", *pages("vllm-off", "after")[:1]]

# case -> (argv after `diagnose`, given tmp dir t and a good (before, after) pair g; message)
BAD_INPUTS = {
    "malformed page": (
        lambda t, g: ["--before", g[0], "--after", _write(t, "x.prom", 'vllm:x{a="1" 2\n')],
        "not a valid Prometheus exposition page",
    ),
    "page of another program": (
        lambda t, g: ["--before", g[0], "--after", _write(t, "n.prom", NODE_PAGE)],
        "not from a serving engine",
    ),
    "speculation off": (lambda t, g: ["--before", *OFF], "speculation is off"),
    "binary file": (
        lambda t, g: ["--before", g[0], "--after", _write(t, "b.prom", b"\xff\xfe\x00")],
        "not a text file",
    ),
    "missing file": (
        lambda t, g: ["--before", g[0], "--after", str(t / "nope.prom")],
        "is not a readable file",
    ),
    "unequal page counts": (
        lambda t, g: ["--before", g[0], g[0], "--after", g[1]],
        "give one page per pod",
    ),
    "no input": (lambda t, g: [], "give exactly one input"),
    "two inputs": (
        lambda t, g: ["--example", "--scrape", "http://127.0.0.1:1/metrics"],
        "exactly one input",
    ),
    "bad window": (
        lambda t, g: ["--before", g[0], "--after", g[1], "--window", "ten minutes"],
        "--window: 'ten minutes' is not a duration",
    ),
    "bad selector": (
        lambda t, g: ["--prometheus", "http://127.0.0.1:9", "--selector", "ns=x", "--window", "1m"],
        "must be label matchers in braces",
    ),
    "prometheus without window": (
        lambda t, g: ["--prometheus", "http://127.0.0.1:9", "--selector", '{a="b"}'],
        "--window is required",
    ),
    "unknown example": (lambda t, g: ["--example", "vllm-nope"], "no bundled example 'vllm-nope'"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_3(
    case: str, tmp_path: Path, good: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    build, expected = BAD_INPUTS[case]
    assert main(["diagnose", *build(tmp_path, good)]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("spectune: error: ") and "\n" not in err
    assert expected in err


def test_a_counter_reset_between_pages_is_not_a_negative_window(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Pod 1's moments swapped make its counters go down: a restart inside the window, while
    # pod 0's grew (every pod's going down is refused as swapped pages: test_entry_point).
    before, after = pages("vllm-eagle3-k7", "before"), pages("vllm-eagle3-k7", "after")
    swapped = ["--before", before[0], after[1], "--after", after[0], before[1]]
    doc = run_json(capsys, "diagnose", *swapped, "--draft-cost", "0.12", "--json")
    assert doc["acceptance"]["drafts"] > 0
    assert 0 < doc["acceptance"]["rate"] < 1


def test_the_installed_command_runs_the_quick_start() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "spectune.cli", "diagnose", "--example"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "K_PAST_PEAK" in proc.stdout and "best" in proc.stdout
