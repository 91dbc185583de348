"""The operator's kopf handlers: the only module that imports kopf.

Each handler parses the body into the api models, calls a plain function of
``spectune.k8s`` and maps project errors to kopf's: :class:`~spectune.errors.SpecError` to
``kopf.PermanentError`` (with a ``Ready=False, reason=InvalidSpec`` condition naming the
field), :class:`~spectune.errors.NoDataError` and
:class:`~spectune.errors.SourceUnavailableError` to ``kopf.TemporaryError`` with a delay.
Collaborators (the Kubernetes client, the settings, the clock, the operator's metrics) live
in kopf's ``memo``, set at start-up; there are no module globals.

``spectune run`` (``spectune/run.py``) starts kopf through :func:`run_operator`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from spectune.api.names import GROUP, PLURAL, VERSION
from spectune.api.spec import parse_spec
from spectune.api.status import ConditionStatus, parse_status
from spectune.errors import NoDataError, SourceUnavailableError, SpecError
from spectune.k8s.connect import api_client
from spectune.k8s.projection import ConditionUpdate, merge_conditions
from spectune.k8s.telemetry import OperatorMetrics
from spectune.k8s.tuning import TuningLoop, WallClock, check_supported, cleanup
from spectune.settings import Settings, seniority_priority

__all__ = ["configure_logging", "run_operator"]

_PREFIX = "spectune.io"
#: Threads for the blocking Kubernetes and Prometheus calls of every SpecTuning together.
IO_THREADS = 16


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Configure kopf and put the collaborators into ``memo``."""
    cfg: Settings = memo.get("settings") or Settings.from_env()
    memo.settings = cfg
    # Standalone unless the replicas share a peering object; then it is mandatory: a replica
    # that cannot see the object stays paused rather than act beside another (kopf's rule).
    settings.peering.standalone = cfg.peering is None
    if cfg.peering is not None:
        settings.peering.name = cfg.peering
        settings.peering.mandatory = True
        settings.peering.lifetime = cfg.peering_lifetime_s
        settings.peering.priority = (
            cfg.peering_priority
            if cfg.peering_priority is not None
            else seniority_priority(time.time(), secrets.randbelow(1000))
        )
    # Keep kopf's own bookkeeping in annotations: the status schema is ours alone.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    if cfg.namespaces:
        # A fixed list of namespaces needs no cluster-wide namespace scan: without this kopf
        # tries to list namespaces, is refused by namespaced RBAC and falls back only after
        # about a minute of retries.
        settings.scanning.disabled = True
    # The Kubernetes and Prometheus clients block, so every call runs in a thread; asyncio's
    # default pool (CPU count + 4 threads) queues hundreds of SpecTunings' calls behind
    # each other, and a window's reads arrive late. The calls wait on the network.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="spectune-io")
    )
    memo.api = api_client(connections=IO_THREADS)
    memo.clock = WallClock()
    memo.telemetry = OperatorMetrics()
    if cfg.metrics_port:
        memo.telemetry.serve(cfg.metrics_port)


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    """Close the Kubernetes client."""
    api = memo.get("api")
    if api is not None:
        api.close()


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def validate(body: kopf.Body, meta: kopf.Meta, patch: kopf.Patch, **_: Any) -> None:
    """Reject an invalid spec for good, with a condition naming the field."""
    try:
        check_supported(parse_spec(body))
    except SpecError as exc:
        now = datetime.now(tz=UTC)
        try:
            previous = parse_status(body).conditions
        except SpecError:
            previous = ()
        update = ConditionUpdate("Ready", ConditionStatus.FALSE, "InvalidSpec", str(exc))
        conditions = merge_conditions(previous, [update], now, meta.get("generation"))
        patch.status["phase"] = "Failed"
        patch.status["conditions"] = [c.model_dump(mode="json") for c in conditions]
        raise kopf.PermanentError(str(exc)) from None


@kopf.index(GROUP, VERSION, PLURAL)
def spectunings_by_target(
    namespace: str | None, name: str, spec: kopf.Spec, meta: kopf.Meta, **_: Any
) -> dict[tuple[str, str], tuple[str, str]] | None:
    """Index the live SpecTunings by their target Deployment, from kopf's own watch.

    Each tuning loop asks it whether an older SpecTuning already tunes its target; listing
    every SpecTuning of the namespace on every turn instead cost one list per SpecTuning and
    window, most of the operator's memory at a few hundred SpecTunings.
    """
    target = (spec.get("targetRef") or {}).get("name")
    if target is None or meta.get("deletionTimestamp"):
        return None
    return {(str(namespace), str(target)): (str(meta.get("creationTimestamp", "")), name)}


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0)
async def tune(body: kopf.Body, meta: kopf.Meta, memo: kopf.Memo, **kwargs: Any) -> None:
    """Run the SpecTuning's tuning loop until it is deleted or the operator stops."""
    index: kopf.Index[tuple[str, str], tuple[str, str]] = kwargs["spectunings_by_target"]

    def emit(kind: str, reason: str, message: str) -> None:
        kopf.event(body, type=kind, reason=reason, message=message)

    def claims(target: str) -> list[tuple[str, str]]:
        return list(index.get((meta["namespace"], target), ()))

    loop = TuningLoop(memo.api, body, memo.settings, memo.clock, memo.telemetry, emit, claims)
    try:
        await loop.run()
    except (NoDataError, SourceUnavailableError) as exc:
        raise kopf.TemporaryError(str(exc), delay=memo.settings.poll_s) from None


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def delete(
    body: kopf.Body,
    meta: kopf.Meta,
    memo: kopf.Memo,
    logger: Any,
    runtime: timedelta,
    **_: Any,
) -> None:
    """Remove the canaries; leave the target on its last setting (or restore the original).

    A cleanup step that failed is tried again every poll for ``SPECTUNE_CLEANUP_TIMEOUT_SECONDS``;
    after that the finalizer goes anyway, with a Warning event saying what remains, so a
    deletion never hangs on an API error (canaries are owned by the SpecTuning: Kubernetes'
    garbage collector removes them with it).
    """
    report = await cleanup(memo.api, body, memo.settings.drafter_model_allow_list)
    if report.failed and runtime.total_seconds() < memo.settings.cleanup_timeout_s:
        raise kopf.TemporaryError(str(report), delay=memo.settings.poll_s)
    if report.failed:
        kopf.event(
            body,
            type="Warning",
            reason="CleanupIncomplete",
            message=(
                f"deleted after {runtime.total_seconds():.0f}s of cleanup; what remains: "
                + "; ".join(report.failed)
            )[:1024],
        )
    memo.telemetry.forget(meta["namespace"], meta["name"])
    logger.info(str(report))


def configure_logging(level: str = "info", log_format: str = "full") -> None:
    """Set the root logger's level and kopf's format (``full``, ``plain`` or ``json``).

    JSON lines carry the object a message concerns (kopf's ``object`` key: the SpecTuning's
    namespace and name), so a log pipeline can filter one SpecTuning's story.
    """
    formats = {
        "full": kopf.LogFormat.FULL,
        "plain": kopf.LogFormat.PLAIN,
        "json": kopf.LogFormat.JSON,
    }
    if log_format not in formats:
        raise SpecError(f"log format {log_format!r}: use one of {', '.join(formats)}")
    levels = {
        "debug": logging.DEBUG, "info": logging.INFO,
        "warning": logging.WARNING, "error": logging.ERROR,
    }  # fmt: skip
    if level not in levels:
        raise SpecError(f"log level {level!r}: use one of {', '.join(levels)}")
    kopf.configure(debug=level == "debug", log_format=formats[log_format], log_refkey="object")
    logging.getLogger().setLevel(levels[level])


def run_operator(settings: Settings, *, log_level: str = "info", log_format: str = "full") -> None:
    """Run the operator in this process until it is stopped (SIGTERM/SIGINT)."""
    configure_logging(log_level, log_format)
    liveness = (
        f"http://0.0.0.0:{settings.liveness_port}/healthz" if settings.liveness_port else None
    )
    kopf.run(
        standalone=settings.peering is None,  # startup() configures the peering itself
        clusterwide=not settings.namespaces,
        namespaces=list(settings.namespaces),
        liveness_endpoint=liveness,
        memo=kopf.Memo(settings=settings),
    )
