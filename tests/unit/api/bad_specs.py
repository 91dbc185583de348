"""Bad SpecTuning specs and the field each must be rejected at.

Shared by the unit tier (``parse_spec``) and the integration tier (the real API server with
the generated CRD), so both refuse the same specs and name the same field.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

DELETE = object()
"""A change value that removes the key from the base spec."""

BASE: dict[str, Any] = {
    "targetRef": {"kind": "Deployment", "name": "llama-8b", "container": "vllm"},
    "engine": "vllm",
    "metrics": {"prometheus": {"url": "http://prometheus.monitoring:9090"}},
    "drafters": [
        {"name": "ngram", "method": "ngram", "maxK": 4},
        {"name": "eagle3", "method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-8B", "maxK": 6},
    ],
    "search": {"window": "5m", "maxTrials": 12},
    "retune": {"every": "168h", "drift": {"threshold": 0.15, "for": "30m"}},
}

NGRAM = {"name": "ngram", "method": "ngram", "maxK": 4}
EAGLE3 = BASE["drafters"][1]
_ROWS = [{"minBatch": 1, "maxBatch": 32, "k": 5}, {"minBatch": 33, "maxBatch": 512, "k": 3}]
_TLS_BOTH = {"caSecretRef": {"name": "ca"}, "insecureSkipVerify": True}


@dataclass(frozen=True)
class BadSpec:
    """One bad spec: ``change`` merged into :data:`BASE`, refused at ``path``."""

    id: str
    change: dict[str, Any]
    path: str
    server_path: str | None = None
    """Where the API server reports it, when that differs (a rule on a whole list)."""

    def spec(self) -> dict[str, Any]:
        """The bad spec."""
        return _merge(copy.deepcopy(BASE), self.change)

    @property
    def api_server_path(self) -> str:
        """The field path the API server's message names."""
        return self.server_path or self.path


def _merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    for key, value in change.items():
        if value is DELETE:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


BAD_SPECS = [
    # wrong types
    BadSpec(
        "maxK-not-integer", {"drafters": [{**NGRAM, "maxK": "eight"}]}, "spec.drafters[0].maxK"
    ),
    BadSpec("maxK-numeric-string", {"drafters": [{**NGRAM, "maxK": "8"}]}, "spec.drafters[0].maxK"),
    BadSpec("suspend-not-boolean", {"suspend": "yes"}, "spec.suspend"),
    BadSpec("targetRef-not-object", {"targetRef": "llama-8b"}, "spec.targetRef"),
    BadSpec("window-not-string", {"search": {"window": 300}}, "spec.search.window"),
    # ranges
    BadSpec("k-above-16", {"drafters": [{**NGRAM, "maxK": 17}]}, "spec.drafters[0].maxK"),
    BadSpec("k-zero", {"drafters": [{**NGRAM, "maxK": 0}]}, "spec.drafters[0].maxK"),
    BadSpec("maxTrials-above-50", {"search": {"maxTrials": 51}}, "spec.search.maxTrials"),
    BadSpec("epsilon-zero", {"search": {"epsilon": 0}}, "spec.search.epsilon"),
    BadSpec("canaryReplicas-zero", {"search": {"canaryReplicas": 0}}, "spec.search.canaryReplicas"),
    BadSpec(
        "drift-threshold-one",
        {"retune": {"drift": {"threshold": 1.0}}},
        "spec.retune.drift.threshold",
    ),
    BadSpec(
        "pod-action-unknown",
        {"retune": {"drift": {"podAction": "deletePod"}}},
        "spec.retune.drift.podAction",
    ),
    BadSpec(
        "min-ready-pods-zero",
        {"retune": {"drift": {"minReadyPods": 0}}},
        "spec.retune.drift.minReadyPods",
    ),
    BadSpec(
        "negative-guardrail",
        {"objective": {"guardrails": {"maxTTFTP95Regression": -0.1}}},
        "spec.objective.guardrails.maxTTFTP95Regression",
    ),
    BadSpec(
        "scrape-port-out-of-range",
        {"metrics": {"prometheus": DELETE, "scrape": {"port": 70000}}},
        "spec.metrics.scrape.port",
    ),
    # enums
    BadSpec("unknown-engine", {"engine": "trtllm"}, "spec.engine"),
    BadSpec(
        "unknown-method",
        {"drafters": [{"name": "la", "method": "lookahead"}]},
        "spec.drafters[0].method",
    ),
    BadSpec("unknown-mode", {"mode": "yolo"}, "spec.mode"),
    BadSpec("target-not-deployment", {"targetRef": {"kind": "StatefulSet"}}, "spec.targetRef.kind"),
    # required fields and names
    BadSpec("target-without-name", {"targetRef": {"name": DELETE}}, "spec.targetRef.name"),
    BadSpec("drafter-named-off", {"drafters": [{**NGRAM, "name": "off"}]}, "spec.drafters[0].name"),
    BadSpec(
        "drafter-name-with-slash",
        {"drafters": [{**NGRAM, "name": "ng/4"}]},
        "spec.drafters[0].name",
    ),
    # cross-field rules (CEL in the CRD, validators in the models)
    BadSpec("empty-drafters-off-disabled", {"drafters": [], "allowOff": False}, "spec.drafters"),
    BadSpec("no-drafters-off-disabled", {"drafters": DELETE, "allowOff": False}, "spec.drafters"),
    BadSpec(
        "eagle3-without-model",
        {"drafters": [NGRAM, {"name": "e3", "method": "eagle3", "maxK": 4}]},
        "spec.drafters[1].model",
    ),
    BadSpec(
        "ngram-with-model",
        {"drafters": [{**NGRAM, "model": "meta-llama/Llama-3.2-1B"}]},
        "spec.drafters[0].model",
    ),
    BadSpec(
        "promptLookupMin-above-max",
        {"drafters": [{**NGRAM, "promptLookupMin": 5, "promptLookupMax": 3}]},
        "spec.drafters[0].promptLookupMin",
    ),
    BadSpec(
        "promptLookup-on-eagle3",
        {"drafters": [{"name": "e3", "method": "eagle3", "model": "m", "promptLookupMax": 3}]},
        "spec.drafters[0].method",
    ),
    # in-engine adaptive arms (drafters[].adaptive)
    BadSpec(
        "adaptive-batchTable-without-table",
        {"drafters": [NGRAM, {**EAGLE3, "adaptive": [{"mode": "batchTable"}]}]},
        "spec.drafters[1].adaptive[0].table",
    ),
    BadSpec(
        "adaptive-unknown-mode",
        {"drafters": [NGRAM, {**EAGLE3, "adaptive": [{"mode": "dynamic", "table": _ROWS}]}]},
        "spec.drafters[1].adaptive[0].mode",
    ),
    BadSpec(
        "adaptive-steps-on-batchTable",
        {
            "drafters": [
                NGRAM,
                {**EAGLE3, "adaptive": [{"mode": "batchTable", "table": _ROWS, "steps": [1, 3]}]},
            ]
        },
        "spec.drafters[1].adaptive[0].mode",
    ),
    BadSpec(
        "adaptive-range-reversed",
        {
            "drafters": [
                NGRAM,
                {
                    **EAGLE3,
                    "adaptive": [
                        {"mode": "batchTable", "table": [{"minBatch": 64, "maxBatch": 16, "k": 3}]}
                    ],
                },
            ]
        },
        "spec.drafters[1].adaptive[0].table[0].minBatch",
    ),
    BadSpec(
        "adaptive-tiers-on-vllm",
        {"drafters": [NGRAM, {**EAGLE3, "adaptive": [{"mode": "tiers"}]}]},
        "spec.drafters[1].adaptive[0].mode",
        server_path="spec.drafters",
    ),
    BadSpec(
        "adaptive-verify-on-ngram",
        {"drafters": [{**NGRAM, "adaptive": [{"mode": "verify", "table": _ROWS}]}]},
        "spec.drafters[0].adaptive[0].mode",
        server_path="spec.drafters[0].adaptive",
    ),
    BadSpec(
        "adaptive-verify-table-above-maxK",
        {
            "drafters": [
                NGRAM,
                {**EAGLE3, "adaptive": [{"mode": "verify", "maxK": 4, "table": _ROWS}]},
            ]
        },
        "spec.drafters[1].adaptive[0].table",
        server_path="spec.drafters[1].adaptive",
    ),
    BadSpec(
        "duplicate-drafter-names",
        {"drafters": [NGRAM, {**NGRAM, "maxK": 8}]},
        "spec.drafters[1].name",
        server_path="spec.drafters",
    ),
    BadSpec(
        "prometheus-and-scrape",
        {"metrics": {"scrape": {"port": 8000}}},
        "spec.metrics",
    ),
    BadSpec("neither-prometheus-nor-scrape", {"metrics": {"prometheus": DELETE}}, "spec.metrics"),
    # strings with a format
    BadSpec(
        "prometheus-url-not-a-url",
        {"metrics": {"prometheus": {"url": "prometheus.monitoring:9090"}}},
        "spec.metrics.prometheus.url",
    ),
    # Prometheus connectivity (issue [M] item 9): credentials only from a Secret
    BadSpec(
        "prometheus-authorization-as-a-plain-header",
        {"metrics": {"prometheus": {"headers": [{"name": "Authorization", "value": "Bearer x"}]}}},
        "spec.metrics.prometheus.headers",
        server_path="spec.metrics.prometheus.headers[0]",
    ),
    BadSpec(
        "prometheus-header-name-not-a-token",
        {"metrics": {"prometheus": {"headers": [{"name": "X Scope", "value": "t"}]}}},
        "spec.metrics.prometheus.headers[0].name",
    ),
    BadSpec(
        "prometheus-tls-ca-and-skip-verify",
        {"metrics": {"prometheus": {"tls": _TLS_BOTH}}},
        "spec.metrics.prometheus.tls",
    ),
    BadSpec(
        "prometheus-cluster-label-not-a-label",
        {"metrics": {"prometheus": {"cluster": "eu-1", "clusterLabel": "k8s-cluster"}}},
        "spec.metrics.prometheus.clusterLabel",
    ),
    BadSpec("window-not-a-duration", {"search": {"window": "5 min"}}, "spec.search.window"),
    BadSpec("window-zero", {"search": {"window": "0s"}}, "spec.search.window"),
    # bounds on what costs the operator (issue O item 8): a window under 30 s
    BadSpec("window-below-minimum", {"search": {"window": "10s"}}, "spec.search.window"),
    BadSpec("window-in-milliseconds", {"search": {"window": "500ms"}}, "spec.search.window"),
    BadSpec("window-just-under-minimum", {"search": {"window": "29.9s"}}, "spec.search.window"),
    BadSpec(
        "drift-for-not-a-duration",
        {"retune": {"drift": {"for": "half an hour"}}},
        "spec.retune.drift.for",
    ),
    BadSpec("every-in-weeks", {"retune": {"every": "1w"}}, "spec.retune.every"),
    # a typo: refused by the models, and by the API server under strict field validation
    BadSpec("misspelt-field", {"serch": {"window": "5m"}}, "spec.serch"),
]
