r"""The pure math of speculative decoding: acceptance, expected tokens, speedup, cost, intervals.

Every other layer reasons through these functions (DESIGN.md §1): ``diagnose`` for its
findings, ``search`` for counterfactual draft lengths and stopping rules, the simulator and
the bench for their oracle, the status writer for the numbers it reports. The core depends
on numpy, scipy and the standard library only, never on another spectune layer except
:mod:`spectune.errors`, and has no state: the same counts always give the same answer.

The functions live in private modules by concern and are public only through this package:

- acceptance from counters: :func:`acceptance_rate`, :func:`mean_accepted_length`,
  :func:`survival_from_counts`, :func:`flat_survival`;
- tokens per pass and speedup: :func:`expected_tokens`, :func:`expected_tokens_flat`,
  :func:`speedup`, :func:`predict_speedup` (:class:`SpeedupTable`),
  :func:`break_even_survival`;
- uncertainty: :func:`wilson_interval`, :func:`beta_interval`, :func:`survival_intervals`
  (:class:`ConfidenceInterval`);
- cost and capacity: :func:`draft_cost_from_tpot`, :func:`kv_pool_tokens`;
- latency tails from acceptance across requests: :func:`fit_acceptance_spread`,
  :func:`tail_ratio` (:class:`AcceptanceSpread`).

Examples
--------
One window of vLLM counters, measured at :math:`K = 5` with a drafter whose step costs
0.15 target steps, answers what every smaller draft length would have done:

>>> from spectune.core import predict_speedup, survival_from_counts
>>> curve = survival_from_counts([8_100, 5_900, 4_000, 2_500, 1_500], drafts=10_000)
>>> table = predict_speedup(curve, c=0.15)
>>> print(table.speedup.round(2))
[1.   1.57 1.85 1.93 1.91 1.83]
>>> table.best_k
3
"""

from spectune.core._acceptance import (
    acceptance_rate,
    flat_rate_for_length,
    flat_survival,
    mean_accepted_length,
    survival_from_counts,
)
from spectune.core._capacity import draft_cost_from_tpot, kv_pool_tokens
from spectune.core._intervals import (
    ConfidenceInterval,
    beta_interval,
    survival_intervals,
    wilson_interval,
)
from spectune.core._quantile import gamma_quantiles
from spectune.core._speedup import (
    SpeedupTable,
    break_even_survival,
    expected_tokens,
    expected_tokens_flat,
    predict_speedup,
    speedup,
)
from spectune.core._tail import (
    AcceptanceSpread,
    RequestAcceptance,
    fit_acceptance_spread,
    request_acceptance_spread,
    tail_ratio,
)

__all__ = [
    "AcceptanceSpread",
    "ConfidenceInterval",
    "RequestAcceptance",
    "SpeedupTable",
    "acceptance_rate",
    "beta_interval",
    "break_even_survival",
    "draft_cost_from_tpot",
    "expected_tokens",
    "expected_tokens_flat",
    "fit_acceptance_spread",
    "flat_rate_for_length",
    "flat_survival",
    "gamma_quantiles",
    "kv_pool_tokens",
    "mean_accepted_length",
    "predict_speedup",
    "request_acceptance_spread",
    "speedup",
    "survival_from_counts",
    "survival_intervals",
    "tail_ratio",
    "wilson_interval",
]
