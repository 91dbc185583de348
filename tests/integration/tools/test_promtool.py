"""promtool (Debian's prometheus package) really evaluates rule unit tests."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

RULES = textwrap.dedent(
    """
    groups:
      - name: spectune-test
        rules:
          - record: job:requests:rate1m
            expr: sum by (job) (rate(requests_total[1m]))
          - alert: HighRequestRate
            expr: job:requests:rate1m > 5
            for: 1m
            labels: {severity: page}
    """
)


def _tests(expected_rate: float) -> str:
    return textwrap.dedent(
        f"""
        rule_files: [rules.yaml]
        evaluation_interval: 15s
        tests:
          - interval: 15s
            input_series:
              - series: 'requests_total{{job="sim", pod="a"}}'
                values: '0+150x20'
              - series: 'requests_total{{job="sim", pod="b"}}'
                values: '0+0x20'
            promql_expr_test:
              - expr: job:requests:rate1m
                eval_time: 3m
                exp_samples:
                  - labels: 'job:requests:rate1m{{job="sim"}}'
                    value: {expected_rate}
            alert_rule_test:
              - eval_time: 3m
                alertname: HighRequestRate
                exp_alerts:
                  - exp_labels: {{severity: page, job: sim}}
        """
    )


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool not found on PATH: install Debian's 'prometheus' package "
            "(apt-get install prometheus)",
            pytrace=False,
        )
    return path


def _run(tmp_path: Path, expected_rate: float) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "tests.yaml").write_text(_tests(expected_rate))
    return subprocess.run(
        [_promtool(), "test", "rules", "tests.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_promtool_rule_test_passes(tmp_path: Path) -> None:
    proc = _run(tmp_path, expected_rate=10)  # 150 per 15 s = 10/s
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_promtool_rule_test_catches_a_wrong_expectation(tmp_path: Path) -> None:
    proc = _run(tmp_path, expected_rate=11)
    assert proc.returncode != 0
    assert "FAILED" in proc.stdout + proc.stderr
