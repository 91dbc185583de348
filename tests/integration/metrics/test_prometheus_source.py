"""PrometheusSource and `spectune diagnose --prometheus` against a real Prometheus.

The pods are local HTTP servers whose vLLM pages advance with the clock; Prometheus
scrapes them every second. Whatever path a user takes (saved pages or Prometheus), the
figures must agree within 2 %.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from spectune.diagnose import diagnose
from spectune.errors import NoDataError
from spectune.metrics import PrometheusSource, observation_from_pages, parse_page
from tests.fixtures.prometheus import Prometheus
from tests.integration.metrics.advancing_pages import AdvancingPod, PodRates, advancing_pods

WINDOW = 20
SPEC = '{namespace="llm",pod=~"llama-.*"}'
BASE = '{namespace="llm",pod=~"base-.*"}'


@pytest.fixture(scope="module")
def fleet(prometheus: Prometheus) -> Iterator[list[AdvancingPod]]:
    rates = [
        PodRates(drafts_per_s=400, survival=(0.8, 0.6, 0.45, 0.3), tpot_s=0.016),
        PodRates(drafts_per_s=300, survival=(0.7, 0.5, 0.35, 0.2), tpot_s=0.018),
        PodRates(speculating=False, tpot_s=0.030, num_gpu_blocks=9500),
        PodRates(speculating=False, tpot_s=0.030, num_gpu_blocks=9500),
    ]
    names = ["llama-0", "llama-1", "base-0", "base-1"]
    with advancing_pods(rates) as pods:
        for pod, name in zip(pods, names, strict=True):
            prometheus.register_target(pod.address, {"namespace": "llm", "pod": name})
        prometheus.wait_for_series("vllm:num_requests_running", count=4)
        # A window needs WINDOW seconds of samples behind it, plus a few scrapes of slack.
        time.sleep(WINDOW + 4)
        yield pods


def _page_pair(pods: list[AdvancingPod], end: float) -> tuple:
    before = [parse_page(p.page_at(end - WINDOW), f"pod-{i}") for i, p in enumerate(pods)]
    after = [parse_page(p.page_at(end), f"pod-{i}") for i, p in enumerate(pods)]
    return observation_from_pages(before, after, WINDOW)


def _close(a: float | None, b: float | None, rel: float = 0.02) -> bool:
    assert a is not None and b is not None
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


def test_prometheus_and_page_pairs_give_the_same_diagnosis(
    prometheus: Prometheus, fleet: list[AdvancingPod]
) -> None:
    end = time.time() - 2  # a moment Prometheus has certainly scraped past
    spec = PrometheusSource(prometheus.url, SPEC)
    base = PrometheusSource(prometheus.url, BASE)
    from_prom = asyncio.run(spec.observe(WINDOW, at=end))
    base_prom = asyncio.run(base.observe(WINDOW, at=end))
    from_pages = _page_pair(fleet[:2], end)
    base_pages = _page_pair(fleet[2:], end)

    assert sorted(from_prom.pods) == ["llama-0", "llama-1"]
    # One range query per window once the dialect is known (the operator's query budget).
    sent: list[str] = []
    real_query = spec.query

    async def counting(promql: str, at: float | None = None) -> list:
        sent.append(promql)
        return await real_query(promql, at)

    spec.query = counting  # type: ignore[method-assign]
    asyncio.run(spec.observe(WINDOW, at=end))
    assert len(sent) == 1, sent
    d_prom = diagnose(from_prom, base_prom)
    d_pages = diagnose(from_pages, base_pages)
    assert _close(d_prom.acceptance.rate, d_pages.acceptance.rate)
    assert _close(d_prom.acceptance.mean_accepted_length, d_pages.acceptance.mean_accepted_length)
    for a, b in zip(d_prom.acceptance.per_position, d_pages.acceptance.per_position, strict=True):
        assert _close(a, b)
    assert _close(d_prom.draft_cost.value, d_pages.draft_cost.value)
    assert d_prom.draft_cost.source == "measured"
    assert d_prom.best_k == d_pages.best_k
    assert from_prom.num_gpu_blocks == 9000 and base_prom.num_gpu_blocks == 9500
    # The pooled curve weighs each pod by its drafts (400/s and 300/s).
    expected_p1 = (400 * 0.8 + 300 * 0.7) / 700
    assert _close(d_prom.acceptance.per_position[0], expected_p1)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spectune.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_diagnose_cli_prometheus_matches_saved_pages(
    prometheus: Prometheus, fleet: list[AdvancingPod], tmp_path: Path
) -> None:
    live = _cli(
        "diagnose", "--prometheus", prometheus.url, "--selector", SPEC,
        "--baseline-selector", BASE, "--window", f"{WINDOW}s", "--json",
    )  # fmt: skip
    assert live.returncode == 0, live.stderr
    end = time.time() - 2
    files: dict[str, list[str]] = {}
    for group, pods in (("spec", fleet[:2]), ("base", fleet[2:])):
        for moment, t in (("before", end - WINDOW), ("after", end)):
            paths = []
            for i, p in enumerate(pods):
                path = tmp_path / f"{group}-{moment}-{i}.prom"
                path.write_text(p.page_at(t))
                paths.append(str(path))
            files[f"{group}-{moment}"] = paths
    saved = _cli(
        "diagnose", "--before", *files["spec-before"], "--after", *files["spec-after"],
        "--baseline-before", *files["base-before"], "--baseline-after", *files["base-after"],
        "--window", str(WINDOW), "--json",
    )  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    a, b = json.loads(live.stdout), json.loads(saved.stdout)
    assert a["engine"] == b["engine"] == "vllm"
    assert _close(a["acceptance"]["rate"], b["acceptance"]["rate"])
    assert _close(a["acceptance"]["mean_accepted_length"], b["acceptance"]["mean_accepted_length"])
    assert _close(a["draft_cost"]["value"], b["draft_cost"]["value"])
    assert a["best_k"] == b["best_k"]
    for ra, rb in zip(a["prediction"], b["prediction"], strict=True):
        assert _close(ra["speedup"], rb["speedup"])
    assert [f["code"] for f in a["findings"]] == [f["code"] for f in b["findings"]]


def test_a_pod_first_scraped_late_in_the_window_covers_only_part_of_it(
    prometheus: Prometheus, fleet: list[AdvancingPod]
) -> None:
    """A canary that just became ready is in Prometheus only from its first scrape: the
    window's figures for it come from a fraction of the window, and ``covered`` says so
    (the controller measures such a first trial window again)."""
    whole = asyncio.run(PrometheusSource(prometheus.url, SPEC).observe(WINDOW, at=time.time() - 2))
    assert whole.covered is not None and whole.covered >= 0.8, whole.covered
    rates = PodRates(drafts_per_s=400, survival=(0.8, 0.6, 0.45, 0.3), tpot_s=0.016)
    with advancing_pods([rates]) as (pod,):
        prometheus.register_target(pod.address, {"namespace": "llm", "pod": "late-0"})
        late = '{namespace="llm",pod="late-0"}'
        prometheus.wait_for_series(f"vllm:num_requests_running{late}")
        time.sleep(3)  # a few scrapes: about 3 s of a 20 s window
        seen = asyncio.run(PrometheusSource(prometheus.url, late).observe(WINDOW))
    assert seen.pods == ("late-0",)
    assert seen.covered is not None and 0.0 < seen.covered < 0.5, seen.covered


def test_a_selector_that_matches_nothing_is_no_data(prometheus: Prometheus, fleet: list) -> None:
    source = PrometheusSource(prometheus.url, '{namespace="nowhere"}')
    with pytest.raises(NoDataError, match="matches no"):
        asyncio.run(source.observe(WINDOW))
    cli = _cli("diagnose", "--prometheus", prometheus.url, "--selector", '{namespace="nowhere"}',
               "--window", "20s")  # fmt: skip
    assert cli.returncode == 5  # no data (spectune.exitcodes)
    assert "matches no" in cli.stderr and "Traceback" not in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1


class _Garbage(BaseHTTPRequestHandler):
    """A fake Prometheus that answers nonsense, chosen by the request path's first query."""

    mode = "html"

    def do_GET(self) -> None:
        bodies = {
            "html": (200, b"<html><body>login required</body></html>"),
            "json": (200, b'{"status": "success", "data": {"resultType": "vector", "result": 7}}'),
            "500": (500, b"internal error"),
        }
        code, body = bodies[type(self).mode]
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("mode", ["html", "json", "500"])
def test_a_prometheus_that_answers_garbage_is_a_clear_error(mode: str) -> None:
    handler = type("Garbage", (_Garbage,), {"mode": mode})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        cli = _cli("diagnose", "--prometheus", url, "--selector", '{namespace="llm"}',
                   "--window", "60s")  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert cli.returncode == 4, cli.stdout  # the source answered garbage: unreachable
    assert "Traceback" not in cli.stderr
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spectune: error: Prometheus at")


def test_an_unreachable_prometheus_is_a_clear_error() -> None:
    from tests.fixtures.prometheus import free_port

    cli = _cli("diagnose", "--prometheus", f"http://127.0.0.1:{free_port()}",
               "--selector", '{namespace="llm"}', "--window", "60s", "--timeout", "3")  # fmt: skip
    assert cli.returncode == 4
    assert "cannot reach Prometheus" in cli.stderr and "Traceback" not in cli.stderr
