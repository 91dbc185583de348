"""The offline-table baseline: a per-batch k table from an idle-box sweep, shipped once."""

from __future__ import annotations

from collections.abc import Callable

from spectune.bench.offline_table import offline_table_arm
from spectune.bench.runner import BenchResult
from tests.unit.bench.conftest import DRIFT, tiny_scenario


def test_the_table_drafts_less_as_the_batch_grows() -> None:
    """Verification over b·(k+1) tokens leaves the memory-bound regime as b grows, so the
    sweep's best k can only fall with the batch (DESIGN.md §1, sentence 4)."""
    arm = offline_table_arm(tiny_scenario(initial={"drafter": "eagle3", "k": 3}))
    assert arm.drafter == "eagle3"
    assert arm.schedule is not None
    ks = [k for _, _, k in arm.schedule]
    assert ks == sorted(ks, reverse=True)
    assert ks[0] >= 1
    assert arm.schedule[0][0] == 1 and arm.schedule[-1][1] == 256


def test_sglang_gets_the_idle_box_k_as_a_fixed_length() -> None:
    arm = offline_table_arm(tiny_scenario(engine="sglang", initial={"drafter": "eagle3", "k": 1}))
    assert arm.schedule is None
    assert arm.drafter == "eagle3" and arm.k >= 1


def test_a_drafter_that_never_accepts_ships_no_speculation() -> None:
    routes = tiny_scenario().model_dump()["routes"]
    routes[0]["acceptance"] = {"eagle3": {"alpha": 0.0, "decay": 1.0, "spread": 8}}
    arm = offline_table_arm(tiny_scenario(routes=routes, initial={"drafter": "eagle3", "k": 2}))
    assert arm.is_off


def test_the_bench_promotes_the_table_once_and_never_revisits_it(
    bench: Callable[..., BenchResult],
) -> None:
    """A model release that makes the head nearly useless changes nothing: the table is
    never re-measured (what sets it apart from a tuner)."""
    result = bench("offline-table", "drift")
    expected = offline_table_arm(tiny_scenario(**DRIFT))
    assert [arm for _, arm in result.promotions] == [expected.name]
    assert result.trials == 1
