"""The family bench: every policy on every world of a sampled set, reported as distributions.

Run: python3 benchmarks/family.py [--set quick|tune|eval] [--policies spectune,initial,...]
         [--jobs N] [--out DIR] [--compare A,B] [--baseline runs.json] [--digest SET]

A set (``benchmarks/families/sets.yaml``) is a family file, a seed and a count: the worlds
are drawn by ``spectune.sim.sampler`` (as ``spectune sim sample`` writes them), so a set is
the same on every machine. For each world the oracle (every static arm) is simulated once,
one process per world, and cached by the scenario's content hash (``bench/oracle.py``);
then each policy runs through ``spectune.bench.runner.run_bench``, the code of
``spectune bench``, in parallel over processes with a progress bar.

Printed, per policy: efficiency median / p10 / min, mean run efficiency, time-integrated
regret (``bench/regret.py``: seconds of serving lost against the phase oracles,
exploration included) as a share of the run, restarts (absolute and per search), runs with
a guardrail breach, seconds served worse than the initial setting after the first promotion
and rollbacks (issue [N]'s floor), and the slowest recovery after a model change; then the median
efficiency per regime (load band, replicas, drafter kinds, objective). ``--compare A,B``
pairs two policies of this run by world (mean difference with a 95 % bootstrap interval and
a sign test, ``bench/paired.py``); ``--baseline FILE`` pairs this run with another commit's
``runs.json``, policy by policy. ``--out DIR`` writes ``runs.json`` (every run) and
``family.png`` (efficiency CDF per policy, mean cumulative regret against time).

``initial`` stands for ``static:<the world's initial arm>``: what users had without tuning.

``--aa`` runs the A/A check instead: on each world, spectune chooses between the world's
drafter at k = 1 and an identical twin of it (:func:`aa_world`), so every promotion of the
twin is a false promotion — a restart bought for nothing, on a difference that is noise.
It prints the realised false-promotion rate with a Wilson interval, to hold against the
SpecTuning's δ (0.05), and the ratios the false promotions claimed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import statistics
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from spectune.bench.oracle import Oracle
from spectune.bench.paired import paired_comparison
from spectune.bench.runner import run_bench
from spectune.core import wilson_interval
from spectune.search.policy import DrafterSpec, SearchSpace
from spectune.sim.sampler import SampledWorld, load_family, sample_worlds
from spectune.sim.scenario import Scenario, scenario_from_mapping

FAMILIES = Path(__file__).resolve().parent / "families"
SETS = FAMILIES / "sets.yaml"
DEFAULT_POLICIES = "spectune,initial,offline-table,grid,egreedy,ucb1,acceptance-threshold"
REGIMES = ("load_band", "replicas", "drafters", "objective")


def load_set(name: str, sets_file: Path = SETS) -> tuple[list[SampledWorld], dict[str, Any]]:
    """The worlds of set ``name`` and its entry in the sets file."""
    doc = yaml.safe_load(sets_file.read_text())
    sets = doc["sets"]
    if name not in sets:
        raise SystemExit(f"unknown set {name!r}; sets are: {', '.join(sets)}")
    entry = sets[name]
    family = load_family(sets_file.parent / doc["family"])
    return sample_worlds(family, int(entry["seed"]), int(entry["count"])).worlds, entry


def digest(worlds: list[SampledWorld]) -> str:
    """SHA-256 over the worlds' scenario documents, in order."""
    h = hashlib.sha256()
    for w in worlds:
        h.update(json.dumps(w.scenario, sort_keys=True).encode())
    return h.hexdigest()


def _policy_name(policy: str, scenario: Scenario) -> str:
    return f"static:{scenario.initial_arm.name}" if policy == "initial" else policy


def _warm_oracle(doc: dict[str, Any]) -> str:
    scenario = scenario_from_mapping(doc)
    oracle = Oracle(scenario, scenario.seed, jobs=1)
    oracle.runs([a.name for a in oracle.candidates()])
    return scenario.name


def _one(doc: dict[str, Any], policy: str, window: float) -> dict[str, Any]:
    scenario = scenario_from_mapping(doc)
    r = run_bench(scenario, _policy_name(policy, scenario), window_s=window, jobs=1)
    out = r.to_json()
    out["policy"] = policy
    out["regret_s"] = r.regret_s
    out["regret"] = [[t, round(v, 1)] for t, v in r.regret]
    out["recoveries"] = [s for _, s in r.recoveries]
    out["searches"] = 1 + sum(1 for e in r.events if e.reason == "Retune")
    out["worse_than_initial_s"] = r.worse_than_initial_s
    out["rollbacks"] = r.rollbacks
    return out


def aa_world(doc: dict[str, Any]) -> tuple[dict[str, Any], SearchSpace] | None:
    """The world's A/A twin, or None when it has no drafter.

    Its incumbent drafter (or its first one, where the world starts with ``off``) at k = 1,
    and an identical copy of it (same weights, cost and acceptance on every route) named
    ``<drafter>-twin``: the two candidate arms. The two are the same physics, so any
    promotion of the twin is a false promotion, whatever the world's traffic and load.
    """
    drafters = doc["drafters"]
    if not drafters:
        return None
    initial = doc["initial"].get("drafter")
    base = next((d for d in drafters if d["name"] == initial), drafters[0])
    twin = {**base, "name": f"{base['name']}-twin", "max_k": 1}
    world = {
        **doc,
        "name": f"{doc['name']}-aa",
        "drafters": [{**base, "max_k": 1}, twin],
        "initial": {"drafter": base["name"], "k": 1},
        "routes": [
            {
                **r,
                "acceptance": {n: a for n, a in r["acceptance"].items() if n == base["name"]}
                | (
                    {twin["name"]: r["acceptance"][base["name"]]}
                    if base["name"] in r["acceptance"]
                    else {}
                ),
            }
            for r in doc["routes"]
        ],
        "events": [e for e in doc["events"] if e["kind"] != "model_version"],
    }
    space = SearchSpace(
        drafters=(
            DrafterSpec(base["name"], base["method"], 1),
            DrafterSpec(twin["name"], twin["method"], 1),
        ),
        allow_off=False,
        per_position=doc["engine"] == "vllm",
        schedules=False,
    )
    return world, space


def _aa_one(doc: dict[str, Any], window: float, policy: str) -> dict[str, Any] | None:
    made = aa_world(doc)
    if made is None:
        return None
    world, space = made
    scenario = scenario_from_mapping(world)
    twin = f"{space.drafters[1].name}/1"
    r = run_bench(scenario, policy, window_s=window, jobs=1, space=space)
    claims = [
        float(m.group(1)) if m.group(1) else 1 - float(m.group(2)) / 100
        for e in r.events
        if e.reason == "Promoted" and e.message.startswith(twin)
        for m in [re.search(r"measured at ([0-9.]+)×|([+-][0-9.]+)% vs", e.message)]
        if m
    ]
    return {
        "scenario": doc["name"],
        "trialled": any(e.reason == "TrialStarted" and twin in e.message for e in r.events),
        "promoted": any(arm == twin for _, arm in r.promotions),
        "claimed": claims,
    }


def aa_check(
    worlds: list[SampledWorld], window: float, jobs: int, console: Console, policy: str = "spectune"
) -> tuple[int, int, int, list[float]]:
    """The A/A check over the set: worlds, worlds whose twin was trialled, worlds where it
    was promoted (a false promotion: a restart for an arm that is the incumbent's physics),
    and the objective ratios the promotions claimed for the twin."""
    out = []
    with ProcessPoolExecutor(max_workers=jobs) as pool, Progress(console=console) as progress:
        task = progress.add_task("A/A worlds", total=len(worlds))
        for f in as_completed([pool.submit(_aa_one, w.scenario, window, policy) for w in worlds]):
            res = f.result()
            if res is not None:
                out.append(res)
            progress.advance(task)
    trialled = sum(1 for r in out if r["trialled"])
    promoted = sum(1 for r in out if r["promoted"])
    claimed = sorted(c for r in out for c in r["claimed"])
    return len(out), trialled, promoted, claimed


def run_set(
    worlds: list[SampledWorld], policies: list[str], window: float, jobs: int, console: Console
) -> list[dict[str, Any]]:
    """Every policy on every world; each run's JSON with the world's regime tags."""
    runs: list[dict[str, Any]] = []
    with (
        ProcessPoolExecutor(max_workers=jobs) as pool,
        Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress,
    ):
        task = progress.add_task("oracles", total=len(worlds))
        for done in as_completed([pool.submit(_warm_oracle, w.scenario) for w in worlds]):
            done.result()
            progress.advance(task)
        task = progress.add_task("policy runs", total=len(worlds) * len(policies))
        futures: dict[Future[dict[str, Any]], SampledWorld] = {
            pool.submit(_one, w.scenario, p, window): w for w in worlds for p in policies
        }
        for f in as_completed(futures):
            doc = f.result()
            doc["regime"] = futures[f].regime
            runs.append(doc)
            progress.advance(task)
    runs.sort(key=lambda d: (d["scenario"], policies.index(d["policy"])))
    return runs


def _q(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) if values else math.nan


def summary(runs: list[dict[str, Any]], policies: list[str], window: float) -> Table:
    """The per-policy table."""
    t = Table(title="family bench, per policy", width=160)
    for col in (
        "policy",
        "runs",
        "eff median",
        "eff p10",
        "eff min",
        "run eff mean",
        "regret % of run",
        "restarts",
        "per search",
        "breached runs",
        "worse than initial s",
        "rollbacks",
        "worst recovery s",
    ):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for p in policies:
        mine = [r for r in runs if r["policy"] == p]
        effs = [r["efficiency"] for r in mine if r["efficiency"] is not None]
        run_effs = [r["run_efficiency"] for r in mine if r["run_efficiency"] is not None]
        regret = [r["regret_s"] / r["sim_seconds"] for r in mine if math.isfinite(r["regret_s"])]
        trials = [r["trials"] for r in mine]
        per = [r["trials"] / r["searches"] for r in mine]
        breached = sum(1 for r in mine if r["guardrail_breach_s"] > window)
        worse = sum(r["worse_than_initial_s"] for r in mine)
        worse_runs = sum(1 for r in mine if r["worse_than_initial_s"] > 0)
        rollbacks = sum(r["rollbacks"] for r in mine)
        rec = [s for r in mine for s in r["recoveries"]]
        never = sum(1 for s in rec if s is None)
        worst = max((s for s in rec if s is not None), default=None)
        worst_txt = "—" if not rec else (f"never ×{never}" if never else f"{worst:.0f}")
        t.add_row(
            p,
            str(len(mine)),
            f"{_q(effs, 0.5):.3f}",
            f"{_q(effs, 0.1):.3f}",
            f"{min(effs, default=math.nan):.3f}",
            f"{statistics.fmean(run_effs):.3f}" if run_effs else "—",
            f"{100 * statistics.fmean(regret):.1f}" if regret else "—",
            f"{statistics.fmean(trials):.1f}" if trials else "—",
            f"{statistics.fmean(per):.1f}" if per else "—",
            str(breached),
            f"{worse:.0f} in {worse_runs} runs",
            str(rollbacks),
            worst_txt,
        )
    return t


def regimes(runs: list[dict[str, Any]], policies: list[str]) -> Table:
    """Median efficiency per regime and policy."""
    t = Table(title="median efficiency per regime", width=160)
    t.add_column("regime")
    t.add_column("worlds", justify="right")
    for p in policies:
        t.add_column(p, justify="right")
    for key in REGIMES:
        values = sorted({str(r["regime"][key]) for r in runs})
        for v in values:
            cells = []
            n = 0
            for p in policies:
                effs = [
                    r["efficiency"]
                    for r in runs
                    if r["policy"] == p
                    and str(r["regime"][key]) == v
                    and r["efficiency"] is not None
                ]
                n = max(n, len(effs))
                cells.append(f"{_q(effs, 0.5):.3f}" if effs else "—")
            t.add_row(f"{key}={v}", str(n), *cells)
    return t


def pair(
    a: list[dict[str, Any]], b: list[dict[str, Any]], what: str = "efficiency"
) -> tuple[int, str]:
    """The paired comparison of ``b`` against ``a`` on ``what``, by world and seed."""
    ka = {(r["scenario"], r["seed"]): r for r in a}
    keys = [(r["scenario"], r["seed"]) for r in b if (r["scenario"], r["seed"]) in ka]
    kb = {(r["scenario"], r["seed"]): r for r in b}

    def val(r: dict[str, Any]) -> float:
        v = r[what]
        return math.nan if v is None else float(v)

    c = paired_comparison([val(ka[k]) for k in keys], [val(kb[k]) for k in keys])
    return c.n, c.describe(what)


def plot(runs: list[dict[str, Any]], policies: list[str], path: Path) -> None:
    """Efficiency CDF per policy and mean cumulative regret against time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    horizon = max(r["sim_seconds"] for r in runs)
    grid = np.linspace(0, horizon, 200)
    for p in policies:
        mine = [r for r in runs if r["policy"] == p]
        effs = np.sort([r["efficiency"] for r in mine if r["efficiency"] is not None])
        if effs.size:
            left.step(effs, np.arange(1, effs.size + 1) / effs.size, where="post", label=p)
        curves = []
        for r in mine:
            if not r["regret"]:
                continue
            t = np.array([0.0] + [x[0] for x in r["regret"]])
            v = np.array([0.0] + [x[1] for x in r["regret"]])
            curves.append(np.interp(grid, t, v))  # past its end a world holds its total
        if curves:
            right.plot(grid / 60.0, np.mean(curves, axis=0) / 60.0, label=p)
    left.set_xlabel("efficiency (1 = oracle)")
    left.set_ylabel("share of worlds at or below")
    left.set_title("efficiency CDF")
    left.grid(alpha=0.3)
    right.set_xlabel("simulated minutes")
    right.set_ylabel("mean cumulative regret, minutes of serving")
    right.set_title("regret against time")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the family bench; exit code 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="quick", help="quick, tune or eval (sets.yaml)")
    ap.add_argument("--sets-file", type=Path, default=SETS)
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    ap.add_argument("--window", type=float, default=300.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--limit", type=int, help="only the first N worlds of the set")
    ap.add_argument("--out", type=Path, help="folder for runs.json and family.png")
    ap.add_argument("--compare", help="A,B: pair two policies of this run")
    ap.add_argument("--baseline", type=Path, help="runs.json of another commit to pair with")
    ap.add_argument("--digest", metavar="SET", help="print a set's digest and exit")
    ap.add_argument(
        "--aa", action="store_true", help="the A/A check instead: spectune against a twin arm"
    )
    ns = ap.parse_args(argv)
    console = Console(width=160)
    if ns.digest:
        worlds, _ = load_set(ns.digest, ns.sets_file)
        print(digest(worlds))
        return 0
    worlds, _ = load_set(ns.set, ns.sets_file)
    if ns.limit:
        worlds = worlds[: ns.limit]
    wall0 = time.perf_counter()
    if ns.aa:
        # The A/A check judges one policy: the first of --policies when given, else spectune.
        policy = (
            ns.policies.split(",")[0].strip() if ns.policies != DEFAULT_POLICIES else "spectune"
        )
        n, trialled, promoted, claimed = aa_check(worlds, ns.window, ns.jobs, console, policy)
        ci = wilson_interval(promoted, trialled) if trialled else None
        rate = f"{promoted / trialled:.3f}" if trialled else "—"
        console.print(
            f"A/A ({policy}): {n} worlds, the twin trialled in {trialled}, promoted in {promoted}: "
            f"false-promotion rate {rate}"
            + (f" (95 % interval {ci.low:.3f}–{ci.high:.3f}); δ = 0.05" if ci else "")
            + f"; {time.perf_counter() - wall0:.0f} s"
        )
        if claimed:
            console.print(
                "ratios the promotions claimed: " + ", ".join(f"{c:.2f}" for c in claimed)
            )
        return 0
    policies = [p.strip() for p in ns.policies.split(",") if p.strip()]
    runs = run_set(worlds, policies, ns.window, ns.jobs, console)
    console.print(summary(runs, policies, ns.window))
    console.print(regimes(runs, policies))
    if ns.compare:
        a, b = (x.strip() for x in ns.compare.split(","))
        for what in ("efficiency", "run_efficiency", "regret_s"):
            _, line = pair(
                [r for r in runs if r["policy"] == a], [r for r in runs if r["policy"] == b], what
            )
            console.print(f"{b} vs {a}: {line}")
    if ns.baseline:
        before = json.loads(ns.baseline.read_text())["runs"]
        for p in policies:
            n, line = pair(
                [r for r in before if r["policy"] == p], [r for r in runs if r["policy"] == p]
            )
            if n:
                console.print(f"{p} (this run vs baseline): {line}")
    if ns.out:
        ns.out.mkdir(parents=True, exist_ok=True)
        doc = {"set": ns.set, "policies": policies, "worlds": len(worlds), "runs": runs}
        (ns.out / "runs.json").write_text(json.dumps(doc))
        plot(runs, policies, ns.out / "family.png")
        console.print(f"wrote {ns.out / 'runs.json'} and {ns.out / 'family.png'}")
    console.print(
        f"{len(worlds)} worlds × {len(policies)} policies in {time.perf_counter() - wall0:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
