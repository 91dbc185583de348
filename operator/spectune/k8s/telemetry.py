"""The operator's own metrics on ``/metrics``: what every SpecTuning is doing, in numbers.

``spectune run`` builds one :class:`OperatorMetrics` at start-up (never at import: a registry
of its own, so importing this module registers nothing) and puts it in kopf's ``memo``; the
tuning loop (``k8s/tuning.py``) reports to it after every step, and counts each trial it
starts. Every series is labelled with the SpecTuning's ``namespace`` and ``name``.

``spectune_trials`` is the number of trials *in the status*, which keeps only the latest 20,
so it stops moving on a long search; ``spectune_trials_started_total`` is the counter to
take ``increase()`` of (the SpecTuneTuningStuck alert and the dashboard's trial annotations
do). It exists at 0 from the SpecTuning's first status write, so "no trial started" is a
series with no increase rather than no series at all.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from spectune.api.status import Phase

__all__ = ["OperatorMetrics"]

_LABELS = ("namespace", "name")


class OperatorMetrics:
    """Gauges and counters per SpecTuning, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.acceptance = Gauge(
            "spectune_acceptance_rate",
            "Acceptance rate (accepted / drafted tokens) of the applied setting, latest window.",
            _LABELS,
            registry=r,
        )
        self.baseline_acceptance = Gauge(
            "spectune_baseline_acceptance",
            "First-position acceptance recorded at convergence (the drift reference).",
            _LABELS,
            registry=r,
        )
        self.drift_ratio = Gauge(
            "spectune_drift_ratio",
            "Latest first-position acceptance / the reference at convergence.",
            _LABELS,
            registry=r,
        )
        self.phase = Gauge(
            "spectune_phase",
            "1 for the SpecTuning's current phase, 0 for the others.",
            (*_LABELS, "phase"),
            registry=r,
        )
        self.trials = Gauge(
            "spectune_trials",
            "Trials in the SpecTuning's status (the latest 20 at most).",
            _LABELS,
            registry=r,
        )
        self.trials_started = Counter(
            "spectune_trials_started",
            "Trials started (canaries launched for a candidate arm) since the operator started.",
            _LABELS,
            registry=r,
        )
        self.applied_k = Gauge(
            "spectune_applied_k",
            "Draft length the target runs now (0: speculation off).",
            _LABELS,
            registry=r,
        )
        self.speedup = Gauge(
            "spectune_measured_speedup",
            "Expected speedup of the recommended setting against speculation off.",
            _LABELS,
            registry=r,
        )
        self.source_errors = Counter(
            "spectune_metric_source_errors",
            "Windows lost because the metric source failed.",
            _LABELS,
            registry=r,
        )

    def serve(self, port: int) -> None:
        """Serve ``/metrics`` on ``port`` in a background thread."""
        start_http_server(port, registry=self.registry)

    def set_phase(self, namespace: str, name: str, phase: Phase) -> None:
        """Mark ``phase`` as the current one (and make the SpecTuning's trial counter exist)."""
        self.trials_started.labels(namespace, name)
        for p in Phase:
            self.phase.labels(namespace, name, p.value).set(1.0 if p is phase else 0.0)

    def forget(self, namespace: str, name: str) -> None:
        """Drop every series of a deleted SpecTuning."""
        for g in (
            self.acceptance,
            self.baseline_acceptance,
            self.drift_ratio,
            self.trials,
            self.trials_started,
            self.applied_k,
            self.speedup,
            self.source_errors,
        ):
            with contextlib.suppress(KeyError):
                g.remove(namespace, name)
        for p in Phase:
            with contextlib.suppress(KeyError):
                self.phase.remove(namespace, name, p.value)
