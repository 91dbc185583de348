"""The bench scores how the operator meets a broken drafter and a decaying pod: the seconds
from the scenario's event to the operator's report of it (time to detect), and until the
target recovered (time to recover), beside the contract's object and in the bench's table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spectune.bench.command import _print_summary
from spectune.bench.runner import BenchResult, run_bench
from spectune.control.controller import ControllerConfig, PodAction
from tests.unit.bench.conftest import WINDOW, tiny_scenario

_RUNS: dict[tuple[str, str], BenchResult] = {}


def _broken(policy: str, cache_dir: Path) -> BenchResult:
    key = ("broken", policy)
    if key not in _RUNS:
        scenario = tiny_scenario(
            name="tiny-broken",
            initial={"drafter": "eagle3", "k": 3},
            events=[{"at_s": 300, "kind": "drafter_broken", "drafter": "eagle3"}],
        )
        _RUNS[key] = run_bench(scenario, policy, window_s=WINDOW, cache_dir=cache_dir, jobs=1)
    return _RUNS[key]


def _decaying(action: PodAction, cache_dir: Path) -> BenchResult:
    """Three pods; after the first rollout pod 0 is older than pod 1, and from 150 s on it
    loses acceptance with its uptime (α × 0.05 per hour)."""
    key = ("decay", action.value)
    if key not in _RUNS:
        scenario = tiny_scenario(
            name="tiny-decay",
            duration_s=720,
            fleet={"replicas": 3},
            load=[{"at_s": 0, "requests_per_s": 4.5}],
            events=[{"at_s": 150, "kind": "pod_decay", "pod": 0, "acceptance_per_hour": 0.05}],
        )
        config = ControllerConfig(drift_for_s=120.0, pod_action=action)
        _RUNS[key] = run_bench(
            scenario,
            "static:eagle3/3",
            window_s=WINDOW,
            cache_dir=cache_dir,
            jobs=1,
            controller_config=config,
        )
    return _RUNS[key]


@pytest.mark.parametrize("policy", ["spectune", "static:eagle3/3"])
def test_a_broken_drafter_is_reported_within_two_windows_and_the_target_recovers(
    policy: str, cache_dir: Path
) -> None:
    (incident,) = _broken(policy, cache_dir).incidents
    assert (incident.at_s, incident.kind, incident.what) == (300.0, "drafter_broken", "eagle3")
    assert incident.detected_s is not None and 0 < incident.detected_s <= 2 * WINDOW
    # the fall-back rolls the target off the broken drafter: back near the new oracle
    assert incident.recovered_s is not None
    assert incident.detected_s <= incident.recovered_s <= 300.0


def test_a_decaying_pod_is_reported_and_restartpod_replaces_it(cache_dir: Path) -> None:
    alert = _decaying(PodAction.ALERT, cache_dir)
    restart = _decaying(PodAction.RESTART_POD, cache_dir)
    (seen,) = alert.incidents
    (fixed,) = restart.incidents
    assert (seen.kind, seen.what) == ("pod_decay", "pod 0")
    assert seen.detected_s is not None and fixed.detected_s is not None
    # an alert leaves the pod to a person: it is never replaced in the run
    assert seen.recovered_s is None
    assert fixed.recovered_s is not None and fixed.recovered_s > fixed.detected_s
    assert any(e.reason == "PodRestarted" for e in restart.events)


def test_the_bench_table_shows_time_to_detect_and_to_recover(
    cache_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    result = _broken("static:eagle3/3", cache_dir)
    (incident,) = result.incidents
    assert incident.detected_s is not None and incident.recovered_s is not None
    _print_summary(result)
    out = capsys.readouterr().out
    assert "drafter_broken eagle3 @300s: reported · recovered" in out
    assert f"after {incident.detected_s:.0f} s · after {incident.recovered_s:.0f} s" in out
    # beside the contract's object, never in it
    assert "incidents" not in result.to_json()


def test_a_run_without_these_events_has_no_incidents(cache_dir: Path) -> None:
    scenario = tiny_scenario(duration_s=300)
    result = run_bench(scenario, "static:off", window_s=WINDOW, cache_dir=cache_dir, jobs=1)
    assert result.incidents == ()
