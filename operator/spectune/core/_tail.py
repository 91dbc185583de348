r"""How far a drafter's per-token latency tail reaches, from how acceptance varies by request.

A p95 of per-token latency under speculation is set by the requests the drafter serves
worst: each request accepts at its own rate, and one that accepts little pays for every
drafted position while emitting few tokens per pass. So the tail grows with ``k`` faster
than the mean does, and the ``k`` that minimises a p95 sits below the one that minimises the
mean. Where vLLM's per-token histogram cannot show the tail (every request under its first
bound of 10 ms, as on an 8B model, or within one bucket), ``search/model.py`` reads it from
this model instead.

The model: a request's acceptance rate :math:`a` is drawn from
:math:`\mathrm{Beta}(\alpha s, (1-\alpha) s)`, and draft position :math:`i` is accepted, given
the ones before it were, with probability :math:`a\,\gamma^{i-1}`; so the request's expected
tokens per pass at ``k`` are

.. math::

    E(a, k) = 1 + \sum_{i=1}^{k} a^i \gamma^{i(i-1)/2}.

Its per-token latency is the step time over :math:`E(a, k)`; the request-to-request spread of
step times, and the noise of a finite number of passes, are left out (they are small
beside the acceptance spread and the same for every ``k``).

The three parameters are fitted to the engine's per-position counters. Those count passes,
not requests: a request that accepts little takes more passes for its tokens, so the
counters see the rates weighted by :math:`1/E(a, k)`. The concentration :math:`s` shows in
the counters as survivor bias: the passes that reach position :math:`i` come from requests
that accept more, so the conditional acceptance of later positions sinks less than
:math:`\gamma` alone would make it. Three draft positions are the least that tell
:math:`s` apart from :math:`\gamma`.

References
----------
.. [1] Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative
       Decoding", ICML 2023: expected tokens per pass with a per-token acceptance rate.
.. [2] Li et al., "EAGLE-3", 2025: acceptance falls with draft position.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "AcceptanceSpread",
    "RequestAcceptance",
    "fit_acceptance_spread",
    "request_acceptance_spread",
    "tail_ratio",
]

#: Gauss–Legendre nodes and weights on (0, 1) for integrals over a request's acceptance rate.
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(96)
_NODES = (_NODES + 1.0) / 2.0
_WEIGHTS = _WEIGHTS / 2.0
#: Fewest draft positions that separate the spread across requests from the decay.
MIN_POSITIONS = 3


@dataclass(frozen=True)
class AcceptanceSpread:
    """Acceptance of one drafter across requests.

    Attributes
    ----------
    alpha : float
        Mean over requests of the first position's acceptance rate.
    decay : float
        Factor by which each later position's conditional acceptance falls.
    concentration : float
        :math:`s` of the Beta distribution of request rates: large is alike, small is varied.
    """

    alpha: float
    decay: float
    concentration: float


def _beta_pdf(alpha: float, concentration: float) -> npt.NDArray[np.float64]:
    from scipy import special  # imported here: scipy.special costs ~0.3 s at start-up

    a, b = alpha * concentration, (1.0 - alpha) * concentration
    log_pdf = (a - 1) * np.log(_NODES) + (b - 1) * np.log1p(-_NODES) - special.betaln(a, b)
    return np.asarray(np.exp(log_pdf), dtype=np.float64)


def _survival(rate: npt.ArrayLike, decay: float, k: int) -> npt.NDArray[np.float64]:
    """P(L ≥ i) for i = 1..k at per-request rates ``rate``: shape (k, len(rate))."""
    r = np.asarray(rate, dtype=float)
    i = np.arange(1, k + 1, dtype=float)[:, None]
    return np.asarray(r[None, :] ** i * decay ** (i * (i - 1) / 2), dtype=np.float64)


def _tokens_per_pass(rate: npt.ArrayLike, decay: float, k: int) -> npt.NDArray[np.float64]:
    """E(a, k) at per-request rates ``rate``."""
    return np.asarray(1.0 + _survival(rate, decay, k).sum(axis=0), dtype=np.float64)


def _counter_curve(alpha: float, decay: float, concentration: float, k: int) -> np.ndarray:
    """P(L ≥ i) as the counters of an engine drafting ``k`` see it (pass-weighted)."""
    surv = _survival(_NODES, decay, k)
    weight = _beta_pdf(alpha, concentration) * _WEIGHTS / (1.0 + surv.sum(axis=0))
    return np.asarray((surv * weight).sum(axis=1) / weight.sum())


@functools.lru_cache(maxsize=512)
def _fit(groups: tuple[tuple[int, tuple[float, ...], float], ...]) -> AcceptanceSpread | None:
    from scipy import optimize

    ys, ses, ks, drafts = [], [], [], []
    for k, accepted, n in groups:
        y = np.clip(np.asarray(accepted) / n, 1e-6, 1 - 1e-6)
        ys.append(y)
        ses.append(np.sqrt(y * (1 - y) / n))
        ks.append(k)
        drafts.append(n)

    def residuals(p: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        log_s, decay, *alphas = p
        parts = [
            (_counter_curve(alpha, decay, math.exp(log_s), k) - y) / se
            for alpha, k, y, se in zip(alphas, ks, ys, ses, strict=True)
        ]
        return np.concatenate(parts)

    n_groups = len(groups)
    lower = [math.log(0.5), 0.5, *([0.01] * n_groups)]
    upper = [math.log(1000.0), 1.0, *([0.99] * n_groups)]
    firsts = [min(max(float(y[0]), 0.02), 0.98) for y in ys]
    best = None
    # Two starts, a varied and an alike population: the fit is not convex in the spread.
    for start_s in (3.0, 30.0):
        try:
            r = optimize.least_squares(
                residuals, [math.log(start_s), 0.97, *firsts], bounds=(lower, upper)
            )
        except ValueError:  # residuals not finite: counters the model cannot describe
            continue
        if best is None or r.cost < best.cost:
            best = r
    if best is None or not best.success:
        return None
    log_s, decay, *alphas = (float(v) for v in best.x)
    alpha = float(np.average(alphas, weights=drafts))
    return AcceptanceSpread(alpha, decay, math.exp(log_s))


def fit_acceptance_spread(
    windows: Sequence[tuple[Sequence[float], float]],
) -> AcceptanceSpread | None:
    r"""Fit the spread of acceptance across requests to per-position counters.

    Parameters
    ----------
    windows
        ``(accepted per position, drafts)`` of each window of one drafter on one traffic,
        at any ``k`` (vLLM's ``spec_decode_num_accepted_tokens_per_pos`` and
        ``spec_decode_num_drafts`` deltas). Windows at the same ``k`` are pooled.

    Returns
    -------
    AcceptanceSpread or None
        None when no window has :data:`MIN_POSITIONS` positions with drafts (from fewer,
        the spread across requests cannot be told apart from the decay by position) or
        the fit does not converge. Windows with a missing (NaN) or negative count are
        left out.

    Notes
    -----
    Weighted least squares over every window's :math:`P(L \ge i)`, each with its
    binomial standard error, against the pass-weighted model curve

    .. math::

        \frac{\int f(a)\, S_i(a) / E(a, k)\, da}{\int f(a) / E(a, k)\, da},
        \qquad S_i(a) = a^i \gamma^{i(i-1)/2},

    with :math:`f` the Beta density. The windows of each ``k`` get their own mean rate
    :math:`\alpha`: a window's requests are a sample, and its mean acceptance moves with
    them by more than the binomial error of its counters, so only the shape of each
    curve along the positions (decay and survivor bias) is pooled. The reported
    :math:`\alpha` is their average weighted by drafts. The result is cached: the policy
    refits from the same counters on every call.

    Examples
    --------
    Counters of a drafter whose requests accept 0.8 on average, drawn with concentration 8
    (some requests near 0.5, some near 1), seen at ``k = 4``:

    >>> curve = _counter_curve(0.8, 0.97, 8.0, 4)
    >>> fit = fit_acceptance_spread([(tuple(curve * 200_000), 200_000.0)])
    >>> round(fit.alpha, 2), round(fit.decay, 2), round(fit.concentration)
    (0.8, 0.97, 8)
    """
    pooled: dict[int, tuple[np.ndarray, float]] = {}
    for accepted, drafts in windows:
        k = len(accepted)
        if k == 0 or not drafts > 0 or not math.isfinite(drafts):
            continue
        acc = np.asarray(accepted, dtype=float)
        if not np.all(np.isfinite(acc)) or np.any(acc < 0):
            continue  # a scrape gap (an idle rate() is NaN), not a count: the window says nothing
        if k in pooled:
            prev, d = pooled[k]
            pooled[k] = (prev + acc, d + drafts)
        else:
            pooled[k] = (acc, float(drafts))
    if not pooled or max(pooled) < MIN_POSITIONS:
        return None
    groups = tuple(
        (k, tuple(round(float(v), 6) for v in acc), round(d, 6))
        for k, (acc, d) in sorted(pooled.items())
    )
    return _fit(groups)


def tail_ratio(spread: AcceptanceSpread, k: int, q: float = 0.95) -> float:
    r"""The ``q`` quantile of per-token latency over requests, relative to its mean.

    A request's per-token latency is proportional to :math:`1/E(a, k)`, which falls as its
    rate :math:`a` rises; so its ``q`` quantile is :math:`1/E(a_{1-q}, k)` with
    :math:`a_{1-q}` the ``1 − q`` quantile of the Beta distribution, and the mean is
    :math:`\int f(a)/E(a, k)\, da`. ``k = 0`` (no drafting) gives 1.

    Examples
    --------
    Requests that accept 0.8 on average with concentration 8: the p95 sits 16 % above the
    mean at ``k = 1`` and 54 % above it at ``k = 4``, so the p95's best ``k`` is smaller than
    the mean's.

    >>> s = AcceptanceSpread(0.8, 0.97, 8.0)
    >>> [round(tail_ratio(s, k), 2) for k in (0, 1, 2, 4)]
    [1.0, 1.16, 1.31, 1.54]
    """
    if k <= 0:
        return 1.0
    from scipy import special

    a = spread.alpha * spread.concentration
    b = (1.0 - spread.alpha) * spread.concentration
    low_rate = float(special.betaincinv(a, b, 1.0 - q))
    tokens = float(_tokens_per_pass([low_rate], spread.decay, k)[0])
    weight = _beta_pdf(spread.alpha, spread.concentration) * _WEIGHTS
    per_node = 1.0 / _tokens_per_pass(_NODES, spread.decay, k)
    mean_inverse = float(np.sum(weight * per_node) / np.sum(weight))
    return (1.0 / tokens) / mean_inverse


@dataclass(frozen=True)
class RequestAcceptance:
    """Acceptance across requests as the engine measured it, one rate per finished request.

    Attributes
    ----------
    mean : float
        Mean over requests of a request's acceptance rate (accepted over drafted tokens).
    sd : float
        Standard deviation of the rates over requests.
    concentration : float
        :math:`s` of the Beta distribution with that mean and spread,
        :math:`s = m(1-m)/\\sigma^2 - 1`: the quantity :class:`AcceptanceSpread` otherwise
        fits from survivor bias in the per-position counters.
    requests : float
        Number of requests behind it.
    """

    mean: float
    sd: float
    concentration: float
    requests: float


def request_acceptance_spread(
    bounds: Sequence[float], cumulative: Sequence[float], total: float
) -> RequestAcceptance | None:
    r"""Moments of per-request acceptance from a histogram of it (vLLM PR #44487's
    ``vllm:request_spec_decode_acceptance_rate``).

    The mean is exact (the histogram's ``_sum`` over its count); the variance takes each
    observation at its bucket's midpoint plus the uniform-within-bucket term
    :math:`w^2/12`. The concentration follows by the method of moments of a Beta
    distribution. None with fewer than two requests, or when the spread is zero or as
    wide as a Beta with that mean allows (every request at 0 or 1).

    Examples
    --------
    A hundred requests: ten accept between a quarter and half of their drafts, eighty
    between half and three quarters, ten more:

    >>> r = request_acceptance_spread((0.25, 0.5, 0.75, 1.0, math.inf), (0, 10, 90, 100, 100), 62.5)
    >>> round(r.mean, 3), r.requests, round(r.concentration, 1)
    (0.625, 100.0, 12.2)
    """
    cum = np.asarray(cumulative, dtype=float)
    n = float(cum[-1]) if cum.size else 0.0
    if n < 2:
        return None
    upper = np.minimum(np.asarray(bounds, dtype=float), 1.0)
    lower = np.concatenate([[0.0], upper[:-1]])
    counts = np.diff(np.concatenate([[0.0], cum]))
    mean = total / n
    mid = (lower + upper) / 2
    var = float(np.sum(counts * ((mid - mean) ** 2 + (upper - lower) ** 2 / 12)) / n)
    top = mean * (1 - mean)
    if not 0 < var < top:
        return None
    return RequestAcceptance(mean, math.sqrt(var), top / var - 1, n)
