"""``spectune sim run`` / ``sim serve``: what a user types and what comes back."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest
import yaml

from spectune.errors import SpecError
from spectune.search.arms import Arm, parse_arm
from spectune.sim import load_scenario
from spectune.sim.command import main, register
from spectune.sim.server import (
    SimServer,
    arm_from_vllm_args,
    check_loopback,
    model_name_from_vllm_args,
)

from .conftest import BASE

KEYS = {
    "arm", "tpot_p50", "tpot_p95", "ttft_p95", "e2e_p95", "queue_p95", "output_tokens_per_s",
    "num_gpu_blocks", "preemptions", "mean_accepted_length", "acceptance_rate", "sim_seconds",
    "wall_seconds",
}  # fmt: skip


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "unit.yaml"
    path.write_text(yaml.safe_dump(BASE), encoding="utf-8")
    return path


def test_run_prints_the_figures_as_json(
    scenario_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "metrics.txt"
    code = main(
        ["run", "--scenario", str(scenario_file), "--arm", "eagle3/3", "--duration", "60",
         "--seed", "3", "--metrics-out", str(page), "--json"]
    )  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= KEYS
    assert out["arm"] == "eagle3/3" and out["sim_seconds"] == 60 and out["seed"] == 3
    assert 0 < out["tpot_p50"] <= out["tpot_p95"] < 1
    assert 1 < out["mean_accepted_length"] < 4 and 0 < out["acceptance_rate"] < 1
    assert "vllm:spec_decode_num_drafts_total" in page.read_text(encoding="utf-8")


def test_run_off_has_no_acceptance(scenario_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--scenario", str(scenario_file), "--arm", "off", "--duration", "30",
                 "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["mean_accepted_length"] is None and out["acceptance_rate"] is None


def test_run_prints_a_table_without_json(
    scenario_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["run", "--scenario", str(scenario_file), "--arm", "ngram/2", "--duration", "30"]) == 0
    )
    out = capsys.readouterr().out
    assert "tpot_p95" in out and "ngram/2" in out


@pytest.mark.parametrize(
    ("arm", "fragment"),
    [
        ("eagle3/x", "bad arm 'eagle3/x'"),
        ("medusa/2", "unknown drafter 'medusa'; drafters are: eagle3, ngram, draft8b"),
        ("eagle3/9", "max_k 8"),
    ],
)
def test_run_errors_are_one_line_and_exit_3(
    scenario_file: Path, capsys: pytest.CaptureFixture[str], arm: str, fragment: str
) -> None:
    assert main(["run", "--scenario", str(scenario_file), "--arm", arm, "--json"]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert fragment in captured.err and captured.err.count("\n") == 1
    assert "Traceback" not in captured.err


def test_run_reports_a_bad_scenario_by_field_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = {**BASE, "duration_s": "1h"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad), encoding="utf-8")
    assert main(["run", "--scenario", str(path), "--arm", "off"]) == 3
    assert "duration_s: expected a number of seconds" in capsys.readouterr().err


def test_run_reports_an_arm_that_cannot_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = {**BASE, "hardware": {**BASE["hardware"], "memory_gib": 180},
             "target": {**BASE["target"], "max_model_len": 20000}}  # fmt: skip
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(small), encoding="utf-8")
    assert main(["run", "--scenario", str(path), "--arm", "draft8b/2"]) == 3
    assert "cannot start" in capsys.readouterr().err


def test_register_adds_sim_run_and_serve() -> None:
    parser = argparse.ArgumentParser(prog="spectune")
    register(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["sim", "run", "--scenario", "f.yaml", "--arm", "off"])
    assert ns.func.__name__ == "run_command"
    ns = parser.parse_args(
        ["sim", "serve", "--scenario", "f.yaml", "--port", "8000", "--replica-index", "1",
         "--replicas", "3", "--", "--model", "m", "--speculative-config", "{}"]
    )  # fmt: skip
    assert ns.func.__name__ == "serve_command"
    assert ns.replica_index == 1 and ns.replicas == 3
    assert ns.vllm_args[-4:] == ["--model", "m", "--speculative-config", "{}"]


EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "scenarios" / "chat-eagle3.yaml"


def test_vllm_args_map_to_the_scenarios_drafters() -> None:
    scenario = load_scenario(EXAMPLE)
    eagle = json.dumps(
        {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
         "num_speculative_tokens": 4}
    )  # fmt: skip
    assert arm_from_vllm_args(scenario, ["--speculative-config", eagle]) == Arm("eagle3", 4)
    ngram = '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}'
    assert arm_from_vllm_args(scenario, ["--speculative-config", ngram]) == Arm("ngram", 5)
    sched = json.dumps(
        {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
         "num_speculative_tokens": 3,
         "num_speculative_tokens_per_batch_size": [[1, 64, 3], [65, 256, 0]]}
    )  # fmt: skip
    assert arm_from_vllm_args(scenario, ["--speculative-config", sched]) == parse_arm(
        "eagle3/sched:1-64=3,65-256=0"
    )
    assert arm_from_vllm_args(scenario, ["--model", "m"]) == Arm(None)


def test_sglang_flags_map_for_an_sglang_scenario() -> None:
    scenario = load_scenario(EXAMPLE.with_name("sglang-mixed.yaml"))
    argv = [
        "--model-path", "meta-llama/Llama-3.1-70B-Instruct",
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
        "--speculative-num-steps", "3",
    ]  # fmt: skip
    assert arm_from_vllm_args(scenario, argv) == Arm("eagle3", 3)
    assert model_name_from_vllm_args(argv) == "meta-llama/Llama-3.1-70B-Instruct"


def test_unknown_speculative_setting_is_a_clear_error() -> None:
    scenario = load_scenario(EXAMPLE)
    other = '{"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 3}'
    with pytest.raises(SpecError, match=r"model 'Qwen/Qwen3-0\.6B' matches no drafter"):
        arm_from_vllm_args(scenario, ["--speculative-config", other])
    too_long = '{"method": "ngram", "num_speculative_tokens": 12}'
    with pytest.raises(SpecError, match="max_k"):
        arm_from_vllm_args(scenario, ["--speculative-config", too_long])


def test_model_name_comes_from_the_vllm_args() -> None:
    assert model_name_from_vllm_args(["serve", "org/m", "--port", "1"]) == "org/m"
    assert model_name_from_vllm_args(["--model", "a", "--served-model-name", "b"]) == "b"
    assert model_name_from_vllm_args(["--model=a"]) == "a"
    assert model_name_from_vllm_args([]) is None


def test_serve_refuses_anything_but_loopback() -> None:
    check_loopback("127.0.0.1")
    check_loopback("::1")
    check_loopback("localhost")
    with pytest.raises(SpecError, match="loopback only"):
        check_loopback("0.0.0.0")


def test_serve_exits_1_when_its_arm_cannot_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = {**BASE, "hardware": {**BASE["hardware"], "memory_gib": 180},
             "target": {**BASE["target"], "max_model_len": 20000}}  # fmt: skip
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(small), encoding="utf-8")
    spec = json.dumps(
        {"method": "draft_model", "model": "meta-llama/Llama-3.1-8B-Instruct",
         "num_speculative_tokens": 2}
    )  # fmt: skip
    code = main(
        ["serve", "--scenario", str(path), "--port", "0", "--", "--speculative-config", spec]
    )
    assert code == 1
    assert "ValueError: The model's max seq len (20000)" in capsys.readouterr().err


def test_server_advances_with_the_scaled_clock() -> None:
    from spectune.sim import Fleet

    scenario = load_scenario(EXAMPLE)
    fleet = Fleet(scenario, arms=Arm("eagle3", 3), replicas=1, load_scale=0.5, stream=1)
    server = SimServer(fleet, time_scale=1000.0, host="127.0.0.1", port=0)
    try:
        server._t0 -= 0.05  # 50 ms of wall time = 50 simulated seconds
        server._catch_up()
        assert fleet.now >= 50.0
        assert "vllm:num_requests_running" in fleet.metrics_text(0)
    finally:
        server._http.server_close()


def test_serve_on_a_shared_clock_starts_at_the_epochs_scaled_age(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from spectune.sim import Fleet

    scenario = load_scenario(EXAMPLE)
    fleet = Fleet(scenario, arms=Arm("eagle3", 3), replicas=1, start_s=500.0)
    server = SimServer(fleet, time_scale=1000.0, host="127.0.0.1", port=0)
    try:
        assert 500.0 <= server.sim_now() < 600.0
        server._catch_up()
        assert fleet.now >= 500.0
    finally:
        server._http.server_close()
    future = time.time() + 3600
    code = main(["serve", "--scenario", str(EXAMPLE), "--port", "0", "--clock-epoch",
                 str(future), "--", "serve", "m"])  # fmt: skip
    assert code == 3
    err = capsys.readouterr().err
    assert "--clock-epoch" in err and "a Unix time that has passed" in err
