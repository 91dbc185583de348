"""``spectune bench`` on the command line: JSON on stdout, one-line errors with exit 3."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from spectune.bench import command, registry
from spectune.bench.registry import check_policy_name, policy_names, register_policy
from spectune.errors import SpecError
from spectune.search.baselines import GridPolicy
from tests.unit.bench.conftest import TINY, merged


@pytest.fixture
def scenario_file(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECTUNE_CACHE_DIR", str(cache_dir))
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    return path


def test_json_run_prints_one_object(scenario_file: Path, capsys: pytest.CaptureFixture[str]):
    code = command.main(
        ["--scenario", str(scenario_file), "--policy", "static:eagle3/2", "--json",
         "--window", "60", "--jobs", "1"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert len(out.strip().splitlines()) == 1
    doc = json.loads(out)
    assert doc["policy"] == "static:eagle3/2" and doc["phases"][0]["chosen_arm"] == "eagle3/2"


def test_terminal_run_prints_a_summary_table(
    scenario_file: Path, capsys: pytest.CaptureFixture[str]
):
    code = command.main(
        [
            "--scenario",
            str(scenario_file),
            "--policy",
            "static:off",
            "--window",
            "60",
            "--jobs",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "oracle arm" in out and "run efficiency" in out and "trials" in out


def test_a_terminal_shows_progress_and_events_on_stderr(
    scenario_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code = command.main(
        ["--scenario", str(scenario_file), "--policy", "oracle", "--window", "60", "--jobs", "1"]
    )
    captured = capsys.readouterr()
    assert code == 0
    assert "Promoted: eagle3/" in captured.err
    assert "oracle arm" in captured.out


@pytest.mark.parametrize("policy", ["nope", "static", "grid:eagle3/2", "static:eagle3/x"])
def test_a_bad_policy_is_one_line_and_exit_3(
    scenario_file: Path, capsys: pytest.CaptureFixture[str], policy: str
):
    code = command.main(["--scenario", str(scenario_file), "--policy", policy, "--json"])
    err = capsys.readouterr()
    assert code == 3
    assert err.out == ""
    assert len(err.err.strip().splitlines()) == 1
    assert err.err.startswith("spectune: error:")
    if policy == "nope":
        for name in ("grid", "egreedy", "ucb1", "acceptance-threshold", "oracle", "static:<arm>"):
            assert name in err.err


def test_an_unknown_drafter_in_a_static_arm_is_one_line_and_exit_3(
    scenario_file: Path, capsys: pytest.CaptureFixture[str]
):
    code = command.main(["--scenario", str(scenario_file), "--policy", "static:medusa/2"])
    err = capsys.readouterr().err
    assert code == 3 and "medusa" in err and len(err.strip().splitlines()) == 1


def test_a_bad_scenario_names_the_field_and_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(merged(TINY, {"fleet": {"replicas": -1}})), encoding="utf-8")
    code = command.main(["--scenario", str(bad), "--policy", "grid", "--json"])
    err = capsys.readouterr().err
    assert code == 3
    assert len(err.strip().splitlines()) == 1 and "fleet.replicas" in err
    missing = command.main(["--scenario", str(tmp_path / "none.yaml"), "--policy", "grid"])
    assert missing == 3 and "none.yaml" in capsys.readouterr().err


def test_the_registry_lists_and_accepts_new_policies(monkeypatch: pytest.MonkeyPatch):
    assert "spectune" in policy_names()  # found lazily in search/spectune_policy.py
    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))
    register_policy("grid-copy", lambda req: GridPolicy(name="grid-copy"))
    check_policy_name("grid-copy")
    with pytest.raises(SpecError, match=r"valid policies: .*grid-copy"):
        check_policy_name("grid-copy2")


def test_pod_action_reaches_the_controller(
    scenario_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    from spectune.bench import runner
    from spectune.control.controller import PodAction

    seen: dict[str, object] = {}

    def fake(scenario: object, policy: str, **kwargs: object) -> object:
        seen.update(kwargs)
        raise SpecError("stop here")

    monkeypatch.setattr(runner, "run_bench", fake)
    args = ["--scenario", str(scenario_file), "--policy", "static:off", "--json"]
    assert command.main([*args, "--pod-action", "restartPod"]) == 3
    config = seen["controller_config"]
    assert getattr(config, "pod_action", None) is PodAction.RESTART_POD
    with pytest.raises(SystemExit) as bad:
        command.main([*args, "--pod-action", "reboot"])
    assert bad.value.code == 2
    assert "--pod-action: invalid choice: 'reboot'" in capsys.readouterr().err
