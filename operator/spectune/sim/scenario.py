"""Scenario files: the simulator's input contract (``shared/scenario-format.md``, version 1).

A scenario describes one serving world — a replica's hardware, the target model, the
candidate drafters, the traffic and its changes, the fleet and what it runs before
tuning. ``spectune sim``, the bench and the demo all load scenarios through
:func:`load_scenario`, which validates every field and reports the first problems as one
:class:`~spectune.errors.SpecError` line that names the field path
(``routes[1].acceptance.eagel3: unknown drafter 'eagel3'; drafters are: eagle3, ngram``),
never a traceback. Units live in the field names (``_s``, ``_gib``, ``_tbs``, ``_ms``).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from spectune.errors import SpecError
from spectune.search.arms import Arm

__all__ = [
    "Acceptance",
    "Drafter",
    "DrafterBrokenEvent",
    "Event",
    "FixedTokens",
    "FleetSpec",
    "Hardware",
    "Initial",
    "LoadEvent",
    "LoadPoint",
    "LogNormalTokens",
    "ModelVersionEvent",
    "Objective",
    "PodDecayEvent",
    "Route",
    "RouteMixEvent",
    "Scenario",
    "SecondPopulation",
    "Target",
    "TokenDist",
    "UniformTokens",
    "injectable_event",
    "load_scenario",
    "scenario_from_mapping",
]

GPU_METHODS = frozenset({"eagle", "eagle3", "mtp", "draft_model", "medusa"})
CPU_METHODS = frozenset({"ngram", "suffix"})


class _Model(BaseModel):
    # strict: a YAML string such as "80GB" is never coerced into a number, so a value
    # written with a unit is reported instead of silently misread.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


NonNeg = Annotated[float, Field(ge=0)]
Pos = Annotated[float, Field(gt=0)]


class Hardware(_Model):
    """One replica, all its GPUs together."""

    memory_gib: Pos
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    bandwidth_tbs: Pos
    tflops: Pos
    step_overhead_ms: NonNeg = 4.0
    draft_step_overhead_ms: NonNeg = 1.0
    activation_reserve_gib: NonNeg = 0.0
    speed_spread: Annotated[float, Field(ge=0, lt=0.5)] = 0.0
    """Per-pod speed spread (realism knob, default off): each replica's forwards take
    ``m`` times as long, ``m`` uniform in ``[1 − s, 1 + s]`` and fixed per replica slot
    (GPUs of one model differ by a few per cent in clocks and thermals)."""
    cuda_graph_max_batch: Annotated[int, Field(ge=0)] = 0
    """CUDA-graph step staircase (realism knob, 0 = off): a decode step over ``n`` tokens,
    ``n`` up to this size, costs as many tokens as the smallest captured size at or above
    ``n`` (vLLM captures 1, 2, 4 and then every multiple of 8); steps with prefill and
    larger ones run eagerly, unpadded."""


class Target(_Model):
    """The served model and the engine limits that shape its scheduler."""

    name: str
    weights_gib: Pos
    params_b: Pos
    kv_bytes_per_token: Annotated[int, Field(gt=0)]
    max_num_seqs: Annotated[int, Field(ge=1)] = 256
    max_num_batched_tokens: Annotated[int, Field(ge=1)] = 8192
    block_size: Annotated[int, Field(ge=1)] = 16
    max_model_len: Annotated[int, Field(ge=2)] | None = None
    restart_s: NonNeg = 180.0


class Drafter(_Model):
    """A candidate drafter. Model drafters cost GPU memory and time; n-gram ones CPU time."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")]
    method: Literal["eagle", "eagle3", "mtp", "draft_model", "ngram", "suffix", "medusa"]
    model: str | None = None
    weights_gib: NonNeg = 0.0
    params_b: NonNeg = 0.0
    kv_bytes_per_token: Annotated[int, Field(ge=0)] = 0
    cpu_ms_per_step: NonNeg = 0.0
    max_k: Annotated[int, Field(ge=1, le=64)]

    @property
    def on_gpu(self) -> bool:
        """Whether drafting runs a model on the GPU (and so costs memory and a forward)."""
        return self.method in GPU_METHODS


class LogNormalTokens(_Model):
    """Token counts ~ log-normal with the given mean (not the log-space mean) and sigma."""

    dist: Literal["lognormal"]
    mean: Pos
    sigma: NonNeg
    max: Annotated[int, Field(ge=1)]


class FixedTokens(_Model):
    """Every request has the same token count."""

    dist: Literal["fixed"]
    value: Annotated[int, Field(ge=1)]
    max: Annotated[int, Field(ge=1)] | None = None


class UniformTokens(_Model):
    """Token counts uniform on ``[low, high]``."""

    dist: Literal["uniform"]
    low: Annotated[int, Field(ge=1)]
    high: Annotated[int, Field(ge=1)]
    max: Annotated[int, Field(ge=1)] | None = None


TokenDist = Annotated[LogNormalTokens | FixedTokens | UniformTokens, Field(discriminator="dist")]


def dist_mean(d: TokenDist) -> float:
    """A token-count distribution's mean for planning (a log-normal's mean, capped at its
    clip; the clipped tail's shape is ignored)."""
    if isinstance(d, LogNormalTokens):
        return float(min(d.mean, d.max))
    if isinstance(d, FixedTokens):
        return float(d.value)
    return float(d.low + d.high) / 2.0


def dist_upper(d: TokenDist) -> int:
    """The largest value a token-count distribution can produce after clipping."""
    if isinstance(d, LogNormalTokens):
        return d.max
    natural = d.value if isinstance(d, FixedTokens) else d.high
    return natural if d.max is None else min(natural, d.max)


class SecondPopulation(_Model):
    """A second population of requests on a route, with its own acceptance Beta."""

    share: Annotated[float, Field(gt=0, lt=1)]
    alpha: Annotated[float, Field(ge=0, le=1)]
    spread: Pos = 8.0


class Acceptance(_Model):
    """Per-route, per-drafter acceptance: ``q_i = α_req · decay^(i−1)``, α_req ~ Beta."""

    alpha: Annotated[float, Field(ge=0, le=1)]
    decay: Annotated[float, Field(gt=0, le=1)] = 1.0
    spread: Pos = 8.0
    second: SecondPopulation | None = None
    """Two-population acceptance (realism knob, default off): a ``share`` of the route's
    requests draws α from ``Beta(alpha, spread)`` of its own (requests that copy their
    prompt and requests that do not are two modes, not one wide Beta)."""


class Route(_Model):
    """A traffic class: its share, token-count distributions and acceptance per drafter."""

    name: str
    share: NonNeg
    prompt_tokens: TokenDist
    output_tokens: TokenDist
    acceptance: dict[str, Acceptance] = Field(default_factory=dict)


class LoadPoint(_Model):
    """Offered load from ``at_s`` on: constant, or a linear ramp to ``ramp_to`` over ``over_s``."""

    at_s: NonNeg
    requests_per_s: NonNeg
    ramp_to: NonNeg | None = None
    over_s: Pos | None = None


class FleetSpec(_Model):
    """How many replicas serve, and how the load balancer picks one."""

    replicas: Annotated[int, Field(ge=1, le=1024)] = 1
    balancer: Literal["round_robin", "least_outstanding"] = "least_outstanding"
    scrape_offset_s: Annotated[float, Field(ge=0, le=300)] = 0.0
    """Scrape offsets between pods (realism knob, default off): each pod's page is read
    ``u`` seconds after a window's nominal start and end, ``u`` uniform in ``[0, s]`` and
    fixed per replica slot, as Prometheus scrapes each target at its own phase within
    the scrape interval. The pods' counters then span windows shifted against each other:
    a burst or a load step falls into one pod's window and not another's."""


class Initial(_Model):
    """What the deployment runs before tuning; ``drafter: off`` (or null) for no speculation."""

    drafter: str | None = None
    k: Annotated[int, Field(ge=0)] | None = None
    schedule: list[tuple[int, int, int]] | None = None

    @field_validator("drafter", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        # YAML 1.1 reads a bare `off` as the boolean False.
        if value is False or value == "off":
            return None
        return value


class ModelVersionEvent(_Model):
    """A new checkpoint: each listed drafter's alpha is scaled (relative to the file's)."""

    at_s: NonNeg
    kind: Literal["model_version"]
    version: str
    acceptance_scale: dict[str, NonNeg] = Field(default_factory=dict)


class RouteMixEvent(_Model):
    """Route shares change; routes left out keep their share."""

    at_s: NonNeg
    kind: Literal["route_mix"]
    shares: dict[str, NonNeg]


class LoadEvent(_Model):
    """Offered load changes (same meaning as an entry of ``load``)."""

    at_s: NonNeg
    kind: Literal["load"]
    requests_per_s: NonNeg
    ramp_to: NonNeg | None = None
    over_s: Pos | None = None


class PodDecayEvent(_Model):
    """One pod's acceptance decays with its uptime; a restarted pod starts fresh.

    From ``at_s`` on, replica slot ``pod`` scales ``drafter``'s alpha (every drafter's when
    ``drafter`` is absent) by ``acceptance_per_hour ** h``, ``h`` the hours the pod has run
    since the later of ``at_s`` and its engine's start, never below ``floor``. A restart of
    the slot (a rollout, a deleted pod replaced) resets ``h`` to 0, and the new pod decays
    again from there: stale draft state that builds up while a pod runs (vLLM #41838,
    SGLang #28771). Like ``model_version``, it applies to requests admitted from then on.
    """

    at_s: NonNeg
    kind: Literal["pod_decay"]
    pod: Annotated[int, Field(ge=0)]
    acceptance_per_hour: Annotated[float, Field(gt=0, le=1)]
    drafter: str | None = None
    floor: Annotated[float, Field(ge=0, le=1)] = 0.0

    def factor(self, uptime_s: float) -> float:
        """The multiplier on alpha after ``uptime_s`` seconds counted from this event."""
        hours = max(uptime_s, 0.0) / 3600.0
        return max(self.floor, float(self.acceptance_per_hour**hours))


class DrafterBrokenEvent(_Model):
    """A drafter stops accepting: a wrong or corrupt draft checkpoint shipped.

    From ``at_s`` on, ``drafter`` accepts nothing on every pod (its alpha is 0), for
    requests admitted from then on. The checkpoint is what is broken, so a restarted pod
    loads it again and stays broken; the next ``model_version`` event (a new release of
    the checkpoints) repairs it. Arms of other drafters, and ``off``, are unaffected.
    """

    at_s: NonNeg
    kind: Literal["drafter_broken"]
    drafter: str


Event = Annotated[
    ModelVersionEvent | RouteMixEvent | LoadEvent | PodDecayEvent | DrafterBrokenEvent,
    Field(discriminator="kind"),
]


class Guardrails(_Model):
    """Regression limits relative to the baseline, as fractions (0.2 = 20 % worse)."""

    maxTTFTP95Regression: NonNeg | None = None
    maxQueueP95Regression: NonNeg | None = None
    maxE2EP95Regression: NonNeg | None = None
    maxTPOTP95Regression: NonNeg | None = None


class Objective(_Model):
    """The bench's default objective, and optional guardrails."""

    metric: Literal["tpotP95", "e2eP95", "ttftP95", "outputTokensPerSecond", "goodput"] = "tpotP95"
    guardrails: Guardrails | None = None


class Scenario(_Model):
    """One serving world. See ``shared/scenario-format.md`` for every field's meaning."""

    version: Literal[1]
    name: str
    seed: Annotated[int, Field(ge=0)] = 0
    duration_s: Pos
    engine: Literal["vllm", "sglang"] = "vllm"
    #: which release's /metrics page the replicas serve (the same physics, the families
    #: that release had): ``current`` is today's page of ``engine``; ``vllm-0.10`` has the
    #: per-step ``time_per_output_token_seconds`` and both KV gauges, no per-token TPOT;
    #: ``vllm-0.8.5`` also only ``gpu_cache_usage_perc``; ``vllm-0.8.3`` also no
    #: ``num_drafts`` nor per-position counters; ``sglang-2026`` adds
    #: ``spec_verify_calls_total`` and the active-tier gauges; ``sglang-underscore`` is the
    #: page spelled ``sglang_`` as routers that rewrite ``:`` serve it.
    metrics_version: Literal[
        "current", "vllm-0.10", "vllm-0.8.5", "vllm-0.8.3", "sglang-2026", "sglang-underscore"
    ] = "current"
    hardware: Hardware
    target: Target
    drafters: list[Drafter] = Field(default_factory=list)
    routes: Annotated[list[Route], Field(min_length=1)]
    load: Annotated[list[LoadPoint], Field(min_length=1)]
    fleet: FleetSpec = Field(default_factory=FleetSpec)
    initial: Initial = Field(default_factory=Initial)
    events: list[Event] = Field(default_factory=list)
    objective: Objective = Field(default_factory=Objective)

    @model_validator(mode="after")
    def _version_of_engine(self) -> Scenario:
        if self.metrics_version != "current" and not self.metrics_version.startswith(self.engine):
            raise ValueError(
                f"metrics_version {self.metrics_version!r} is not a {self.engine} release; "
                f"use current or one starting with {self.engine}-"
            )
        return self

    def drafter(self, name: str) -> Drafter:
        """The drafter called ``name``; :class:`SpecError` listing the valid ones if unknown."""
        for d in self.drafters:
            if d.name == name:
                return d
        raise SpecError(f"unknown drafter {name!r}; drafters are: {self.drafter_names()}")

    def drafter_names(self) -> str:
        """The drafters' names, comma-separated, for messages."""
        return ", ".join(d.name for d in self.drafters) or "(none)"

    @property
    def max_model_len(self) -> int:
        """``target.max_model_len``, or the largest prompt plus the largest output."""
        if self.target.max_model_len is not None:
            return self.target.max_model_len
        prompt = max(dist_upper(r.prompt_tokens) for r in self.routes)
        output = max(dist_upper(r.output_tokens) for r in self.routes)
        return prompt + output

    def route_weights(self) -> list[float]:
        """The routes' shares at the start, normalised to sum to 1 (validation keeps their
        sum above 0)."""
        total = sum(r.share for r in self.routes)
        return [r.share / total for r in self.routes]

    def mean_lengths(self) -> tuple[float, float]:
        """The share-weighted mean prompt and output tokens at the start."""
        w = self.route_weights()
        prompt = sum(x * dist_mean(r.prompt_tokens) for x, r in zip(w, self.routes, strict=True))
        output = sum(x * dist_mean(r.output_tokens) for x, r in zip(w, self.routes, strict=True))
        return prompt, output

    @property
    def initial_arm(self) -> Arm:
        """The arm every replica runs at time zero."""
        return _initial_arm(self.initial)

    def check_arm(self, arm: Arm) -> None:
        """Raise :class:`SpecError` if ``arm`` names an unknown drafter or a k above max_k."""
        if arm.drafter is None:
            return
        drafter = self.drafter(arm.drafter)
        mode = arm.adaptive
        if mode is not None and mode.engine != self.engine:
            raise SpecError(
                f"arm {arm}: {mode.value} is {mode.describe.split(':')[0]}, and this scenario's "
                f"engine is {self.engine}"
            )
        if arm.k > drafter.max_k:
            raise SpecError(f"arm {arm}: k={arm.k} is above {drafter.name}'s max_k {drafter.max_k}")


def _initial_arm(initial: Initial) -> Arm:
    if initial.drafter is None:
        return Arm(None)
    if initial.schedule is not None:
        return Arm.scheduled(initial.drafter, tuple(initial.schedule))
    return Arm(initial.drafter, initial.k if initial.k is not None else 1)


# --- loading and error reporting --------------------------------------------------------


def load_scenario(source: str | Path) -> Scenario:
    """Load and validate a scenario from a path, or from YAML text.

    A ``Path``, or a one-line string naming an existing file, is read from disk; any other
    string is parsed as YAML. Raises :class:`SpecError` with the field path on any problem.
    """
    text: str
    origin = "scenario"
    if isinstance(source, Path) or ("\n" not in source and Path(source).is_file()):
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"cannot read scenario {path}: {exc.strerror}") from None
        origin = str(path)
    elif "\n" not in source and source.endswith((".yaml", ".yml")):
        raise SpecError(f"scenario file {source} does not exist")
    else:
        text = source
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise SpecError(
            f"{origin}{where}: not valid YAML ({getattr(exc, 'problem', exc)})"
        ) from None
    if not isinstance(data, Mapping):
        raise SpecError(f"{origin}: a scenario is a YAML mapping (version, name, hardware, ...)")
    return scenario_from_mapping(data)


def scenario_from_mapping(data: Mapping[str, Any]) -> Scenario:
    """Validate an already-parsed scenario mapping (see :func:`load_scenario`)."""
    try:
        scenario = Scenario.model_validate(dict(data))
    except ValidationError as exc:
        raise SpecError(_describe(exc, data)) from None
    problems = _cross_check(scenario)
    if problems:
        raise SpecError(_join(problems))
    return scenario


def injectable_event(
    scenario: Scenario, data: object
) -> ModelVersionEvent | RouteMixEvent | DrafterBrokenEvent:
    """Validate one event to apply to a running replica (``sim serve``'s ``POST /sim/events``).

    ``data`` is one entry of ``events`` in the scenario format; ``at_s`` may be left out (the
    event applies when it arrives). Only ``model_version``, ``route_mix`` and
    ``drafter_broken`` can be injected: the load profile is drawn into the arrival stream at
    start-up, and a ``pod_decay`` belongs in the scenario file of the pod it decays (its
    uptime counts from the pod's start). Drafter and route names
    are checked against ``scenario``. Raises :class:`SpecError` naming the field.
    """
    if not isinstance(data, Mapping):
        raise SpecError("event: an event is a mapping such as {kind: model_version, ...}")
    body = {"at_s": 0, **dict(data)}
    kind = body.get("kind")
    models: dict[object, type[ModelVersionEvent | RouteMixEvent | DrafterBrokenEvent]] = {
        "model_version": ModelVersionEvent,
        "route_mix": RouteMixEvent,
        "drafter_broken": DrafterBrokenEvent,
    }
    model = models.get(kind)
    if model is None:
        raise SpecError(
            f"event.kind: {kind!r} cannot be injected into a running replica; "
            "use model_version, route_mix or drafter_broken"
        )
    try:
        event = model.model_validate(body)
    except ValidationError as exc:
        raise SpecError(
            "; ".join(
                f"event.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
        ) from None
    checked = scenario.model_copy(update={"events": [event], "duration_s": math.inf})
    problems = [p.replace("events[0]", "event", 1) for p in _cross_check(checked)]
    problems = [p for p in problems if p.startswith("event")]
    if problems:
        raise SpecError(_join(problems))
    return event


def _join(problems: list[str]) -> str:
    head = "; ".join(problems[:3])
    more = len(problems) - 3
    return head + (f" (and {more} more)" if more > 0 else "")


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


_UNITS = {
    "_s": "seconds",
    "_ms": "milliseconds",
    "_gib": "GiB",
    "_tbs": "TB/s",
    "tflops": "TFLOP/s",
    "_b": "billions of parameters",
    "_per_token": "bytes per token",
    "requests_per_s": "requests per second",
    "ramp_to": "requests per second",
}


def _unit_of(field: str) -> str | None:
    for suffix, unit in sorted(_UNITS.items(), key=lambda kv: -len(kv[0])):
        if field.endswith(suffix):
            return unit
    return None


def _model_fields_at(loc: tuple[int | str, ...]) -> list[str]:
    """Names of the fields valid in the mapping that holds ``loc``'s last element."""
    models: list[type[BaseModel]] = [Scenario]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        nxt: list[type[BaseModel]] = []
        for model in models:
            info = model.model_fields.get(part)
            if info is not None:
                nxt += _inner_models(info.annotation)
        models = nxt
    fields: list[str] = []
    for model in models:
        fields += [f for f in model.model_fields if f not in fields]
    return fields


def _inner_models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in getattr(annotation, "__args__", None) or ():
        found += _inner_models(arg)
    return found


def _describe(exc: ValidationError, data: Mapping[str, Any]) -> str:
    problems: list[tuple[int, str]] = []
    seen: set[str] = set()
    for err in exc.errors():
        loc = _strip_union_tags(tuple(err["loc"]))
        if err["type"] in {"union_tag_invalid", "union_tag_not_found"}:
            loc = (*loc, str(err.get("ctx", {}).get("discriminator", "kind")).strip("'"))
        path = _path(loc) or "scenario"
        if path in seen:
            continue  # one message per field: a union reports each branch
        seen.add(path)
        # A misspelt field shows up twice (unknown + missing); the unknown one says more.
        rank = 0 if err["type"] == "extra_forbidden" else 1
        problems.append((rank, f"{path}: {_reason(err, loc)}"))
    return _join([text for _, text in sorted(problems, key=lambda p: p[0])])


_DIST_TAGS = frozenset({"lognormal", "fixed", "uniform"})
_EVENT_TAGS = frozenset({"model_version", "route_mix", "load", "pod_decay", "drafter_broken"})


def _strip_union_tags(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """Drop the tags pydantic inserts after a discriminated union; the user never wrote them."""
    out: list[int | str] = []
    for part in loc:
        prev = out[-1] if out else None
        if prev in ("prompt_tokens", "output_tokens") and part in _DIST_TAGS:
            continue
        if len(out) == 2 and out[0] == "events" and part in _EVENT_TAGS:
            continue
        out.append(part)
    return tuple(out)


def _reason(err: Any, loc: tuple[int | str, ...]) -> str:
    kind = err["type"]
    field = str(loc[-1]) if loc else ""
    value = err.get("input")
    if kind == "extra_forbidden":
        valid = _model_fields_at(loc)
        close = difflib.get_close_matches(field, valid, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        unit_hint = ""
        if close and _unit_of(close[0]) and not _unit_of(field):
            unit_hint = f" (units are part of the field name: {_unit_of(close[0])})"
        listing = f"; valid fields: {', '.join(valid)}" if valid and not close else ""
        return f"unknown field{hint}{unit_hint}{listing}".rstrip()
    if kind == "missing":
        return "required field is missing"
    if kind in {"float_type", "int_type", "float_parsing", "int_parsing", "int_from_float"}:
        unit = _unit_of(field)
        wanted = "a whole number" if kind.startswith("int") else "a number"
        if unit:
            wanted += f" of {unit} (the unit is in the field name; write the bare number)"
        return f"expected {wanted}, got {value!r}"
    if kind in {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}:
        ctx = err.get("ctx", {})
        bound = {
            "greater_than": f"must be greater than {ctx.get('gt')}",
            "greater_than_equal": f"must be at least {ctx.get('ge')}",
            "less_than": f"must be less than {ctx.get('lt')}",
            "less_than_equal": f"must be at most {ctx.get('le')}",
        }[kind]
        negative = isinstance(value, int | float) and value < 0
        return f"{bound}, got {value!r}" + (
            " (negative values are not allowed)" if negative else ""
        )
    if kind in {"literal_error", "enum"}:
        return f"{value!r} is not one of {err.get('ctx', {}).get('expected')}"
    if kind == "union_tag_invalid":
        ctx = err.get("ctx", {})
        return f"{ctx.get('tag')!r} is not one of {ctx.get('expected_tags')}"
    if kind == "union_tag_not_found":
        return "required field is missing"
    if kind in {"model_type", "dict_type"}:
        return f"expected a mapping, got {value!r}"
    if kind == "list_type":
        return f"expected a list, got {value!r}"
    if kind in {"string_type"}:
        return f"expected a string, got {value!r}"
    if kind == "too_short":
        return "must not be empty"
    msg = str(err.get("msg", kind))
    return msg[0].lower() + msg[1:]


def _cross_check(s: Scenario) -> list[str]:
    """Checks that span fields: names that must exist, ordering, and arm limits."""
    problems: list[str] = []
    names = [d.name for d in s.drafters]
    valid = s.drafter_names()
    for i, d in enumerate(s.drafters):
        if names.index(d.name) != i:
            problems.append(f"drafters[{i}].name: duplicate drafter {d.name!r}")
        if d.on_gpu and d.params_b <= 0:
            problems.append(
                f"drafters[{i}].params_b: a {d.method} drafter runs on the GPU and needs "
                "params_b > 0"
            )
        if not d.on_gpu and (d.weights_gib > 0 or d.params_b > 0 or d.kv_bytes_per_token > 0):
            problems.append(
                f"drafters[{i}]: a {d.method} drafter uses no GPU memory; set "
                "cpu_ms_per_step instead of weights_gib/params_b/kv_bytes_per_token"
            )
    route_names = [r.name for r in s.routes]
    for i, r in enumerate(s.routes):
        if route_names.index(r.name) != i:
            problems.append(f"routes[{i}].name: duplicate route {r.name!r}")
        for key in r.acceptance:
            if key not in names:
                problems.append(
                    f"routes[{i}].acceptance.{key}: unknown drafter {key!r}; drafters are: {valid}"
                )
        for field in ("prompt_tokens", "output_tokens"):
            dist = getattr(r, field)
            if isinstance(dist, UniformTokens) and dist.low > dist.high:
                problems.append(f"routes[{i}].{field}.low: must not exceed high ({dist.high})")
    if sum(r.share for r in s.routes) <= 0:
        problems.append("routes: at least one route needs a share above 0")
    problems += _check_load(s)
    problems += _check_initial(s)
    for i, ev in enumerate(s.events):
        where = f"events[{i}]"
        if ev.at_s > s.duration_s:
            problems.append(f"{where}.at_s: {ev.at_s} is after duration_s ({s.duration_s})")
        if isinstance(ev, ModelVersionEvent):
            for key in ev.acceptance_scale:
                if key not in names:
                    problems.append(
                        f"{where}.acceptance_scale.{key}: unknown drafter {key!r}; "
                        f"drafters are: {valid}"
                    )
        elif isinstance(ev, RouteMixEvent):
            for key in ev.shares:
                if key not in route_names:
                    problems.append(
                        f"{where}.shares.{key}: unknown route {key!r}; routes are: "
                        + ", ".join(route_names)
                    )
        elif isinstance(ev, PodDecayEvent | DrafterBrokenEvent):
            if ev.drafter is not None and ev.drafter not in names:
                problems.append(
                    f"{where}.drafter: unknown drafter {ev.drafter!r}; drafters are: {valid}"
                )
            if isinstance(ev, PodDecayEvent) and ev.pod >= s.fleet.replicas:
                problems.append(
                    f"{where}.pod: no pod {ev.pod}; the fleet's pods are 0..{s.fleet.replicas - 1}"
                )
        elif (ev.ramp_to is None) != (ev.over_s is None):
            problems.append(f"{where}: ramp_to and over_s go together")
    return problems


def _check_load(s: Scenario) -> list[str]:
    problems: list[str] = []
    previous = -math.inf
    for i, p in enumerate(s.load):
        if p.at_s < previous:
            problems.append(f"load[{i}].at_s: entries must be in time order")
        previous = p.at_s
        if (p.ramp_to is None) != (p.over_s is None):
            problems.append(f"load[{i}]: ramp_to and over_s go together")
    return problems


def _check_initial(s: Scenario) -> list[str]:
    ini = s.initial
    if ini.drafter is None:
        if ini.k not in (None, 0) or ini.schedule is not None:
            return ["initial.k: speculation is off; drop k and schedule"]
        return []
    names = [d.name for d in s.drafters]
    if ini.drafter not in names:
        return [
            f"initial.drafter: unknown drafter {ini.drafter!r}; drafters are: {s.drafter_names()}"
        ]
    drafter = s.drafter(ini.drafter)
    if ini.schedule is None and ini.k is None:
        return ["initial.k: required when a drafter is set"]
    try:
        arm = _initial_arm(ini)
    except SpecError as exc:
        field = "initial.schedule" if ini.schedule is not None else "initial.k"
        return [f"{field}: {exc}"]
    if arm.k > drafter.max_k:
        field = "initial.schedule" if ini.schedule is not None else "initial.k"
        return [f"{field}: k={arm.k} is above {drafter.name}'s max_k ({drafter.max_k})"]
    return []
