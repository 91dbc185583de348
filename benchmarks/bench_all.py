"""Every bench policy on every shipped scenario: the table that keeps the search honest.

Run: python3 benchmarks/bench_all.py [--scenarios 'examples/scenarios/*.yaml']
         [--policies grid,ucb1,...] [--window 300] [--jobs N] [--json]

For each scenario the oracle (every candidate static arm) is computed first — or read from
the on-disk cache (``$SPECTUNE_CACHE_DIR``, default ``~/.cache/spectune``) — and timed
separately; then each policy runs through ``spectune.bench.runner.run_bench`` (the same
code as ``spectune bench``). Prints efficiency, run_efficiency, trials,
guardrail_breach_s and the recovery after each model change (seconds until the target
stays within 0.95 of the new oracle: ``bench/scoring.py``) per scenario × policy, each
run's wall time (the oracle cached), and the total. ``static:<initial>`` is the untuned
deployment (the scenario's ``initial`` arm).

Then, when ``spectune`` ran, the issue's targets per scenario: its efficiency against every
baseline's (``better`` / ``tie`` / ``worse``), and its trials against one full pass of
``grid`` — every candidate arm once, per search (the first, plus one per
``model_version`` / ``route_mix`` event, which re-open it) — and its recovery. Grid's own
``trials`` column is cut short by the scenario's length (a trial costs a restart and a
window), so it is not the count grid needs to finish. Last, spectune's median and minimum
efficiency.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from spectune.bench.oracle import Oracle
from spectune.bench.registry import policy_names
from spectune.bench.runner import run_bench
from spectune.sim.scenario import load_scenario


def _policies(initial_arm: str, wanted: list[str] | None) -> list[str]:
    if wanted:
        return wanted
    return [n for n in policy_names() if n != "static:<arm>"] + [f"static:{initial_arm}"]


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def main() -> int:
    """Run the table; exit code 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default="examples/scenarios/*.yaml")
    ap.add_argument("--policies", help="comma-separated (default: every registered policy)")
    ap.add_argument("--window", type=float, default=300.0)
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--json", action="store_true", help="one JSON object per run, per line")
    ns = ap.parse_args()
    wanted = ns.policies.split(",") if ns.policies else None
    console = Console(stderr=ns.json, width=160)
    table = Table(title="spectune bench: every policy on every scenario")
    for col in (
        "scenario",
        "policy",
        "efficiency",
        "run_efficiency",
        "trials",
        "breach s",
        "recovery s",
        "worse than initial s",
        "rollbacks",
        "wall s",
    ):
        table.add_column(col, justify="left" if col in ("scenario", "policy") else "right")
    total0 = time.perf_counter()
    results: dict[str, dict[str, dict[str, Any]]] = {}
    grid_pass: dict[str, int] = {}
    for path in sorted(glob.glob(ns.scenarios)):
        scenario = load_scenario(path)
        oracle = Oracle(scenario, scenario.seed, jobs=ns.jobs)
        arms = [a.name for a in oracle.candidates()]
        cached = sum(oracle.cached(a) for a in arms)
        t0 = time.perf_counter()
        oracle.runs(arms)
        console.print(
            f"{scenario.name}: oracle of {len(arms)} arms in {time.perf_counter() - t0:.1f}s "
            f"({cached} cached before)"
        )
        searches = 1 + sum(e.kind in ("model_version", "route_mix") for e in scenario.events)
        grid_pass[scenario.name] = len(arms) * searches
        for policy in _policies(scenario.initial_arm.name, wanted):
            result = run_bench(scenario, policy, window_s=ns.window, jobs=ns.jobs)
            doc = result.to_json()
            recovery = _recovery(result.recoveries)
            results.setdefault(scenario.name, {})[policy] = {**doc, "recovery": recovery}
            if ns.json:
                doc = {
                    **doc,
                    "worse_than_initial_s": result.worse_than_initial_s,
                    "rollbacks": result.rollbacks,
                }
            if ns.json:
                print(json.dumps(doc), flush=True)
            table.add_row(
                scenario.name,
                policy,
                _fmt(doc["efficiency"]),
                _fmt(doc["run_efficiency"]),
                str(doc["trials"]),
                _fmt(doc["guardrail_breach_s"], ".0f"),
                recovery,
                f"{result.worse_than_initial_s:.0f}",
                str(result.rollbacks),
                _fmt(doc["wall_seconds"], ".1f"),
            )
    console.print(table)
    if any("spectune" in r for r in results.values()):
        console.print(_targets(results, grid_pass))
    console.print(f"total wall time: {time.perf_counter() - total0:.1f}s")
    return 0


def _recovery(recoveries: tuple[tuple[float, float | None], ...]) -> str:
    """Seconds after each model change until back within 0.95 of the oracle (runner.py)."""
    if not recoveries:
        return "–"
    return ", ".join("never" if took is None else f"{took:.0f}" for _, took in recoveries)


def _targets(results: dict[str, dict[str, dict[str, Any]]], grid_pass: dict[str, int]) -> Table:
    """spectune against the baselines and grid's full pass, per scenario."""
    table = Table(title="spectune against the targets")
    for col in ("scenario", "efficiency", "vs baselines", "trials / grid pass",
                "recovery s"):  # fmt: skip
        table.add_column(col)
    effs = []
    for name, docs in results.items():
        ours = docs.get("spectune")
        if ours is None:
            continue
        eff = ours["efficiency"]
        effs.append(eff)
        groups: dict[str, list[str]] = {"better than": [], "tie with": [], "WORSE than": []}
        for policy, doc in docs.items():
            if policy in ("spectune", "oracle", "grid") or doc["efficiency"] is None:
                continue
            other = doc["efficiency"]
            word = (
                "tie with"
                if abs(eff - other) < 1e-3
                else ("better than" if eff > other else "WORSE than")
            )
            groups[word].append(f"{policy} {other:.3f}")
        verdicts = [f"{word} {', '.join(names)}" for word, names in groups.items() if names]
        ratio = ours["trials"] / grid_pass[name]
        table.add_row(
            name,
            _fmt(eff),
            "; ".join(verdicts),
            f"{ours['trials']} / {grid_pass[name]} = {ratio:.2f}",
            ours["recovery"],
        )
    if effs:
        table.caption = (
            f"spectune efficiency: median {statistics.median(effs):.3f}, min {min(effs):.3f}"
        )
    return table


if __name__ == "__main__":
    sys.exit(main())
