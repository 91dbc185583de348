"""The SpecTuning spec: what a user asks the operator to tune, and how.

The models here are the single source of the resource's schema: ``api/crd.py`` generates the
CRD from them (ranges, enums, defaults, descriptions and the CEL rules declared beside the
fields), and :func:`parse_spec` validates a body with the same rules, so a spec the API
server accepted and one read from a file fail alike. The operator's handlers call
:func:`parse_spec` on every event; ``api/convert.py`` turns the result into the brain's
search space, objective and controller settings.

Every field carries its unit and default in its description (``kubectl explain`` shows it).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from spectune.api.names import API_VERSION, KIND
from spectune.api.validation import (
    ApiModel,
    Duration,
    FieldProblem,
    HttpUrl,
    InvalidSpecError,
    PromSelector,
    field_error,
    validate_body,
)
from spectune.durations import parse_duration
from spectune.errors import InputError
from spectune.selectors import (
    HEADER_NAME_PATTERN,
    LABEL_NAME_PATTERN,
    MAX_HEADER_VALUE,
    RESERVED_HEADERS,
    check_headers,
)

__all__ = [
    "ADAPTIVE_METHODS",
    "MAX_NAME",
    "MIN_WINDOW_S",
    "MODEL_METHODS",
    "NO_MODEL_METHODS",
    "AdaptiveArm",
    "AdaptiveMode",
    "BatchRange",
    "CaSecretRef",
    "Drafter",
    "DriftAction",
    "DriftSpec",
    "Engine",
    "Guardrails",
    "HttpHeader",
    "Method",
    "MetricsSpec",
    "Mode",
    "ObjectiveMetric",
    "ObjectiveSpec",
    "PlacementChoice",
    "PodAction",
    "PrometheusMetrics",
    "PrometheusTLS",
    "RetuneSpec",
    "Schedule",
    "ScrapeMetrics",
    "SearchSpec",
    "SecretKeyRef",
    "SpecTuningSpec",
    "Strategy",
    "SwitchbackSpec",
    "TargetRef",
    "TiersStrategy",
    "TrafficMix",
    "TrustRemoteCode",
    "engine_mismatch",
    "parse_spec",
]

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# The arm names (`<drafter>/<k>`) and the trial history use the drafter's name: no '/'.
_DRAFTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
MAX_DRAFTERS = 16
MAX_K = 16
MIN_WINDOW_S = 30.0
"""Shortest ``search.window``, seconds (the spec's value, before any time scale).

A window is the unit the operator pays for: every window costs a Prometheus query or a
scrape of every pod, a status write and a step of the policy, per SpecTuning. A shorter one
also measures nothing: vLLM's counters are scraped every 15-30 s, so a window under 30 s
can hold no new sample at all, and a p95 of the few requests it sees is noise.
"""
MAX_NAME = 63
"""Longest SpecTuning name: it is the value of the ``spectune.io/spectuning`` label on every
canary, and a label value holds at most 63 characters."""


class Engine(enum.StrEnum):
    """The serving engine of the target container."""

    VLLM = "vllm"
    SGLANG = "sglang"


class Method(enum.StrEnum):
    """A speculative method, by its vLLM name (SGLang's algorithms map onto these)."""

    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    MTP = "mtp"
    DRAFT_MODEL = "draft_model"
    NGRAM = "ngram"
    SUFFIX = "suffix"
    MEDUSA = "medusa"
    DFLASH = "dflash"
    DSPARK = "dspark"
    MLP_SPECULATOR = "mlp_speculator"


MODEL_METHODS = frozenset(
    {
        Method.EAGLE,
        Method.EAGLE3,
        Method.DRAFT_MODEL,
        Method.MEDUSA,
        Method.DFLASH,
        Method.DSPARK,
        Method.MLP_SPECULATOR,
    }
)
"""Methods that need draft weights (``model``): vLLM refuses them without."""
NO_MODEL_METHODS = frozenset({Method.NGRAM, Method.SUFFIX})
"""Methods that draft from the text itself and take no ``model``."""
_VERIFY_METHODS = frozenset({Method.DSPARK, Method.MTP, Method.EAGLE3, Method.DFLASH})
_TIERS_METHODS = frozenset({Method.EAGLE, Method.EAGLE3})


def _cel_list(methods: frozenset[Method]) -> str:
    return "[" + ", ".join(f"'{m.value}'" for m in sorted(methods)) + "]"


class AdaptiveMode(enum.StrEnum):
    """An in-engine adaptive mode a drafter can run as one arm (``drafters[].adaptive``)."""

    BATCH_TABLE = "batchTable"
    VERIFY = "verify"
    TIERS = "tiers"

    @property
    def engine(self) -> Engine:
        """The one engine that has the mode."""
        return Engine.SGLANG if self is AdaptiveMode.TIERS else Engine.VLLM

    @property
    def what(self) -> str:
        """The engine setting the mode is, for messages."""
        return {
            AdaptiveMode.BATCH_TABLE: "vLLM's num_speculative_tokens_per_batch_size",
            AdaptiveMode.VERIFY: "vLLM's adaptive_verification",
            AdaptiveMode.TIERS: "SGLang's --speculative-adaptive",
        }[self]


ADAPTIVE_METHODS: Mapping[AdaptiveMode, frozenset[Method] | None] = {
    # Dynamic SD: vLLM documents it as tested with eagle, eagle3 and dflash and refuses no
    # method, so neither does spectune.
    AdaptiveMode.BATCH_TABLE: None,
    # DSpark's confidence head, generalised to MTP, EAGLE-3 and DFlash by vllm#52228.
    AdaptiveMode.VERIFY: _VERIFY_METHODS,
    # SGLang runs it with EAGLE and EAGLE3 (topk 1) only (reference/engines.md §2.4).
    AdaptiveMode.TIERS: _TIERS_METHODS,
}
"""The methods each adaptive mode runs with (``None``: any)."""


class TiersStrategy(enum.StrEnum):
    """How SGLang's ``--speculative-adaptive`` picks a tier."""

    ACCEPT_LENGTH = "acceptLength"
    THROUGHPUT_AWARE = "throughputAware"


class Strategy(enum.StrEnum):
    """How a trial arm is put in front of traffic."""

    CANARY = "canary"
    IN_PLACE = "inPlace"


class PlacementChoice(enum.StrEnum):
    """Where a canary's pods serve (``search.placement``)."""

    AUTO = "auto"
    REPLACE = "replace"
    BESIDE = "beside"


class Schedule(enum.StrEnum):
    """Whether to emit a per-batch-size draft-length table."""

    AUTO = "auto"
    OFF = "off"


class ObjectiveMetric(enum.StrEnum):
    """The figure the search optimises."""

    TPOT_P95 = "tpotP95"
    E2E_P95 = "e2eP95"
    TTFT_P95 = "ttftP95"
    OUTPUT_TOKENS_PER_SECOND = "outputTokensPerSecond"
    GOODPUT = "goodput"


class DriftAction(enum.StrEnum):
    """What a confirmed acceptance drift does."""

    ALERT = "alert"
    RETUNE = "retune"


class PodAction(enum.StrEnum):
    """What a pod whose acceptance decayed with its uptime gets."""

    ALERT = "alert"
    RESTART_POD = "restartPod"


class Mode(enum.StrEnum):
    """Whether the operator applies its choice or only recommends it."""

    AUTO = "auto"
    RECOMMEND = "recommend"


class TargetRef(ApiModel):
    """The Deployment whose speculative decoding is tuned (in the SpecTuning's namespace)."""

    kind: Literal["Deployment"] = Field(
        "Deployment", description="Kind of the target; only Deployment. Default Deployment."
    )
    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=_DNS_SUBDOMAIN,
        description="Name of the target Deployment, in the SpecTuning's namespace. Required.",
    )
    container: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        pattern=_DNS_LABEL,
        description=(
            "Name of the container that runs the engine. Unset: the Deployment's only "
            "container, or the one whose command runs vLLM, SGLang or trtllm-serve."
        ),
    )
    allow_managed: bool = Field(
        False,
        description=(
            "Tune a Deployment that another controller owns (an ownerReference with "
            "controller: true: KServe, llm-d, Dynamo, an Argo Rollout). That controller may "
            "revert every patch, so such a target is refused (Ready=False, ManagedTarget) "
            "unless this is true; set it only when the owner leaves the container's "
            "arguments alone. Default false."
        ),
    )


class SecretKeyRef(ApiModel):
    """A Secret in the SpecTuning's namespace holding Prometheus credentials.

    A Secret of type ``kubernetes.io/basic-auth`` gives HTTP basic authentication (its
    ``username`` and ``password`` keys); any other Secret gives a bearer token from ``key``.
    """

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=_DNS_SUBDOMAIN,
        description="Name of the Secret, in the SpecTuning's namespace. Required.",
    )
    key: str = Field(
        "token",
        min_length=1,
        max_length=253,
        description=(
            "Key in the Secret whose value is the bearer token (ignored for a Secret of type "
            "kubernetes.io/basic-auth, whose username and password keys are used). Default token."
        ),
    )


class CaSecretRef(ApiModel):
    """A Secret in the SpecTuning's namespace holding the CA that signed Prometheus'
    certificate (PEM)."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=_DNS_SUBDOMAIN,
        description="Name of the Secret, in the SpecTuning's namespace. Required.",
    )
    key: str = Field(
        "ca.crt",
        min_length=1,
        max_length=253,
        description="Key in the Secret whose value is the PEM CA bundle. Default ca.crt.",
    )


class PrometheusTLS(ApiModel):
    """How Prometheus' TLS certificate is checked (https URLs)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.caSecretRef) && self.insecureSkipVerify)",
                    "message": "set caSecretRef or insecureSkipVerify, not both",
                }
            ]
        }
    )

    ca_secret_ref: CaSecretRef | None = Field(
        None,
        description=(
            "Secret with the CA bundle (PEM) that signed Prometheus' certificate, for a "
            "private CA; only it is trusted then. Like authSecretRef, only a Secret labelled "
            'spectune.io/prometheus-credentials: "true" is used (the operator reads it with '
            "get on secrets). Unset: the system's CAs."
        ),
    )
    insecure_skip_verify: bool = Field(
        False,
        description=(
            "Do not check Prometheus' certificate: the traffic is encrypted but anyone on the "
            "path can pose as Prometheus (and receive authSecretRef's credentials). For "
            "testing only. Default false."
        ),
    )

    @model_validator(mode="after")
    def _not_both(self) -> PrometheusTLS:
        if self.ca_secret_ref is not None and self.insecure_skip_verify:
            raise field_error("", "set caSecretRef or insecureSkipVerify, not both")
        return self


class HttpHeader(ApiModel):
    """One extra HTTP header sent with every query."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(self.name.lowerAscii() in ["
                    + ", ".join(f"'{h}'" for h in sorted(RESERVED_HEADERS))
                    + "])",
                    "message": "this header cannot be set here (credentials come from "
                    "authSecretRef; the framing headers are the HTTP client's)",
                }
            ]
        }
    )

    name: str = Field(
        min_length=1,
        max_length=128,
        pattern=HEADER_NAME_PATTERN,
        description="Header name, e.g. X-Scope-OrgID. Not Authorization (use authSecretRef).",
    )
    value: str = Field(max_length=MAX_HEADER_VALUE, description="Header value, one line. Required.")


class PrometheusMetrics(ApiModel):
    """Read the engine's metrics from a Prometheus server that scrapes the pods."""

    url: HttpUrl = Field(
        description="Base URL of the Prometheus HTTP API, e.g. http://prometheus.monitoring:9090."
        " Must be on the operator's SPECTUNE_PROMETHEUS_URL_ALLOWLIST when one is set; "
        "redirects are not followed. Required."
    )
    auth_secret_ref: SecretKeyRef | None = Field(
        None,
        description=(
            "Secret with the credentials for Prometheus: a bearer token, or username and "
            "password for a Secret of type kubernetes.io/basic-auth. Only a Secret labelled "
            'spectune.io/prometheus-credentials: "true" is used (any other is treated as '
            "missing), so no SpecTuning can send a Secret that was not meant for Prometheus; "
            "a Secret annotated spectune.io/prometheus-url: <url> is sent to that URL only. "
            "The operator reads it with get on secrets. Unset: no authentication."
        ),
    )
    selector: PromSelector | None = Field(
        None,
        description=(
            "PromQL label matchers in braces that select the target's series, e.g. "
            '{namespace="llm",pod=~"llama-.*"}. Unset: the namespace and the pods of the '
            "target and its canaries."
        ),
    )
    headers: list[HttpHeader] = Field(
        default_factory=list,
        max_length=16,
        description=(
            "Extra HTTP headers sent with every query, e.g. X-Scope-OrgID for a Mimir, Cortex "
            "or Thanos tenant. Not for credentials: a header here is plain text that whoever "
            "reads the SpecTuning reads (use authSecretRef). Default none."
        ),
    )
    cluster: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        description=(
            "Only series whose clusterLabel label has this value: a matcher added to every "
            "query spectune builds, for a Prometheus (a global Thanos, Mimir) that holds many "
            "clusters' series, whose pods could otherwise share a namespace and a name. Not "
            "added to retune.trafficMix.query, which is used as written. Unset: no matcher."
        ),
    )
    cluster_label: str = Field(
        "cluster",
        max_length=128,
        pattern=LABEL_NAME_PATTERN,
        description="Name of the label that tells clusters apart (see cluster). Default cluster.",
    )
    tls: PrometheusTLS | None = Field(
        None, description="How Prometheus' TLS certificate is checked. Unset: the system's CAs."
    )

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: list[HttpHeader]) -> list[HttpHeader]:
        names = [h.name.lower() for h in headers]
        dup = next((h.name for h in headers if names.count(h.name.lower()) > 1), None)
        if dup is not None:
            raise ValueError(f"header {dup} is given twice; give each header once")
        try:
            check_headers({h.name: h.value for h in headers}, "headers")
        except InputError as exc:
            raise ValueError(str(exc).removeprefix("headers: ")) from None
        return headers


class ScrapeMetrics(ApiModel):
    """Scrape the engine's /metrics endpoint on every pod directly (no Prometheus needed)."""

    port: int = Field(
        ge=1, le=65535, description="Container port serving the metrics page. Required."
    )
    path: str = Field(
        "/metrics",
        min_length=1,
        max_length=256,
        pattern=r"^/\S*$",
        description="HTTP path of the metrics page. Default /metrics.",
    )


class MetricsSpec(ApiModel):
    """Where the engine's metrics come from: exactly one of prometheus or scrape."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.prometheus) != has(self.scrape)",
                    "message": "set exactly one of prometheus or scrape",
                }
            ]
        }
    )

    prometheus: PrometheusMetrics | None = Field(
        None, description="Query a Prometheus server. Set this or scrape."
    )
    scrape: ScrapeMetrics | None = Field(
        None, description="Scrape the pods' metrics pages directly. Set this or prometheus."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> MetricsSpec:
        if (self.prometheus is None) == (self.scrape is None):
            raise field_error("", "set exactly one of prometheus or scrape")
        return self


MAX_RANGES = 16
MAX_ADAPTIVE = 8
MAX_BATCH = 65536
_DEFAULT_STEPS = (1, 3, 7)  # SGLang's candidate_steps default (reference/engines.md §2.4)


class BatchRange(ApiModel):
    """One row of an adaptive table: the draft length for a range of running batch sizes."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.minBatch <= self.maxBatch",
                    "message": "must not exceed maxBatch",
                    "fieldPath": ".minBatch",
                }
            ]
        }
    )

    min_batch: int = Field(
        ge=1, le=MAX_BATCH, description="Smallest running batch size of the range. Required."
    )
    max_batch: int = Field(
        ge=1,
        le=MAX_BATCH,
        description="Largest running batch size of the range, at least minBatch. Required.",
    )
    k: int = Field(
        ge=0,
        le=MAX_K,
        description=(
            "batchTable: the draft length in the range (0: no drafts); verify: optimal_K, the "
            "mean drafted tokens verified per request. Tokens. Required."
        ),
    )


_TABLE_MODES = f"self.mode in ['{AdaptiveMode.BATCH_TABLE}', '{AdaptiveMode.VERIFY}']"


class AdaptiveArm(ApiModel):
    """One in-engine adaptive mode of a drafter, tried as one arm beside its fixed k."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"!({_TABLE_MODES}) || has(self.table)",
                    "messageExpression": "'required for mode ' + self.mode",
                    "fieldPath": ".table",
                    "reason": "FieldValueRequired",
                },
                {
                    "rule": f"{_TABLE_MODES} || !has(self.table)",
                    "message": "mode tiers takes steps, not a table",
                    "fieldPath": ".table",
                },
                {
                    "rule": f"self.mode == '{AdaptiveMode.VERIFY}' || !has(self.maxK)",
                    "message": "maxK applies to mode verify only",
                    "fieldPath": ".maxK",
                },
                {
                    "rule": f"self.mode == '{AdaptiveMode.TIERS}' || "
                    "(!has(self.steps) && !has(self.strategy))",
                    "message": "steps and strategy apply to mode tiers only",
                    "fieldPath": ".mode",
                },
            ]
        }
    )

    mode: AdaptiveMode = Field(
        description=(
            "batchTable: vLLM Dynamic SD (num_speculative_tokens_per_batch_size: k by running "
            "batch size, from table); verify: vLLM adaptive verification (adaptive_verification "
            "with table as optimal_K per batch size; methods dspark, mtp, eagle3, dflash); "
            "tiers: SGLang --speculative-adaptive over steps (methods eagle, eagle3). Required."
        )
    )
    table: tuple[BatchRange, ...] | None = Field(
        None,
        min_length=1,
        max_length=MAX_RANGES,
        description=(
            "batchTable and verify: the rows, in ascending batch sizes and not overlapping; "
            "outside them vLLM uses num_speculative_tokens. At most 16. Required for those "
            "modes."
        ),
    )
    max_k: int | None = Field(
        None,
        ge=1,
        le=MAX_K,
        description=(
            "verify only: the most one request drafts (num_speculative_tokens), at least the "
            "table's largest k, tokens. Unset: the drafter's maxK."
        ),
    )
    steps: (
        tuple[
            Annotated[int, Field(ge=1, le=MAX_K, description="A tier: draft steps, tokens.")], ...
        ]
        | None
    ) = Field(
        None,
        min_length=1,
        max_length=8,
        description=(
            "tiers only: SGLang's candidate_steps, ascending and distinct, tokens. "
            "Unset: [1, 3, 7]."
        ),
    )
    strategy: TiersStrategy | None = Field(
        None,
        description=(
            "tiers only: acceptLength (the tier follows the running accept length; SGLang's "
            "default) or throughputAware (--speculative-adaptive-strategy=throughput_aware). "
            "Unset: acceptLength."
        ),
    )

    @model_validator(mode="after")
    def _mode_fields(self) -> AdaptiveArm:
        mode = self.mode
        if mode is AdaptiveMode.TIERS:
            if self.table is not None:
                raise field_error("table", "mode tiers takes steps, not a table")
            steps = list(self.steps or ())
            if steps != sorted(set(steps)):
                raise field_error(
                    "steps", f"{steps} must be ascending and distinct, e.g. [1, 3, 7]"
                )
            return self
        if self.steps is not None or self.strategy is not None:
            raise field_error("mode", "steps and strategy apply to mode tiers only")
        if mode is not AdaptiveMode.VERIFY and self.max_k is not None:
            raise field_error("maxK", "maxK applies to mode verify only")
        if self.table is None:
            raise field_error("table", f"required for mode {mode.value}")
        previous = 0
        for i, row in enumerate(self.table):
            if row.min_batch > row.max_batch:
                raise field_error(f"table[{i}].minBatch", "must not exceed maxBatch")
            if row.min_batch <= previous:
                raise field_error(
                    f"table[{i}].minBatch",
                    f"{row.min_batch} is not above the previous row's maxBatch ({previous}): "
                    "list the rows in ascending batch sizes, without overlap",
                )
            previous = row.max_batch
        if max(row.k for row in self.table) < 1:
            raise field_error(
                "table", "every k is 0 (no drafts at any batch size); allowOff covers that"
            )
        return self

    @property
    def tiers(self) -> tuple[int, ...]:
        """The candidate steps (tiers only), SGLang's default when unset."""
        return self.steps or _DEFAULT_STEPS

    def rows(self) -> tuple[tuple[int, int, int], ...]:
        """The table as vLLM's ``[start_bs, end_bs, K]`` rows (empty for tiers)."""
        return tuple((r.min_batch, r.max_batch, r.k) for r in self.table or ())


class Drafter(ApiModel):
    """One candidate drafter; the search tries it at every draft length 1..maxK."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"!(self.method in {_cel_list(MODEL_METHODS)}) || has(self.model)",
                    "messageExpression": "'required for method ' + self.method",
                    "fieldPath": ".model",
                    "reason": "FieldValueRequired",
                },
                {
                    "rule": f"!(self.method in {_cel_list(NO_MODEL_METHODS)}) || !has(self.model)",
                    "messageExpression": (
                        "'not used by method ' + self.method + ': it drafts from the text'"
                    ),
                    "fieldPath": ".model",
                },
                {
                    "rule": "self.method == 'ngram' || "
                    "(!has(self.promptLookupMin) && !has(self.promptLookupMax))",
                    "message": "promptLookupMin and promptLookupMax apply to method ngram only",
                    "fieldPath": ".method",
                },
                {
                    "rule": "!has(self.promptLookupMin) || !has(self.promptLookupMax) || "
                    "self.promptLookupMin <= self.promptLookupMax",
                    "message": "must not exceed promptLookupMax",
                    "fieldPath": ".promptLookupMin",
                },
                {
                    "rule": "!has(self.adaptive) || self.adaptive.all(a, a.mode != "
                    f"'{AdaptiveMode.VERIFY}' || self.method in "
                    f"{_cel_list(_VERIFY_METHODS)})",
                    "messageExpression": "'adaptive mode verify (vLLM adaptive_verification) "
                    "runs with methods dspark, mtp, eagle3 and dflash, not ' + self.method",
                    "fieldPath": ".adaptive",
                },
                {
                    "rule": "!has(self.adaptive) || self.adaptive.all(a, a.mode != "
                    f"'{AdaptiveMode.TIERS}' || self.method in {_cel_list(_TIERS_METHODS)})",
                    "messageExpression": "'adaptive mode tiers (SGLang --speculative-adaptive) "
                    "runs with methods eagle and eagle3, not ' + self.method",
                    "fieldPath": ".adaptive",
                },
                {
                    "rule": "!has(self.adaptive) || self.adaptive.all(a, a.mode != "
                    f"'{AdaptiveMode.VERIFY}' || !has(a.table) || a.table.all(r, "
                    "r.k <= (has(a.maxK) ? a.maxK : self.maxK)))",
                    "message": "a verify table's k (optimal_K) must not exceed its maxK (unset: "
                    "the drafter's maxK): raise maxK or lower the table",
                    "fieldPath": ".adaptive",
                },
            ]
        }
    )

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=_DRAFTER_NAME,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self != 'off'", "message": "'off' names speculation off; pick another"}
            ]
        },
        description=(
            "Name of this candidate, unique in the list; arms are named <name>/<k> in status. "
            "Letters, digits, '_', '-', '.'; not 'off'. Required."
        ),
    )
    method: Method = Field(description="Speculative method, by its vLLM name. Required.")
    model: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        description=(
            "Draft weights: a Hugging Face repository or a path in the container. Required for "
            "eagle, eagle3, draft_model, medusa, dflash, dspark and mlp_speculator; optional "
            "for mtp (default: the target's own MTP heads); not allowed for ngram and suffix."
        ),
    )
    max_k: int = Field(
        5,
        ge=1,
        le=MAX_K,
        description="Largest draft length (num_speculative_tokens) to try, tokens. Default 5.",
    )
    adaptive: tuple[AdaptiveArm, ...] = Field(
        (),
        max_length=MAX_ADAPTIVE,
        description=(
            "In-engine adaptive modes of this drafter, each tried as one arm against the "
            "fixed draft lengths (and measured only by its own trial): batchTable and verify "
            "on vLLM, tiers on SGLang. At most 8. Default []."
        ),
    )
    prompt_lookup_max: int | None = Field(
        None,
        ge=1,
        le=64,
        description="ngram only: longest n-gram to match in the prompt, tokens. Unset: vLLM's.",
    )
    prompt_lookup_min: int | None = Field(
        None,
        ge=1,
        le=64,
        description=(
            "ngram only: shortest n-gram to match in the prompt, tokens; at most "
            "promptLookupMax. Unset: vLLM's."
        ),
    )

    @field_validator("name")
    @classmethod
    def _not_off(cls, name: str) -> str:
        if name == "off":
            raise ValueError("'off' names speculation off; pick another")
        return name

    @model_validator(mode="after")
    def _method_fields(self) -> Drafter:
        m = self.method
        if m in MODEL_METHODS and self.model is None:
            raise field_error("model", f"required for method {m.value}")
        if m in NO_MODEL_METHODS and self.model is not None:
            raise field_error("model", f"not used by method {m.value}: it drafts from the text")
        if m is not Method.NGRAM and (
            self.prompt_lookup_min is not None or self.prompt_lookup_max is not None
        ):
            raise field_error(
                "method", "promptLookupMin and promptLookupMax apply to method ngram only"
            )
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise field_error("promptLookupMin", "must not exceed promptLookupMax")
        for i, a in enumerate(self.adaptive):
            methods = ADAPTIVE_METHODS[a.mode]
            if methods is not None and m not in methods:
                raise field_error(
                    f"adaptive[{i}].mode",
                    f"{a.mode.value} ({a.mode.what}) runs with methods "
                    f"{', '.join(sorted(methods))}, not {m.value}; list it under one of those "
                    "drafters or remove it",
                )
            if a.mode is AdaptiveMode.VERIFY:
                top = max(k for _, _, k in a.rows())
                most = a.max_k if a.max_k is not None else self.max_k
                if top > most:
                    where = "maxK" if a.max_k is not None else "the drafter's maxK"
                    raise field_error(
                        f"adaptive[{i}].table",
                        f"optimal_K {top} exceeds {where} ({most}), the most one request "
                        f"drafts: raise maxK to {top} or lower the table",
                    )
        seen: dict[str, int] = {}
        for i, a in enumerate(self.adaptive):
            key = a.model_dump_json()
            if key in seen:
                raise field_error(
                    f"adaptive[{i}]", f"the same adaptive arm as adaptive[{seen[key]}]"
                )
            seen[key] = i
        return self


class SwitchbackSpec(ApiModel):
    """How an ``inPlace`` trial alternates the target between its two arms."""

    washout: Duration = Field(
        "1m",
        description=(
            "inPlace strategy: time after each restart of the target (once its rollout is "
            "Ready) that is not measured, a duration: the new pods' batch, prefix cache and "
            "queue refill, and Prometheus first scrapes them. Each A/B pair costs two "
            "restarts and two wash-outs. Default 1m."
        ),
    )


class SearchSpec(ApiModel):
    """How arms are tried and when the search stops."""

    strategy: Strategy = Field(
        Strategy.CANARY,
        description=(
            "canary: clone the target per trial arm so both arms serve the same live traffic; "
            "inPlace: a switchback on the target itself, one trial at a time: the target "
            "alternates between the trial arm and the incumbent, window by window, each "
            "window after a restart and a wash-out, and each trial window is compared with "
            "the incumbent window next to it. Default canary."
        ),
    )
    switchback: SwitchbackSpec = Field(
        default_factory=SwitchbackSpec,
        json_schema_extra={"default": {}},
        description="inPlace strategy: the switchback's wash-out. Default {} (washout 1m).",
    )
    canary_replicas: int = Field(
        1,
        ge=1,
        le=100,
        description="Replicas of each canary Deployment (canary strategy only). Default 1.",
    )
    placement: PlacementChoice = Field(
        PlacementChoice.AUTO,
        description=(
            "canary strategy: replace: the canary's pods take the place of as many target "
            "pods (the target is scaled from N to N-c once the canary is Ready, and back to "
            "N before it leaves), so every pod serves the target's own per-pod load; "
            "beside: the canary is added to the target's pods (each then carries N/(N+c) of "
            "its load); auto: replace where it can hold (N >= 2, c < N, no "
            "HorizontalPodAutoscaler or KEDA ScaledObject owns the replicas), else beside, "
            "with the reason in the LoadMatched condition. Default auto."
        ),
    )
    window: Duration = Field(
        "5m",
        json_schema_extra={
            "x-kubernetes-validations": [
                # The Duration type's own rule (this list replaces the type's).
                {"rule": "self.matches('[1-9]')", "message": "must be a positive duration"},
                {
                    # CEL reads Go durations; one written with days ("d") is checked by the
                    # operator only (it is at least a day unless its digits are all zero).
                    "rule": "self.contains('d') || duration(self) >= duration('30s')",
                    "message": "must be at least 30s (one scrape interval of the engine's "
                    "counters); write e.g. 1m or 5m",
                },
            ]
        },
        description=(
            "Length of one measurement window per trial, a duration of at least 30s. Default 5m."
        ),
    )

    @field_validator("window")
    @classmethod
    def _long_enough(cls, window: str) -> str:
        if parse_duration(window) < MIN_WINDOW_S:
            raise ValueError(
                f"{window!r} is shorter than the minimum {MIN_WINDOW_S:g}s (one scrape interval "
                "of the engine's counters); write e.g. 1m or 5m"
            )
        return window

    min_drafts: int = Field(
        20000,
        ge=0,
        description=(
            "Fewest tokens a drafted arm's canary must draft over its trial before the trial "
            "is judged: a trial short of it measures another window, up to three, tokens. "
            "Default 20000."
        ),
    )
    max_trials: int = Field(
        12, ge=1, le=50, description="Most trials (restarts) per search. Default 12."
    )
    verify_windows: int = Field(
        2,
        ge=0,
        le=20,
        description=(
            "Windows of the target on a newly promoted arm compared with the setting before "
            "it; worse with confidence on the objective or a guardrail rolls it back. Phase "
            "Verifying until then; 0 disables the check. Default 2."
        ),
    )
    epsilon: float = Field(
        0.02,
        gt=0,
        lt=1,
        description=(
            "Stop when the chosen arm is within this relative distance of the best, a fraction "
            "(0.02 = 2 %). Default 0.02."
        ),
    )
    delta: float = Field(
        0.05,
        gt=0,
        lt=1,
        description=("...with probability at least 1 - delta, a fraction. Default 0.05."),
    )
    schedule: Schedule = Field(
        Schedule.AUTO,
        description=(
            "auto: emit a per-batch-size draft-length table where the engine supports it; "
            "off: one draft length. Default auto."
        ),
    )


class Guardrails(ApiModel):
    """Largest tolerated regressions of a trial against the incumbent; null disables one."""

    max_ttft_p95_regression: float | None = Field(
        0.2,
        ge=0,
        alias="maxTTFTP95Regression",
        description=(
            "Largest relative rise of p95 time to first token, a fraction (0.2 = 20 %); "
            "null: unchecked. Default 0.2."
        ),
    )
    max_queue_p95_regression: float | None = Field(
        0.2,
        ge=0,
        alias="maxQueueP95Regression",
        description=(
            "Largest relative rise of p95 queue time, a fraction (0.2 = 20 %); "
            "null: unchecked. Default 0.2."
        ),
    )


class ObjectiveSpec(ApiModel):
    """What better means for this deployment."""

    metric: ObjectiveMetric = Field(
        ObjectiveMetric.TPOT_P95,
        description=(
            "tpotP95, e2eP95, ttftP95 (seconds, lower is better), outputTokensPerSecond or "
            "goodput (tokens/s per pod, higher is better). Default tpotP95."
        ),
    )
    guardrails: Guardrails = Field(
        default_factory=Guardrails,
        json_schema_extra={"default": {}},
        description="Regressions a trial may not cause. Default {} (every guardrail at 0.2).",
    )


class DriftSpec(ApiModel):
    """Acceptance drift: the first-position acceptance falling below its converged value."""

    threshold: float = Field(
        0.15,
        gt=0,
        lt=1,
        description=(
            "Relative drop of acceptance that counts as drift, a fraction (0.15 = 15 %). "
            "Default 0.15."
        ),
    )
    for_: Duration = Field(
        "30m",
        alias="for",
        description="How long the drop must last before it is drift, a duration. Default 30m.",
    )
    action: DriftAction = Field(
        DriftAction.RETUNE,
        description="alert: record an event and phase Drifted; retune: re-open the search. "
        "Default retune.",
    )
    pod_action: PodAction = Field(
        PodAction.ALERT,
        description=(
            "What a pod whose first-position acceptance fell below that of the pods started "
            "after it (POD_ACCEPTANCE_DECAY), for `for`, gets. alert: an event and the "
            "PodsHoldAcceptance condition; restartPod: also evict that pod (Eviction API: "
            "its PodDisruptionBudgets hold) so its Deployment replaces it, one pod at a time "
            "and two windows apart, never while a trial or a verification runs, and only "
            "while minReadyPods other pods stay Ready. "
            "Default alert."
        ),
    )
    min_ready_pods: int = Field(
        1,
        ge=1,
        le=1000,
        description=(
            "With podAction restartPod: Ready pods of the target, besides the one evicted, "
            "that must keep serving while it restarts, a count. Default 1."
        ),
    )


class TrafficMix(ApiModel):
    """A PromQL query whose result is the traffic mix; a large enough move re-opens the search."""

    query: str = Field(
        min_length=1,
        max_length=4096,
        description=(
            "Instant PromQL query returning one series per route with its traffic, e.g. "
            'sum by (route) (rate(http_requests_total{service="llama"}[10m])). Each '
            "series' share of the total is its route's share of the mix. Required."
        ),
    )
    threshold: float = Field(
        0.2,
        gt=0,
        le=1,
        description=(
            "Total variation distance between the mix the search ran on and the current mix "
            "(half the sum of the absolute share changes, 0..1) beyond which the routes count "
            "as changed, a fraction. Default 0.2."
        ),
    )


class RetuneSpec(ApiModel):
    """When a converged setting is measured again."""

    on_model_change: bool = Field(
        True,
        description=(
            "Re-tune when the image, --model, a drafter model or the spectune.io/model-version "
            "annotation changes. Default true."
        ),
    )
    on_route_change: bool = Field(
        True,
        description=(
            "Re-tune when the traffic mix of trafficMix moves beyond its threshold. Default true."
        ),
    )
    traffic_mix: TrafficMix | None = Field(
        None,
        description=(
            "How to measure the traffic mix (needs metrics.prometheus). Unset: route changes "
            "are not watched."
        ),
    )
    every: Duration | None = Field(
        None, description="Re-tune this long after each convergence, a duration. Unset: never."
    )
    drift: DriftSpec = Field(
        default_factory=DriftSpec,
        json_schema_extra={"default": {}},
        description="Acceptance drift detection. Default {} (threshold 0.15 for 30m, retune).",
    )


class TrustRemoteCode(ApiModel):
    """Drafter models this SpecTuning means to run on a target started with --trust-remote-code.

    A drafter's checkpoint is loaded with the target's --trust-remote-code, so its model names
    code that the canary runs. Two keys must agree: the SpecTuning lists the model here, and
    the operator's allow-list (SPECTUNE_DRAFTER_MODEL_ALLOW_LIST, chart value
    operator.drafterModelAllowList), which only its administrator sets, matches it. This list
    can only narrow what the operator allows; a model the target already runs as its drafter
    needs neither.
    """

    allowed_drafter_models: tuple[
        Annotated[
            str,
            Field(
                min_length=1,
                max_length=512,
                description="A drafter model, exactly as written in spec.drafters[].model.",
            ),
        ],
        ...,
    ] = Field(
        (),
        max_length=MAX_DRAFTERS,
        description=(
            "Drafter models (exactly as in spec.drafters[].model) that may run on a target "
            "started with --trust-remote-code, if the operator's allow-list also matches "
            "them. At most 16. Default []."
        ),
    )


class SpecTuningSpec(ApiModel):
    """Tune speculative decoding of one vLLM or SGLang Deployment under its live traffic."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.allowOff || (has(self.drafters) && size(self.drafters) > 0)",
                    "message": "list at least one drafter when allowOff is false",
                    "fieldPath": ".drafters",
                    "reason": "FieldValueRequired",
                },
                {
                    "rule": "!has(self.engine) || !has(self.drafters) || self.drafters.all(d, "
                    "!has(d.adaptive) || d.adaptive.all(a, "
                    f"(a.mode == '{AdaptiveMode.TIERS}') == (self.engine == '{Engine.SGLANG}')))",
                    "message": "adaptive modes batchTable and verify are vLLM's, tiers is "
                    "SGLang's: list only the engine's own modes",
                    "fieldPath": ".drafters",
                },
                {
                    "rule": "!has(self.retune) || !has(self.retune.trafficMix) || "
                    "has(self.metrics.prometheus)",
                    "message": "trafficMix is a Prometheus query: set metrics.prometheus",
                    "fieldPath": ".retune.trafficMix",
                },
            ]
        }
    )

    target_ref: TargetRef = Field(description="The Deployment to tune. Required.")
    engine: Engine | None = Field(
        None,
        description="vllm or sglang. Unset: detected from the target container's command.",
    )
    metrics: MetricsSpec = Field(description="Where the engine's metrics come from. Required.")
    drafters: tuple[Drafter, ...] = Field(
        (),
        max_length=MAX_DRAFTERS,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(x, self.exists_one(y, y.name == x.name))",
                    "message": "drafter names must be unique",
                }
            ]
        },
        description=(
            "Candidate drafters; speculation off is a candidate too unless allowOff is false. "
            "At most 16. Default []."
        ),
    )
    allow_off: bool = Field(
        True, description="Whether speculation off is a candidate. Default true."
    )
    search: SearchSpec = Field(
        default_factory=SearchSpec,
        json_schema_extra={"default": {}},
        description="How arms are tried. Default {} (every field at its default).",
    )
    objective: ObjectiveSpec = Field(
        default_factory=ObjectiveSpec,
        json_schema_extra={"default": {}},
        description="What to optimise. Default {} (tpotP95 with 20 % guardrails).",
    )
    retune: RetuneSpec = Field(
        default_factory=RetuneSpec,
        json_schema_extra={"default": {}},
        description="When to measure again. Default {} (on model and route changes, on drift).",
    )
    mode: Mode = Field(
        Mode.AUTO,
        description=(
            "auto: apply trials and the winner; recommend: write the recommendation to status "
            "and never touch the target. Default auto."
        ),
    )
    suspend: bool = Field(
        False,
        description=(
            "Freeze everything: no new trials, canaries removed, the target left as it is. "
            "Default false."
        ),
    )
    restore_on_delete: bool = Field(
        False,
        description=(
            "On deletion, put the target back on its original speculative setting instead of "
            "the last promoted one. Default false."
        ),
    )
    trust_remote_code: TrustRemoteCode | None = Field(
        None,
        description=(
            "For a target started with --trust-remote-code: the drafter models this "
            "SpecTuning may run there (the operator's allow-list must match them too). "
            "Unset: none but the one the target already runs."
        ),
    )

    @model_validator(mode="after")
    def _drafters(self) -> SpecTuningSpec:
        if not self.allow_off and not self.drafters:
            raise field_error("drafters", "list at least one drafter when allowOff is false")
        seen: dict[str, int] = {}
        for i, d in enumerate(self.drafters):
            if d.name in seen:
                raise field_error(
                    f"drafters[{i}].name",
                    f"duplicate drafter name {d.name!r} (also drafters[{seen[d.name]}])",
                )
            seen[d.name] = i
        if self.engine is not None and (problem := engine_mismatch(self, self.engine)):
            raise field_error(*problem)
        if self.retune.traffic_mix is not None and self.metrics.prometheus is None:
            raise field_error(
                "retune.trafficMix", "trafficMix is a Prometheus query: set metrics.prometheus"
            )
        return self


def engine_mismatch(spec: SpecTuningSpec, engine: Engine) -> tuple[str, str] | None:
    """The first adaptive arm ``engine`` does not have, as (field, reason); None if none.

    ``parse_spec`` asks it of ``spec.engine``; ``api/convert.py`` of the engine detected on
    the target when ``spec.engine`` is unset.
    """
    for i, d in enumerate(spec.drafters):
        for j, a in enumerate(d.adaptive):
            if a.mode.engine is not engine:
                own = "tiers" if engine is Engine.SGLANG else "batchTable or verify"
                return (
                    f"drafters[{i}].adaptive[{j}].mode",
                    f"{a.mode.value} is {a.mode.what}, and the engine is {engine.value}: use "
                    f"{engine.value}'s mode ({own}) or remove it",
                )
    return None


def parse_spec(body: Mapping[str, Any]) -> SpecTuningSpec:
    """The validated spec of a SpecTuning.

    ``body`` is the whole resource (kopf's ``body``, or a loaded manifest with ``apiVersion``,
    ``kind``, ``metadata`` and ``spec``) or the bare spec (kopf's ``spec``). Raises
    :class:`~spectune.api.validation.InvalidSpecError` (a
    :class:`~spectune.errors.SpecError`) listing every bad field by its path, e.g.
    ``spec.drafters[1].model: required for method eagle3``.

    >>> spec = parse_spec({"targetRef": {"name": "llama"},
    ...                    "metrics": {"scrape": {"port": 8000}},
    ...                    "drafters": [{"name": "ng", "method": "ngram", "maxK": 4}]})
    >>> spec.drafters[0].max_k, spec.search.window, spec.mode.value
    (4, '5m', 'auto')
    >>> try:
    ...     parse_spec({"targetRef": {"name": "llama"}, "metrics": {"scrape": {"port": 8000}},
    ...                 "drafters": [{"name": "e3", "method": "eagle3"}]})
    ... except InvalidSpecError as exc:
    ...     print(exc)
    invalid SpecTuning: spec.drafters[0].model: required for method eagle3
    """
    if not isinstance(body, Mapping):
        raise InvalidSpecError([FieldProblem("spec", "must be an object")])
    if not {"apiVersion", "kind", "metadata", "spec"}.isdisjoint(body):
        problems = []
        if body.get("apiVersion", API_VERSION) != API_VERSION:
            problems.append(FieldProblem("apiVersion", f"must be {API_VERSION}"))
        if body.get("kind", KIND) != KIND:
            problems.append(FieldProblem("kind", f"must be {KIND}"))
        if "spec" not in body:
            problems.append(FieldProblem("spec", "required"))
        name = (body.get("metadata") or {}).get("name")
        if isinstance(name, str) and len(name) > MAX_NAME:
            problems.append(
                FieldProblem(
                    "metadata.name",
                    f"at most {MAX_NAME} characters, got {len(name)}: it is the value of the "
                    "spectune.io/spectuning label on every canary; pick a shorter name",
                )
            )
        if problems:
            raise InvalidSpecError(problems)
        body = body["spec"]
    return validate_body(SpecTuningSpec, body, "spec")
