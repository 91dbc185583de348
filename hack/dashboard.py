"""Write dashboards/spectune.json (and the chart's copy): the spectune Grafana dashboard.

    python hack/dashboard.py          # rewrite both files
    python hack/dashboard.py --check  # exit 1 when either is out of date

The panels read the recording rules of deploy/alerts/spectune-rules.yaml (per namespace,
deployment, model_name and engine: vLLM, SGLang and TensorRT-LLM alike), the engines' own
queue and KV gauges, and the operator's metrics.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "dashboards" / "spectune.json"
CHART_COPY = REPO / "charts" / "spectune" / "files" / "spectune-dashboard.json"
MAX_K = 8
SEL = 'namespace=~"$namespace", deployment=~"$deployment"'
BY = "namespace, deployment, model_name"
# The workload's name from a pod's: a StatefulSet's <name>-<ordinal> and a LeaderWorkerSet's
# <name>-<group>[-<worker>] first, then a Deployment's <name>-<hash>-<5 chars> over it (as the
# rules file does).
POD_TO_WORKLOAD = '"deployment", "$1", "pod", "(.+?)(?:-[0-9]+){1,2}"'
POD_TO_DEPLOYMENT = '"deployment", "$1", "pod", "(.+)-[a-z0-9]{1,10}-[a-z0-9]{5}"'
DS = {"type": "prometheus", "uid": "${datasource}"}
#: SGLang's labels whose series repeat one value (the ranks of one scheduler), as in the
#: operator's catalogue: averaged away before a gauge is summed.
SGLANG_RANKS = "tp_rank, pp_rank, moe_ep_rank, attn_cp_rank"


def target(expr: str, legend: str, ref: str, instant: bool = False) -> dict[str, Any]:
    """A Prometheus query of a panel."""
    return {
        "datasource": DS,
        "expr": expr,
        "legendFormat": legend,
        "refId": ref,
        "instant": instant,
        "range": not instant,
    }


def panel(
    pid: int,
    title: str,
    kind: str,
    grid: tuple[int, int, int, int],
    targets: list[dict[str, Any]],
    description: str,
    unit: str = "none",
    **options: Any,
) -> dict[str, Any]:
    """A panel at ``grid`` = (x, y, w, h)."""
    x, y, w, h = grid
    out: dict[str, Any] = {
        "id": pid,
        "title": title,
        "type": kind,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
    }
    out.update(options)
    return out


def engine(vllm: str, sglang: str, trtllm: str, agg: str = "sum") -> str:
    """One gauge of the three engines aggregated per deployment (deployment derived from pod).

    SGLang's ranks of one scheduler repeat the value and are averaged first; its draft
    engine's own series (``engine_type="draft"``) are left out, as the operator does.
    """
    metric = (
        f'{vllm} or avg without ({SGLANG_RANKS}) ({sglang}{{engine_type!="draft"}}) or {trtllm}'
    )
    return (
        f"{agg} by ({BY}) (label_replace(label_replace({metric}, {POD_TO_WORKLOAD}), "
        f"{POD_TO_DEPLOYMENT}))"
        f" and on ({BY}) spectune:drafts:rate5m{{{SEL}}}"
    )


def speedup_for_k(k: int) -> str:
    """Expected speedup with draft length ``k`` from the measured per-position acceptance."""
    positions = "|".join(str(i) for i in range(k))
    return (
        f"(1 + sum by ({BY}) (spectune:position_acceptance:ratio_rate5m"
        f'{{{SEL}, position=~"{positions}"}})) / (1 + $draft_cost * {k})'
    )


def dashboard() -> dict[str, Any]:
    """The dashboard model."""
    panels = [
        panel(
            1,
            "Per-position acceptance",
            "barchart",
            (0, 0, 8, 9),
            [
                target(
                    f"spectune:position_acceptance:ratio_rate5m{{{SEL}}}", "{{position}}", "A", True
                )
            ],
            "P(draft tokens 0..p all accepted) per position p, last 5 minutes. A curve lowered "
            "evenly: the drafter got worse. A curve that falls off at deep positions: k is too "
            "long.",
            unit="percentunit",
            options={"xField": "position", "showValue": "auto", "orientation": "vertical"},
            transformations=[{"id": "reduce", "options": {"reducers": ["lastNotNull"]}}],
        ),
        panel(
            2,
            "Acceptance over time, with the drift baseline",
            "timeseries",
            (8, 0, 16, 9),
            [
                target(
                    f"spectune:first_position_acceptance:ratio_rate5m{{{SEL}}}",
                    "first position {{deployment}}",
                    "A",
                ),
                target(
                    f"spectune:first_position_acceptance:baseline{{{SEL}}}",
                    "baseline (trailing day) {{deployment}}",
                    "B",
                ),
                target(
                    f"0.85 * spectune:first_position_acceptance:baseline{{{SEL}}}",
                    "drift threshold {{deployment}}",
                    "C",
                ),
                target(
                    f"spectune:acceptance_rate:ratio_rate5m{{{SEL}}}",
                    "acceptance rate (all positions) {{deployment}}",
                    "D",
                ),
                target(
                    'spectune_baseline_acceptance{namespace=~"$namespace"}',
                    "operator's baseline at convergence {{name}}",
                    "E",
                ),
                target(
                    f'spectune:acceptance_rate:baseline{{{SEL}, engine="sglang"}}',
                    "acceptance-rate baseline (SGLang) {{deployment}}",
                    "F",
                ),
            ],
            "First-position acceptance against the trailing-day baseline that "
            "SpecTuneAcceptanceDrift uses, and the 85% line it fires under. SGLang exports no "
            "first-position counter: its drift is the acceptance rate against its own "
            "baseline. Trials and promotions are annotations.",
            unit="percentunit",
        ),
        panel(
            3,
            "Predicted speedup vs k",
            "barchart",
            (0, 9, 8, 9),
            [
                target(speedup_for_k(k), f"k={k}", chr(ord("A") + k - 1), True)
                for k in range(1, MAX_K + 1)
            ],
            "Expected speedup against speculation off if the draft length were k: (1 + sum of "
            "per-position acceptance below k) / (1 + c k), c = $draft_cost. Positions beyond the "
            "running k are not measured: those bars are a floor.",
            unit="x",
            transformations=[
                {"id": "reduce", "options": {"reducers": ["lastNotNull"]}},
            ],
        ),
        panel(
            4,
            "Mean accepted length, draft length, predicted speedup",
            "timeseries",
            (8, 9, 16, 9),
            [
                target(
                    f"spectune:mean_accepted_length:ratio_rate5m{{{SEL}}}",
                    "tokens per step {{deployment}}",
                    "A",
                ),
                target(f"spectune:draft_length:ratio_rate5m{{{SEL}}}", "k {{deployment}}", "B"),
                target(
                    f"spectune:predicted_speedup:ratio_rate5m{{{SEL}}}",
                    "predicted speedup (c=0.1) {{deployment}}",
                    "C",
                ),
                target(
                    'spectune_measured_speedup{namespace=~"$namespace"}',
                    "operator's expected speedup {{name}}",
                    "D",
                ),
            ],
            "Tokens emitted per verification step (bonus included), the k actually drafted, "
            "and the speedup they imply. Under 1x, speculation costs more than it saves.",
        ),
        panel(
            8,
            "Drafter health: first drafted token landed",
            "timeseries",
            (0, 18, 12, 8),
            [
                target(
                    f"spectune:first_position_acceptance:ratio_rate5m{{{SEL}}}",
                    "P(L>=1) {{deployment}}",
                    "A",
                ),
                target(
                    f'spectune:mean_accepted_length:ratio_rate5m{{{SEL}, engine="sglang"}} - 1',
                    "accepted per pass (SGLang) {{deployment}}",
                    "B",
                ),
                target("vector(0.03)", "SpecTuneDrafterBroken below", "C"),
            ],
            "The share of verification passes whose first drafted token landed (SGLang: "
            "accepted tokens per pass, an upper bound of it). Under 3% for 15 minutes the "
            "drafter is broken (SpecTuneDrafterBroken): weights not loaded, the wrong method "
            "or tokenizer. A poor fit stays far above the line.",
            unit="percentunit",
        ),
        panel(
            9,
            "Per-pod acceptance against its peers",
            "timeseries",
            (12, 18, 12, 8),
            [
                target(
                    f"spectune:pod_first_position_acceptance:ratio_rate5m{{{SEL}}}"
                    f" / spectune:pod_peers_first_position_acceptance:ratio_rate5m{{{SEL}}}",
                    "{{pod}}",
                    "A",
                ),
                target(
                    f'spectune:pod_accepted_per_draft:ratio_rate5m{{{SEL}, engine="sglang"}}'
                    f" / spectune:pod_peers_accepted_per_draft:ratio_rate5m{{{SEL}}}",
                    "{{pod}} (accepted per pass)",
                    "B",
                ),
                target("vector(0.9)", "SpecTunePodAcceptanceDecay below", "C"),
            ],
            "Each pod's first-position acceptance (SGLang: accepted tokens per pass) as a share "
            "of the other pods' of its workload. A pod that sinks alone while a pod started "
            "after it holds the level decays with its uptime (SpecTunePodAcceptanceDecay, "
            "under 0.9 for 30 minutes); the youngest pod has no younger peer and is never "
            "flagged.",
            unit="percentunit",
        ),
        panel(
            5,
            "Queue",
            "timeseries",
            (0, 26, 12, 8),
            [
                target(
                    engine(
                        "vllm:num_requests_waiting",
                        "sglang:num_queue_reqs",
                        "trtllm_num_requests_waiting",
                    ),
                    "waiting {{deployment}}",
                    "A",
                ),
                target(
                    engine(
                        "vllm:num_requests_running",
                        "sglang:num_running_reqs",
                        "trtllm_num_requests_running",
                    ),
                    "running {{deployment}}",
                    "B",
                ),
            ],
            "Requests waiting and running (vLLM, SGLang, TensorRT-LLM). Speculation pays at "
            "low concurrency; at high concurrency verification stops being free.",
        ),
        panel(
            6,
            "KV cache usage",
            "timeseries",
            (12, 26, 12, 8),
            [
                target(
                    engine(
                        "vllm:kv_cache_usage_perc",
                        "sglang:token_usage",
                        "trtllm_kv_cache_utilization",
                        "max",
                    ),
                    "{{deployment}} (max pod)",
                    "A",
                )
            ],
            "Fraction of the KV pool in use, the fullest pod. Draft tokens take KV slots: a "
            "full pool preempts requests and speculation loses.",
            unit="percentunit",
        ),
        panel(
            7,
            "SpecTunings",
            "table",
            (0, 34, 24, 8),
            [
                target('spectune_phase{namespace=~"$namespace"} == 1', "", "A", True),
                target('spectune_applied_k{namespace=~"$namespace"}', "", "B", True),
                target('spectune_trials{namespace=~"$namespace"}', "", "C", True),
                target('spectune_measured_speedup{namespace=~"$namespace"}', "", "D", True),
                target(
                    'increase(spectune_metric_source_errors_total{namespace=~"$namespace"}[1h])',
                    "",
                    "E",
                    True,
                ),
            ],
            "Each SpecTuning: phase, applied k (0: off), trials in its status (the latest 20), "
            "expected speedup, metric windows lost in the last hour "
            "(from the operator's /metrics).",
            transformations=[
                {"id": "merge", "options": {}},
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True, "Value #A": True, "__name__": True},
                        "renameByName": {
                            "Value #B": "applied k",
                            "Value #C": "trials in status",
                            "Value #D": "expected speedup",
                            "Value #E": "lost windows (1h)",
                        },
                    },
                },
            ],
        ),
    ]
    annotations = [
        {
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        },
        {
            "name": "Trials",
            "datasource": DS,
            "enable": True,
            "iconColor": "blue",
            "expr": (
                "sum by (namespace, name) "
                '(increase(spectune_trials_started_total{namespace=~"$namespace"}[2m])) > 0'
            ),
            "step": "1m",
            "titleFormat": "Trial started",
            "textFormat": "{{namespace}}/{{name}}",
            "tagKeys": "namespace,name",
            "useValueForTime": False,
        },
        {
            "name": "Promotions",
            "datasource": DS,
            "enable": True,
            "iconColor": "green",
            "expr": 'changes(spectune_applied_k{namespace=~"$namespace"}[2m]) > 0',
            "step": "1m",
            "titleFormat": "Applied setting changed",
            "textFormat": "{{namespace}}/{{name}}",
            "tagKeys": "namespace,name",
            "useValueForTime": False,
        },
    ]
    dep_query = 'label_values(spectune:drafts:rate5m{namespace=~"$namespace"}, deployment)'
    templating = [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
        },
        {
            "name": "namespace",
            "label": "Namespace",
            "type": "query",
            "datasource": DS,
            "query": {"query": "label_values(spectune:drafts:rate5m, namespace)", "refId": "ns"},
            "definition": "label_values(spectune:drafts:rate5m, namespace)",
            "includeAll": True,
            "multi": True,
            "refresh": 2,
            "current": {},
            "hide": 0,
        },
        {
            "name": "deployment",
            "label": "Deployment",
            "type": "query",
            "datasource": DS,
            "query": {
                "query": dep_query,
                "refId": "dep",
            },
            "definition": dep_query,
            "includeAll": True,
            "multi": True,
            "refresh": 2,
            "current": {},
            "hide": 0,
        },
        {
            "name": "draft_cost",
            "label": "Draft cost c",
            "type": "textbox",
            "query": "0.1",
            "current": {"text": "0.1", "value": "0.1"},
            "hide": 0,
        },
    ]
    return {
        "uid": "spectune",
        "title": "spectune: speculative decoding",
        "description": (
            "Acceptance, its drift, the speedup per draft length, and what spectune is doing."
        ),
        "tags": ["spectune", "vllm", "sglang", "tensorrt-llm", "speculative-decoding"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "timezone": "browser",
        "annotations": {"list": annotations},
        "templating": {"list": templating},
        "panels": panels,
    }


def render() -> str:
    """The dashboard as the JSON text written to the files."""
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    """Write the files, or with ``--check`` report whether they are current."""
    text = render()
    if "--check" in argv:
        stale = [p for p in (OUT, CHART_COPY) if not p.exists() or p.read_text() != text]
        if stale:
            print(f"out of date: {stale}; run python hack/dashboard.py", file=sys.stderr)
            return 1
        return 0
    for path in (OUT, CHART_COPY):
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
