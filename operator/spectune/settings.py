"""The operator's settings: one model, read from the environment in one place.

``spectune run`` calls :meth:`Settings.from_env` once at start-up and hands the result to
kopf's ``memo``; nothing else reads the environment. Every field names its variable, unit
and default (the README's "Running the operator" table is this docstring).

==============================  ==========================================================
variable                        meaning
==============================  ==========================================================
``SPECTUNE_NAMESPACES``         comma-separated namespaces to watch; empty: all namespaces
``SPECTUNE_PROMETHEUS_URL``     when set, used instead of every SpecTuning's
                                ``spec.metrics.prometheus.url`` (an operator that reaches
                                Prometheus by another address than users write)
``SPECTUNE_LIVENESS_PORT``      port of kopf's ``/healthz`` liveness endpoint; 0: off
``SPECTUNE_METRICS_PORT``       port of the operator's own ``/metrics``; 0: off
``SPECTUNE_POLL_SECONDS``       how often to look again while waiting (rollouts, a
                                suspended or paused SpecTuning, a spec or model change
                                during a window), seconds
``SPECTUNE_METRICS_FAILURES``   consecutive failed windows during a trial before it ends
``SPECTUNE_TIME_SCALE``         divides every duration of a spec (window, drift ``for``,
                                ``every``) and the readiness timeout: for demos and tests
                                against a time-scaled simulator; 1 in production. Rates
                                and windows in the status and events stay in the pods'
                                own units (per simulated second)
``SPECTUNE_READY_TIMEOUT_SECONDS``  a canary not ready after this long is infeasible, seconds
``SPECTUNE_DRAFT_COST``         draft cost ``c`` assumed by ``mode: recommend``, by the
                                status diagnosis and by the search until it has measured
                                one (its first trial), in target-step units
``SPECTUNE_PROMETHEUS_URL_ALLOWLIST``  comma-separated Prometheus URLs a SpecTuning may
                                name in ``spec.metrics.prometheus.url``: an entry allows
                                itself and any path below it on the same scheme, host and
                                port; empty: any URL
``SPECTUNE_SCRAPE_MAX_BYTES``   the largest metrics page read from a pod
                                (``metrics.scrape``), bytes; a larger one is refused
``SPECTUNE_PEERING``            name of the kopf peering object (a KopfPeering in each
                                watched namespace, or a ClusterKopfPeering cluster-wide)
                                shared by the operator's replicas; unset: standalone, one
                                replica only
``SPECTUNE_PEERING_PRIORITY``   this replica's peering priority (the highest acts, the
                                others pause); unset: by seniority, the oldest replica acts
``SPECTUNE_PEERING_LIFETIME_SECONDS``  a replica not heard from for this long is taken for
                                dead and a standby takes over, seconds (at least 10)
``SPECTUNE_CLEANUP_TIMEOUT_SECONDS``  how long a deleted SpecTuning's cleanup is retried
                                (canaries, restore) before its finalizer goes anyway, with
                                a ``CleanupIncomplete`` event saying what remains, seconds
``SPECTUNE_STATUS_INTERVAL_SECONDS``  at most one status write per this many seconds per
                                SpecTuning, except when its phase or a condition's status
                                or reason changes; a write with nothing new is never sent
``SPECTUNE_DRAFTER_MODEL_ALLOW_LIST``  comma-separated drafter models (``fnmatch`` patterns,
                                e.g. ``yuhuili/*``) that may run on a target started with
                                ``--trust-remote-code``; empty: none
==============================  ==========================================================

Peering is kopf's: it pauses, it does not fence. The replica with the highest priority acts;
the others keep their watches closed and their daemons stopped while its record (renewed every
lifetime − 5..10 s) is fresh. A killed leader is replaced once its record is a lifetime old; a
leader that stops cleanly removes its record, and a standby takes over at once. Two replicas
with one priority both pause (kopf's rule), so priorities must differ: by default each replica
takes :func:`seniority_priority` of its start time.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from spectune.errors import SpecError

__all__ = ["Settings", "seniority_priority"]

#: A Kubernetes object name (DNS-1123 subdomain), as the peering object's name must be.
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
#: The shortest peering lifetime: kopf renews a record every lifetime − 5..10 s (at least 1 s),
#: so below this a slow API round trip could let a live leader's record expire and a standby
#: act beside it.
MIN_PEERING_LIFETIME_S = 10


@dataclass(frozen=True)
class Settings:
    """The operator's settings (see the module docstring for the variables)."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty: every namespace (cluster-wide)."""
    prometheus_url: str | None = None
    """Overrides ``spec.metrics.prometheus.url`` of every SpecTuning when set."""
    liveness_port: int = 8080
    """Port of the liveness endpoint ``/healthz``; 0 disables it."""
    metrics_port: int = 8081
    """Port of the operator's own ``/metrics``; 0 disables it."""
    poll_s: float = 15.0
    """Seconds between looks while waiting for a rollout or a paused SpecTuning."""
    metrics_failures: int = 3
    """Consecutive failed metric windows during a trial before the trial ends."""
    time_scale: float = 1.0
    """Spec durations and the readiness timeout are divided by this (tests, demos)."""
    draft_cost: float = 0.1
    """Draft cost ``c`` assumed where none is measured, in target-step units."""
    ready_timeout_s: float = 1800.0
    """A canary not ready after this long (before ``time_scale``) is infeasible, seconds."""
    prometheus_url_allowlist: tuple[str, ...] = ()
    """Prometheus URLs a SpecTuning may name (and paths below them); empty: any."""
    scrape_max_bytes: int = 8 * 1024 * 1024
    """The largest metrics page read from a pod, in bytes (after decompression)."""
    peering: str | None = None
    """Name of the kopf peering object the replicas share; None: standalone (one replica)."""
    peering_priority: int | None = None
    """This replica's peering priority (the highest acts); None: :func:`seniority_priority`."""
    peering_lifetime_s: int = 60
    """A replica not heard from for this long is taken for dead, seconds."""
    cleanup_timeout_s: float = 300.0
    """A deleted SpecTuning's failed cleanup is retried this long before it goes, seconds."""
    status_interval_s: float = 10.0
    """Fewest seconds between two status writes of one SpecTuning in the same phase and
    conditions (a phase or condition change is written at once)."""
    drafter_model_allow_list: tuple[str, ...] = ()
    """Drafter models (``fnmatch`` patterns) that may run on a ``--trust-remote-code``
    target, besides the ones it already runs; empty: none. The authority: a SpecTuning's
    own ``trustRemoteCode.allowedDrafterModels`` can only narrow it."""

    def __post_init__(self) -> None:
        for name in ("liveness_port", "metrics_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise SpecError(f"{_var(name)}: a port is 0..65535, got {port}")
        if not self.poll_s > 0:
            raise SpecError(f"{_var('poll_s')}: must be above 0 seconds, got {self.poll_s:g}")
        if self.metrics_failures < 1:
            raise SpecError(f"{_var('metrics_failures')}: must be at least 1")
        if not self.time_scale > 0:
            raise SpecError(f"{_var('time_scale')}: must be above 0, got {self.time_scale:g}")
        if self.draft_cost < 0:
            raise SpecError(f"{_var('draft_cost')}: must be at least 0")
        if self.cleanup_timeout_s < 0:
            raise SpecError(f"{_var('cleanup_timeout_s')}: must be at least 0")
        if self.status_interval_s < 0:
            raise SpecError(f"{_var('status_interval_s')}: must be at least 0")
        if self.prometheus_url is not None and not self.prometheus_url.startswith(
            ("http://", "https://")
        ):
            raise SpecError(f"{_var('prometheus_url')}: must start with http:// or https://")
        for entry in self.prometheus_url_allowlist:
            if not entry.startswith(("http://", "https://")):
                raise SpecError(
                    f"{_var('prometheus_url_allowlist')}: {entry!r} must start with http:// or "
                    "https://"
                )
        if self.scrape_max_bytes < 1024:
            raise SpecError(f"{_var('scrape_max_bytes')}: must be at least 1024 bytes")
        if self.peering is not None and not _OBJECT_NAME.match(self.peering):
            raise SpecError(
                f"{_var('peering')}={self.peering!r}: must be a Kubernetes object name "
                "(lower-case letters, digits, '-' and '.'), the KopfPeering's name"
            )
        if self.peering_lifetime_s < MIN_PEERING_LIFETIME_S:
            raise SpecError(
                f"{_var('peering_lifetime_s')}: must be at least {MIN_PEERING_LIFETIME_S} "
                f"seconds, got {self.peering_lifetime_s}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from ``env`` (the process environment by default).

        Raises :class:`~spectune.errors.SpecError` naming the variable that is wrong.
        """
        source = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = source.get(_var(f.name))
            if raw is None or raw.strip() == "":
                continue
            raw = raw.strip()
            try:
                if f.name in ("namespaces", "prometheus_url_allowlist", "drafter_model_allow_list"):
                    values[f.name] = tuple(n.strip() for n in raw.split(",") if n.strip())
                elif f.name in ("prometheus_url", "peering"):
                    values[f.name] = raw
                elif f.name in (
                    "liveness_port",
                    "metrics_port",
                    "metrics_failures",
                    "scrape_max_bytes",
                    "peering_priority",
                    "peering_lifetime_s",
                ):
                    values[f.name] = int(raw)
                else:
                    values[f.name] = float(raw)
            except ValueError:
                raise SpecError(f"{_var(f.name)}={raw!r} is not a number") from None
        return cls(**values)  # type: ignore[arg-type]

    def scaled(self, seconds: float) -> float:
        """A spec duration in wall seconds under :attr:`time_scale`."""
        return seconds / self.time_scale


def seniority_priority(started_s: float, tiebreak: int) -> int:
    """A peering priority that ranks replicas by age: the earlier ``started_s``, the higher.

    kopf lets the replica with the highest priority act. Ranking by start time means a replica
    that starts later (a rollout's new pod, a restarted one) joins as a standby and never takes
    over from a leader that is working, so a restart costs no handover; the leader changes only
    when it leaves or dies. ``tiebreak`` (0..999, random per process) keeps two replicas started
    in the same millisecond apart, since equal priorities pause both (kopf's rule).
    """
    if not 0 <= tiebreak < 1000:
        raise ValueError(f"tiebreak must be 0..999, got {tiebreak}")
    return -(int(started_s * 1000) * 1000 + tiebreak)


_NAMES = {
    "poll_s": "SPECTUNE_POLL_SECONDS",
    "ready_timeout_s": "SPECTUNE_READY_TIMEOUT_SECONDS",
    "peering_lifetime_s": "SPECTUNE_PEERING_LIFETIME_SECONDS",
    "cleanup_timeout_s": "SPECTUNE_CLEANUP_TIMEOUT_SECONDS",
    "status_interval_s": "SPECTUNE_STATUS_INTERVAL_SECONDS",
}


def _var(field_name: str) -> str:
    return _NAMES.get(field_name, "SPECTUNE_" + field_name.upper())
