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

from spectune.sim.fleet import (
    ApplyResult,
    Fleet,
    FleetTotals,
    Phase,
    ReplicaState,
    RequestRecord,
)
from spectune.sim.scenario import Scenario, load_scenario, scenario_from_mapping
from spectune.sim.summary import Summary, summarise

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
