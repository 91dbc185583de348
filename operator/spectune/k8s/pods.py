"""The target's own pods for the tuning loop: which serve, when each started, deleting one.

``k8s/tuning.py`` gives the controller a :class:`TargetPods` (the ``Pods`` port of
``control/ports.py``) for ``retune.drift.podAction: restartPod``, and wraps its metrics in
:class:`PodStarts` so every pod of the target has a start time even where its metrics page
has no ``process_start_time_seconds`` (vLLM in multiprocess mode registers no process
collector): the pod's ``status.startTime``. Both are what per-pod decay
(``diagnose.pod_decay``) compares pods by.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from spectune.control.ports import Group, GroupMetrics
from spectune.errors import SpecTuneError
from spectune.k8s.actuator import api_error
from spectune.k8s.sources import pod_ready
from spectune.metrics.observation import Observation

__all__ = ["PodStarts", "TargetPods", "start_times"]

Obj = dict[str, Any]


def start_times(pods: list[Obj]) -> dict[str, float]:
    """Each pod's ``status.startTime`` as Unix seconds (pods without one are left out).

    >>> start_times([{"metadata": {"name": "a"}, "status": {"startTime": "2026-01-01T00:00:10Z"}}])
    {'a': 1767225610.0}
    """
    out: dict[str, float] = {}
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name")
        started = (pod.get("status") or {}).get("startTime")
        if not name or not started:
            continue
        try:
            out[str(name)] = datetime.fromisoformat(str(started).replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
    return out


class TargetPods:
    """The ``Pods`` port over the target Deployment's own pods (never its canaries').

    Parameters
    ----------
    api
        The Kubernetes API client.
    namespace
        The SpecTuning's (and the target's) namespace.
    list_pods
        Lists the target's own pods (``KubeActuator.target_pods``).
    """

    def __init__(
        self, api: k8s.ApiClient, namespace: str, list_pods: Callable[[], Awaitable[list[Obj]]]
    ) -> None:
        self._core = k8s.CoreV1Api(api)
        self._ns = namespace
        self._list = list_pods

    async def ready(self) -> list[str]:
        """The target's pods that are Running and Ready and not being deleted."""
        return sorted(str(p["metadata"]["name"]) for p in await self._list() if pod_ready(p))

    async def started(self) -> dict[str, float]:
        """Each of the target's pods' start time, Unix seconds."""
        return start_times(await self._list())

    async def evict(self, pod: str) -> str | None:
        """Evict one pod through the Eviction API (its ReplicaSet replaces it), so the
        PodDisruptionBudgets that cover it are honoured; one already gone is no error.

        The API server answers 429 when a budget allows no disruption now: that is returned
        as the reason, and the pod is left as it is.
        """
        body = k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=pod, namespace=self._ns))
        try:
            await asyncio.to_thread(self._core.create_namespaced_pod_eviction, pod, self._ns, body)
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status == 429:
                return f"a PodDisruptionBudget allows no disruption of {pod} now ({_reason(exc)})"
            raise api_error(exc, f"evict pod {self._ns}/{pod}") from None
        return None


def _reason(exc: ApiException) -> str:
    """The message of an API error's Status body, else its reason phrase."""
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or exc.status)


class PodStarts:
    """GroupMetrics that gives the target's pods a start time where their page had none.

    ``process_start_time_seconds`` is the engine's own start (a container restart resets
    it, as it resets the engine's state); the pod's ``status.startTime`` is used only
    where the page lacks it, and a failing pod list leaves the observation as it is.
    """

    def __init__(self, inner: GroupMetrics, started: Callable[[], Awaitable[dict[str, float]]]):
        self._inner = inner
        self._started = started

    async def observe(self, window_s: float) -> Mapping[Group, Observation]:
        """The inner observations, the target's pods given their start times."""
        out = dict(await self._inner.observe(window_s))
        obs = out.get(Group.INCUMBENT)
        if obs is None or not any(c.started_s is None for c in obs.per_pod.values()):
            return out
        try:
            starts = await self._started()
        except SpecTuneError:  # no start times: the pods are not compared this window
            return out
        per_pod = {
            name: c if c.started_s is not None else replace(c, started_s=starts.get(name))
            for name, c in obs.per_pod.items()
        }
        out[Group.INCUMBENT] = replace(obs, per_pod=per_pod)
        return out
