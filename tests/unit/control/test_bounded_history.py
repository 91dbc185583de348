"""A week of monitoring in the status: the history stays bounded and keeps what it needs.

The loop is the real one over the fake fleet of ``test_controller.py`` (fake clock, fake
metrics) and the operator's real projection of it into ``status`` (``k8s/projection.py``);
a week of 5-minute windows, three model versions (each a new search with trials) and a
load that keeps moving: the status must stay far inside etcd's 1.5 MiB object limit, stop
growing once the history is at its bound, still catch a drift and a slow load climb against
the reference of days before, and read back as the running loop holds it.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from spectune.api.status import Phase as ApiPhase
from spectune.api.status import SpecTuningStatus, parse_status
from spectune.control.controller import Controller, Phase
from spectune.k8s.projection import Memory, StatusInputs, build_status, decode_memory, load_memory
from spectune.metrics import Observation, SpecCounts
from spectune.search.arms import Arm, parse_arm
from tests.unit.control.test_controller import WORLD, FakeClock, FakeFleet, make

DAY = 86400.0
#: The memory's JSON a week of monitoring may take (a sixth of etcd's 1.5 MiB object
#: limit), before the status gzips it...
MEMORY_BOUND = 256 * 1024
#: ...and the whole status as stored.
STATUS_BOUND = 64 * 1024


@dataclass
class JitteryFleet(FakeFleet):
    """The FAKE fleet with every window's counts a few per cent off, as real windows are
    (Poisson counts): figures that do not repeat, so the status cannot compress them away."""

    rng: random.Random = field(default_factory=lambda: random.Random(7))

    def _obs(
        self, arm: Arm, window: float, share: float = 1.0, queue_s: float | None = None
    ) -> Observation:
        obs = super()._obs(arm, window, share, queue_s)
        f = 1 + self.rng.uniform(-0.03, 0.03)
        spec = obs.spec
        if spec is not None and spec.accepted_per_pos is not None:
            per_pos = tuple(v * (1 + self.rng.uniform(-0.01, 0.01)) for v in spec.accepted_per_pos)
            spec = SpecCounts(spec.drafts, spec.draft_tokens, sum(per_pos), per_pos)
        return replace(
            obs,
            spec=spec,
            generation_tokens=(obs.generation_tokens or 0.0) * f,
            running=(obs.running or 0.0) * (1 + self.rng.uniform(-0.05, 0.05)),
        )


def _status(c: Controller, previous: SpecTuningStatus) -> dict[str, Any]:
    memory = Memory(c.history, c.state, "eagle3/8")
    x = StatusInputs(ApiPhase.MONITORING, 1, datetime.now(UTC), memory=memory)
    return build_status(previous, x)


def _describe_lines(value: Any, depth: int = 0) -> list[str]:
    """The lines ``kubectl describe`` prints for a value (its generic describer: a map is a
    line per key, nested; a list a line per scalar item; a scalar one line)."""
    if isinstance(value, dict):
        out = []
        for k in sorted(value):
            v = value[k]
            if isinstance(v, dict | list):
                out.append("  " * depth + f"{k}:")
                out += _describe_lines(v, depth + 1)
            else:
                out.append("  " * depth + f"{k}: {v}")
        return out
    if isinstance(value, list):
        out = []
        for v in value:
            out += _describe_lines(v, depth) if isinstance(v, dict) else ["  " * depth + str(v)]
        return out
    return ["  " * depth + str(value)]


def _step_until(c: Controller, clock: FakeClock, until_s: float) -> None:
    while clock.t < until_s:
        asyncio.run(c.step())


def test_a_week_of_monitoring_keeps_the_status_bounded_and_the_reference() -> None:
    clock = FakeClock()
    fleet = JitteryFleet(WORLD, clock, parse_arm("eagle3/8"))
    c, events = make(fleet, clock)
    status = parse_status({})
    sizes: list[tuple[float, int]] = []
    lines: list[int] = []
    raw: list[int] = []
    for day in range(1, 8):
        # A new model version on days 2, 4 and 6: each opens a search with trials.
        if day in (2, 4, 6):
            fleet.model_version = f"v{day}"
            fleet.acceptance_scale = {2: 0.8, 4: 1.0, 6: 0.9}[day]
        for hour in range(24):
            _step_until(c, clock, (day - 1) * DAY + (hour + 1) * 3600)
            doc = _status(c, status)
            status = parse_status(doc)
            sizes.append((clock.t, len(json.dumps(doc))))
            raw.append(len(json.dumps(decode_memory(doc["history"]))))
        lines.append(len(_describe_lines(doc)))
    assert c.history.epoch == 3, [e.message for e in events if e.reason == "Retune"]
    assert c.state.phase is Phase.MONITORING
    recorded = c.history.recorded()
    assert recorded[2] > 1900, "a week of 5-minute windows was recorded"
    # Bounded: far inside etcd's limit, and no larger on the last days than on the second.
    assert max(n for _, n in sizes) < STATUS_BOUND, max(sizes, key=lambda x: x[1])
    assert max(raw) < MEMORY_BOUND, max(raw)
    early = max(n for t, n in sizes if t <= 2 * DAY)
    late = max(n for t, n in sizes if t > 5 * DAY)
    assert late <= 1.1 * early, (early, late)
    # ...and what kubectl describe prints does not grow with it: the history is one line.
    history_lines = [x for x in _describe_lines(doc) if x.startswith("history:")]
    assert len(history_lines) == 1
    assert max(lines) < 400, lines
    # A restarted operator reads the history the running loop holds.
    back = load_memory(status.history)
    assert back.history.to_json() == c.history.to_json()  # figures equal (ints read as floats)
    assert back.state == c.state
    assert decode_memory(doc["history"])["version"] == 2

    # After a week, a slow climb of the load (one day, 1x → 2x) is caught against the
    # reference window of two days before, not against the windows just before it.
    start, ramp = clock.t, DAY
    while clock.t < start + ramp and not any(
        e.reason == "Retune" and e.at_s > start for e in events
    ):
        fleet.load = 1.0 + (clock.t - start) / ramp
        asyncio.run(c.step())
    moved = [e for e in events if e.reason == "Retune" and e.at_s > start]
    assert moved and "offered load moved" in moved[0].message, moved
    assert 1.6 <= fleet.load < 1.8

    # The acceptance reference survives the week too: a drop is drift.
    fleet.load = 1.0
    _step_until(c, clock, clock.t + 2 * DAY)  # the new epoch's search, then monitoring
    assert c.state.phase is Phase.MONITORING
    fleet.acceptance_scale = 0.6
    drift_from = clock.t
    _step_until(c, clock, clock.t + 3 * 3600)
    assert any(e.reason == "AcceptanceDrift" and e.at_s > drift_from for e in events)
