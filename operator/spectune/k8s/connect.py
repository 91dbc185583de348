"""The operator's Kubernetes client: in-cluster credentials, else the kubeconfig.

``handlers.py`` calls :func:`api_client` once at start-up and keeps the client in kopf's
memo; kopf itself finds the same credentials through its own login handlers.
"""

from __future__ import annotations

from kubernetes import client as k8s
from kubernetes import config
from kubernetes.config.config_exception import ConfigException

__all__ = ["api_client"]


def api_client() -> k8s.ApiClient:
    """A client for the cluster the operator runs in (or the current kubeconfig context)."""
    try:
        cfg = k8s.Configuration()
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return k8s.ApiClient(cfg)
    except ConfigException:
        api: k8s.ApiClient = config.new_client_from_config()  # type: ignore[no-untyped-call]
        return api
