"""Issue [N]'s floor on a whole family set, without the oracle's every arm.

Run: python3 benchmarks/floor.py [--set eval] [--policy spectune] [--jobs N] [--limit N]
         [--out FILE.jsonl]

``worse_than_initial_s`` (``bench/scoring.py``: seconds after the first promotion in which
the target served an arm worse than the world's initial arm, with confidence) needs the
static runs of the initial arm and of each promoted arm only. The family bench
(``family.py``) simulates every candidate arm of every world first, for efficiency and
regret; this script drives the same controller over the same simulated fleet and scores
it the same way (``bench/runner.py``'s ``sim_controller``, ``drive`` and
``worse_than_initial``), but simulates only the arms the floor reads, so the whole
``eval`` set fits a short run on a small machine. Static runs go to the same on-disk cache
as the family bench's oracles.

Printed: per world with a positive figure, its name, the seconds, and the arms served;
then the runs with a positive figure, their total, and the rollbacks. Exit status 1 when
any run served worse than its initial arm.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from family import load_set

from spectune.bench.oracle import Oracle
from spectune.bench.registry import PolicyRequest, make_policy
from spectune.bench.runner import drive, sim_controller, worse_than_initial
from spectune.control.controller import Event
from spectune.sim.scenario import scenario_from_mapping


def floor_run(doc: dict[str, Any], policy: str, window_s: float) -> dict[str, Any]:
    """One world: the policy's run, the arms it served and its seconds worse than initial."""
    scenario = scenario_from_mapping(doc)
    oracle = Oracle(scenario, scenario.seed, jobs=1)
    request = PolicyRequest(policy, None, oracle.space, (), scenario.seed, scenario)
    events: list[Event] = []
    controller, stage, clock = sim_controller(
        scenario,
        make_policy(policy, request),
        oracle.space,
        seed=scenario.seed,
        window_s=window_s,
        on_event=events.append,
    )
    duration = float(scenario.duration_s)
    drive(controller, clock, duration)
    worse = worse_than_initial(
        scenario, stage.timeline, lambda arm: oracle.run(arm).requests, window_s
    )
    return {
        "scenario": scenario.name,
        "policy": policy,
        "worse_than_initial_s": worse,
        "rollbacks": sum(1 for e in events if e.reason == "RolledBack"),
        "served": [[round(t, 1), arm] for t, arm in stage.timeline],
        "trials": stage.trials,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the set, print the floor per world and in all; 1 when any run was worse."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="eval", help="a set of benchmarks/families/sets.yaml")
    ap.add_argument("--policy", default="spectune")
    ap.add_argument("--window", type=float, default=300.0, help="window seconds")
    ap.add_argument("--jobs", type=int, default=1, help="processes, one world each")
    ap.add_argument("--limit", type=int, default=None, help="the set's first N worlds")
    ap.add_argument("--out", type=Path, default=None, help="append one JSON line per world")
    args = ap.parse_args(argv)

    worlds, _ = load_set(args.set)
    docs = [w.scenario for w in worlds[: args.limit]]
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(floor_run, d, args.policy, args.window) for d in docs]
        for i, fut in enumerate(as_completed(futures), 1):
            row = fut.result()
            rows.append(row)
            if args.out is not None:
                with args.out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            mark = (
                f"  WORSE {row['worse_than_initial_s']:.0f} s"
                if row["worse_than_initial_s"]
                else ""
            )
            print(f"[{i}/{len(docs)}] {row['scenario']}: {row['served']}{mark}", flush=True)
    worse = [r for r in rows if r["worse_than_initial_s"] > 0]
    total = sum(r["worse_than_initial_s"] for r in worse)
    rollbacks = sum(r["rollbacks"] for r in rows)
    print(
        f"{args.policy} on {args.set} ({len(rows)} worlds): served worse than initial in "
        f"{len(worse)} runs, {total:.0f} s in all; rollbacks {rollbacks}"
    )
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
