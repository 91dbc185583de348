"""``benchmarks/seeds.py --compare``: a moved run shows which phase moved.

A run's efficiency is its worst phase, so a change that lifts the phase it aims at can read
as a loss when a later phase falls: the comparison prints each moved run's phases and each
multi-phase scenario's mean per phase, and a reader can tell the two apart.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from tests.scripts import load_script


def _seeds() -> ModuleType:
    return load_script("benchmarks/seeds.py")


def _run(seed: int, *phases: float) -> dict[str, Any]:
    return {
        "scenario": "load-ramp", "seed": seed, "trials": 5, "efficiency": min(phases),
        "phases": [{"efficiency": e} for e in phases],
    }  # fmt: skip


def test_a_moved_run_names_its_phases_and_the_phase_means_show_where_it_moved() -> None:
    seeds = _seeds()
    before = {("load-ramp", 1): _run(1, 0.93, 1.0, 1.0), ("load-ramp", 2): _run(2, 0.94, 1.0, 1.0)}
    after = [_run(1, 1.0, 0.6, 1.0), _run(2, 0.94, 1.0, 1.0)]
    text = seeds._comparison(before, after)
    lines = text.splitlines()
    assert lines[0].startswith("against the earlier file: 0 up, 1 down of 2 runs"), text
    assert "load-ramp seed 1: 0.930 → 0.600 (trials 5 → 5; phases 0.93/1.00/1.00 → " in text
    assert "1.00/0.60/1.00)" in text
    assert "load-ramp seed 2" not in text  # unmoved runs are not listed
    assert lines[-1] == "  load-ramp phase means: 0.935 → 0.970, 1.000 → 0.800, 1.000 → 1.000"
