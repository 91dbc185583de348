"""Fixtures for the tuning-loop tests: the fake cluster and Prometheus put in the loop's way."""

from __future__ import annotations

import pytest

from spectune.k8s import tuning
from tests.unit.operator.fakes import FakeKube, FakeProm, FakeWorld


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> FakeWorld:
    """A fresh fake world that the loop's Kubernetes actuator and Prometheus source read."""
    w = FakeWorld()
    FakeKube.world = w
    FakeProm.world = w
    monkeypatch.setattr(tuning, "KubeActuator", FakeKube)
    monkeypatch.setattr(tuning, "PrometheusSource", FakeProm)
    return w
