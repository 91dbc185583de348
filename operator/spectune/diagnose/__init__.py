"""Findings from a window of observations: why speculation pays or does not."""

from spectune.diagnose.findings import (
    AcceptanceSummary,
    Code,
    Diagnosis,
    DraftCost,
    Finding,
    PredictionRow,
    Thresholds,
    diagnose,
    drafter_broken,
    pod_decay,
)

__all__ = [
    "AcceptanceSummary",
    "Code",
    "Diagnosis",
    "DraftCost",
    "Finding",
    "PredictionRow",
    "Thresholds",
    "diagnose",
    "drafter_broken",
    "pod_decay",
]
