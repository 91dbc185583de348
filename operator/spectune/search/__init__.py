"""The tuning policy: arms, posteriors, counterfactuals, guardrails, stopping rule.

Everything here is pure and rebuildable from the trial history alone. This package never
imports a body (the simulator or the Kubernetes code): it sees the world only through
metric text and port calls (DESIGN.md §2).
"""

from spectune.search.arms import Arm, parse_arm

__all__ = ["Arm", "parse_arm"]
