"""``spectune status NS/NAME [-w]``: the live view of one SpecTuning, from the API server.

A body (DESIGN.md §2), like ``kubectl argo rollouts get rollout -w``: it reads the SpecTuning
with the current kubeconfig context (or in-cluster credentials), and shows what a platform
engineer asks of it: the phase and whether it is ready, the setting applied against the one
recommended, the acceptance curve of the applied arm, the trials with what was measured
beside what the acceptance model predicts, the last decision, and the conditions. ``-w``
follows the object (a watch on the API server) and redraws on every change.

*Measured* is the trial's own figure: the objective on the canary against the incumbent in
the same windows (``status.trials``), as a gain (above 1 is better, for a latency the
incumbent's over the canary's). *Predicted* is what the acceptance model says of the arm
from the acceptance measured on it (the canary's per-position counters, kept in
``status.history``): the speedup at its ``k`` against speculation off at the draft cost
``--draft-cost`` (the operator's ``SPECTUNE_DRAFT_COST`` default, 0.1). A gap between them is
what the model does not see (batching, memory, the target's load): the reason the operator
measures instead of trusting the prediction.

Imports of kubernetes and rich stay inside the functions: ``spectune --help`` must not pay
for them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spectune.errors import InputError, SourceUnavailableError

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["register", "split_ref", "view"]

#: The operator's default draft cost (``spectune.settings.Settings.draft_cost``).
DEFAULT_DRAFT_COST = 0.1
#: Objectives where lower is better (a latency); the others are rates.
_LATENCIES = frozenset({"tpotP95", "e2eP95", "ttftP95"})


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``spectune status``."""
    from spectune.cli import HELP_FORMAT, examples

    p = subparsers.add_parser(
        "status",
        help="show a SpecTuning from the API server: phase, setting, trials (-w to follow)",
        description=(
            "Read a SpecTuning from the API server (the kubeconfig's current context) and show "
            "its phase, the applied and recommended settings, the acceptance curve, the "
            "trials with their measured gain beside the acceptance model's prediction, the "
            "last decision and the conditions. With -w, follow it and redraw on every change "
            "(Ctrl-C to stop). Also a kubectl plugin: kubectl spectune status NS/NAME."
        ),
        epilog=examples(
            "spectune status llm/llama-70b",
            "spectune status llama-70b -n llm -w",
            "spectune status llm/llama-70b --json | jq .trials",
        ),
        formatter_class=HELP_FORMAT,
    )
    p.add_argument("ref", metavar="NS/NAME", help="the SpecTuning, as NAMESPACE/NAME or NAME")
    p.add_argument(
        "-n", "--namespace", help="namespace of a bare NAME (default: the context's namespace)"
    )
    p.add_argument("-w", "--watch", action="store_true", help="follow the SpecTuning's changes")
    p.add_argument(
        "--draft-cost",
        type=float,
        default=DEFAULT_DRAFT_COST,
        metavar="C",
        help=f"draft cost for the predicted speedups (default {DEFAULT_DRAFT_COST:g}, "
        "the operator's SPECTUNE_DRAFT_COST default)",
    )
    p.add_argument("--json", action="store_true", help="print the view as JSON (one per change)")
    p.set_defaults(func=_run)


def split_ref(ref: str, namespace: str | None) -> tuple[str | None, str]:
    """``(namespace, name)`` of ``NS/NAME`` or ``NAME`` (the namespace then from ``-n``).

    >>> split_ref("llm/llama-70b", None)
    ('llm', 'llama-70b')
    >>> split_ref("llama-70b", "llm")
    ('llm', 'llama-70b')
    """
    ns, sep, name = ref.rpartition("/")
    if sep and (not ns or not name or "/" in ns):
        raise InputError(f"{ref!r}: write the SpecTuning as NAMESPACE/NAME or NAME")
    if sep and namespace and namespace != ns:
        raise InputError(f"{ref!r} names namespace {ns}, but -n says {namespace}; give one")
    return (ns if sep else namespace), name


# -- the view (pure: a SpecTuning object in, a JSON-able dict out) ---------------------------


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


def _gain(metric: str, canary: float | None, incumbent: float | None) -> float | None:
    """The canary's measured gain over the incumbent on the objective (above 1 is better)."""
    if canary is None or incumbent is None or canary <= 0 or incumbent <= 0:
        return None
    return incumbent / canary if metric in _LATENCIES else canary / incumbent


def _predicted(windows: list[Any], draft_cost: float) -> tuple[float | None, float | None]:
    """(acceptance rate, predicted speedup at the arm's k) from the canary's counters."""
    from spectune.core import predict_speedup, survival_from_counts

    drafts, k = 0.0, 0
    per_pos: list[float] = []
    for w in windows:
        c = w.canary
        if c is None or not c.drafts or not c.accepted_per_pos:
            continue
        k = max(k, c.k)
        counts = list(c.accepted_per_pos)
        per_pos += [0.0] * (len(counts) - len(per_pos))
        per_pos = [a + (counts[i] if i < len(counts) else 0.0) for i, a in enumerate(per_pos)]
        drafts += c.drafts
    if drafts <= 0 or k <= 0 or len(per_pos) < k:
        return None, None
    survival = survival_from_counts(per_pos[:k], drafts)
    rate = sum(per_pos[:k]) / (drafts * k)
    table = predict_speedup(survival, draft_cost)
    return rate, float(table.speedup[k])


def view(body: Mapping[str, Any], draft_cost: float = DEFAULT_DRAFT_COST) -> dict[str, Any]:
    """What ``spectune status`` shows of a SpecTuning object, as JSON-able data.

    Raises :class:`~spectune.errors.InputError` when the status is not a SpecTuning's (a
    newer operator's fields are ignored, as the operator itself ignores them).
    """
    from spectune.api.status import parse_status
    from spectune.api.validation import InvalidSpecError
    from spectune.k8s.projection import load_memory

    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    try:
        status = parse_status(body)
    except InvalidSpecError as exc:
        raise InputError(f"the SpecTuning's status cannot be read: {exc}") from None
    try:
        memory = load_memory(status.history if isinstance(status.history, str | dict) else None)
    except (ValueError, KeyError, TypeError):
        memory = None  # an unreadable history loses the predictions, not the view
    metric = str((spec.get("objective") or {}).get("metric") or "tpotP95")
    recorded: dict[str, list[Any]] = {}
    for kept in memory.history.trials if memory is not None else ():
        recorded.setdefault(kept.arm, []).append(kept)
    trials = []
    for t in status.trials:
        # The memory's record of the same trial: same arm, start within a second (else the
        # arm's latest: the memory is compacted, the status keeps the last 20).
        same = recorded.get(t.arm, [])
        at = t.started_at.timestamp()
        record = next((r for r in same if abs(r.started_s - at) < 1.0), same[-1] if same else None)
        rate, predicted = _predicted(list(record.windows), draft_cost) if record else (None, None)
        trials.append(
            {
                "arm": t.arm,
                "outcome": t.outcome.value,
                "started": t.started_at.isoformat(),
                "windows": t.windows,
                "incumbent": t.incumbent,
                "canary_objective": _num(t.canary_objective),
                "incumbent_objective": _num(t.incumbent_objective),
                "measured_gain": _gain(metric, t.canary_objective, t.incumbent_objective),
                "acceptance": rate,
                "predicted_speedup": predicted,
                "load_ratio": _num(t.load_ratio),
                "reason": t.reason,
            }
        )
    conditions = [
        {"type": c.type, "status": c.status.value, "reason": c.reason, "message": c.message}
        for c in status.conditions
    ]
    rec = status.recommendation
    applied = status.applied
    ended = [t for t in trials if t["outcome"] != "running"]
    decision = rec.reason if rec is not None and rec.reason else ""
    if ended and ended[-1]["reason"]:
        decision = f"{ended[-1]['arm']} {ended[-1]['outcome']}: {ended[-1]['reason']}"
    acc = status.acceptance
    return {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "target": (spec.get("targetRef") or {}).get("name"),
        "mode": spec.get("mode", "auto"),
        "objective": metric,
        "phase": status.phase.value if status.phase is not None else None,
        "ready": next((c for c in conditions if c["type"] == "Ready"), None),
        "applied": None
        if applied is None
        else {
            "arm": applied.arm,
            "k": applied.k,
            "speedup": _num(applied.speedup),
            "adaptive": applied.adaptive,
        },
        "recommendation": None
        if rec is None
        else {
            "arm": rec.arm,
            "k": rec.k,
            "expected_speedup": _num(rec.expected_speedup),
            "interval": None if rec.interval is None else [rec.interval.low, rec.interval.high],
            "reason": rec.reason,
        },
        "acceptance": None
        if acc is None
        else {
            "rate": acc.rate,
            "per_position": list(acc.per_position),
            "mean_accepted_length": _num(acc.mean_accepted_length),
            "window": acc.window,
        },
        "diagnosis": [{"code": f.code, "message": f.message} for f in status.diagnosis],
        "trials": trials,
        "last_decision": decision,
        "conditions": conditions,
        "draft_cost": draft_cost,
    }


# -- rendering ---------------------------------------------------------------------------------


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}×"


def _phase_style(phase: str | None, ready: Mapping[str, Any] | None) -> str:
    if phase in ("Failed", "Degraded") or (ready is not None and ready["status"] == "False"):
        return "bold red"
    if phase in ("Converged", "Monitoring"):
        return "bold green"
    return "bold yellow"


def render(v: Mapping[str, Any]) -> RenderableType:
    """The view as rich renderables: a header, the curve, the trials, the conditions."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    ready = v["ready"]
    head = Table.grid(padding=(0, 2))
    head.add_column(style="dim")
    head.add_column()
    head.add_row("Name", f"{v['namespace']}/{v['name']}  (target Deployment {v['target']})")
    phase = Text(str(v["phase"] or "-"), style=_phase_style(v["phase"], ready))
    if ready is not None:
        phase.append(f"   Ready={ready['status']}", style="")
        if ready["reason"]:
            phase.append(f" ({ready['reason']})")
    head.add_row("Phase", phase)
    head.add_row("Mode", f"{v['mode']}, objective {v['objective']}")
    app, rec = v["applied"], v["recommendation"]
    head.add_row(
        "Applied",
        "-"
        if app is None
        else f"{app['arm']}  "
        + (
            "speedup not measured yet"
            if app["speedup"] is None
            else f"speedup {_x(app['speedup'])} (measured)"
        ),
    )
    if app is not None and app.get("adaptive"):
        head.add_row("Adaptive", str(app["adaptive"]))
    if rec is not None:
        span = rec["interval"]
        ci = f" [{span[0]:.2f}, {span[1]:.2f}]" if span else ""
        same = " (applied)" if app is not None and app["arm"] == rec["arm"] else ""
        head.add_row(
            "Recommended", f"{rec['arm']}{same}  expected {_x(rec['expected_speedup'])}{ci}"
        )
    else:
        head.add_row("Recommended", "-")
    if v["last_decision"]:
        head.add_row("Last decision", v["last_decision"])
    parts: list[Any] = [head]

    acc = v["acceptance"]
    if acc is not None and acc["per_position"]:
        curve = Table(title="Acceptance of the applied arm", title_justify="left", box=None)
        curve.add_column("position", justify="right")
        curve.add_column("P(accepted)", justify="right")
        curve.add_column("")
        for i, p in enumerate(acc["per_position"], start=1):
            curve.add_row(str(i), f"{p:.2f}", "█" * round(p * 30))
        length = acc["mean_accepted_length"]
        note = f"rate {acc['rate']:.2f}" + (
            f", mean accepted length {length:.2f}" if length else ""
        )
        parts += [Text(""), curve, Text(f"  {note} over {acc['window'] or 'the last window'}")]

    if v["trials"]:
        t = Table(title="Trials (oldest first)", title_justify="left")
        for col, just in (("arm", "left"), ("outcome", "left"), ("win", "right"),
                          ("accept", "right"), ("measured", "right"), ("predicted", "right"),
                          ("load", "right"), ("reason", "left")):  # fmt: skip
            t.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
        style = {"aborted": "red", "infeasible": "red", "running": "yellow"}
        for tr in v["trials"]:
            t.add_row(
                tr["arm"],
                Text(tr["outcome"], style=style.get(tr["outcome"], "")),
                str(tr["windows"]),
                "-" if tr["acceptance"] is None else f"{tr['acceptance']:.2f}",
                _x(tr["measured_gain"]),
                _x(tr["predicted_speedup"]),
                "-" if tr["load_ratio"] is None else f"{tr['load_ratio']:.2f}",
                tr["reason"],
            )
        parts += [Text(""), t]
        parts.append(
            Text(
                "  measured: gain over the incumbent, same windows; predicted: the acceptance "
                f"model's speedup over off at draft cost {v['draft_cost']:g}",
                style="dim",
            )
        )
    if v["diagnosis"]:
        parts.append(Text(""))
        parts += [Text(f"  {f['code']}: {f['message']}") for f in v["diagnosis"]]
    if v["conditions"]:
        c = Table(title="Conditions", title_justify="left")
        for col in ("type", "status", "reason", "message"):
            c.add_column(col, overflow="fold")
        for cond in v["conditions"]:
            c.add_row(
                cond["type"],
                Text(cond["status"], style="green" if cond["status"] == "True" else "red"),
                cond["reason"],
                cond["message"],
            )
        parts += [Text(""), c]
    return Group(*parts)


# -- the API server ----------------------------------------------------------------------------


def _client() -> tuple[Any, str]:
    """A CustomObjectsApi for the kubeconfig's context (or in-cluster), and its namespace."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        config.load_kube_config()  # type: ignore[no-untyped-call]
        _, active = config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
        ns = str((active or {}).get("context", {}).get("namespace") or "default")
    except (ConfigException, OSError, TypeError):
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except ConfigException:
            raise InputError(
                "no kubeconfig (KUBECONFIG or ~/.kube/config) and not in a cluster; point "
                "KUBECONFIG at the cluster that runs spectune"
            ) from None
        ns = "default"
    return client.CustomObjectsApi(), ns


def _api_error(exc: Exception, ns: str, name: str) -> Exception:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(exc, ApiException):
        if exc.status == 404:
            return InputError(
                f"SpecTuning {ns}/{name} not found (kubectl get spt -n {ns} lists them; is the "
                "CRD installed?)"
            )
        if exc.status in (401, 403):
            return SourceUnavailableError(
                f"the API server refused to read SpecTuning {ns}/{name} (HTTP {exc.status}); "
                "it takes get (and watch, for -w) on spectunings.spectune.io"
            )
        return SourceUnavailableError(
            f"the API server answered HTTP {exc.status} for SpecTuning {ns}/{name}"
        )
    if isinstance(exc, HTTPError | OSError):
        return SourceUnavailableError(f"cannot reach the API server: {type(exc).__name__}")
    return exc


def _objects(api: Any, ns: str, name: str, watch: bool) -> Iterator[dict[str, Any]]:
    """The SpecTuning now, then (``watch``) every new version of it, as the API sends them."""
    from kubernetes import watch as kwatch

    from spectune.api.names import GROUP, PLURAL, VERSION

    try:
        first: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    except Exception as exc:  # mapped to spectune's errors, else re-raised
        raise _api_error(exc, ns, name) from None
    yield first
    version = first["metadata"].get("resourceVersion")
    while watch:
        w = kwatch.Watch()  # type: ignore[no-untyped-call]
        try:
            for event in w.stream(  # type: ignore[no-untyped-call]
                api.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL,
                field_selector=f"metadata.name={name}", resource_version=version,
                timeout_seconds=300,
            ):  # fmt: skip
                obj = event["object"]
                if event["type"] == "DELETED":
                    raise InputError(f"SpecTuning {ns}/{name} was deleted")
                if event["type"] in ("ADDED", "MODIFIED"):
                    version = obj["metadata"].get("resourceVersion", version)
                    yield obj
        except InputError:
            raise
        except Exception as exc:
            from kubernetes.client.exceptions import ApiException

            if isinstance(exc, ApiException) and exc.status == 410:  # resourceVersion too old
                version = None
                continue
            raise _api_error(exc, ns, name) from None
        finally:
            w.stop()  # type: ignore[no-untyped-call]


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    if not (math.isfinite(args.draft_cost) and args.draft_cost >= 0):
        raise InputError(f"--draft-cost {args.draft_cost:g}: must be a number at least 0")
    ns, name = split_ref(args.ref, args.namespace)
    api, context_ns = _client()
    ns = ns or context_ns
    console = Console()
    objects = _objects(api, ns, name, args.watch)
    if args.json:
        for obj in objects:
            print(json.dumps(view(obj, args.draft_cost)), flush=True)
        return 0
    if args.watch and console.is_terminal:
        from rich.live import Live

        with Live(console=console, auto_refresh=False, screen=False) as live:
            for obj in objects:
                live.update(_stamped(view(obj, args.draft_cost)), refresh=True)
        return 0
    last = None
    for obj in objects:
        shown = view(obj, args.draft_cost)
        if shown != last:  # a watch also sends writes that change nothing shown
            console.print(_stamped(shown) if args.watch else render(shown))
            last = shown
        sys.stdout.flush()
    return 0


def _stamped(v: Mapping[str, Any]) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    now = datetime.now(UTC).strftime("%H:%M:%S UTC")
    return Group(Text(f"-- {now} (watching; Ctrl-C to stop)", style="dim"), render(v))
