"""The policy over many seeds and a few held-out variants: what one bench table cannot show.

Run: python3 benchmarks/seeds.py [--policy spectune] [--seeds file,11-20] [--jobs N]
         [--only NAME,...] [--out runs.jsonl] [--compare before.jsonl]

``bench_all.py`` runs each shipped scenario on its own seed, which is one draw of its
traffic: a change to the policy can lift that draw and sink others. This script runs one
policy on every shipped scenario and on :data:`VARIANTS` — the same worlds moved to another
regime (busier, more replicas, the ramp the other way or faster, an 8B target whose
requests accept alike, summaries that turn into chat), as the unseen scenarios of the
issue's evaluation would be — over many seeds (the
file's own, then 11–20 by default; ``--seeds file,11-40`` narrows a mean's noise 1.7×
more, in about five minutes once its oracles are cached, half an hour before). Each run
goes through ``spectune.bench.runner.run_bench`` (the code of ``spectune bench``); the
oracles are cached as there. A single run swings between 0.2 and 1.0 on a small change of
timing, so quote a change by its runs up and down and its mean over all of them.

Prints one row per scenario (median, minimum and mean efficiency, mean run_efficiency,
mean trials, runs whose guardrail breach exceeds one window per trial, the slowest return
within 0.95 of the oracle after a model change) and the totals.
``--out`` keeps every run's JSON, one per line; ``--compare`` reads such a file from an
earlier run and lists the runs whose efficiency moved by 0.005 or more, with the counts up
and down — the figure to quote for a change, against a baseline measured the same way —
with each moved run's phases, and each multi-phase scenario's mean per phase.
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from spectune.bench.paired import paired_comparison
from spectune.bench.runner import run_bench
from spectune.sim.scenario import Scenario, scenario_from_mapping

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "scenarios"

#: Each variant: the shipped file it starts from and the top-level keys it replaces.
VARIANTS: dict[str, Any] = yaml.safe_load("""
chat-busy:            # chat at four times the load: a larger batch, so a smaller best k
  base: chat-eagle3.yaml
  set:
    load: [{at_s: 0, requests_per_s: 4.0}]
kv-two:               # kv-pressure on two replicas at the same load per pod: trials run at
  base: kv-pressure-draft-model.yaml        # 2/3 of the target's per-pod load, not 1/2
  set:
    fleet: {replicas: 2}
    load: [{at_s: 0, requests_per_s: 3.6}]
ramp-down:            # the ramp the other way: off at the start, a drafter at the end
  base: load-ramp.yaml
  set:
    load: [{at_s: 0, requests_per_s: 10.0}]
    events:
      - {at_s: 1200, kind: load, requests_per_s: 10.0, ramp_to: 0.3, over_s: 1200}
      - {at_s: 2400, kind: load, requests_per_s: 0.3}
small-alike:          # an 8B target under 10 ms per token whose requests accept nearly
  base: model-drift.yaml                    # alike, tuned from a long k
  set:
    duration_s: 2400
    events: []
    initial: {drafter: eagle3, k: 6}
    routes:
      - name: assistant
        share: 1.0
        prompt_tokens: {dist: lognormal, mean: 800, sigma: 0.8, max: 8000}
        output_tokens: {dist: lognormal, mean: 350, sigma: 0.7, max: 2048}
        acceptance:
          eagle3: {alpha: 0.80, decay: 0.97, spread: 60}
          ngram: {alpha: 0.30, decay: 0.90, spread: 2}
ngram-shift:          # summaries turn into chat at 1500 s: ngram's best world becomes eagle3's,
  base: summarize-ngram.yaml                # and per-token latencies split into two modes
  set:
    duration_s: 3600
    routes:
      - name: summarize
        share: 1.0
        prompt_tokens: {dist: lognormal, mean: 5000, sigma: 0.5, max: 16000}
        output_tokens: {dist: lognormal, mean: 350, sigma: 0.5, max: 1500}
        acceptance:
          eagle3: {alpha: 0.55, decay: 0.93, spread: 6}
          ngram: {alpha: 0.88, decay: 0.99, spread: 12}
      - name: chat
        share: 0.0
        prompt_tokens: {dist: lognormal, mean: 600, sigma: 0.8, max: 8000}
        output_tokens: {dist: lognormal, mean: 300, sigma: 0.7, max: 2048}
        acceptance:
          eagle3: {alpha: 0.78, decay: 0.97, spread: 8}
          ngram: {alpha: 0.25, decay: 0.90, spread: 2}
    load: [{at_s: 0, requests_per_s: 1.0}]
    events: [{at_s: 1500, kind: route_mix, shares: {summarize: 0.2, chat: 0.8}}]
ramp-fast:            # load-ramp's ramp in half the time, to a lower top
  base: load-ramp.yaml
  set:
    events:
      - {at_s: 1200, kind: load, requests_per_s: 0.3, ramp_to: 8.0, over_s: 600}
      - {at_s: 1800, kind: load, requests_per_s: 8.0}
""")


def scenarios(only: set[str] | None) -> Iterator[tuple[Scenario, dict[str, Any]]]:
    """Every shipped scenario, then every variant: (validated scenario, its mapping)."""
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(glob.glob(str(EXAMPLES / "*.yaml"))):
        doc = yaml.safe_load(Path(path).read_text())
        docs[Path(path).name] = doc
        if only is None or doc["name"] in only:
            yield scenario_from_mapping(doc), doc
    for name, variant in VARIANTS.items():
        if only is not None and name not in only:
            continue
        doc = copy.deepcopy(docs[variant["base"]])
        doc.update(copy.deepcopy(variant["set"]), name=name)
        yield scenario_from_mapping(doc), doc


def parse_seeds(text: str) -> list[str]:
    """``file,11-20`` → ``["file", "11", ..., "20"]`` (``file``: the scenario's own seed)."""
    out: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if part == "file":
            out.append(part)
        elif "-" in part:
            lo, hi = (int(x) for x in part.split("-", 1))
            out.extend(str(s) for s in range(lo, hi + 1))
        else:
            out.append(str(int(part)))
    return out


def _one(
    doc: dict[str, Any], seed: int, policy: str, window: float, placement: str
) -> dict[str, Any]:
    scenario = scenario_from_mapping(doc)
    result = run_bench(scenario, policy, seed=seed, window_s=window, jobs=1, placement=placement)
    # Beside the contract's keys: seconds until back within 0.95 after each model change,
    # seconds served worse than the initial arm after the first promotion, rollbacks.
    return {
        **result.to_json(),
        "recovery_s": [took for _, took in result.recoveries],
        "worse_than_initial_s": result.worse_than_initial_s,
        "rollbacks": result.rollbacks,
        "placement": result.placement,
        "load_ratios": list(result.load_ratios),
    }


def _key(doc: dict[str, Any]) -> tuple[str, int]:
    return str(doc["scenario"]), int(doc["seed"])


def _breached(doc: dict[str, Any], window: float) -> bool:
    return bool(doc["guardrail_breach_s"] > window * max(int(doc["trials"]), 1))


def main() -> int:
    """Run the sweep; exit code 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="spectune")
    ap.add_argument("--seeds", default="file,11-20")
    ap.add_argument("--only", help="comma-separated scenario names (default: all)")
    ap.add_argument("--window", type=float, default=300.0)
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    ap.add_argument("--out", type=Path, help="write every run's JSON here, one per line")
    ap.add_argument("--compare", type=Path, help="an earlier --out file to compare with")
    ap.add_argument(
        "--placement",
        default="auto",
        choices=("auto", "replace", "beside"),
        help="where trial canaries serve (search.placement; default auto)",
    )
    ns = ap.parse_args()
    console = Console(width=150)
    only = set(ns.only.split(",")) if ns.only else None
    seeds = parse_seeds(ns.seeds)
    jobs = []
    for scenario, doc in scenarios(only):
        for s in seeds:
            jobs.append((doc, scenario.seed if s == "file" else int(s)))
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=ns.jobs) as pool:
        futures = [
            pool.submit(_one, doc, seed, ns.policy, ns.window, ns.placement) for doc, seed in jobs
        ]
        for i, fut in enumerate(as_completed(futures), 1):
            doc = fut.result()
            runs.append(doc)
            console.print(
                f"[{i}/{len(jobs)}] {doc['scenario']} seed {doc['seed']}: "
                f"efficiency {doc['efficiency']:.3f}, trials {doc['trials']}",
                highlight=False,
            )
    runs.sort(key=_key)
    if ns.out:
        ns.out.write_text("".join(json.dumps(r) + "\n" for r in runs))
    console.print(_summary(runs, ns.policy, ns.window))
    if ns.compare:
        before = {_key(d): d for d in map(json.loads, ns.compare.read_text().splitlines())}
        console.print(_comparison(before, runs))
    console.print(f"{len(runs)} runs in {time.perf_counter() - t0:.0f} s wall")
    return 0


def _summary(runs: list[dict[str, Any]], policy: str, window: float) -> Table:
    table = Table(title=f"{policy} over seeds")
    cols = ("scenario", "runs", "median", "min", "mean", "run_eff mean", "trials mean",
            "breach > window/trial", "worst recovery s", "worse than initial s (runs)",
            "rollbacks", "load ratio median [p10, p90]")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col == "scenario" else "right")
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["scenario"], []).append(r)
    for name, rs in [*by.items(), ("all", runs)]:
        eff = [r["efficiency"] for r in rs]
        table.add_row(
            name,
            str(len(rs)),
            f"{statistics.median(eff):.3f}",
            f"{min(eff):.3f}",
            f"{statistics.fmean(eff):.3f}",
            f"{statistics.fmean(r['run_efficiency'] for r in rs):.3f}",
            f"{statistics.fmean(r['trials'] for r in rs):.1f}",
            str(sum(_breached(r, window) for r in rs)),
            _worst_recovery(rs),
            _worse(rs),
            str(sum(int(r.get("rollbacks", 0)) for r in rs)),
            _ratios(rs),
        )
    return table


def _ratios(runs: list[dict[str, Any]]) -> str:
    """The trials' canary-to-incumbent load per pod: median and 10th–90th percentiles."""
    xs = sorted(x for r in runs for x in r.get("load_ratios", []))
    if not xs:
        return "–"
    q = statistics.quantiles(xs, n=10) if len(xs) > 1 else [xs[0]] * 9
    return f"{statistics.median(xs):.2f} [{q[0]:.2f}, {q[-1]:.2f}]"


def _worse(runs: list[dict[str, Any]]) -> str:
    """Seconds served worse than the initial arm, summed over the runs, and how many runs
    had any ("–" for runs recorded before the figure existed)."""
    worse = [float(r["worse_than_initial_s"]) for r in runs if "worse_than_initial_s" in r]
    if not worse:
        return "–"
    return f"{sum(worse):.0f} ({sum(w > 0 for w in worse)})"


def _worst_recovery(runs: list[dict[str, Any]]) -> str:
    """The slowest return within 0.95 of the oracle after a model change ("never" if one
    run did not return by its phase's end; "–" without model changes)."""
    took = [t for r in runs for t in r.get("recovery_s", [])]
    if not took:
        return "–"
    if any(t is None for t in took):
        return f"never ({sum(t is None for t in took)} of {len(took)})"
    return f"{max(took):.0f}"


def _comparison(before: dict[tuple[str, int], dict[str, Any]], runs: list[dict[str, Any]]) -> str:
    up = down = 0
    lines = []
    for r in runs:
        old = before.get(_key(r))
        if old is None:
            continue
        delta = r["efficiency"] - old["efficiency"]
        if abs(delta) < 0.005:
            continue
        up, down = up + (delta > 0), down + (delta < 0)
        phases = ""
        if len(r["phases"]) > 1:
            phases = f"; phases {_phases(old)} → {_phases(r)}"
        lines.append(
            f"  {r['scenario']} seed {r['seed']}: {old['efficiency']:.3f} → "
            f"{r['efficiency']:.3f} (trials {old['trials']} → {r['trials']}{phases})"
        )
    same = [r for r in runs if _key(r) in before]
    mean_old = statistics.fmean(before[_key(r)]["efficiency"] for r in same) if same else 0.0
    mean_new = statistics.fmean(r["efficiency"] for r in same) if same else 0.0
    head = (
        f"against the earlier file: {up} up, {down} down of {len(same)} runs; mean "
        f"efficiency {mean_old:.3f} → {mean_new:.3f}"
    )
    if len(same) >= 2:
        paired = paired_comparison(
            [before[_key(r)]["efficiency"] for r in same], [r["efficiency"] for r in same]
        )
        old_t = statistics.fmean(before[_key(r)]["trials"] for r in same)
        new_t = statistics.fmean(r["trials"] for r in same)
        head += f"\n  paired by seed: {paired.describe()}; trials {old_t:.1f} → {new_t:.1f}"
    return "\n".join([head, *lines, *_phase_means(before, same)])


def _phases(doc: dict[str, Any]) -> str:
    return "/".join(f"{p['efficiency']:.2f}" for p in doc["phases"])


def _phase_means(
    before: dict[tuple[str, int], dict[str, Any]], same: list[dict[str, Any]]
) -> list[str]:
    """Per scenario of several phases, each phase's mean efficiency before → after.

    A run's efficiency is its worst phase, so a change that lifts the phase it aims at can
    show as a loss wherever a later phase happens to fall lower: the phases tell them apart.
    """
    by: dict[str, list[dict[str, Any]]] = {}
    for r in same:
        if len(r["phases"]) > 1 and len(before[_key(r)]["phases"]) == len(r["phases"]):
            by.setdefault(r["scenario"], []).append(r)
    out = []
    for name, rs in by.items():
        cells = []
        for i in range(len(rs[0]["phases"])):
            old = statistics.fmean(before[_key(r)]["phases"][i]["efficiency"] for r in rs)
            new = statistics.fmean(r["phases"][i]["efficiency"] for r in rs)
            cells.append(f"{old:.3f} → {new:.3f}")
        out.append(f"  {name} phase means: " + ", ".join(cells))
    return out


if __name__ == "__main__":
    sys.exit(main())
