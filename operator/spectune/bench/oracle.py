"""The oracle: every candidate static arm simulated on the scenario's seed and traffic.

The bench's runner asks :class:`Oracle` for the finished requests of each candidate arm —
``off`` and every drafter at ``k = 1..max_k`` — on the whole fleet for the whole scenario,
and scores phases from them (``bench/scoring.py``). The arrival stream depends only on the
seed, so every arm serves the same requests. This is the slow part of a bench, so each
arm's requests are cached on disk as ``.npz`` files under
``$SPECTUNE_CACHE_DIR/oracle/<key>/`` (default ``~/.cache/spectune``), where ``<key>``
hashes the validated scenario, the seed and the code version (spectune's version and the
simulator's source), so an edit to either invalidates it. Arms whose KV pool cannot hold
one sequence fail at start-up and are skipped. Uncached arms are simulated in parallel
processes. An arm outside the candidates (a schedule the policy promoted, a schedule
``initial``) is simulated on demand the same way, cached alike.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

import spectune
from spectune.bench.scoring import RequestTable
from spectune.search.arms import Arm, parse_arm
from spectune.search.policy import DrafterSpec, SearchSpace
from spectune.sim.fleet import Fleet
from spectune.sim.scenario import Scenario

__all__ = [
    "ArmRun",
    "Oracle",
    "cache_root",
    "code_version",
    "search_space",
    "simulate_arm",
]

_COLUMNS = ("finish_s", "tpot_s", "ttft_s", "queue_s", "e2e_s", "output_tokens")


@dataclass(frozen=True)
class ArmRun:
    """One static arm's simulated run: its finished requests, or why it cannot start."""

    arm: str
    failure: str | None
    requests: RequestTable


def search_space(scenario: Scenario) -> SearchSpace:
    """The candidate arms of a scenario: ``off`` and every drafter at ``1..max_k``."""
    return SearchSpace(
        drafters=tuple(DrafterSpec(d.name, d.method, d.max_k) for d in scenario.drafters),
        allow_off=True,
        per_position=scenario.engine == "vllm",
        schedules=scenario.engine == "vllm",
    )


def _empty() -> RequestTable:
    z = np.zeros(0, dtype=np.float64)
    return RequestTable(z, z, z, z, z, z)


def simulate_arm(scenario: Scenario, seed: int, arm_name: str) -> ArmRun:
    """Run ``arm_name`` on every replica for the whole scenario (no cache)."""
    arm = parse_arm(arm_name)
    scenario.check_arm(arm)
    fleet = Fleet(scenario, seed=seed, arms=arm)
    failure = next((s.failure for s in fleet.states() if s.failure is not None), None)
    if failure is not None:
        return ArmRun(arm.name, failure, _empty())
    fleet.advance(float(scenario.duration_s))
    table = RequestTable.from_records(fleet.records(0.0, float(scenario.duration_s)))
    return ArmRun(arm.name, None, table)


@cache
def code_version() -> str:
    """spectune's version plus a hash of the simulator's and the oracle's source."""
    h = hashlib.sha256(spectune.__version__.encode())
    root = Path(spectune.__file__).parent
    files = [*sorted((root / "sim").glob("*.py")), root / "search" / "arms.py", Path(__file__)]
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return f"{spectune.__version__}+{h.hexdigest()[:16]}"


def cache_root() -> Path:
    """``$SPECTUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/spectune``, else ``~/.cache/spectune``."""
    env = os.environ.get("SPECTUNE_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "spectune"


def _slug(arm: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", arm)
    return f"{safe}-{hashlib.sha256(arm.encode()).hexdigest()[:8]}.npz"


class Oracle:
    """Static-arm runs of one scenario and seed, cached on disk.

    Parameters
    ----------
    cache_dir:
        The cache's root (``cache_root()`` by default); ``None`` with ``use_cache=False``
        keeps nothing on disk.
    jobs:
        Processes for uncached arms (default: the CPU count).
    """

    def __init__(
        self,
        scenario: Scenario,
        seed: int,
        *,
        cache_dir: Path | None = None,
        use_cache: bool = True,
        jobs: int | None = None,
    ) -> None:
        self.scenario = scenario
        self.seed = seed
        self.jobs = max(1, jobs if jobs is not None else (os.cpu_count() or 1))
        self.space = search_space(scenario)
        self._runs: dict[str, ArmRun] = {}
        self.dir: Path | None = None
        if use_cache:
            key = hashlib.sha256(
                "\n".join((scenario.model_dump_json(), str(seed), code_version())).encode()
            ).hexdigest()[:24]
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", scenario.name)
            self.dir = (cache_dir or cache_root()) / "oracle" / f"{name}-{key}"

    def candidates(self) -> list[Arm]:
        """``off`` and every drafter at every ``k`` up to its ``max_k``."""
        return self.space.arms()

    # --- cache ----------------------------------------------------------------------------

    def _load(self, arm: str) -> ArmRun | None:
        if self.dir is None:
            return None
        path = self.dir / _slug(arm)
        try:
            with np.load(path, allow_pickle=False) as z:
                failure = str(z["failure"]) or None
                cols = [np.asarray(z[c], dtype=np.float64) for c in _COLUMNS]
        except (OSError, KeyError, ValueError):
            return None
        return ArmRun(arm, failure, RequestTable(*cols))

    def _store(self, run: ArmRun) -> None:
        if self.dir is None:
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f".{_slug(run.arm)}.{os.getpid()}.tmp.npz"
            cols = {c: getattr(run.requests, c) for c in _COLUMNS}
            np.savez(tmp, failure=np.array(run.failure or ""), **cols)
            os.replace(tmp, self.dir / _slug(run.arm))
        except OSError:
            return  # the cache is a speed-up; a read-only home still benches

    # --- runs -----------------------------------------------------------------------------

    def cached(self, arm: str) -> bool:
        """Whether ``arm``'s run is in memory or on disk."""
        return arm in self._runs or (self.dir is not None and (self.dir / _slug(arm)).is_file())

    def runs(
        self,
        arms: Iterable[str],
        on_done: Callable[[str, bool], None] | None = None,
    ) -> dict[str, ArmRun]:
        """The runs of ``arms`` (cached, or simulated in parallel and cached).

        ``on_done(arm, was_cached)`` is called once per arm as it becomes available.
        """
        wanted = list(dict.fromkeys(parse_arm(a).name for a in arms))
        missing: list[str] = []
        for arm in wanted:
            run = self._runs.get(arm) or self._load(arm)
            if run is None:
                missing.append(arm)
                continue
            self._runs[arm] = run
            if on_done is not None:
                on_done(arm, True)
        if missing and (self.jobs == 1 or len(missing) == 1):
            for arm in missing:
                self._finish(simulate_arm(self.scenario, self.seed, arm), on_done)
        elif missing:
            with ProcessPoolExecutor(max_workers=min(self.jobs, len(missing))) as pool:
                futures = [pool.submit(simulate_arm, self.scenario, self.seed, a) for a in missing]
                for fut in futures:
                    self._finish(fut.result(), on_done)
        return {arm: self._runs[arm] for arm in wanted}

    def _finish(self, run: ArmRun, on_done: Callable[[str, bool], None] | None) -> None:
        self._runs[run.arm] = run
        self._store(run)
        if on_done is not None:
            on_done(run.arm, False)

    def run(self, arm: str) -> ArmRun:
        """One arm's run (cached or simulated now)."""
        return self.runs([arm])[parse_arm(arm).name]
