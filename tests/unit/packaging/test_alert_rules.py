"""The alert and recording rules: promtool checks them and runs their unit tests.

``deploy/alerts/spectune-rules.yaml`` is the one source; the chart's PrometheusRule embeds a
byte-identical copy. promtool comes with Debian's prometheus package (hack/test.sh installs
it); a missing promtool FAILS these tests.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from spectune.api.status import Phase

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "deploy" / "alerts" / "spectune-rules.yaml"
RULE_TESTS = REPO / "deploy" / "alerts" / "spectune-rules.test.yaml"
CHART_RULES = REPO / "charts" / "spectune" / "files" / "spectune-rules.yaml"
RUNBOOKS = REPO / "docs" / "runbooks.md"
ALERTS = {
    "SpecTuneAcceptanceDrift",
    "SpecTuneSpeculationRegressed",
    "SpecTuneMetricsSourceDown",
    "SpecTuneTuningStuck",
    "SpecTuneOperatorDown",
    "SpecTuneDrafterBroken",
    "SpecTunePodAcceptanceDecay",
}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool not found: install Debian's prometheus package (hack/test.sh does)",
            pytrace=False,
        )
    return path


def _promtool_run(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [_promtool(), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_check_rules() -> None:
    out = _promtool_run("check", "rules", str(RULES), str(CHART_RULES)).stdout
    assert "SUCCESS" in out


def test_promtool_unit_tests_pass() -> None:
    out = _promtool_run("test", "rules", str(RULE_TESTS))
    assert "SUCCESS" in out.stdout + out.stderr


def test_every_alert_is_tested_firing_and_silent() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired: set[str] = set()
    silent: set[str] = set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    assert fired == ALERTS, f"alerts never tested firing: {ALERTS - fired}"
    assert silent == ALERTS, f"alerts never tested silent: {ALERTS - silent}"


def test_every_alert_has_summary_description_and_a_runbook_anchor() -> None:
    alerts = [r for r in _rules() if "alert" in r]
    assert {str(r["alert"]) for r in alerts} == ALERTS
    runbooks = RUNBOOKS.read_text()
    # GitHub's anchors: lower-cased heading text, spaces to dashes, punctuation dropped
    anchors = {
        re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", runbooks, flags=re.M)
    }
    for rule in alerts:
        ann = rule["annotations"]
        assert isinstance(ann, dict)
        assert ann.get("summary") and ann.get("description"), rule["alert"]
        assert "$value" in ann["description"] or "$labels" in ann["description"]
        url = str(ann["runbook_url"])
        assert url.split("#")[0].endswith("docs/runbooks.md"), url
        assert url.split("#")[1] in anchors, f"{rule['alert']}: no heading for {url} in docs"
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}  # type: ignore[index]


def test_every_recording_rule_is_tested() -> None:
    """Each recorded series is evaluated by a promql_expr_test."""
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    exprs = " ".join(check["expr"] for case in tests for check in case.get("promql_expr_test", []))
    for rule in _rules():
        if "record" in rule:
            assert str(rule["record"]) in exprs, f"recording rule {rule['record']} untested"


def test_chart_embeds_the_same_rules() -> None:
    assert CHART_RULES.read_bytes() == RULES.read_bytes(), (
        "charts/spectune/files/spectune-rules.yaml differs from deploy/alerts/spectune-rules.yaml;"
        " copy it: cp deploy/alerts/spectune-rules.yaml charts/spectune/files/"
    )


def test_rules_read_only_operator_metrics_that_the_operator_exports() -> None:
    """An alert on a series the operator never exports would never fire."""
    from spectune.k8s.telemetry import OperatorMetrics

    families = list(OperatorMetrics().registry.collect())
    exported = {f.name + ("_total" if f.type == "counter" else "") for f in families}
    exprs = " ".join(str(r["expr"]) for r in _rules())
    used = set(re.findall(r"\b(spectune_[a-z_]+)\b", exprs))
    assert {"spectune_phase", "spectune_trials_started_total"} <= used
    assert used <= exported, (
        f"the rules read metrics the operator does not export: {used - exported}"
    )


def test_the_trial_counter_exists_before_the_first_trial() -> None:
    """SpecTuneTuningStuck needs the counter at 0 for a SpecTuning that never starts a trial."""
    from spectune.k8s.telemetry import OperatorMetrics

    metrics = OperatorMetrics()
    metrics.set_phase("llm", "t", Phase.BASELINE)  # what every status write does
    value = metrics.registry.get_sample_value(
        "spectune_trials_started_total", {"namespace": "llm", "name": "t"}
    )
    assert value == 0.0
    metrics.trials_started.labels("llm", "t").inc()
    metrics.forget("llm", "t")
    assert (
        metrics.registry.get_sample_value(
            "spectune_trials_started_total", {"namespace": "llm", "name": "t"}
        )
        is None
    )


def test_rules_read_the_engine_series_the_operator_reads() -> None:
    """Rules and operator agree on the engines' names: every vLLM, SGLang and TensorRT-LLM
    series the rules read is a name of the operator's engine catalogue, and each of the three
    engines has its rule for the drafts every other rule builds on."""
    from dataclasses import fields

    from spectune.engines import SGLANG, TRTLLM, VLLM_V1

    catalogued = {
        value
        for cat in (VLLM_V1, SGLANG, TRTLLM)
        for value in (getattr(cat, f.name) for f in fields(cat))
        if isinstance(value, str)
    }
    exprs = " ".join(str(r["expr"]) for r in _rules())
    used = set(re.findall(r"\b((?:vllm|sglang):[a-z_:]*[a-z]|trtllm_[a-z_]*[a-z])\b", exprs))
    assert {"sglang:spec_accept_length", "trtllm_spec_decode_accepted_tokens_total"} <= used
    assert used <= catalogued, f"series not in engines/catalogue.py: {used - catalogued}"
    engines = {
        rule.get("labels", {}).get("engine")  # type: ignore[attr-defined]
        for rule in _rules()
        if rule.get("record") == "spectune:pod_drafts:rate5m"
    }
    assert engines == {"vllm", "sglang", "trtllm"}
