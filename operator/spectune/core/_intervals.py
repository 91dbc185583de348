r"""Confidence intervals for acceptance rates and per-position survival.

A window of a few hundred drafts pins acceptance down only loosely, and the tuning policy
must not act on noise: ``search`` uses these intervals in its stopping rule and when it
compares arms, ``diagnose`` uses them to decide between a finding and
``INSUFFICIENT_DATA``, and the status writer reports them next to every rate.

Both intervals behave well where the textbook Wald interval fails: near 0 and 1 (a good
drafter's first position is often above 0.95) and at small counts. Counts may be
fractional (PromQL ``increase()`` extrapolates), which both formulas accept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from spectune.core._acceptance import _ROUNDING, _validated_counts
from spectune.errors import InputError

__all__ = [
    "ConfidenceInterval",
    "beta_interval",
    "survival_intervals",
    "wilson_interval",
]


@dataclass(frozen=True)
class ConfidenceInterval:
    """A two-sided interval for a proportion.

    Attributes
    ----------
    low, high : float
        The bounds, within :math:`[0, 1]`; both NaN when there were no trials.
    confidence : float
        The nominal coverage the interval was built for, e.g. 0.95.
    """

    low: float
    high: float
    confidence: float


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise InputError(f"confidence must be in (0, 1), e.g. 0.95, got {confidence!r}")


def _check_binomial(successes: float, trials: float) -> None:
    if successes < 0 or trials < 0:
        raise InputError(
            f"successes and trials must be >= 0, got successes={successes!r}, trials={trials!r}"
        )
    if successes > trials * (1 + _ROUNDING):
        raise InputError(f"successes ({successes!r}) exceed trials ({trials!r})")


def _wilson_bounds(
    x: npt.NDArray[np.float64], n: float, confidence: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Vectorised Wilson bounds for successes ``x`` out of ``n > 0`` trials."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p = np.clip(x / n, 0.0, 1.0)
    z2n = z * z / n
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * np.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n))
    return np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)


def wilson_interval(
    successes: float, trials: float, confidence: float = 0.95
) -> ConfidenceInterval:
    r"""Wilson score interval for a binomial proportion.

    The set of :math:`p` that a two-sided score test does not reject,
    :math:`|\hat p - p| \le z \sqrt{p(1-p)/n}`, which solves to

    .. math::

        \frac{\hat p + \frac{z^2}{2n}}{1 + \frac{z^2}{n}}
        \pm \frac{z}{1 + \frac{z^2}{n}}
        \sqrt{\frac{\hat p (1 - \hat p)}{n} + \frac{z^2}{4n^2}},

    with :math:`\hat p = x / n` and :math:`z` the :math:`(1 + \text{confidence})/2` quantile
    of the standard normal.

    Parameters
    ----------
    successes : float
        Successes :math:`x` (e.g. accepted tokens), :math:`0 \le x \le n`.
    trials : float
        Trials :math:`n` (e.g. drafted tokens).
    confidence : float, optional
        Nominal coverage, in :math:`(0, 1)`. Default 0.95.

    Returns
    -------
    ConfidenceInterval
        The interval; ``low`` and ``high`` are NaN when ``trials`` is zero.

    Raises
    ------
    spectune.errors.InputError
        If a count is negative, ``successes > trials``, or ``confidence`` is outside
        :math:`(0, 1)`.

    References
    ----------
    .. [1] E. B. Wilson, "Probable Inference, the Law of Succession, and Statistical
       Inference", Journal of the American Statistical Association 22(158), 209–212, 1927.
    .. [2] L. D. Brown, T. T. Cai, A. DasGupta, "Interval Estimation for a Binomial
       Proportion", Statistical Science 16(2), 101–133, 2001.

    Examples
    --------
    140 of 200 drafted tokens accepted: 70 %, but anything from 63 % to 76 % fits.

    >>> ci = wilson_interval(140, 200)
    >>> print(f"{ci.low:.3f} {ci.high:.3f}")
    0.633 0.759

    Ten times the evidence narrows it to about ±2 points:

    >>> ci = wilson_interval(1_400, 2_000)
    >>> print(f"{ci.low:.3f} {ci.high:.3f}")
    0.680 0.720
    """
    _check_confidence(confidence)
    _check_binomial(successes, trials)
    if math.isnan(successes) or math.isnan(trials) or trials == 0:
        return ConfidenceInterval(math.nan, math.nan, confidence)
    low, high = _wilson_bounds(np.asarray(successes, dtype=np.float64), trials, confidence)
    return ConfidenceInterval(float(low), float(high), confidence)


def beta_interval(
    successes: float,
    trials: float,
    confidence: float = 0.95,
    prior: tuple[float, float] = (0.5, 0.5),
) -> ConfidenceInterval:
    r"""Equal-tailed Beta-posterior interval; the Jeffreys interval by default.

    With a :math:`\mathrm{Beta}(a, b)` prior the posterior of the proportion after
    :math:`x` successes in :math:`n` trials is :math:`\mathrm{Beta}(x + a, n - x + b)`, and
    the interval is its :math:`\alpha/2` and :math:`1 - \alpha/2` quantiles,
    :math:`\alpha = 1 - \text{confidence}`:

    .. math::

        \Bigl[\, B^{-1}_{x+a,\; n-x+b}(\alpha/2),\;
                 B^{-1}_{x+a,\; n-x+b}(1 - \alpha/2) \,\Bigr].

    The default prior :math:`(1/2, 1/2)` gives the Jeffreys interval. As Brown, Cai and
    DasGupta recommend, the lower bound is set to 0 when :math:`x = 0` and the upper bound
    to 1 when :math:`x = n`, which keeps coverage at the edges.

    Parameters
    ----------
    successes : float
        Successes :math:`x`, :math:`0 \le x \le n`.
    trials : float
        Trials :math:`n`.
    confidence : float, optional
        Nominal coverage, in :math:`(0, 1)`. Default 0.95.
    prior : tuple of float, optional
        Beta prior parameters :math:`(a, b)`, both positive. Default ``(0.5, 0.5)``.

    Returns
    -------
    ConfidenceInterval
        The interval; ``low`` and ``high`` are NaN when ``trials`` is zero (no evidence,
        so no interval, the same as :func:`wilson_interval`).

    Raises
    ------
    spectune.errors.InputError
        On negative counts, ``successes > trials``, ``confidence`` outside
        :math:`(0, 1)`, or a non-positive prior parameter.

    References
    ----------
    .. [1] L. D. Brown, T. T. Cai, A. DasGupta, "Interval Estimation for a Binomial
       Proportion", Statistical Science 16(2), 101–133, 2001, Section 4.1.2.

    Examples
    --------
    A first draft position accepted in all 50 passes seen so far: the rate could still be
    as low as 95 %.

    >>> ci = beta_interval(50, 50)
    >>> print(f"{ci.low:.3f} {ci.high:.3f}")
    0.951 1.000
    """
    _check_confidence(confidence)
    _check_binomial(successes, trials)
    a, b = prior
    if not (a > 0 and b > 0):
        raise InputError(f"prior parameters must both be > 0, got {prior!r}")
    if math.isnan(successes) or math.isnan(trials) or trials == 0:
        return ConfidenceInterval(math.nan, math.nan, confidence)
    x = min(successes, trials)
    tail = (1.0 - confidence) / 2.0
    # scipy.stats costs over a second to import; only the Beta interval needs it, so it is
    # imported here rather than at start-up of every spectune command.
    from scipy import stats

    post = stats.beta(x + a, trials - x + b)
    low = 0.0 if x == 0 else float(post.ppf(tail))
    high = 1.0 if x == trials else float(post.ppf(1.0 - tail))
    return ConfidenceInterval(low, high, confidence)


def survival_intervals(
    accepted_per_pos: npt.ArrayLike, drafts: float, confidence: float = 0.95
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    r"""Wilson intervals for each point of a measured survival curve.

    Position :math:`i` is a binomial proportion in its own right: of ``drafts`` passes,
    ``accepted_per_pos[i - 1]`` reached an accepted length of at least :math:`i`
    (see :func:`spectune.core.survival_from_counts`). Each gets the interval of
    :func:`wilson_interval`, computed for all positions at once.

    Parameters
    ----------
    accepted_per_pos : array_like, shape (K,)
        Per-position accepted counts in the window, position 0 first.
    drafts : float
        Verification passes in the window.
    confidence : float, optional
        Nominal coverage per position, in :math:`(0, 1)`. Default 0.95.

    Returns
    -------
    low, high : numpy.ndarray, shape (K,)
        Bounds on :math:`P(L \ge i)` for :math:`i = 1, \dots, K`; all NaN when ``drafts``
        is zero.

    Raises
    ------
    spectune.errors.InputError
        On the count errors of :func:`spectune.core.survival_from_counts`, or a
        ``confidence`` outside :math:`(0, 1)`.

    References
    ----------
    .. [1] E. B. Wilson, "Probable Inference, the Law of Succession, and Statistical
       Inference", Journal of the American Statistical Association 22(158), 209–212, 1927.

    Examples
    --------
    After 400 passes the first position is known to a few points, the fourth less well in
    relative terms:

    >>> low, high = survival_intervals([360, 270, 180, 90], 400)
    >>> print(low.round(3), high.round(3))
    [0.867 0.628 0.402 0.187] [0.926 0.719 0.499 0.268]
    """
    _check_confidence(confidence)
    counts = _validated_counts(accepted_per_pos, drafts)
    if math.isnan(drafts) or drafts == 0:
        nan = np.full(counts.shape, np.nan)
        return nan, nan.copy()
    return _wilson_bounds(counts, drafts, confidence)
