"""Fixtures for the math-core tests: a seeded simulation of a chain drafter.

The simulation is the independent computation the closed forms are checked against: it
draws Bernoulli acceptances position by position and counts what an engine would count,
without using any spectune formula.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest


@dataclass(frozen=True)
class SimulatedWindow:
    """What a vLLM replica's counters and a stopwatch would show after ``passes`` passes."""

    accepted_lengths: npt.NDArray[np.int64]  # L per pass: first rejected position - 1
    accepted_per_pos: npt.NDArray[np.int64]  # vLLM's per-position counter
    drafts: int
    draft_tokens: int
    accepted: int


def simulate_window(
    rng: np.random.Generator, conditional: npt.ArrayLike, passes: int
) -> SimulatedWindow:
    """Draft ``K = len(conditional)`` tokens per pass; token i lands with ``conditional[i]``.

    ``conditional[i]`` is the acceptance of position i given that all before it landed.
    """
    q = np.asarray(conditional, dtype=np.float64)
    k = q.size
    landed = rng.random((passes, k)) < q
    # L = (1-based index of the first rejection) - 1, or K when nothing was rejected.
    rejected = ~landed
    lengths = np.where(rejected.any(axis=1), rejected.argmax(axis=1), k).astype(np.int64)
    # vLLM increments position i when draft tokens 0..i were all accepted.
    all_before_landed = np.logical_and.accumulate(landed, axis=1)
    per_pos = all_before_landed.sum(axis=0).astype(np.int64)
    return SimulatedWindow(
        accepted_lengths=lengths,
        accepted_per_pos=per_pos,
        drafts=passes,
        draft_tokens=passes * k,
        accepted=int(lengths.sum()),
    )


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20230518)


@pytest.fixture
def simulate() -> Callable[[np.random.Generator, npt.ArrayLike, int], SimulatedWindow]:
    return simulate_window
