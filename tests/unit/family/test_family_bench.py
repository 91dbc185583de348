"""benchmarks/family.py: the frozen eval set, and the paired comparison it prints."""

from __future__ import annotations

from typing import Any

import yaml

from tests.scripts import REPO, load_script

family = load_script("benchmarks/family.py")


def test_the_eval_set_is_frozen() -> None:
    """The eval worlds are what sets.yaml's digest says: a change to the family file or the
    sampler that moves them fails here, so a new eval set is a deliberate, visible change."""
    sets = yaml.safe_load((REPO / "benchmarks" / "families" / "sets.yaml").read_text())
    worlds, entry = family.load_set("eval")
    assert len(worlds) == entry["count"] >= 100
    assert family.digest(worlds) == sets["sets"]["eval"]["digest"]


def test_quick_is_the_start_of_tune_and_apart_from_eval() -> None:
    quick, _ = family.load_set("quick")
    tune, _ = family.load_set("tune")
    evaluation, _ = family.load_set("eval")
    assert len(quick) == 20
    assert [w.scenario for w in quick] == [w.scenario for w in tune[:20]]
    assert not {w.name for w in tune} & {w.name for w in evaluation}


def _runs(policy: str, effs: list[float]) -> list[dict[str, Any]]:
    return [
        {"scenario": f"w{i}", "seed": 1, "policy": policy, "efficiency": e}
        for i, e in enumerate(effs)
    ]


def test_pairing_matches_runs_by_world_and_reports_a_planted_difference() -> None:
    a = _runs("a", [0.80, 0.90, 0.70, 0.95, 0.85, 0.75, 0.88, 0.92, 0.81, 0.86])
    b = _runs("b", [r["efficiency"] + 0.05 for r in a])
    b.reverse()  # order does not matter: runs pair by world and seed
    n, line = family.pair(a, b)
    assert n == 10
    assert "+0.0500 [+0.0500, +0.0500]" in line
    assert "10 up / 0 down" in line
    n, line = family.pair(a, a)
    assert "+0.0000" in line and "0 up / 0 down" in line


def test_the_aa_twin_is_the_incumbents_physics_under_another_name() -> None:
    worlds, _ = family.load_set("quick")
    doc = next(w.scenario for w in worlds if w.scenario["initial"].get("drafter") != "off")
    world, space = family.aa_world(doc)
    base, twin = world["drafters"]
    assert twin["name"] == f"{base['name']}-twin"
    assert {k: v for k, v in twin.items() if k != "name"} == {
        k: v for k, v in base.items() if k != "name"
    }
    assert base["name"] == doc["initial"]["drafter"]
    for route in world["routes"]:
        assert route["acceptance"][twin["name"]] == route["acceptance"][base["name"]]
    assert [a.name for a in space.arms()] == [f"{base['name']}/1", f"{twin['name']}/1"]
    assert world["initial"] == {"drafter": base["name"], "k": 1}
