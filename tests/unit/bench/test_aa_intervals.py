"""``benchmarks/aa_intervals.py``: the A/A check reads a window pair the way the model does.

Its figure is only worth reading if the spread it checks is the one the policy acts on: a
p95 the per-token histogram hides is read from the acceptance counters there, and every
window's spread is floored (``search/model.py``). chat-eagle3 runs ``off`` at 4–6 ms per
token, all under vLLM's first 10 ms bound, which is that case.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

from spectune.search.model import MEASURED_FLOOR
from spectune.sim.scenario import load_scenario
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[3]


def _aa() -> ModuleType:
    return load_script("benchmarks/aa_intervals.py")


def test_an_aa_window_claims_the_spread_the_model_gives_it() -> None:
    scenario = load_scenario(ROOT / "examples" / "scenarios" / "chat-eagle3.yaml")
    pairs = _aa().aa_windows(scenario, seed=11, windows=2, window_s=300.0)
    assert len(pairs) == 2
    for ratio, spread in pairs:
        # The same arm on both sides: a ratio within its claimed interval, and the spread
        # the model floors a window at, not the hidden bucket's guessed width.
        assert spread == MEASURED_FLOOR
        assert math.isfinite(ratio) and abs(ratio) < 1.96 * spread
