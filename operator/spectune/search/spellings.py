"""How an arm is spelled in an engine's speculative config, and read back from one.

The drafter's own settings (method, model, n-gram window) come from the SpecTuning or the
scenario; this module adds what the *arm* decides — ``k`` and the in-engine adaptive mode
(:class:`~spectune.search.arms.AdaptiveMode`) — and reads them back, so that a deployment
the operator adopts, or one a person edited, is recognised as the arm it runs:

* a fixed ``k``: ``num_speculative_tokens`` (SGLang ``--speculative-num-steps``);
* ``batch-table``: ``num_speculative_tokens_per_batch_size`` (vLLM Dynamic SD);
* ``verify``: the same table with ``"adaptive_verification": true``;
* ``tiers``: SGLang ``--speculative-adaptive``, its ``--speculative-adaptive-config``
  ``{"candidate_steps": [...]}`` and, for ``throughput_aware``,
  ``--speculative-adaptive-strategy``.

Called by the operator's Deployment patches (``k8s/deployments.py``) and the simulator's
server mode. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spectune.engines.args import (
    ADAPTIVE_CONFIG_KEY,
    ADAPTIVE_KEY,
    ADAPTIVE_STRATEGY_KEY,
    VERIFY_KEY,
    SpecConfig,
)
from spectune.errors import SpecError
from spectune.search.arms import Arm

__all__ = ["DEFAULT_TIERS", "arm_extra", "arm_of_config"]

#: SGLang's default ``candidate_steps`` (reference/engines.md §2.4).
DEFAULT_TIERS = (1, 3, 7)
_ADAPTIVE_KEYS = (VERIFY_KEY, ADAPTIVE_KEY, ADAPTIVE_CONFIG_KEY, ADAPTIVE_STRATEGY_KEY)


def arm_extra(arm: Arm) -> tuple[tuple[str, Any], ...]:
    """The ``SpecConfig.extra`` items that say ``arm``'s adaptive mode (none for fixed k).

    >>> from spectune.search.arms import parse_arm
    >>> arm_extra(parse_arm("eagle3/tiers:1,3,5"))
    (('speculative_adaptive', True), ('speculative_adaptive_config', {'candidate_steps': [1, 3, 5]}))
    """  # noqa: E501
    if arm.verify:
        return ((VERIFY_KEY, True),)
    if arm.tiers is not None:
        items: list[tuple[str, Any]] = [
            (ADAPTIVE_KEY, True),
            (ADAPTIVE_CONFIG_KEY, {"candidate_steps": list(arm.tiers)}),
        ]
        if arm.strategy is not None:
            items.append((ADAPTIVE_STRATEGY_KEY, arm.strategy))
        return tuple(items)
    return ()


def without_adaptive(extra: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """``extra`` less the keys an arm's adaptive mode owns."""
    return tuple((k, v) for k, v in extra.items() if k not in _ADAPTIVE_KEYS)


def arm_of_config(drafter: str, spec: SpecConfig) -> Arm:
    """The arm that ``spec`` runs for the drafter named ``drafter``.

    Raises :class:`~spectune.errors.SpecError` for an adaptive setting spectune cannot
    read (a config file instead of inline JSON, tiers that are not whole numbers).
    """
    extra = dict(spec.extra)
    if extra.get(ADAPTIVE_KEY) is True:
        config = extra.get(ADAPTIVE_CONFIG_KEY, {})
        if not isinstance(config, Mapping):
            raise SpecError(
                f"--speculative-adaptive-config {config!r} is not inline JSON (a file?); "
                "write it inline, e.g. '{\"candidate_steps\":[1,3,7]}', so spectune can "
                "tell which tiers run"
            )
        steps = config.get("candidate_steps", list(DEFAULT_TIERS))
        if not isinstance(steps, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in steps
        ):
            raise SpecError(
                f"--speculative-adaptive-config: candidate_steps {steps!r} must be a list of "
                "whole numbers, e.g. [1,3,7]"
            )
        strategy = extra.get(ADAPTIVE_STRATEGY_KEY)
        return Arm.tiered(drafter, tuple(sorted(set(steps))), strategy)
    if extra.get(VERIFY_KEY) is True:
        if spec.per_batch_size is None:
            raise SpecError(
                "adaptive_verification is on without num_speculative_tokens_per_batch_size; "
                "give the table of optimal_K per batch size, e.g. [[1,32,5],[33,512,3]]"
            )
        return Arm.verifying(drafter, spec.num_speculative_tokens, spec.per_batch_size)
    if spec.per_batch_size is not None:
        return Arm.scheduled(drafter, spec.per_batch_size)
    return Arm(drafter, spec.num_speculative_tokens)
