"""The operator's Kubernetes client: in-cluster credentials, else the kubeconfig.

``handlers.py`` calls :func:`api_client` once at start-up and keeps the client in kopf's
memo; kopf itself finds the same credentials through its own login handlers. The actuator
and the metric sources read objects through :func:`read_json`, as plain dicts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes import config
from kubernetes.config.config_exception import ConfigException

__all__ = ["api_client", "read_json"]


def api_client(connections: int | None = None) -> k8s.ApiClient:
    """A client for the cluster the operator runs in (or the current kubeconfig context).

    ``connections``: how many connections to the API server to keep open — as many as
    threads call it at once, or the pool (5 per CPU by default) drops and re-opens TLS
    connections under load.
    """
    cfg = k8s.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except ConfigException:
        config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    if connections is not None:
        cfg.connection_pool_maxsize = connections
    return k8s.ApiClient(cfg)


def read_json(call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The object a read or list method of the client returns, as the API server's JSON.

    The client would otherwise build its model objects (``V1Deployment``, ``V1PodList``, ...)
    from the JSON, and the operator turns them straight back into dicts: with hundreds of
    SpecTunings polling, that round trip was most of the operator's memory and CPU. An HTTP
    error still raises ``ApiException`` with its status and the server's message. Blocking:
    call it in a worker thread.
    """
    response = call(*args, _preload_content=False, **kwargs)
    try:
        doc: dict[str, Any] = json.loads(response.data)
    finally:
        response.release_conn()
    return doc
