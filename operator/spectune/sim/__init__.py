"""The simulator body: simulated vLLM/SGLang replicas that the bench, the demo and tests drive.

Layout: :mod:`~spectune.sim.scenario` (the input contract), :mod:`~spectune.sim.traffic`
(arrivals), :mod:`~spectune.sim.physics` (step cost, KV pool), :mod:`~spectune.sim.engine`
(one replica's scheduler and steps), :mod:`~spectune.sim.exposition` (its ``/metrics``
page), :mod:`~spectune.sim.fleet` (replicas, balancer, restarts, events, records),
:mod:`~spectune.sim.summary` (objective figures), :mod:`~spectune.sim.server` and
:mod:`~spectune.sim.command` (``spectune sim serve`` / ``sim run``).

The tuning brain never imports this package (DESIGN.md §2): it sees the simulator only
through metric text and port calls.
"""

from importlib import import_module
from typing import Any

# Names load on first use (PEP 562): `spectune --help` registers the sim subcommands without
# paying for numpy and scipy.special.
_EXPORTS = {
    "ApplyResult": "spectune.sim.fleet",
    "Fleet": "spectune.sim.fleet",
    "FleetTotals": "spectune.sim.fleet",
    "Phase": "spectune.sim.fleet",
    "ReplicaState": "spectune.sim.fleet",
    "RequestRecord": "spectune.sim.fleet",
    "Scenario": "spectune.sim.scenario",
    "load_scenario": "spectune.sim.scenario",
    "scenario_from_mapping": "spectune.sim.scenario",
    "Summary": "spectune.sim.summary",
    "summarise": "spectune.sim.summary",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'spectune.sim' has no attribute {name!r}")


__all__ = [
    "ApplyResult",
    "Fleet",
    "FleetTotals",
    "Phase",
    "ReplicaState",
    "RequestRecord",
    "Scenario",
    "Summary",
    "load_scenario",
    "scenario_from_mapping",
    "summarise",
]
