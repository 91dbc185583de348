"""Which Prometheus series belong to the target's pods, and which to the canary's.

The operator's tuning loop (``k8s/tuning.py``) builds one
:class:`~spectune.metrics.PrometheusSource` for the target and one per canary from these
selectors. Pods are told apart by name, as Kubernetes names them: a Deployment ``D``'s pods
are ``D-<replicaset hash>-<pod hash>``, and a canary of ``D`` is a Deployment
``D-spt-<arm>`` (``k8s/deployments.py``), so its pods carry one more dash-separated part and
never match the target's pattern. Prometheus anchors ``=~`` on both ends. Pure strings.
"""

from __future__ import annotations

from spectune.metrics.prometheus import validate_selector

__all__ = ["canary_selector", "pod_pattern", "target_selector"]

#: The two hashes Kubernetes appends to a Deployment's pod names.
_HASHES = "-[a-z0-9]+-[a-z0-9]+"


def pod_pattern(deployment: str) -> str:
    """A PromQL regular expression matching exactly the pods of ``deployment``.

    >>> pod_pattern("llama-70b")
    'llama-70b-[a-z0-9]+-[a-z0-9]+'
    """
    # DNS names hold [a-z0-9.-]; only the dot is special in a regular expression.
    return deployment.replace(".", "[.]") + _HASHES


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def target_selector(namespace: str, target: str, user: str | None = None) -> str:
    """The selector of the target's own pods (never its canaries').

    With a ``user`` selector (``spec.metrics.prometheus.selector``) its matchers are kept and
    the canaries' pods are excluded by name.

    >>> target_selector("llm", "llama")
    '{namespace="llm",pod=~"llama-[a-z0-9]+-[a-z0-9]+"}'
    >>> target_selector("llm", "llama", '{job="vllm"}')
    '{job="vllm",pod!~"llama-spt-.+"}'
    """
    if user is not None:
        body = validate_selector(user)
        return "{" + body + ",pod!~" + _quote(target.replace(".", "[.]") + "-spt-.+") + "}"
    return "{namespace=" + _quote(namespace) + ",pod=~" + _quote(pod_pattern(target)) + "}"


def canary_selector(namespace: str, canary: str, user: str | None = None) -> str:
    """The selector of one canary Deployment's pods.

    >>> canary_selector("llm", "llama-spt-eagle3-3")
    '{namespace="llm",pod=~"llama-spt-eagle3-3-[a-z0-9]+-[a-z0-9]+"}'
    """
    pods = "pod=~" + _quote(pod_pattern(canary))
    if user is not None:
        return "{" + validate_selector(user) + "," + pods + "}"
    return "{namespace=" + _quote(namespace) + "," + pods + "}"
