"""One service's arrival stream, split among the ``sim serve`` pods behind it.

A load balancer does not multiply traffic: the requests a Service receives are split among
its pods, so adding a pod (a canary) leaves the service's offered load where it was and
lowers each pod's share. The virtual-time :class:`~spectune.sim.fleet.Fleet` does this with
its balancer; separate ``sim serve`` processes cannot share one balancer, so each pod draws
the service's whole stream (the same seed on the same clock, ``sim serve --clock-epoch``)
and keeps only the arrivals a round-robin balancer would send it. All the pods of a service
agree on who serves each arrival because the choice depends only on the arrival's index in
the stream and on who was a member at its time, and membership is a directory of small
files that every pod reads (``sim serve --service DIR``):

* a pod joins by writing ``DIR/<member>.json`` with the simulated second from which it
  serves, and leaves by writing the second at which it stops;
* arrival ``k`` at time ``t`` goes to member ``k mod n`` of the ``n`` members live at ``t``
  (ordered by join time, then name): each arrival is served exactly once, and at constant
  membership every pod gets ``1/n`` of the stream, in the balancer's order.

Joins and leaves are announced :data:`LEAD_WALL_S` wall seconds ahead (scaled to simulated
seconds), so every other pod has read the change before its clock reaches it: a pod's
simulation never runs ahead of the shared clock, and it reads the directory after fixing
how far it advances. Round-robin is used whatever the scenario's ``fleet.balancer``: a
least-outstanding split would need every pod's queue at each arrival, which separate
processes do not share.

Called by :mod:`spectune.sim.command` (``sim serve --service``) through
:class:`~spectune.sim.server.SimServer`, and by :mod:`spectune.playground.pods`, which
records the leave of a pod whose process it had to kill. Standard library only.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spectune.errors import SpecError

__all__ = ["LEAD_WALL_S", "Member", "Service", "assign", "leave", "read_members"]

LEAD_WALL_S = 1.0
"""Wall seconds by which a join or a leave is announced ahead of the moment it takes effect."""


@dataclass(frozen=True)
class Member:
    """One pod of a service: it serves its share of the arrivals in ``[joined_s, left_s)``."""

    name: str
    joined_s: float
    left_s: float = math.inf

    def live_at(self, t: float) -> bool:
        """Whether the member takes arrivals at simulated time ``t``."""
        return self.joined_s <= t < self.left_s


def assign(members: Sequence[Member], index: int, at_s: float) -> str | None:
    """The member that serves arrival ``index`` of the stream, arriving at ``at_s``.

    Round-robin over the members live at ``at_s``, ordered by join time then name; ``None``
    when no member is live (the arrival reaches no pod, as with no endpoint behind a
    Service).

    >>> pods = [Member("a", 0.0), Member("b", 0.0), Member("c", 100.0)]
    >>> [assign(pods, k, 50.0) for k in range(4)]
    ['a', 'b', 'a', 'b']
    >>> [assign(pods, k, 150.0) for k in range(4)]
    ['a', 'b', 'c', 'a']
    """
    live = sorted((m for m in members if m.live_at(at_s)), key=lambda m: (m.joined_s, m.name))
    if not live:
        return None
    return live[index % len(live)].name


def read_members(directory: Path) -> list[Member]:
    """Every member recorded in a service directory (a file being replaced is skipped)."""
    members = []
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            left = doc.get("left_s")
            members.append(
                Member(
                    str(doc["name"]),
                    float(doc["joined_s"]),
                    math.inf if left is None else float(left),
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # written atomically, so only a foreign file lands here
    return members


def _write(directory: Path, member: Member) -> None:
    path = directory / f"{_file_name(member.name)}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    left = None if math.isinf(member.left_s) else member.left_s
    tmp.write_text(
        json.dumps({"name": member.name, "joined_s": member.joined_s, "left_s": left}),
        encoding="utf-8",
    )
    tmp.rename(path)  # atomic: a pod reading the directory never sees half a file


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def leave(directory: Path, name: str, at_s: float) -> None:
    """Record that member ``name`` serves nothing from ``at_s`` on (an earlier leave stands).

    A member that never joined is left alone: it never took a share.
    """
    for m in read_members(directory):
        if m.name == name and at_s < m.left_s:
            _write(directory, Member(name, m.joined_s, max(at_s, m.joined_s)))


class Service:
    """One pod's view of its service: its membership and the arrivals it keeps.

    :meth:`join` names the pod (its address, once its port is bound); :meth:`refresh`
    re-reads the directory (the server calls it before each advance); :meth:`keeps` is the
    fleet's filter over the service's arrival stream, and keeps nothing before the join.
    """

    def __init__(self, directory: Path) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpecError(f"--service {directory}: {exc.strerror}") from None
        self.directory = directory
        self.name: str | None = None
        self.members: list[Member] = []

    def join(self, name: str, at_s: float) -> None:
        """Serve this pod's share of the arrivals from ``at_s`` on, as member ``name``."""
        self.name = name
        _write(self.directory, Member(name, at_s))
        self.refresh()

    def leave(self, at_s: float) -> None:
        """Serve nothing from ``at_s`` on; the other members take the arrivals after it."""
        if self.name is not None:
            leave(self.directory, self.name, at_s)
        self.refresh()

    def refresh(self) -> None:
        """Read the service's members again."""
        self.members = read_members(self.directory)

    def keeps(self, index: int, at_s: float) -> bool:
        """Whether this pod serves arrival ``index`` of the stream, arriving at ``at_s``."""
        return self.name is not None and assign(self.members, index, at_s) == self.name
