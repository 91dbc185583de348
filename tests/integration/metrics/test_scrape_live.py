"""`spectune diagnose --scrape` against live local pods, and PodScrapeSource over real HTTP."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from spectune.errors import SourceUnavailableError
from spectune.metrics import PodScrapeSource
from tests.fixtures.prometheus import free_port
from tests.integration.metrics.advancing_pages import PodRates, advancing_pods


def test_live_scrape_reads_the_pods_rates() -> None:
    rates = [PodRates(drafts_per_s=500, survival=(0.8, 0.6, 0.4)), PodRates(drafts_per_s=500)]
    with advancing_pods(rates) as pods:
        urls = [f"http://{p.address}/metrics" for p in pods]
        obs = asyncio.run(PodScrapeSource(urls).observe(2.0))
        cli = subprocess.run(
            [sys.executable, "-m", "spectune.cli", "diagnose", "--scrape", *urls,
             "--window", "2s", "--draft-cost", "0.1", "--json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert obs.spec is not None and obs.spec.drafts is not None
    # Two pods at 500 drafts/s for ~2 s (scrape latency makes it a little more).
    assert 1900 < obs.spec.drafts < 2600
    assert cli.returncode == 0, cli.stderr
    doc = json.loads(cli.stdout)
    assert doc["window_s"] == 2.0
    # Pod 0 drafts k = 3, pod 1 k = 4: positions pool, so the curve has 4 positions.
    assert doc["current"]["k"] == 4
    p1 = doc["acceptance"]["per_position"][0]
    assert p1 == pytest.approx(0.8, abs=0.01)


def test_dead_pods_make_the_scrape_unavailable() -> None:
    urls = [f"http://127.0.0.1:{free_port()}/metrics" for _ in range(2)]
    with pytest.raises(SourceUnavailableError, match="every pod failed"):
        asyncio.run(PodScrapeSource(urls, timeout_s=2).observe(0.1))
