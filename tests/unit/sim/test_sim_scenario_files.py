"""Scenario files: every documented field loads, every bad value is named by its path."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from spectune.errors import SpecError
from spectune.search.arms import Arm
from spectune.sim import Fleet, Scenario, load_scenario, scenario_from_mapping

from .conftest import merged

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples" / "scenarios").glob("*.yaml"))
CONTRACT = ROOT.parent / "shared" / "scenario-format.md"


def test_at_least_five_example_scenarios_ship() -> None:
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_each_example_loads_and_serves(path: Path) -> None:
    scenario = load_scenario(path)
    fleet = Fleet(scenario)
    fleet.advance(60.0)
    assert fleet.records(), f"{path.name}: no request finished in 60 simulated seconds"
    assert all(s.failure is None for s in fleet.states())
    page = fleet.metrics_text(0)
    assert ("sglang:" if scenario.engine == "sglang" else "vllm:") in page


def test_the_contract_example_loads() -> None:
    if not CONTRACT.exists():
        pytest.skip("shared/scenario-format.md is not beside the repository")
    text = CONTRACT.read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block is not None
    scenario = load_scenario(block.group(1))
    assert scenario.initial_arm == Arm("eagle3", 5)
    assert scenario.max_model_len == 10240
    assert [e.kind for e in scenario.events] == ["model_version", "route_mix"]


def test_defaults_fill_the_optional_fields(base_mapping: dict[str, Any]) -> None:
    for key in ("fleet", "initial", "engine", "seed"):
        base_mapping.pop(key)
    del base_mapping["target"]["max_num_seqs"]
    scenario = scenario_from_mapping(base_mapping)
    assert scenario.fleet.replicas == 1
    assert scenario.initial_arm == Arm(None)
    assert scenario.engine == "vllm"
    assert scenario.target.max_num_seqs == 256
    assert scenario.max_model_len == 6000 + 1000  # largest prompt + largest output


def test_yaml_off_means_no_speculation() -> None:
    text = (ROOT / "examples" / "scenarios" / "chat-eagle3.yaml").read_text(encoding="utf-8")
    assert "initial: {drafter: off}" in text
    assert load_scenario(text).initial_arm == Arm(None)


def _load_with(changes: dict[str, Any]) -> Scenario:
    from .conftest import BASE

    return scenario_from_mapping(merged(BASE, changes))


def _error(build: Callable[[], object]) -> str:
    with pytest.raises(SpecError) as info:
        build()
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_unknown_field_is_named_with_a_hint(base_mapping: dict[str, Any]) -> None:
    base_mapping["hardware"]["memory_gb"] = base_mapping["hardware"].pop("memory_gib")
    message = _error(lambda: scenario_from_mapping(base_mapping))
    assert message.startswith("hardware.memory_gb: unknown field")
    assert "memory_gib" in message


def test_unknown_nested_field_is_named(base_mapping: dict[str, Any]) -> None:
    base_mapping["routes"][1]["output_tokens"]["mean"] = 3
    message = _error(lambda: scenario_from_mapping(base_mapping))
    assert "routes[1].output_tokens.mean: unknown field" in message


@pytest.mark.parametrize(
    ("changes", "path", "fragment"),
    [
        ({"duration_s": "1h"}, "duration_s", "seconds"),
        ({"hardware": {"memory_gib": "80GB"}}, "hardware.memory_gib", "GiB"),
        ({"target": {"restart_s": "3m"}}, "target.restart_s", "seconds"),
        ({"hardware": {"bandwidth_tbs": "3.35 TB/s"}}, "hardware.bandwidth_tbs", "TB/s"),
    ],
)
def test_values_written_with_units_are_rejected(
    changes: dict[str, Any], path: str, fragment: str
) -> None:
    message = _error(lambda: _load_with(changes))
    assert message.startswith(f"{path}: expected a number")
    assert fragment in message


def test_route_naming_an_unknown_drafter(base_mapping: dict[str, Any]) -> None:
    accept = base_mapping["routes"][1]["acceptance"]
    accept["eagel3"] = accept.pop("eagle3")
    message = _error(lambda: scenario_from_mapping(base_mapping))
    assert message == (
        "routes[1].acceptance.eagel3: unknown drafter 'eagel3'; "
        "drafters are: eagle3, ngram, draft8b"
    )


def test_k_above_max_k_in_initial() -> None:
    message = _error(lambda: _load_with({"initial": {"drafter": "eagle3", "k": 9}}))
    assert message.startswith("initial.k:")
    assert "max_k (8)" in message


def test_initial_naming_an_unknown_drafter() -> None:
    message = _error(lambda: _load_with({"initial": {"drafter": "medusa", "k": 2}}))
    assert message.startswith("initial.drafter: unknown drafter 'medusa'")


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"load": [{"at_s": 0, "requests_per_s": -1.0}]}, "load[0].requests_per_s"),
        ({"routes": [{"share": -0.5}]}, "routes[0]"),
        ({"target": {"restart_s": -5}}, "target.restart_s"),
        ({"hardware": {"step_overhead_ms": -1}}, "hardware.step_overhead_ms"),
    ],
)
def test_negative_rates_and_times_are_rejected(changes: dict[str, Any], path: str) -> None:
    message = _error(lambda: _load_with(changes))
    assert message.startswith(path)


def test_negative_route_share_names_the_share(base_mapping: dict[str, Any]) -> None:
    base_mapping["routes"][0]["share"] = -0.5
    message = _error(lambda: scenario_from_mapping(base_mapping))
    assert message.startswith("routes[0].share: must be at least 0")
    assert "negative" in message


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        ({"engine": "trtllm"}, "engine"),
        ({"version": 2}, "version"),
        ({"fleet": {"balancer": "random"}}, "fleet.balancer"),
        ({"events": [{"at_s": 10, "kind": "reboot"}]}, "events[0].kind"),
        ({"events": [{"at_s": 10, "kind": "route_mix", "shares": {"chatt": 1}}]},
         "events[0].shares.chatt"),
        ({"events": [{"at_s": 10, "kind": "model_version", "version": "v2",
                      "acceptance_scale": {"egale": 0.5}}]},
         "events[0].acceptance_scale.egale"),
        ({"hardware": {"gpu_memory_utilization": 1.5}}, "hardware.gpu_memory_utilization"),
        ({"routes": [{"acceptance": {"eagle3": {"alpha": 1.2}}}]}, "routes[0]"),
    ],
)  # fmt: skip
def test_bad_values_name_their_path(changes: dict[str, Any], path: str) -> None:
    assert _error(lambda: _load_with(changes)).startswith(path)


def test_missing_required_field() -> None:
    message = _error(lambda: scenario_from_mapping({"version": 1, "name": "x"}))
    assert "duration_s: required field is missing" in message


def test_yaml_syntax_error_gives_a_line() -> None:
    message = _error(lambda: load_scenario("version: 1\nname: [unclosed\n"))
    assert "line" in message and "not valid YAML" in message


def test_missing_file() -> None:
    assert "does not exist" in _error(lambda: load_scenario("no/such/scenario.yaml"))


def test_an_arm_is_checked_against_the_scenario(make_scenario: Callable[..., Scenario]) -> None:
    scenario = make_scenario()
    with pytest.raises(SpecError, match="unknown drafter 'medusa'; drafters are: eagle3"):
        scenario.check_arm(Arm("medusa", 2))
    with pytest.raises(SpecError, match="above draft8b's max_k 6"):
        scenario.check_arm(Arm("draft8b", 7))


def test_examples_are_plain_yaml_mappings() -> None:
    for path in EXAMPLES:
        assert isinstance(yaml.safe_load(path.read_text(encoding="utf-8")), dict)
