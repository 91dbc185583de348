r"""Acceptance, read from an engine's speculative-decoding counters.

Every decision spectune makes starts from two measured quantities (DESIGN.md §1): how many
drafted tokens the target model accepts, overall and per position. This module turns the
raw counter deltas of a measurement window (vLLM's ``spec_decode_num_*`` counters, or the
simulator's copy of them) into those quantities. ``diagnose`` uses them for the
``LOW_ACCEPTANCE`` finding, ``search`` feeds the per-position curve to
:func:`spectune.core.predict_speedup`, and the status writer reports them.

An empty window is not an acceptance of zero: every function here answers NaN when its
denominator is zero, and leaves it to the caller to say "insufficient data".
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from spectune.errors import InputError

__all__ = [
    "acceptance_rate",
    "flat_survival",
    "mean_accepted_length",
    "survival_from_counts",
]

# Counter deltas are exact integers held in floats, or the output of PromQL's rate()/increase(),
# which scales every series of one window by the same factor. Either way two counters that obey
# an invariant (accepted <= drafted) can only break it by floating-point rounding, never by more
# than this fraction of the largest count. Anything larger is a broken input, not noise.
_ROUNDING = 1e-9


def _check_nonnegative(name: str, value: float) -> None:
    # NaN passes: an idle rate() is NaN and means "no sample", which callers handle.
    if value < 0:
        raise InputError(f"{name} must be >= 0 (a counter delta), got {value!r}")


def acceptance_rate(accepted: float, draft_tokens: float) -> float:
    r"""Fraction of drafted tokens that the target model accepted.

    .. math::

        \alpha = \frac{\text{accepted}}{\text{draft\_tokens}}

    Parameters
    ----------
    accepted : float
        Accepted draft tokens in the window (vLLM
        ``spec_decode_num_accepted_tokens``; the bonus token is not counted).
    draft_tokens : float
        Drafted tokens in the window (vLLM ``spec_decode_num_draft_tokens``).

    Returns
    -------
    float
        The acceptance rate in :math:`[0, 1]`; NaN when ``draft_tokens`` is zero or either
        input is NaN (no drafts in the window says nothing about acceptance).

    Raises
    ------
    spectune.errors.InputError
        If a count is negative, or more tokens were accepted than drafted.

    Examples
    --------
    A window with 12,000 drafted tokens of which 8,400 were accepted:

    >>> acceptance_rate(8_400, 12_000)
    0.7

    An idle window is "no data", not "acceptance 0":

    >>> acceptance_rate(0, 0)
    nan
    """
    _check_nonnegative("accepted", accepted)
    _check_nonnegative("draft_tokens", draft_tokens)
    if math.isnan(accepted) or math.isnan(draft_tokens) or draft_tokens == 0:
        return math.nan
    if accepted > draft_tokens * (1 + _ROUNDING):
        raise InputError(
            f"accepted ({accepted!r}) exceeds draft_tokens ({draft_tokens!r}); "
            "check that both deltas come from the same window"
        )
    return min(accepted / draft_tokens, 1.0)


def mean_accepted_length(accepted: float, drafts: float) -> float:
    r"""Mean tokens emitted per verification pass, bonus token included.

    .. math::

        \bar{\tau} = 1 + \frac{\text{accepted}}{\text{drafts}}

    This is vLLM's "mean acceptance length" convention: every pass emits the accepted draft
    tokens plus one token sampled by the target itself, so the value is at least 1.

    Parameters
    ----------
    accepted : float
        Accepted draft tokens in the window.
    drafts : float
        Verification passes that carried at least one draft token (vLLM
        ``spec_decode_num_drafts``).

    Returns
    -------
    float
        The mean accepted length; NaN when ``drafts`` is zero or an input is NaN.

    Raises
    ------
    spectune.errors.InputError
        If a count is negative.

    Examples
    --------
    1,000 passes that accepted 1,750 draft tokens emitted 2.75 tokens each:

    >>> mean_accepted_length(1_750, 1_000)
    2.75
    """
    _check_nonnegative("accepted", accepted)
    _check_nonnegative("drafts", drafts)
    if math.isnan(accepted) or math.isnan(drafts) or drafts == 0:
        return math.nan
    return 1.0 + accepted / drafts


def _validated_counts(accepted_per_pos: npt.ArrayLike, drafts: float) -> npt.NDArray[np.float64]:
    """Check per-position counts against their invariants; return them as floats.

    Shared with ``_intervals`` so both read the same counters the same way.
    """
    counts = np.asarray(accepted_per_pos, dtype=np.float64)
    if counts.ndim != 1:
        raise InputError(
            f"accepted_per_pos must be a 1-D sequence (one count per position), "
            f"got shape {counts.shape}"
        )
    _check_nonnegative("drafts", drafts)
    if np.any(counts < 0):
        raise InputError(f"accepted_per_pos must be >= 0 (counter deltas), got {counts.tolist()}")
    scale = max(1.0, float(np.nanmax(counts, initial=0.0)))
    if not math.isnan(drafts):
        scale = max(scale, drafts)
    tol = _ROUNDING * scale
    rises = np.diff(counts) > tol
    if np.any(rises):
        pos = int(np.argmax(rises)) + 1
        raise InputError(
            f"accepted_per_pos rises at position {pos} ({counts[pos - 1]!r} -> {counts[pos]!r}); "
            "a position is accepted only if every earlier one was, so counts cannot increase"
        )
    if counts.size and not math.isnan(drafts) and counts[0] > drafts + tol:
        raise InputError(
            f"accepted_per_pos[0] ({counts[0]!r}) exceeds drafts ({drafts!r}); "
            "check that both deltas come from the same window"
        )
    return counts


def survival_from_counts(accepted_per_pos: npt.ArrayLike, drafts: float) -> npt.NDArray[np.float64]:
    r"""Survival curve of the accepted length, :math:`P(L \ge i)`, from per-position counters.

    vLLM increments position :math:`i` (0-based) of
    ``spec_decode_num_accepted_tokens_per_pos`` when draft tokens :math:`0, \dots, i` of a
    pass were all accepted, i.e. when the accepted length :math:`L \ge i + 1`. Dividing by the
    number of passes therefore estimates the survival function directly:

    .. math::

        \hat{P}(L \ge i) = \frac{\text{accepted\_per\_pos}[i - 1]}{\text{drafts}},
        \qquad i = 1, \dots, K.

    Parameters
    ----------
    accepted_per_pos : array_like, shape (K,)
        Per-position accepted counts in the window, position 0 first.
    drafts : float
        Verification passes in the window (vLLM ``spec_decode_num_drafts``).

    Returns
    -------
    numpy.ndarray, shape (K,)
        :math:`P(L \ge i)` for :math:`i = 1, \dots, K`; all NaN when ``drafts`` is zero.

    Raises
    ------
    spectune.errors.InputError
        If ``drafts`` or a count is negative, the counts are not 1-D, a count rises with
        position by more than rounding (a position cannot be accepted more often than the
        one before it), or position 0 was accepted more often than there were drafts.

    Notes
    -----
    The estimate assumes every pass drafted all :math:`K` positions. With a batch-size
    dependent draft length the denominator includes passes that never drafted position
    :math:`i`, and the curve is diluted at the tail.

    Examples
    --------
    A drafter that keeps 70 % of its tokens at every position, seen over 10,000 passes:

    >>> survival_from_counts([7_000, 4_900, 3_430], 10_000)
    array([0.7  , 0.49 , 0.343])

    The ratio of neighbours is the conditional acceptance at each position (0.7 here).
    """
    counts = _validated_counts(accepted_per_pos, drafts)
    if math.isnan(drafts) or drafts == 0:
        return np.full(counts.shape, np.nan)
    return counts / drafts


def flat_survival(a: float, k: int) -> npt.NDArray[np.float64]:
    r"""Survival curve for a drafter with the same acceptance at every position.

    When each drafted token is accepted with probability :math:`a`, independently of the
    others, the accepted length is geometric and

    .. math::

        P(L \ge i) = a^i, \qquad i = 1, \dots, k.

    Parameters
    ----------
    a : float
        Per-token acceptance probability, in :math:`[0, 1]`.
    k : int
        Draft length, at least 0.

    Returns
    -------
    numpy.ndarray, shape (k,)
        :math:`a, a^2, \dots, a^k`.

    Raises
    ------
    spectune.errors.InputError
        If ``a`` is outside :math:`[0, 1]` or ``k`` is negative.

    Examples
    --------
    >>> flat_survival(0.5, 3)
    array([0.5  , 0.25 , 0.125])
    """
    if not 0.0 <= a <= 1.0:
        raise InputError(f"acceptance a must be in [0, 1], got {a!r}")
    if k < 0:
        raise InputError(f"draft length k must be >= 0, got {k!r}")
    return np.power(float(a), np.arange(1, k + 1, dtype=np.float64))


def flat_rate_for_length(mean_length: float, k: int) -> float:
    r"""The flat per-token rate :math:`a` whose :math:`1 + a + \dots + a^k` equals a mean length.

    For engines that report only the mean accepted length (SGLang's gauge, vLLM V0's
    emitted tokens), this is the curve :math:`P(L \ge i) = a^i` that reproduces it at the
    running ``k``: a model, and callers say so. The length is clipped to ``[1, k + 1]``.

    Examples
    --------
    >>> round(flat_rate_for_length(2.533, 3), 3)
    0.7
    """
    if k < 1:
        raise InputError(f"k must be at least 1, got {k}")
    target = min(max(mean_length, 1.0), k + 1.0)
    lo, hi = 0.0, 1.0
    powers = np.arange(k + 1)
    for _ in range(60):  # bisection: E(a) is increasing in a
        mid = (lo + hi) / 2
        if float(np.sum(mid**powers)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
