"""Prometheus holding an engine's series under another spelling (a fake answering queries)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from spectune.engines import Dialect
from spectune.metrics import PrometheusSource

SERIES = {
    "sglang_num_running_reqs": ([(0, 4), (60, 4)], {"tp_rank": "0"}),
    "sglang_spec_accept_length": ([(0, 3.0), (60, 3.0)], {"tp_rank": "0"}),
    "sglang_spec_accept_rate": ([(0, 0.5), (60, 0.5)], {"tp_rank": "0"}),
    "sglang_generation_tokens_total": ([(0, 1000), (60, 4000)], {}),
    "sglang_spec_verify_calls_total": ([(0, 500), (60, 1500)], {}),
}


class FakePrometheus(PrometheusSource):
    """A fake: answers count() and range selectors from SERIES, nothing else."""

    async def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        count = re.fullmatch(r"count\((\S+?)\{.*\}\)", promql)
        if count:
            return [{"value": [0, "1"]}] if count.group(1) in SERIES else []
        wanted = re.search(r'__name__=~"([^"]+)"', promql)
        if not wanted:
            return []
        names = set(wanted.group(1).replace("\\", "").split("|"))
        return [
            {
                "metric": {"__name__": n, "pod": "p", **labels},
                "values": [[t, str(v)] for t, v in pts],
            }
            for n, (pts, labels) in SERIES.items()
            if n in names
        ]


def test_an_sglang_underscore_spelling_in_prometheus_is_read_as_sglang() -> None:
    source = FakePrometheus("http://prom:9090", '{namespace="llm"}')
    obs = asyncio.run(source.observe(60))
    assert obs.dialect is Dialect.SGLANG
    assert obs.running == 4 and obs.accept_length_gauge == 3.0
    # Exact length from the counters: 3000 tokens over 1000 verifications.
    assert obs.spec is not None and obs.spec.drafts == 1000 and obs.spec.accepted == 2000
