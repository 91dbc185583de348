"""`spectune demo`, the README's first command: it tunes the bundled scenario end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path


def test_the_demo_finds_a_speculative_setting_and_shows_its_gain(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "spectune.cli", "demo", "--json", "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            "SPECTUNE_CACHE_DIR": str(tmp_path / "cache"),
            "PATH": "/usr/bin:/bin",
            # the code under test, where a worktree puts it first on the path
            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        },
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # Low-load chat with an EAGLE-3 head: speculation must win, clearly, at a small k.
    assert out["final_arm"].startswith("eagle3/")
    assert 1 <= int(out["final_arm"].split("/")[1]) <= 5
    assert out["gain_over_off"] > 1.3
    assert out["trials"] <= 6
    reasons = [d["reason"] for d in out["decisions"]]
    assert "TrialStarted" in reasons and "Promoted" in reasons
    # The search either ended on a promotion, or the scenario ended inside a trial's window
    # and the demo names that trial (nothing is decided on a window cut short).
    if reasons[-1] not in ("Promoted", "Converged"):
        trial = out["unfinished_trial"]
        assert trial and trial in out["decisions"][-1]["message"]
    for name in ("acceptance.png", "speedup.png", "search.png"):
        assert (tmp_path / "r" / name).read_bytes()[:4] == b"\x89PNG"
    # The picture's numbers: every arm the last decision estimated, on the final arm's
    # scale (its own is 1, measured), and beside each arm of its drafter a static run.
    points = {p["arm"]: p for p in out["search"]}
    final = points[out["final_arm"]]
    assert final["measured"] and final["value"] == 1.0 and final["static_run"] == 1.0
    assert points["off"]["measured"] and points["off"]["static_run"] > 1.3
    assert any(not p["measured"] for p in points.values())
    for p in points.values():
        assert p["low"] <= p["value"] <= p["high"], p
    drafter = out["final_arm"].split("/")[0]
    assert all(p["static_run"] for a, p in points.items() if a.startswith(f"{drafter}/"))
    assert 'src="speedup.png"' in (tmp_path / "r" / "index.html").read_text()
    # One story: the report describes the arm the demo chose, on the demo's objective, with
    # the same gain the trail's last line prints (not the mean model's best k as the answer).
    report = json.loads((tmp_path / "r" / "diagnosis.json").read_text())
    chosen = report["chosen"]
    assert chosen["arm"] == out["final_arm"] and chosen["objective"] == out["objective"]
    assert abs(chosen["gain_over_off"] - out["gain_over_off"]) < 1e-3
    assert chosen["measured_gain_by_k"][str(chosen["k"])] == chosen["gain_over_off"]
    page = (tmp_path / "r" / "index.html").read_text()
    assert f"Chosen: {out['final_arm']}</b> on the objective <b>{out['objective']}" in page
    assert f"Best k = {report['best_k']}" not in page
    # ...and it puts no other draft length forward as the answer: the findings (and what they
    # say to do) are the chosen arm's, and neither "best k" nor an action names another k.
    assert chosen["findings"] and all(f["code"] != "K_PAST_PEAK" for f in chosen["findings"])
    assert set(re.findall(r"num_speculative_tokens to (\d+)", page)) <= {str(chosen["k"])}
    assert set(re.findall(r"best k (?:=|is) (\d+)", page, re.I)) <= {str(chosen["k"])}
    # The gain it leads with is the SPEEDUP the operator would show for this run.
    assert out["speedup"] is not None and out["speedup"] == chosen["speedup"]
    assert f"SPEEDUP {out['speedup']:.2f}&times;" in page
