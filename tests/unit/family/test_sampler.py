"""The family sampler: reproducible, checked worlds, and clear errors on a bad family file."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from spectune.cli import main as cli_main
from spectune.errors import SpecError
from spectune.search.arms import Arm
from spectune.sim.physics import arm_physics
from spectune.sim.sampler import Family, _offered, load_family, off_capacity, sample_worlds
from spectune.sim.scenario import load_scenario, scenario_from_mapping

REPO = Path(__file__).resolve().parents[3]
REALISTIC = REPO / "benchmarks" / "families" / "realistic.yaml"


@pytest.fixture(scope="module")
def family() -> Family:
    return load_family(REALISTIC)


def _raw() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(REALISTIC.read_text())
    return data


def test_the_same_seed_draws_the_same_worlds_and_another_seed_others(family: Family) -> None:
    a = sample_worlds(family, 7, 12)
    b = sample_worlds(family, 7, 12)
    c = sample_worlds(family, 8, 12)
    assert [w.scenario for w in a.worlds] == [w.scenario for w in b.worlds]
    assert [w.scenario for w in a.worlds] != [w.scenario for w in c.worlds]
    # a longer set starts with the shorter one: --count grows a set without reshuffling it
    longer = sample_worlds(family, 7, 14)
    assert [w.scenario for w in longer.worlds[:12]] == [w.scenario for w in a.worlds]


def test_every_sampled_world_is_a_valid_scenario_whose_incumbent_starts(family: Family) -> None:
    sampling = sample_worlds(family, 11, 40)
    assert len(sampling.worlds) == 40
    for w in sampling.worlds:
        s = scenario_from_mapping(w.scenario)
        assert arm_physics(s, s.initial_arm).failure is None, w.name
        others = [Arm(None)] + [Arm(d.name, 1) for d in s.drafters]
        assert any(a != s.initial_arm and arm_physics(s, a).failure is None for a in others)
        assert off_capacity(s) > 0
    # the family spans its regimes: loads from idle to saturated, one to eight replicas
    bands = {w.regime["load_band"] for w in sampling.worlds}
    assert {"idle", "light", "busy"} <= bands
    assert len({w.regime["replicas"] for w in sampling.worlds}) >= 3
    assert any(w.regime["losing"] for w in sampling.worlds)
    assert len({w.regime["objective"] for w in sampling.worlds}) >= 3


def test_a_draw_that_fails_a_check_is_drawn_again_with_its_reason_reported() -> None:
    raw = _raw()
    raw["max_requests"] = 3000  # most busy worlds are then too costly to simulate
    sampling = sample_worlds(Family.model_validate(raw), 5, 10)
    assert len(sampling.worlds) == 10
    assert any("too costly to simulate" in r for r in sampling.rejections)
    for w in sampling.worlds:
        doc = w.scenario
        assert _offered(doc["load"], doc["events"], doc["duration_s"]) <= 3000


def test_a_family_that_cannot_produce_a_world_says_why() -> None:
    raw = _raw()
    raw["targets"] = [t for t in raw["targets"] if t["name"] == "llama-3.1-405b-fp8"]
    raw["hardware"] = [h for h in raw["hardware"] if h["name"] == "L40S-48GB"]
    with pytest.raises(SpecError, match="does not fit on L40S-48GB"):
        sample_worlds(Family.model_validate(raw), 1, 1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.update(unknown_knob=1), "unknown_knob"),
        (lambda r: r["load"]["fraction"].update(low=2.0), "low 2.0 is above high"),
        (lambda r: r["targets"][0]["drafters"].append("eagel3"), "unknown drafters"),
        (lambda r: r["load"]["shapes"].update(sawtooth=1.0), "sawtooth"),
        (lambda r: r.update(objective={"tpotP95": 0.0}), "no option has a positive weight"),
    ],
)
def test_a_bad_family_file_is_refused_naming_the_field(
    tmp_path: Path, change: Any, message: str
) -> None:
    raw = copy.deepcopy(_raw())
    change(raw)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError, match=message):
        load_family(path)


def test_sim_sample_writes_loadable_files_and_an_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "worlds"
    code = cli_main(
        ["sim", "sample", "--family", str(REALISTIC), "--seed", "3", "--count", "4",
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    assert "wrote 4 worlds of family realistic (seed 3)" in capsys.readouterr().out
    files = sorted(out.glob("realistic-3-*.yaml"))
    assert len(files) == 4
    for f in files:
        assert load_scenario(f).name == f.stem
    index = yaml.safe_load((out / "index.yaml").read_text())
    assert [w["file"] for w in index["worlds"]] == [f.name for f in files]
    assert {"load_band", "replicas", "drafters", "objective"} <= set(index["worlds"][0]["regime"])


def test_sim_sample_with_a_missing_family_file_exits_3_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(
        ["sim", "sample", "--family", str(tmp_path / "nope.yaml"), "--seed", "1",
         "--out", str(tmp_path / "o")]
    )  # fmt: skip
    assert code == 3  # bad input (spectune.exitcodes)
    assert "nope.yaml: cannot read it" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_realism_knobs_are_drawn_when_the_family_turns_them_on() -> None:
    raw = _raw()
    plain = sample_worlds(Family.model_validate(raw), 4, 6)
    raw["realism"] = {
        "speed_spread": 1.0,
        "cuda_graphs": 1.0,
        "two_population": 1.0,
        "scrape_offsets": 1.0,
    }
    real = sample_worlds(Family.model_validate(raw), 4, 6)
    for a, b in zip(plain.worlds, real.worlds, strict=True):
        # the knobs are drawn last: the rest of each world is the one drawn without them
        assert a.scenario["target"] == b.scenario["target"]
        assert a.scenario["load"] == b.scenario["load"]
        s = scenario_from_mapping(b.scenario)
        assert 0 < s.hardware.speed_spread <= 0.05
        assert s.hardware.cuda_graph_max_batch == 512
        assert all(acc.second is not None for r in s.routes for acc in r.acceptance.values())
        assert 15 <= s.fleet.scrape_offset_s <= 30
        assert b.regime["realism"] == "speed_spread+cuda_graphs+two_population+scrape_offsets"
        assert "realism" not in a.regime


def test_a_family_can_draw_broken_drafters_and_decaying_pods() -> None:
    raw = _raw()
    raw["events"] = {**raw["events"], "drafter_broken": 1.0, "pod_decay": 1.0}
    sampling = sample_worlds(Family.model_validate(raw), 5, 6)
    for w in sampling.worlds:
        s = scenario_from_mapping(w.scenario)
        kinds = [e.kind for e in s.events]
        assert "drafter_broken" in kinds and "pod_decay" in kinds, w.name
        assert "drafter_broken" in w.regime["events"] and "pod_decay" in w.regime["events"]
