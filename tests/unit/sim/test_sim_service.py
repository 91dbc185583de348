"""The pods of one service split its arrival stream: each arrival is served once, and adding
a pod leaves the service's offered load where it was while each pod's share falls."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from spectune.metrics.exposition import parse_page
from spectune.sim import Fleet, Scenario
from spectune.sim.command import main
from spectune.sim.service import Member, Service, assign, leave, read_members


def _pod(scenario: Scenario, members: Sequence[Member], name: str, start_s: float = 0.0) -> Fleet:
    """One ``sim serve`` pod of the service, as it runs in-process: one replica drawing the
    service's whole stream and keeping its share."""
    return Fleet(
        scenario,
        replicas=1,
        start_s=start_s,
        keep=lambda index, at_s: assign(members, index, at_s) == name,
    )


def _served(fleet: Fleet) -> int:
    """Finished requests, as the pod's ``/metrics`` page counts them."""
    total = parse_page(fleet.metrics_text(0)).total("vllm:request_success_total")
    assert total is not None
    return int(total)


def test_the_pods_of_a_service_serve_each_arrival_of_its_stream_once(
    make_scenario: Callable[..., Scenario],
) -> None:
    scenario = make_scenario(load=[{"at_s": 0, "requests_per_s": 3.0}])
    members = [Member("a", 0.0), Member("b", 0.0), Member("c", 0.0)]
    pods = {m.name: _pod(scenario, members, m.name) for m in members}
    alone = Fleet(scenario, replicas=1)  # one pod taking the whole stream
    for fleet in (*pods.values(), alone):
        fleet.advance(400.0)
    # every request that arrived in the first 300 s has finished by 400 s
    ids = {name: {r.id for r in f.records() if r.arrival_s < 300.0} for name, f in pods.items()}
    everyone = {r.id for r in alone.records() if r.arrival_s < 300.0}
    assert len(everyone) > 800
    assert set().union(*ids.values()) == everyone
    assert sum(len(s) for s in ids.values()) == len(everyone)  # no arrival served twice
    counts = sorted(len(s) for s in ids.values())
    assert counts[-1] - counts[0] <= 1  # round-robin: equal shares


def test_adding_a_pod_leaves_the_services_offered_load_unchanged(
    make_scenario: Callable[..., Scenario],
) -> None:
    scenario = make_scenario(load=[{"at_s": 0, "requests_per_s": 2.0}])
    # a canary pod comes up at 600 s and joins the service
    members = [Member("a", 0.0), Member("b", 0.0), Member("canary", 600.0)]
    pods = {"a": _pod(scenario, members, "a"), "b": _pod(scenario, members, "b")}
    readings: list[dict[str, int]] = []
    for t in (100.0, 500.0):
        for f in pods.values():
            f.advance(t)
        readings.append({name: _served(f) for name, f in pods.items()})
    pods["canary"] = _pod(scenario, members, "canary", start_s=590.0)
    for t in (700.0, 1100.0):
        for f in pods.values():
            f.advance(t)
        readings.append({name: _served(f) for name, f in pods.items()})
    before = {n: (readings[1][n] - readings[0][n]) / 400.0 for n in ("a", "b")}
    after = {n: (readings[3][n] - readings[2][n]) / 400.0 for n in pods}
    # the service's offered load: the sum over its pods, as a dashboard sums them
    assert sum(after.values()) == pytest.approx(sum(before.values()), rel=0.1)
    assert sum(before.values()) == pytest.approx(2.0, rel=0.1)
    for name in ("a", "b"):
        assert after[name] < 0.8 * before[name]  # each incumbent's share fell from 1/2 to 1/3
    assert after["canary"] == pytest.approx(sum(after.values()) / 3, rel=0.15)


def test_a_pod_that_leaves_hands_its_share_to_the_others() -> None:
    members = [Member("a", 0.0, left_s=100.0), Member("b", 0.0)]
    assert {assign(members, k, 50.0) for k in range(10)} == {"a", "b"}
    assert {assign(members, k, 150.0) for k in range(10)} == {"b"}
    assert assign([Member("a", 10.0)], 0, 5.0) is None  # no member live: no pod serves it


def test_members_register_in_the_service_directory(tmp_path: Path) -> None:
    a, b = Service(tmp_path / "svc"), Service(tmp_path / "svc")
    assert not a.keeps(0, 0.0)  # before its join a pod keeps nothing
    a.join("127.0.0.1:8001", 0.0)
    b.join("127.0.0.1:8002", 10.0)
    a.refresh()
    kept = [(a.keeps(k, 20.0), b.keeps(k, 20.0)) for k in range(6)]
    assert all(x != y for x, y in kept)  # each arrival to exactly one of the two
    assert all(a.keeps(k, 5.0) for k in range(6))  # before b's join, a takes them all
    b.leave(50.0)
    leave(tmp_path / "svc", "127.0.0.1:8002", 80.0)  # a later leave does not move it
    leave(tmp_path / "svc", "127.0.0.1:9999", 0.0)  # a pod that never joined: nothing
    (tmp_path / "svc" / "notes.json").write_text(json.dumps({"unrelated": True}))
    assert read_members(tmp_path / "svc") == [
        Member("127.0.0.1:8001", 0.0),
        Member("127.0.0.1:8002", 10.0, left_s=50.0),
    ]
    a.refresh()
    assert all(a.keeps(k, 60.0) for k in range(6))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "--service needs --clock-epoch"),
        (["--clock-epoch", "1", "--replicas", "2"], "leave out --replicas"),
    ],
)
def test_serve_refuses_a_service_it_cannot_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    example = Path(__file__).resolve().parents[3] / "examples/scenarios/chat-eagle3.yaml"
    code = main(
        ["serve", "--scenario", str(example), "--port", "0", "--service", str(tmp_path), *flags,
         "--", "serve", "m"]
    )  # fmt: skip
    assert code == 3
    assert message in capsys.readouterr().err
