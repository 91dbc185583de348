"""The operator's settings from the environment, and which Prometheus series are whose."""

from __future__ import annotations

import re

import pytest

from spectune.errors import SpecError
from spectune.k8s.series import canary_selector, pod_pattern, target_selector
from spectune.settings import Settings


def test_settings_defaults_and_environment() -> None:
    assert Settings.from_env({}) == Settings()
    s = Settings.from_env(
        {
            "SPECTUNE_NAMESPACES": "llm, chat ,",
            "SPECTUNE_PROMETHEUS_URL": "http://prom:9090",
            "SPECTUNE_METRICS_PORT": "0",
            "SPECTUNE_POLL_SECONDS": "1.5",
            "SPECTUNE_TIME_SCALE": "30",
            "SPECTUNE_READY_TIMEOUT_SECONDS": "60",
        }
    )
    assert s.namespaces == ("llm", "chat")
    assert s.prometheus_url == "http://prom:9090"
    assert s.metrics_port == 0 and s.poll_s == 1.5 and s.ready_timeout_s == 60
    assert s.scaled(300) == pytest.approx(10)


def test_the_url_allowlist_and_the_page_limit_from_the_environment() -> None:
    s = Settings.from_env(
        {
            "SPECTUNE_PROMETHEUS_URL_ALLOWLIST": "http://prom.monitoring:9090, https://thanos/q,",
            "SPECTUNE_SCRAPE_MAX_BYTES": "1048576",
        }
    )
    assert s.prometheus_url_allowlist == ("http://prom.monitoring:9090", "https://thanos/q")
    assert s.scrape_max_bytes == 1048576
    assert Settings().prometheus_url_allowlist == () and Settings().scrape_max_bytes == 8 << 20


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"SPECTUNE_METRICS_PORT": "eighty"}, "SPECTUNE_METRICS_PORT"),
        ({"SPECTUNE_LIVENESS_PORT": "70000"}, "SPECTUNE_LIVENESS_PORT"),
        ({"SPECTUNE_POLL_SECONDS": "0"}, "SPECTUNE_POLL_SECONDS"),
        ({"SPECTUNE_TIME_SCALE": "-1"}, "SPECTUNE_TIME_SCALE"),
        ({"SPECTUNE_PROMETHEUS_URL": "prom:9090"}, "SPECTUNE_PROMETHEUS_URL"),
        (
            {"SPECTUNE_PROMETHEUS_URL_ALLOWLIST": "http://a:9090, prom:9090"},
            "SPECTUNE_PROMETHEUS_URL_ALLOWLIST",
        ),
        ({"SPECTUNE_SCRAPE_MAX_BYTES": "12"}, "SPECTUNE_SCRAPE_MAX_BYTES"),
        ({"SPECTUNE_SCRAPE_MAX_BYTES": "8MiB"}, "SPECTUNE_SCRAPE_MAX_BYTES"),
    ],
)
def test_a_bad_setting_names_its_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(SpecError, match=names):
        Settings.from_env(env)


def _matches(selector: str, pod: str) -> bool:
    pattern = re.search(r'pod=~"([^"]+)"', selector)
    assert pattern is not None
    return re.fullmatch(pattern.group(1), pod) is not None  # Prometheus anchors =~


def test_target_and_canary_pods_never_overlap() -> None:
    target = target_selector("llm", "llama")
    canary = canary_selector("llm", "llama-spt-eagle3-3")
    assert _matches(target, "llama-7d9f8c6b5-x2x4z")
    assert not _matches(target, "llama-spt-eagle3-3-6899b95bbd-dm2kh")
    assert not _matches(target, "llama-70b-7d9f8c6b5-x2x4z")  # another Deployment's pods
    assert _matches(canary, "llama-spt-eagle3-3-6899b95bbd-dm2kh")
    assert not _matches(canary, "llama-7d9f8c6b5-x2x4z")
    assert 'namespace="llm"' in target and 'namespace="llm"' in canary
    assert pod_pattern("a.b") == "a[.]b-[a-z0-9]+-[a-z0-9]+"


def test_a_user_selector_is_kept_and_canaries_are_excluded() -> None:
    t = target_selector("llm", "llama", '{job="vllm", team="x"}')
    assert t.startswith('{job="vllm", team="x"') and 'pod!~"llama-spt-.+"' in t
    c = canary_selector("llm", "llama-spt-ngram-2", '{job="vllm"}')
    assert c == '{job="vllm",pod=~"llama-spt-ngram-2-[a-z0-9]+-[a-z0-9]+"}'
    with pytest.raises(SpecError):
        target_selector("llm", "llama", "job=vllm")
