"""Choosing the draft length: speedup per k, the best k, and each position's break-even bar."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectune.core import (
    break_even_survival,
    expected_tokens,
    expected_tokens_flat,
    flat_survival,
    predict_speedup,
    speedup,
)


def test_design_anchor_a07_c015():
    # DESIGN.md §1: a = 0.7, c = 0.15 gives 1.48 / 1.75 / 1.68 / 1.45 for k = 1 / 3 / 5 / 8.
    ks = np.array([1, 3, 5, 8])
    closed = speedup(expected_tokens_flat(0.7, ks), 0.15, ks)
    assert closed.round(2).tolist() == [1.48, 1.75, 1.68, 1.45]

    table = predict_speedup(flat_survival(0.7, 8), 0.15)
    assert table.speedup[ks].round(2).tolist() == [1.48, 1.75, 1.68, 1.45]
    assert table.best_k == 3


def test_table_covers_off_and_every_k():
    table = predict_speedup([0.9, 0.7, 0.4], 0.1)
    assert table.k.tolist() == [0, 1, 2, 3]
    assert table.expected_tokens[0] == 1.0
    assert table.speedup[0] == 1.0
    np.testing.assert_allclose(table.expected_tokens, [1.0, 1.9, 2.6, 3.0])
    np.testing.assert_allclose(table.speedup, [1.0, 1.9 / 1.1, 2.6 / 1.2, 3.0 / 1.3])


def test_table_cannot_be_edited_in_place():
    table = predict_speedup([0.9, 0.7], 0.1)
    with pytest.raises(ValueError):
        table.speedup[1] = 10.0


def test_expensive_drafter_means_off():
    # With a draft step as costly as a target step, even 90 % acceptance loses.
    assert predict_speedup(flat_survival(0.9, 6), c=1.0).best_k == 0


def test_useless_drafter_means_off_even_when_free():
    assert predict_speedup([0.0, 0.0, 0.0], c=0.0).best_k == 0


def test_ties_go_to_the_shorter_draft():
    # Free drafting, but positions 2 and 3 never land: k = 1, 2, 3 tie at 1.5x.
    table = predict_speedup([0.5, 0.0, 0.0], c=0.0)
    np.testing.assert_allclose(table.speedup, [1.0, 1.5, 1.5, 1.5])
    assert table.best_k == 1


def test_cheaper_drafts_never_shorten_the_best_k():
    curve = flat_survival(0.8, 10)
    best = [predict_speedup(curve, c).best_k for c in (0.5, 0.3, 0.15, 0.05, 0.01)]
    assert best == sorted(best)
    assert best[0] < best[-1]


def test_break_even_anchor_explains_why_k3_wins():
    curve = flat_survival(0.7, 8)
    bar = break_even_survival(expected_tokens(curve), 0.15)
    # Position 3 clears its bar, position 4 does not.
    assert curve[2] > bar[2]
    assert curve[3] < bar[3]


def test_break_even_matches_the_derivation():
    e = np.array([1.0, 1.8, 2.4, 2.7])
    c = 0.2
    bar = break_even_survival(e, c)
    np.testing.assert_allclose(bar, [c * 1.0 / 1.0, c * 1.8 / 1.2, c * 2.4 / 1.4])
    # Equivalently: c times the speedup already reached one position earlier.
    table = predict_speedup([0.8, 0.6, 0.3], c)
    np.testing.assert_allclose(bar, c * table.speedup[:-1])


survival_curves = st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=12).map(
    lambda xs: np.sort(np.array(xs))[::-1]
)


@settings(max_examples=300, deadline=None)
@given(curve=survival_curves, c=st.floats(min_value=0.0, max_value=2.0))
def test_position_raises_speedup_exactly_when_it_clears_its_bar(curve, c):
    table = predict_speedup(curve, c)
    bar = break_even_survival(table.expected_tokens, c)
    gain = np.diff(table.speedup)
    margin = curve - bar
    decided = np.abs(margin) > 1e-9  # away from exact ties, where rounding decides
    assert np.array_equal((gain > 0)[decided], (margin > 0)[decided])


@settings(max_examples=300, deadline=None)
@given(curve=survival_curves, c=st.floats(min_value=0.0, max_value=2.0))
def test_best_k_clears_its_bar_and_the_next_position_does_not(curve, c):
    table = predict_speedup(curve, c)
    bar = break_even_survival(table.expected_tokens, c)
    best = table.best_k
    assert table.speedup[best] == table.speedup.max()
    if best > 0:
        assert curve[best - 1] > bar[best - 1]
    if best < curve.size:
        assert curve[best] <= bar[best] + 1e-12


@pytest.mark.parametrize("a", [0.3, 0.5, 0.7, 0.8, 0.9, 0.95])
@pytest.mark.parametrize("c", [0.02, 0.05, 0.1, 0.15, 0.3])
def test_flat_drafter_best_k_is_the_run_of_positions_above_break_even(a, c):
    # With flat acceptance the speedup is unimodal in k, so the best k is where the
    # survival curve first drops below the break-even bar.
    curve = flat_survival(a, 16)
    bar = break_even_survival(expected_tokens(curve), c)
    above = curve > bar
    run = int(np.argmin(above)) if not above.all() else curve.size
    assert predict_speedup(curve, c).best_k == run
