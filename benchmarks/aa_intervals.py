"""A/A check of the objective's intervals: a canary on the incumbent's own arm.

Run: python3 benchmarks/aa_intervals.py [--scenarios 'examples/scenarios/*.yaml']
         [--seeds 11-20] [--windows 4] [--window 300]

The canary and the incumbent run the same arm on the same traffic, so the true ratio of
their objectives is 1. For each window the script reads both groups' figures the way the
policy does (the simulator's exposition text → ``window_stats``), pairs them as the model
does (``search/model.py``: a p95 the per-token histogram hides is read from the acceptance
counters, and a window's spread is floored at ``MEASURED_FLOOR``), and compares the log
ratio with the 95 % interval that pair claims for it. A calibrated interval misses about
5 % of the windows; one that misses far more makes the policy sure of differences that are
noise. Prints, per scenario: windows, the median claimed spread, the actual spread of the
log ratio (its standard deviation over the windows), and the misses.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import math
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from spectune.bench.adapters import SimGroupMetrics, SimStage
from spectune.bench.runner import bench_objective
from spectune.control.ports import Group
from spectune.search.model import MEASURED_FLOOR, _Tails
from spectune.search.objective import WindowStats, window_stats
from spectune.sim.fleet import Fleet
from spectune.sim.scenario import Scenario, load_scenario

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "scenarios"


def aa_windows(
    scenario: Scenario, seed: int, windows: int, window_s: float
) -> list[tuple[float, float]]:
    """(log ratio canary/incumbent, claimed log-spread) of each A/A window of one seed."""
    n = scenario.fleet.replicas
    fleet = Fleet(scenario, seed=seed, replicas=n + 1, parked=[n])
    stage = SimStage(fleet, end_s=float(scenario.duration_s), placement="beside")
    stage.start_canary(scenario.initial_arm)
    stage.advance_to(scenario.target.restart_s + 60.0)
    metrics = SimGroupMetrics(stage)
    objective = bench_objective(scenario)
    out = []
    arm = scenario.initial_arm
    seen: list[WindowStats] = []
    for _ in range(windows):
        if stage.now + window_s > stage.end_s:
            break
        groups = asyncio.run(metrics.observe(window_s))
        if Group.CANARY not in groups or Group.INCUMBENT not in groups:
            continue
        can = window_stats(groups[Group.CANARY], objective)
        inc = window_stats(groups[Group.INCUMBENT], objective)
        # Read the pair as the model does: a p95 the histogram hides is modelled from the
        # acceptance counters seen so far (search/model.py, _Tails).
        seen += [can, inc]
        tails = _Tails({arm.drafter: seen} if arm.drafter else {})
        can_v, inc_v, spread = tails.pair(can, arm.name, inc, arm.name)
        spread = max(spread, MEASURED_FLOOR)  # the floor a measured window is given
        ratio = math.log(can_v) - math.log(inc_v)
        if math.isfinite(ratio) and math.isfinite(spread):
            out.append((ratio, spread))
    return out


def main() -> int:
    """Run the check; exit code 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default=str(EXAMPLES / "*.yaml"))
    ap.add_argument("--seeds", default="11-20", help="an inclusive range, e.g. 11-20")
    ap.add_argument("--windows", type=int, default=4, help="windows per seed")
    ap.add_argument("--window", type=float, default=300.0)
    ns = ap.parse_args()
    lo, _, hi = ns.seeds.partition("-")
    seeds = range(int(lo), int(hi or lo) + 1)
    table = Table(title="A/A: the canary on the incumbent's arm")
    for col in ("scenario", "windows", "claimed spread", "actual spread", "misses of 95 %"):
        table.add_column(col, justify="left" if col == "scenario" else "right")
    for path in sorted(glob.glob(ns.scenarios)):
        scenario = load_scenario(path)
        pairs = [p for s in seeds for p in aa_windows(scenario, s, ns.windows, ns.window)]
        if len(pairs) < 2:
            continue
        misses = sum(abs(r) > 1.96 * sp for r, sp in pairs)
        table.add_row(
            scenario.name,
            str(len(pairs)),
            f"{statistics.median(sp for _, sp in pairs):.4f}",
            f"{statistics.pstdev(r for r, _ in pairs):.4f}",
            f"{misses} ({misses / len(pairs):.0%})",
        )
    Console(width=120).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
