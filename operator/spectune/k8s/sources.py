"""The metric sources a SpecTuning names, built from its spec and the cluster.

The tuning loop (``k8s/tuning.py``) asks here for the target's and the canary's sources:

* ``spec.metrics.prometheus``: :class:`~spectune.metrics.PrometheusSource` with the target's
  or canary's selector (``k8s/series.py``), authenticated from ``authSecretRef`` when set
  (:func:`prometheus_headers`: a bearer token, or basic auth from a Secret of type
  ``kubernetes.io/basic-auth``);
* ``spec.metrics.scrape``: :class:`PodsScrapeSource`, which lists the Deployment's serving
  pods for every window and scrapes their metrics page with
  :class:`~spectune.metrics.PodScrapeSource` (two scrapes, the window apart).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from spectune.api.spec import ScrapeMetrics, SecretKeyRef
from spectune.errors import NoDataError, SpecError
from spectune.k8s.actuator import api_error
from spectune.k8s.connect import read_json
from spectune.metrics.observation import Observation
from spectune.metrics.scrape import PodScrapeSource

__all__ = [
    "BASIC_AUTH",
    "AuthSecretError",
    "PodsScrapeSource",
    "auth_headers",
    "pod_urls",
    "prometheus_headers",
]

Obj = dict[str, Any]
BASIC_AUTH = "kubernetes.io/basic-auth"
"""The Secret type whose ``username`` and ``password`` keys give HTTP basic authentication."""

_FIELD = "spec.metrics.prometheus.authSecretRef"


class AuthSecretError(SpecError):
    """The Prometheus credentials Secret is missing or lacks its key (the user can fix it;
    the tuning loop looks again now and then)."""


def _decode(data: Mapping[str, str], key: str) -> str:
    return base64.b64decode(data[key]).decode().strip()


def auth_headers(secret: Mapping[str, Any], ref: SecretKeyRef) -> dict[str, str]:
    """The ``Authorization`` header from a Secret (as the API returns it: base64 ``data``).

    >>> import base64
    >>> b64 = lambda s: base64.b64encode(s.encode()).decode()
    >>> auth_headers({"data": {"token": b64("abc")}}, SecretKeyRef(name="p"))
    {'Authorization': 'Bearer abc'}
    >>> auth_headers({"type": "kubernetes.io/basic-auth",
    ...               "data": {"username": b64("u"), "password": b64("p")}},
    ...              SecretKeyRef(name="p"))
    {'Authorization': 'Basic dTpw'}
    """
    data: Mapping[str, str] = secret.get("data") or {}
    if secret.get("type") == BASIC_AUTH:
        missing = [k for k in ("username", "password") if k not in data]
        if missing:
            raise AuthSecretError(
                f"{_FIELD}: Secret {ref.name} of type {BASIC_AUTH} has no "
                f"{' or '.join(missing)}; add the key(s)"
            )
        pair = f"{_decode(data, 'username')}:{base64.b64decode(data['password']).decode()}"
        return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}
    if ref.key not in data:
        keys = ", ".join(sorted(data)) or "none"
        raise AuthSecretError(
            f"{_FIELD}.key: Secret {ref.name} has no key {ref.key!r} (its keys: {keys}); set "
            "key to the one holding the bearer token"
        )
    token = _decode(data, ref.key)
    if not token:
        raise AuthSecretError(f"{_FIELD}: key {ref.key!r} of Secret {ref.name} is empty")
    return {"Authorization": f"Bearer {token}"}


async def prometheus_headers(
    api: k8s.ApiClient, namespace: str, ref: SecretKeyRef | None
) -> dict[str, str]:
    """The HTTP headers for Prometheus: none, or ``Authorization`` from ``authSecretRef``."""
    if ref is None:
        return {}
    core = k8s.CoreV1Api(api)
    try:
        secret = await asyncio.to_thread(
            read_json, core.read_namespaced_secret, ref.name, namespace
        )
    except ApiException as exc:
        if exc.status == 404:
            raise AuthSecretError(
                f"{_FIELD}: Secret {namespace}/{ref.name} not found; create it (a bearer token "
                f"under key {ref.key!r}, or a {BASIC_AUTH} Secret)"
            ) from None
        raise api_error(exc, f"read Secret {namespace}/{ref.name}") from None
    return auth_headers(secret, ref)


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def pod_urls(pods: Sequence[Mapping[str, Any]], scrape: ScrapeMetrics) -> list[str]:
    """The metrics URL of every Running, Ready pod with an IP.

    >>> pod = {"metadata": {"name": "a"}, "status": {"phase": "Running", "podIP": "10.0.0.7",
    ...        "conditions": [{"type": "Ready", "status": "True"}]}}
    >>> pod_urls([pod], ScrapeMetrics(port=8000))
    ['http://10.0.0.7:8000/metrics']
    """
    urls = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or not _ready(pod):
            continue
        host = f"[{ip}]" if ":" in ip else ip
        urls.append(f"http://{host}:{scrape.port}{scrape.path}")
    return sorted(urls)


class PodsScrapeSource:
    """A windowed source over the serving pods of one Deployment, scraped directly.

    Parameters
    ----------
    pods
        Lists the Deployment's pods (the target's own, or the canary's).
    scrape
        ``spec.metrics.scrape``: the port and path of the metrics page.
    what
        Which pods these are, for messages ("the target llama").
    sleep
        How to wait out the window (the operator's clock).
    client
        An ``httpx.AsyncClient`` to reuse (tests pass one over a mock transport).
    """

    def __init__(
        self,
        pods: Callable[[], Awaitable[list[Obj]]],
        scrape: ScrapeMetrics,
        what: str,
        sleep: Callable[[float], Awaitable[None]],
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self._pods = pods
        self._scrape = scrape
        self._what = what
        self._sleep = sleep
        self._client = client

    async def observe(self, window_s: float) -> Observation:
        """Scrape the pods that serve now, wait out the window, scrape them again."""
        urls = pod_urls(await self._pods(), self._scrape)
        if not urls:
            raise NoDataError(f"no Running and Ready pod of {self._what} to scrape")
        source = PodScrapeSource(urls, sleep=self._sleep, client=self._client)
        return await source.observe(window_s)
