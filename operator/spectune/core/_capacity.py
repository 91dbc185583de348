r"""The cost side of speculation: the draft cost :math:`c` and the KV pool it competes with.

Acceptance says what a drafter could buy; these two numbers say what it costs
(DESIGN.md §1, sentences 1, 4 and 5). :func:`draft_cost_from_tpot` estimates :math:`c` from
per-token latency measured with and without speculation under the same load — ``search``
uses it to score counterfactual draft lengths, ``diagnose`` for ``DRAFTER_TOO_EXPENSIVE``
and ``LARGE_BATCH_REGIME``. :func:`kv_pool_tokens` reads the size of the request KV pool
from an engine's cache configuration, which ``diagnose`` compares against the baseline for
``KV_POOL_SHRANK``.
"""

from __future__ import annotations

import math
import numbers

from spectune.errors import InputError

__all__ = ["draft_cost_from_tpot", "kv_pool_tokens"]


def draft_cost_from_tpot(tpot_on: float, tpot_off: float, expected_tokens: float, k: int) -> float:
    r"""Effective draft cost :math:`c`, in target-step units, from two per-token latencies.

    Without speculation one target step of duration :math:`T` emits one token, so
    :math:`\mathrm{TPOT}_\text{off} = T`. With :math:`k` drafted tokens a pass costs
    :math:`T (1 + c k)` and emits :math:`E` tokens on average, so
    :math:`\mathrm{TPOT}_\text{on} = T (1 + c k) / E`. Solving for :math:`c`:

    .. math::

        c = \frac{1}{k} \left( \frac{\mathrm{TPOT}_\text{on}\, E}{\mathrm{TPOT}_\text{off}}
            - 1 \right).

    Both latencies must come from the same load (batch size, traffic mix): the estimate
    charges to the drafter everything that makes a speculative pass slower than a plain
    step, including the extra cost of verifying :math:`k + 1` tokens per sequence at large
    batch. That is the cost that matters for choosing :math:`k` at this load, and why
    :math:`c` rises with concurrency.

    Parameters
    ----------
    tpot_on : float
        Mean time per output token with speculation at draft length ``k`` (any unit).
    tpot_off : float
        Mean time per output token without speculation, same unit and load.
    expected_tokens : float
        Measured mean tokens per pass at ``k``, bonus token included (at least 1; e.g.
        :func:`spectune.core.mean_accepted_length`).
    k : int
        Draft length the ``tpot_on`` measurement ran with, at least 1.

    Returns
    -------
    float
        The estimated :math:`c \ge 0`; NaN when an input is NaN (no sample).

    Raises
    ------
    spectune.errors.InputError
        If a latency is not a positive finite number, ``expected_tokens < 1``, or
        ``k < 1``.

    Notes
    -----
    The raw estimate is clipped at 0. A negative value would mean a speculative pass ran
    faster than a plain step, which no drafter can do; it happens only when latency noise
    outweighs a cheap drafter's true cost. Passing it on would predict a speedup above
    :math:`E` and push the policy to the largest :math:`k`; 0 is the nearest physically
    possible cost, and the measurement noise belongs in the caller's interval.

    References
    ----------
    .. [1] Y. Leviathan, M. Kalman, Y. Matias, "Fast Inference from Transformers via
       Speculative Decoding", ICML 2023, arXiv:2211.17192: the cost coefficient :math:`c`
       and the walltime model of Theorem 3.8, inverted here.

    Examples
    --------
    Plain decoding ran at 30 ms per token. With EAGLE at :math:`k = 3` passes emitted 2.5
    tokens on average and the per-token latency fell to 20 ms: each draft step cost about
    22 % of a target step.

    >>> round(draft_cost_from_tpot(tpot_on=0.020, tpot_off=0.030, expected_tokens=2.5, k=3), 3)
    0.222
    """
    if k < 1:
        raise InputError(f"draft length k must be >= 1 to estimate a draft cost, got {k!r}")
    values = {"tpot_on": tpot_on, "tpot_off": tpot_off, "expected_tokens": expected_tokens}
    if any(math.isnan(v) for v in values.values()):
        return math.nan
    for name, value in values.items():
        if not (value > 0 and math.isfinite(value)):
            raise InputError(f"{name} must be a positive finite number, got {value!r}")
    if expected_tokens < 1:
        raise InputError(
            f"expected_tokens counts the bonus token and is at least 1, got {expected_tokens!r}"
        )
    raw = (tpot_on * expected_tokens / tpot_off - 1.0) / k
    return max(raw, 0.0)


def _as_count(name: str, value: object, minimum: int) -> int:
    # Metric sources hand over gauge values as floats and numpy scalars, so any whole number
    # is accepted, whatever its type.
    if isinstance(value, bool) or not isinstance(value, float | numbers.Integral):
        raise InputError(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise InputError(f"{name} must be a whole number, got {value!r}")
    count = int(value)
    if count < minimum:
        raise InputError(f"{name} must be >= {minimum}, got {count!r}")
    return count


def kv_pool_tokens(
    num_gpu_blocks: int, block_size: int, kv_cache_size_tokens: int | None = None
) -> int:
    r"""Tokens the request KV pool holds, as the engine reports its cache.

    .. math::

        \text{tokens} = \begin{cases}
            \text{kv\_cache\_size\_tokens} & \text{when reported,} \\
            \text{num\_gpu\_blocks} \times \text{block\_size} & \text{otherwise.}
        \end{cases}

    Newer vLLM reports ``kv_cache_size_tokens`` in ``vllm:cache_config_info``; it is
    group-aware, and right for hybrid models (sliding-window or Mamba layers) where
    ``num_gpu_blocks * block_size`` is not the capacity. Older versions only have the
    block count.

    Parameters
    ----------
    num_gpu_blocks : int
        KV blocks on the GPU (``num_gpu_blocks`` label), :math:`\ge 0`.
    block_size : int
        Tokens per block (``block_size`` label); at least 1 when the block count is used.
    kv_cache_size_tokens : int, optional
        The engine's own token capacity, preferred when given.

    Returns
    -------
    int
        Token capacity of the KV pool.

    Raises
    ------
    spectune.errors.InputError
        If a value is negative or fractional, or ``block_size`` is 0 when it is needed.

    Examples
    --------
    A drafter took 3,000 of 100,000 blocks of 16 tokens:

    >>> kv_pool_tokens(100_000, 16) - kv_pool_tokens(97_000, 16)
    48000
    """
    blocks = _as_count("num_gpu_blocks", num_gpu_blocks, 0)
    size = _as_count("block_size", block_size, 0)
    if kv_cache_size_tokens is not None:
        return _as_count("kv_cache_size_tokens", kv_cache_size_tokens, 0)
    if size < 1:
        raise InputError("block_size must be >= 1 to size the KV pool from num_gpu_blocks")
    return blocks * size
