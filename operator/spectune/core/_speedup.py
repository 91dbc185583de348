r"""Expected tokens per verification pass, and the speedup they buy at a given draft cost.

This is the arithmetic behind every draft-length decision (DESIGN.md §1, sentences 2–3):
acceptance compounds along the draft, so tokens per pass grow ever more slowly with the
draft length :math:`k`, while the cost of drafting grows linearly; the best :math:`k` is
interior and usually small. ``search`` calls :func:`predict_speedup` to score the
counterfactual draft lengths that one measurement at the largest :math:`k` implies,
``diagnose`` calls :func:`break_even_survival` for the ``K_PAST_PEAK`` finding, and the
simulator and bench use the closed forms to compute their oracle.

Units: the draft cost :math:`c` is the time of one draft step in units of one target
(verification) step, so a pass with :math:`k` drafted tokens costs :math:`1 + c k` target
steps, and "speedup" is tokens per unit time relative to plain decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from spectune.errors import InputError

__all__ = [
    "SpeedupTable",
    "break_even_survival",
    "expected_tokens",
    "expected_tokens_flat",
    "predict_speedup",
    "speedup",
]

# Survival probabilities from rate() ratios may stray past 0 or 1 by rounding only.
_ROUNDING = 1e-9


def _survival_array(survival: npt.ArrayLike) -> npt.NDArray[np.float64]:
    s = np.asarray(survival, dtype=np.float64)
    if s.ndim < 1:
        raise InputError("survival must have one value per position (at least 1-D)")
    if np.any(s < -_ROUNDING) or np.any(s > 1 + _ROUNDING):
        raise InputError(f"survival probabilities must lie in [0, 1], got {s.tolist()}")
    return np.clip(s, 0.0, 1.0)


def _check_cost(c: float) -> None:
    if not c >= 0:  # also rejects NaN
        raise InputError(f"draft cost c must be a number >= 0 (target-step units), got {c!r}")


def _check_draft_lengths(k: npt.NDArray[np.float64]) -> None:
    if np.any(k < 0) or np.any(k != np.floor(k)):
        raise InputError(f"draft length k must be whole numbers >= 0, got {k.tolist()}")


def expected_tokens(survival: npt.ArrayLike) -> npt.NDArray[np.float64]:
    r"""Expected tokens per pass for every draft length up to :math:`K`, from one curve.

    A pass that drafts :math:`k` tokens emits :math:`\min(L, k) + 1` tokens, where :math:`L`
    is the accepted length and the :math:`+1` is the target's own (bonus) token. Since
    :math:`E[\min(L, k)] = \sum_{i=1}^{k} P(L \ge i)`,

    .. math::

        E[\text{tokens} \mid k] = 1 + \sum_{i=1}^{k} P(L \ge i), \qquad k = 0, \dots, K.

    For a chain drafter (draft model, EAGLE/MTP with top-k 1, n-gram) the first :math:`k`
    positions do not depend on how many more follow, so one curve measured at the largest
    :math:`K` gives the expected tokens of every smaller :math:`k` without running it.

    Parameters
    ----------
    survival : array_like, shape (..., K)
        :math:`P(L \ge i)` for :math:`i = 1, \dots, K` along the last axis.

    Returns
    -------
    numpy.ndarray, shape (..., K + 1)
        Expected tokens per pass for :math:`k = 0, \dots, K`; the first entry (no
        speculation) is 1.

    Raises
    ------
    spectune.errors.InputError
        If the input is a scalar or a probability lies outside :math:`[0, 1]`.

    References
    ----------
    .. [1] Y. Leviathan, M. Kalman, Y. Matias, "Fast Inference from Transformers via
       Speculative Decoding", ICML 2023, arXiv:2211.17192, Equation (1) for the flat case.

    Examples
    --------
    >>> expected_tokens([0.8, 0.6, 0.3])
    array([1. , 1.8, 2.4, 2.7])

    Drafting a third token adds only 0.3 tokens per pass: the third position survives
    30 % of passes.
    """
    s = _survival_array(survival)
    head = np.ones((*s.shape[:-1], 1))
    return np.concatenate([head, 1.0 + np.cumsum(s, axis=-1)], axis=-1)


def expected_tokens_flat(a: npt.ArrayLike, k: npt.ArrayLike) -> npt.NDArray[np.float64]:
    r"""Expected tokens per pass for a flat per-token acceptance :math:`a`, in closed form.

    With :math:`P(L \ge i) = a^i` the sum in :func:`expected_tokens` is geometric:

    .. math::

        E[\text{tokens} \mid k] = \sum_{i=0}^{k} a^i = \frac{1 - a^{k+1}}{1 - a},
        \qquad \lim_{a \to 1} = k + 1.

    Parameters
    ----------
    a : array_like
        Per-token acceptance probability, in :math:`[0, 1]`.
    k : array_like
        Draft length, whole numbers :math:`\ge 0`. Broadcast against ``a``.

    Returns
    -------
    numpy.ndarray
        Expected tokens per pass, with the broadcast shape of ``a`` and ``k``.

    Raises
    ------
    spectune.errors.InputError
        If ``a`` is outside :math:`[0, 1]` or ``k`` is negative or fractional.

    References
    ----------
    .. [1] Y. Leviathan, M. Kalman, Y. Matias, "Fast Inference from Transformers via
       Speculative Decoding", ICML 2023, arXiv:2211.17192, Equation (1).

    Examples
    --------
    A drafter with 70 % acceptance, drafting 1, 3 and 8 tokens:

    >>> expected_tokens_flat(0.7, [1, 3, 8]).round(3)
    array([1.7  , 2.533, 3.199])
    """
    a_arr = np.asarray(a, dtype=np.float64)
    k_arr = np.asarray(k, dtype=np.float64)
    if np.any(a_arr < 0) or np.any(a_arr > 1):
        raise InputError(f"acceptance a must be in [0, 1], got {a_arr.tolist()}")
    _check_draft_lengths(k_arr)
    a_b, k_b = np.broadcast_arrays(a_arr, k_arr)
    at_one = a_b == 1.0
    safe_a = np.where(at_one, 0.5, a_b)
    # 1 - a**(k+1) cancels badly as a -> 1; -expm1((k+1)*log(a)) keeps full precision there.
    with np.errstate(divide="ignore"):
        numer = -np.expm1((k_b + 1.0) * np.log(safe_a))
    return np.asarray(np.where(at_one, k_b + 1.0, numer / (1.0 - safe_a)), dtype=np.float64)


def speedup(expected: npt.ArrayLike, c: float, k: npt.ArrayLike) -> npt.NDArray[np.float64]:
    r"""Decoding speedup over plain decoding for a draft length :math:`k` at draft cost :math:`c`.

    A pass drafts :math:`k` tokens at :math:`c` target steps each, then verifies them in one
    target step, and emits :math:`E` tokens on average; plain decoding emits one token per
    target step:

    .. math::

        S(k) = \frac{E[\text{tokens} \mid k]}{1 + c\,k}.

    Parameters
    ----------
    expected : array_like
        Expected tokens per pass (:func:`expected_tokens`).
    c : float
        Draft cost of one draft step in target-step units, :math:`\ge 0`.
    k : array_like
        Draft lengths, broadcast against ``expected``.

    Returns
    -------
    numpy.ndarray
        The speedup; above 1 means speculation pays.

    Raises
    ------
    spectune.errors.InputError
        If ``c`` is negative or NaN, or ``k`` is negative or fractional.

    References
    ----------
    .. [1] Y. Leviathan, M. Kalman, Y. Matias, "Fast Inference from Transformers via
       Speculative Decoding", ICML 2023, arXiv:2211.17192, Theorem 3.8.

    Examples
    --------
    >>> speedup([1.0, 1.7, 2.533], 0.15, [0, 1, 3]).round(2)
    array([1.  , 1.48, 1.75])
    """
    _check_cost(c)
    k_arr = np.asarray(k, dtype=np.float64)
    _check_draft_lengths(k_arr)
    return np.asarray(np.asarray(expected, dtype=np.float64) / (1.0 + c * k_arr))


@dataclass(frozen=True, eq=False)
class SpeedupTable:
    """Predicted speedup for every draft length from 0 (speculation off) to :math:`K`.

    Attributes
    ----------
    k : numpy.ndarray of int
        Draft lengths ``0, 1, ..., K``; 0 is "off".
    expected_tokens : numpy.ndarray
        Expected tokens per pass for each ``k`` (1 at ``k = 0``).
    speedup : numpy.ndarray
        Predicted speedup for each ``k`` (1 at ``k = 0``).
    best_k : int
        The draft length with the largest speedup, the smaller one on a tie; 0 means
        speculation does not pay at this cost.

    The arrays are read-only, so a table can be shared and cached safely.
    """

    k: npt.NDArray[np.int64]
    expected_tokens: npt.NDArray[np.float64]
    speedup: npt.NDArray[np.float64]
    best_k: int


def predict_speedup(survival: npt.ArrayLike, c: float) -> SpeedupTable:
    r"""Predict the speedup of every draft length :math:`k \le K` and pick the best.

    Combines :func:`expected_tokens` and :func:`speedup`:

    .. math::

        S(k) = \frac{1 + \sum_{i=1}^{k} P(L \ge i)}{1 + c\,k}, \qquad
        k^\ast = \operatorname*{arg\,max}_{0 \le k \le K} S(k).

    Parameters
    ----------
    survival : array_like, shape (K,)
        :math:`P(L \ge i)` for :math:`i = 1, \dots, K`, e.g. from
        :func:`spectune.core.survival_from_counts`.
    c : float
        Draft cost in target-step units, :math:`\ge 0`.

    Returns
    -------
    SpeedupTable
        The prediction for :math:`k = 0, \dots, K` and the best :math:`k`.

    Raises
    ------
    spectune.errors.InputError
        If ``survival`` is not 1-D, holds NaN (no drafts were measured; say "insufficient
        data" instead of predicting) or values outside :math:`[0, 1]`, or ``c`` is invalid.

    References
    ----------
    .. [1] Y. Leviathan, M. Kalman, Y. Matias, "Fast Inference from Transformers via
       Speculative Decoding", ICML 2023, arXiv:2211.17192, Theorem 3.8 (the walltime
       improvement factor, maximised over the draft length).

    Examples
    --------
    A drafter that keeps 70 % of its tokens at every position, measured at :math:`K = 8`,
    whose draft step costs 15 % of a target step:

    >>> from spectune.core import flat_survival
    >>> table = predict_speedup(flat_survival(0.7, 8), c=0.15)
    >>> print(table.speedup.round(2))
    [1.   1.48 1.68 1.75 1.73 1.68 1.61 1.53 1.45]
    >>> table.best_k
    3

    Drafting 8 tokens would still be 1.45x faster than plain decoding, but 3 is the peak:
    every position past it costs more draft time than it saves.
    """
    s = _survival_array(survival)
    if s.ndim != 1:
        raise InputError(f"survival must be 1-D (one value per position), got shape {s.shape}")
    if np.any(np.isnan(s)):
        raise InputError(
            "survival holds NaN (no drafts in the window); report insufficient data instead"
        )
    _check_cost(c)
    k = np.arange(s.size + 1, dtype=np.int64)
    expected = expected_tokens(s)
    gain = speedup(expected, c, k)
    # np.argmax returns the first maximum, so ties resolve to the smaller (cheaper) k.
    best_k = int(np.argmax(gain))
    for arr in (k, expected, gain):
        arr.setflags(write=False)
    return SpeedupTable(k=k, expected_tokens=expected, speedup=gain, best_k=best_k)


def break_even_survival(expected: npt.ArrayLike, c: float) -> npt.NDArray[np.float64]:
    r"""Survival each position needs for drafting it to raise the speedup.

    Going from :math:`k - 1` to :math:`k` drafted tokens adds :math:`p_k = P(L \ge k)` to
    the expected tokens, :math:`E_k = E_{k-1} + p_k`, and :math:`c` to the cost. The speedup
    rises exactly when

    .. math::

        \frac{E_{k-1} + p_k}{1 + c\,k} > \frac{E_{k-1}}{1 + c\,(k-1)}
        \iff p_k\,\bigl(1 + c\,(k-1)\bigr) > c\,E_{k-1}
        \iff p_k > p^\ast_k = \frac{c\,E_{k-1}}{1 + c\,(k-1)},

    multiplying out both positive denominators. The bar is the speedup already reached,
    scaled by the cost: :math:`p^\ast_k = c\,S(k-1)`. A position pays for itself when it
    lands in more than a fraction :math:`c\,S(k-1)` of passes, so the better speculation
    already works, the higher the bar for drafting one more token.

    Parameters
    ----------
    expected : array_like, shape (K + 1,)
        Expected tokens per pass for :math:`k = 0, \dots, K` (:func:`expected_tokens`).
    c : float
        Draft cost in target-step units, :math:`\ge 0`.

    Returns
    -------
    numpy.ndarray, shape (K,)
        :math:`p^\ast_k` for :math:`k = 1, \dots, K`.

    Raises
    ------
    spectune.errors.InputError
        If ``expected`` is not 1-D or ``c`` is invalid.

    Examples
    --------
    With 70 % flat acceptance and :math:`c = 0.15`, the fourth position survives
    :math:`0.7^4 \approx 0.24` of passes, but needs 0.26 to pay for itself:

    >>> from spectune.core import expected_tokens, flat_survival
    >>> curve = flat_survival(0.7, 5)
    >>> print(break_even_survival(expected_tokens(curve), c=0.15).round(2))
    [0.15 0.22 0.25 0.26 0.26]
    >>> print(curve.round(2))
    [0.7  0.49 0.34 0.24 0.17]
    """
    _check_cost(c)
    e = np.asarray(expected, dtype=np.float64)
    if e.ndim != 1 or e.size < 1:
        raise InputError(f"expected must be 1-D with one value per k = 0..K, got shape {e.shape}")
    k = np.arange(1, e.size, dtype=np.float64)
    return np.asarray(c * e[:-1] / (1.0 + c * (k - 1.0)))
