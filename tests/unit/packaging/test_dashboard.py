"""The Grafana dashboard: generated and current, valid PromQL, and only metrics that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "dashboards" / "spectune.json"
CHART_COPY = REPO / "charts" / "spectune" / "files" / "spectune-dashboard.json"
RULES = REPO / "deploy" / "alerts" / "spectune-rules.yaml"
TELEMETRY = REPO / "operator" / "spectune" / "k8s" / "telemetry.py"
# vLLM V1's names (shared/reference/engines.md §1.1, §1.4), as Prometheus exposes them
VLLM = {
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
}
_NAME = re.compile(
    r"\b(?:spectune[:_][a-z0-9_:]*[a-z0-9]|(?:vllm|sglang):[a-z0-9_:]*[a-z0-9]"
    r"|trtllm_[a-z0-9_]*[a-z0-9])"
)


def _catalogued() -> set[str]:
    """Every series name of the operator's engine catalogue (vLLM V1, SGLang, TensorRT-LLM)."""
    from dataclasses import fields

    from spectune.engines import SGLANG, TRTLLM, VLLM_V1

    return {
        value
        for cat in (VLLM_V1, SGLANG, TRTLLM)
        for value in (getattr(cat, f.name) for f in fields(cat))
        if isinstance(value, str)
    }


def _generator() -> ModuleType:
    return load_script("hack/dashboard.py")


def _model() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _exprs(model: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in model["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in model["annotations"]["list"] if "expr" in a]
    return exprs


def _known_names() -> set[str]:
    rules = yaml.safe_load(RULES.read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    src = TELEMETRY.read_text()
    gauges = set(re.findall(r'Gauge\(\s*"(spectune_[a-z_]+)"', src))
    counters = {f"{n}_total" for n in re.findall(r'Counter\(\s*"(spectune_[a-z_]+)"', src)}
    assert gauges and counters, "telemetry.py's metric definitions were not found"
    return recorded | gauges | counters | VLLM | _catalogued()


def test_dashboard_files_are_generated_and_current() -> None:
    text = _generator().render()
    assert DASHBOARD.read_text() == text, "run python hack/dashboard.py"
    assert CHART_COPY.read_text() == text, "run python hack/dashboard.py"


def test_dashboard_has_the_panels_and_annotations_users_read() -> None:
    model = _model()
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    titles = " | ".join(p["title"] for p in model["panels"])
    for needed in (
        "Per-position acceptance",
        "Acceptance over time, with the drift baseline",
        "Predicted speedup vs k",
        "Queue",
        "KV cache usage",
        "Drafter health: first drafted token landed",
        "Per-pod acceptance against its peers",
    ):
        assert needed in titles
    names = {a["name"] for a in model["annotations"]["list"]}
    assert {"Trials", "Promotions"} <= names
    variables = {v["name"] for v in model["templating"]["list"]}
    assert {"datasource", "namespace", "deployment", "draft_cost"} <= variables
    for p in model["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"


def test_queue_and_kv_panels_read_every_engine() -> None:
    """The queue and KV panels show SGLang and TensorRT-LLM Deployments too, by the names the
    operator's catalogue reads."""
    from spectune.engines import SGLANG, TRTLLM, VLLM_V1

    panels = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in _model()["panels"]}
    for cat in (VLLM_V1, SGLANG, TRTLLM):
        assert cat.waiting in panels["Queue"] and cat.running in panels["Queue"]
        assert cat.kv_usage is not None and cat.kv_usage in panels["KV cache usage"]


def test_every_metric_the_dashboard_and_rules_read_exists() -> None:
    known = _known_names()
    used = {n for e in _exprs(_model()) for n in _NAME.findall(e)}
    used |= set(_NAME.findall(RULES.read_text().split("groups:", 1)[1]))
    # record names are "known"; anything else must be an engine or operator series
    unknown = {n for n in used if n not in known and not n.startswith("spectune.")}
    assert not unknown, (
        f"series that neither the engines, the operator nor the rules define: {unknown}"
    )


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: install Debian's prometheus package", pytrace=False)
    rules = []
    for i, expr in enumerate(_exprs(_model())):
        concrete = (
            expr.replace('=~"$namespace"', '=~".*"')
            .replace('=~"$deployment"', '=~".*"')
            .replace("$draft_cost", "0.1")
        )
        assert "$" not in concrete.replace('"$1"', ""), f"unresolved variable in {expr}"
        rules.append({"record": f"dashboard:query_{i}", "expr": concrete})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
