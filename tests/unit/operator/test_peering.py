"""More than one operator replica: the peering settings, and how start-up hands them to kopf.

kopf lets the replica with the highest priority act and pauses the others; two replicas with
one priority both pause. These tests pin what the operator tells kopf: standalone unless a
peering object is named, mandatory peering when one is, and priorities that differ and rank
the replicas by age. The failover itself runs on the real API server
(``tests/integration/operator/test_peering.py``).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import kopf
import pytest

from spectune import handlers
from spectune.errors import SpecError
from spectune.settings import Settings, seniority_priority


def test_peering_settings_from_the_environment() -> None:
    assert Settings.from_env({}).peering is None
    s = Settings.from_env(
        {
            "SPECTUNE_PEERING": "spectune",
            "SPECTUNE_PEERING_PRIORITY": "-7",
            "SPECTUNE_PEERING_LIFETIME_SECONDS": "15",
        }
    )
    assert (s.peering, s.peering_priority, s.peering_lifetime_s) == ("spectune", -7, 15)


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"SPECTUNE_PEERING": "Spec Tune"}, "SPECTUNE_PEERING="),
        ({"SPECTUNE_PEERING_LIFETIME_SECONDS": "3"}, "SPECTUNE_PEERING_LIFETIME_SECONDS"),
        ({"SPECTUNE_PEERING_PRIORITY": "high"}, "SPECTUNE_PEERING_PRIORITY"),
    ],
)
def test_a_bad_peering_setting_names_its_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(SpecError, match=names):
        Settings.from_env(env)


def test_seniority_ranks_the_oldest_replica_first_and_never_ties() -> None:
    older = seniority_priority(1_700_000_000.000, 999)
    younger = seniority_priority(1_700_000_000.001, 0)  # one millisecond later
    assert older > younger  # a later start never outranks the leader, whatever its tiebreak
    same_ms = {seniority_priority(1_700_000_000.5, t) for t in range(1000)}
    assert len(same_ms) == 1000  # replicas started together still differ
    with pytest.raises(ValueError, match="tiebreak"):
        seniority_priority(1.0, 1000)


class FakeApiClient:
    """A FAKE Kubernetes client: start-up only stores it in memo."""

    def close(self) -> None:
        pass


def _started(cfg: Settings, monkeypatch: pytest.MonkeyPatch, now: float = 1e9) -> Any:
    monkeypatch.setattr(handlers, "api_client", lambda connections: FakeApiClient())
    monkeypatch.setattr(handlers, "time", SimpleNamespace(time=lambda: now))
    ks = kopf.OperatorSettings()

    async def run() -> None:
        await handlers.startup(settings=ks, memo=kopf.Memo(settings=cfg))

    asyncio.run(run())
    return ks.peering


def test_startup_is_standalone_without_a_peering_name(monkeypatch: pytest.MonkeyPatch) -> None:
    peering = _started(Settings(metrics_port=0), monkeypatch)
    assert peering.standalone is True


def test_startup_makes_peering_mandatory_with_distinct_priorities(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = Settings(metrics_port=0, peering="spectune", peering_lifetime_s=15)
    first = _started(cfg, monkeypatch, now=1e9)
    second = _started(cfg, monkeypatch, now=1e9 + 0.001)  # one millisecond later
    for p in (first, second):
        assert p.standalone is False and p.mandatory is True
        assert p.name == "spectune" and p.lifetime == 15
    assert first.priority > second.priority  # the replica that started first leads
    pinned = _started(Settings(metrics_port=0, peering="spectune", peering_priority=5), monkeypatch)
    assert pinned.priority == 5
