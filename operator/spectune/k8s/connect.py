"""The operator's Kubernetes client: in-cluster credentials, else the kubeconfig.

``handlers.py`` calls :func:`api_client` once at start-up and keeps the client in kopf's
memo; kopf itself finds the same credentials through its own login handlers.
"""

from __future__ import annotations

from kubernetes import client as k8s
from kubernetes import config
from kubernetes.config.config_exception import ConfigException

__all__ = ["api_client"]


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
