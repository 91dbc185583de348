"""Sampled worlds: scenario files drawn from a family of priors (``spectune sim sample``).

A handful of hand-written scenarios cannot tell a general policy from one fitted to them, so
the bench's yardstick is a *family*: a YAML file of priors over hardware, target models,
drafters, traffic, load, fleets, events, objectives and starting settings
(``benchmarks/families/realistic.yaml``, whose comments cite the published numbers behind
each prior). :func:`sample_worlds` draws scenario files from it, in the ordinary scenario
format (``shared/scenario-format.md``), so every tool that reads a scenario reads a sampled
world too.

Every draw is checked before it is kept — the scenario validates, the starting arm can start
(its KV pool holds one ``max_model_len`` sequence), at least one other arm can start (there is
something to tune), the load is one the simulator can afford — and a rejected draw is drawn
again with the next attempt's generator; each rejection is reported with its reason. The
draws depend on the family file, the seed and the world's index only, so the same command
writes the same files on any machine.

The family file is parsed strictly: an unknown key, a range whose low end is above its high
end, or a choice with no positive weight is an error that names the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from spectune.errors import SpecError
from spectune.search.arms import Arm
from spectune.sim.physics import GIB, arm_physics
from spectune.sim.scenario import Scenario, scenario_from_mapping

__all__ = [
    "Family",
    "SampledWorld",
    "Sampling",
    "load_family",
    "off_capacity",
    "sample_worlds",
    "write_worlds",
]

#: Attempts per world before the family is declared unable to produce one.
MAX_ATTEMPTS = 200

Rng = np.random.Generator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Span(_Model):
    """A number drawn uniformly from ``[low, high]`` (``log: true``: log-uniformly)."""

    low: float
    high: float
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> Span:
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        if self.log and self.low <= 0:
            raise ValueError("a log-uniform span needs low > 0")
        return self

    def draw(self, rng: Rng) -> float:
        """One draw."""
        if self.log:
            return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return float(rng.uniform(self.low, self.high))


Num = float | Span
"""A fixed number, or a span to draw from."""

Weights = Annotated[dict[str, Annotated[float, Field(ge=0)]], Field(min_length=1)]
"""A categorical choice: option name → relative weight."""


def _num(x: Num, rng: Rng) -> float:
    return x.draw(rng) if isinstance(x, Span) else float(x)


def _choose(weights: Mapping[str, float], rng: Rng) -> str:
    names = list(weights)
    w = np.array([weights[n] for n in names], dtype=float)
    return names[int(rng.choice(len(names), p=w / w.sum()))]


class HardwareClass(_Model):
    """One GPU of a class; a replica gets ``tp`` of them (tensor parallelism)."""

    name: str
    weight: Annotated[float, Field(ge=0)] = 1.0
    memory_gib: float
    bandwidth_tbs: float
    tflops: float
    step_overhead_ms: Num
    draft_step_overhead_ms: Num
    tp: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    """Tensor-parallel sizes this class is deployed at; the smallest that fits is used."""


class TargetClass(_Model):
    """A target model (``params_b`` is the *active* parameter count, which sets FLOPs)."""

    name: str
    weight: Annotated[float, Field(ge=0)] = 1.0
    weights_gib: float
    params_b: float
    kv_bytes_per_token: int
    max_num_seqs: list[int]
    restart_s: Num = 180.0
    drafters: list[str]
    """Drafter classes that exist for this target (by name)."""


class DrafterClass(_Model):
    """A drafter kind: its method, and its size either absolute or relative to the target."""

    name: str
    method: Literal["eagle", "eagle3", "mtp", "draft_model", "ngram", "suffix", "medusa"]
    model: str | None = None
    params_b: Num | None = None
    """Absolute parameters (draft models)."""
    params_fraction: Num | None = None
    """Parameters as a fraction of the target's active ones (EAGLE/MTP heads)."""
    kv_fraction: Num = 0.0
    """KV bytes per token as a fraction of the target's."""
    cpu_ms_per_step: Num = 0.0
    max_k: list[int]


class AcceptancePrior(_Model):
    """Per-request acceptance on a route: ``alpha`` (first position), ``decay``, ``spread``."""

    alpha: Num
    decay: Num = 1.0
    spread: Num = 8.0


class RouteClass(_Model):
    """A traffic class; acceptance priors are keyed by drafter *method*."""

    name: str
    weight: Annotated[float, Field(ge=0)] = 1.0
    prompt_mean: Num
    prompt_sigma: Num = 0.8
    output_mean: Num
    output_sigma: Num = 0.7
    acceptance: dict[str, AcceptancePrior]


class LoadPrior(_Model):
    """Offered load as a fraction of ``off``'s capacity on the whole fleet, and its shape."""

    fraction: Span
    shapes: Weights
    step_factor: Span = Span(low=1.5, high=3.0)
    """How much a step or ramp multiplies (or divides) the load."""


class EventPrior(_Model):
    """How often the world changes while it runs."""

    model_version: Annotated[float, Field(ge=0, le=1)] = 0.0
    acceptance_scale: Span = Span(low=0.6, high=1.1)
    route_mix: Annotated[float, Field(ge=0, le=1)] = 0.0
    drafter_broken: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Chance of a ``drafter_broken`` event (one of the world's drafters stops accepting)."""
    pod_decay: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Chance of a ``pod_decay`` event on one pod, at ``acceptance_per_hour`` drawn from
    ``pod_decay_per_hour``."""
    pod_decay_per_hour: Span = Span(low=0.5, high=0.9)


class RealismPrior(_Model):
    """How often the simulator's realism knobs are on (each off by default: new physics)."""

    speed_spread: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Share of worlds whose pods differ in speed; their spread is drawn from ``spread``."""
    spread: Span = Span(low=0.02, high=0.05)
    cuda_graphs: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Share of worlds whose decode steps run padded CUDA graphs (captured up to 512)."""
    two_population: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Share of acceptance entries with a second, low-acceptance population of requests."""
    second_share: Span = Span(low=0.1, high=0.4)
    second_scale: Span = Span(low=0.1, high=0.5)
    """The second population's alpha as a share of the first's."""
    scrape_offsets: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Share of worlds whose pods are scraped at phases of their own; the largest offset
    is drawn from ``scrape_interval`` (Prometheus' common 15–30 s scrape intervals)."""
    scrape_interval: Span = Span(low=15.0, high=30.0)


class Family(_Model):
    """The priors of one family of worlds (see ``benchmarks/families/realistic.yaml``)."""

    version: Literal[1]
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    duration_s: Num
    engine: Weights
    hardware: Annotated[list[HardwareClass], Field(min_length=1)]
    targets: Annotated[list[TargetClass], Field(min_length=1)]
    drafters: Annotated[list[DrafterClass], Field(min_length=1)]
    routes: Annotated[list[RouteClass], Field(min_length=1)]
    route_count: Weights
    drafter_count: Weights
    losing: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Share of worlds where every drafter's acceptance is scaled down until none pays."""
    losing_scale: Span = Span(low=0.3, high=0.55)
    load: LoadPrior
    replicas: Weights
    balancer: Weights
    events: EventPrior = Field(default_factory=EventPrior)
    objective: Weights
    guardrails: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Share of worlds whose objective carries a TTFT p95 guardrail of 20 %."""
    initial: Weights
    """``off``, ``past_peak`` (a drafter at its largest k) or ``middle`` (about half of it)."""
    max_requests: Annotated[int, Field(ge=1)] = 60000
    """Most requests a world may offer over its run (the simulator's cost grows with them)."""
    realism: RealismPrior = Field(default_factory=RealismPrior)

    @model_validator(mode="after")
    def _cross(self) -> Family:
        drafters = {d.name for d in self.drafters}
        for t in self.targets:
            unknown = sorted(set(t.drafters) - drafters)
            if unknown:
                raise ValueError(
                    f"target {t.name!r} names unknown drafters {unknown}; "
                    f"drafters are: {', '.join(sorted(drafters))}"
                )
        for name, weights in (
            ("engine", self.engine),
            ("route_count", self.route_count),
            ("drafter_count", self.drafter_count),
            ("replicas", self.replicas),
            ("balancer", self.balancer),
            ("objective", self.objective),
            ("initial", self.initial),
            ("load.shapes", self.load.shapes),
        ):
            if sum(weights.values()) <= 0:
                raise ValueError(f"{name}: no option has a positive weight")
        bad = set(self.load.shapes) - set(_SHAPES)
        if bad:
            raise ValueError(
                f"load.shapes: unknown {sorted(bad)}; shapes are: {', '.join(_SHAPES)}"
            )
        bad = set(self.initial) - {"off", "past_peak", "middle"}
        if bad:
            raise ValueError(f"initial: unknown {sorted(bad)}; options are off, past_peak, middle")
        return self


def load_family(path: str | Path) -> Family:
    """Read and validate a family file; :class:`SpecError` names the field on bad input."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise SpecError(f"family file {p}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"family file {p}: not YAML ({exc})") from None
    if not isinstance(data, dict):
        raise SpecError(f"family file {p}: expected a mapping at the top level")
    try:
        return Family.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise SpecError(f"family file {p}: {where}: {first['msg']}") from None


@dataclass(frozen=True)
class SampledWorld:
    """One kept world: its scenario mapping, regime tags and the draws rejected before it."""

    name: str
    scenario: dict[str, Any]
    regime: dict[str, Any]
    rejected: tuple[str, ...] = ()


@dataclass
class Sampling:
    """The result of :func:`sample_worlds`: the worlds, and every rejection's reason."""

    worlds: list[SampledWorld] = field(default_factory=list)

    @property
    def rejections(self) -> list[str]:
        """Every rejected draw's reason, world by world."""
        return [f"{w.name}: {r}" for w in self.worlds for r in w.rejected]


class _Reject(Exception):
    """A draw that fails a check; the message is the reason."""


def sample_worlds(family: Family, seed: int, count: int) -> Sampling:
    """Draw ``count`` checked worlds from ``family`` with ``seed`` (reproducible)."""
    if count < 1:
        raise SpecError(f"--count must be at least 1, got {count}")
    if seed < 0:
        raise SpecError(f"--seed must be >= 0, got {seed}")
    out = Sampling()
    for i in range(count):
        name = f"{family.name}-{seed}-{i:03d}"
        rejected: list[str] = []
        for attempt in range(MAX_ATTEMPTS):
            rng = np.random.default_rng([seed, i, attempt])
            try:
                scenario, regime = _draw(family, name, rng)
            except _Reject as why:
                rejected.append(str(why))
                continue
            out.worlds.append(SampledWorld(name, scenario, regime, tuple(rejected)))
            break
        else:
            reasons = sorted(set(rejected))[:5]
            raise SpecError(
                f"family {family.name}: no valid world after {MAX_ATTEMPTS} draws for {name}; "
                f"reasons seen: {'; '.join(reasons)}"
            )
    return out


def write_worlds(sampling: Sampling, out_dir: str | Path) -> list[Path]:
    """Write each world as ``<name>.yaml`` and an ``index.yaml`` of their regimes."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    index = []
    for w in sampling.worlds:
        path = out / f"{w.name}.yaml"
        tags = ", ".join(f"{k}={v}" for k, v in w.regime.items())
        path.write_text(f"# sampled world ({tags})\n" + yaml.safe_dump(w.scenario, sort_keys=False))
        paths.append(path)
        index.append({"file": path.name, "regime": w.regime, "rejected": list(w.rejected)})
    (out / "index.yaml").write_text(yaml.safe_dump({"worlds": index}, sort_keys=False))
    return paths


# --- one draw -------------------------------------------------------------------------------

_SHAPES = ("constant", "step_up", "step_down", "ramp_up", "ramp_down", "diurnal")

#: Share of each tensor-parallel rank's bandwidth and FLOPs that survives the all-reduce of a
#: TP group, per doubling. Megatron-style TP adds two all-reduces per layer; on NVLink they
#: cost roughly a tenth of a decode step per doubling at 8B–70B (vLLM's published TP scaling
#: of decode throughput sits between 1.6x and 1.9x per doubling).
TP_EFFICIENCY = 0.9

#: Share of a replica's memory the target's weights may take for a tensor-parallel size to
#: be chosen: below 0.65 the KV pool holds tens of thousands of tokens, the smallest size
#: operators deploy a model at.
WEIGHTS_SHARE = 0.65


def _draw(family: Family, name: str, rng: Rng) -> tuple[dict[str, Any], dict[str, Any]]:
    target = family.targets[int(_pick(family.targets, rng))]
    hw_class = family.hardware[int(_pick(family.hardware, rng))]
    hardware, tp = _hardware(hw_class, target, rng)
    drafters = _drafters(family, target, rng)
    losing = bool(rng.uniform() < family.losing)
    scale = family.losing_scale.draw(rng) if losing else 1.0
    routes = _routes(family, drafters, scale, rng)
    duration = round(_num(family.duration_s, rng) / 60.0) * 60.0
    replicas = int(_choose(family.replicas, rng))
    metric = _choose(family.objective, rng)
    objective: dict[str, Any] = {"metric": metric}
    if rng.uniform() < family.guardrails:
        objective["guardrails"] = {"maxTTFTP95Regression": 0.2}
    scenario: dict[str, Any] = {
        "version": 1,
        "name": name,
        "seed": int(rng.integers(0, 2**31 - 1)),
        "duration_s": duration,
        "engine": _choose(family.engine, rng),
        "hardware": hardware,
        "target": {
            "name": target.name,
            "weights_gib": target.weights_gib,
            "params_b": target.params_b,
            "kv_bytes_per_token": target.kv_bytes_per_token,
            "max_num_seqs": int(rng.choice(target.max_num_seqs)),
            "max_num_batched_tokens": 8192,
            "block_size": 16,
            "restart_s": round(_num(target.restart_s, rng)),
        },
        "drafters": drafters,
        "routes": routes,
        "load": [{"at_s": 0, "requests_per_s": 1.0}],
        "fleet": {"replicas": replicas, "balancer": _choose(family.balancer, rng)},
        "initial": {"drafter": "off"},
        "objective": objective,
    }
    initial = _choose(family.initial, rng)
    scenario["initial"] = _initial(initial, drafters, rng)
    try:
        probe = scenario_from_mapping(scenario)
    except SpecError as exc:
        raise _Reject(f"invalid scenario: {exc}") from None
    _check_arms(probe)
    capacity = off_capacity(probe) * replicas
    fraction = family.load.fraction.draw(rng)
    shape = _choose(family.load.shapes, rng)
    factor = family.load.step_factor.draw(rng)
    load, events = _load(shape, fraction * capacity, factor, duration)
    scenario["load"] = load
    events += _world_events(family, scenario, duration, rng)
    scenario["events"] = sorted(events, key=lambda e: float(e["at_s"]))
    offered = _offered(load, events, duration)
    # A world too costly to simulate is made smaller where the physics allows it: the load
    # is set per fleet as a share of capacity, so fewer replicas (and a shorter run, to one
    # hour) keep each pod's load, which is what decides whether speculation pays. Only a
    # world still too costly on one replica for an hour is drawn again.
    while offered > family.max_requests and (replicas > 1 or duration > 3600):
        shrink = max(replicas // 2, 1) / replicas if replicas > 1 else 1.0
        if shrink == 1.0:
            # whole minutes, rounded down so that every pass shortens the run
            shrink_t = max(3600.0, math.floor(duration * family.max_requests / offered / 60) * 60)
            _scale_times(scenario, shrink_t / duration)
            duration = shrink_t
            scenario["duration_s"] = duration
        else:
            replicas = max(replicas // 2, 1)
            scenario["fleet"]["replicas"] = replicas
            _scale_rates(scenario, shrink)
            for ev in scenario["events"]:
                if ev["kind"] == "pod_decay":  # the decaying pod stays one of the fleet's
                    ev["pod"] = min(int(ev["pod"]), replicas - 1)
        offered = _offered(scenario["load"], scenario["events"], duration)
    if offered > family.max_requests:
        raise _Reject(
            f"too costly to simulate: {offered:.0f} requests offered on one replica in an "
            f"hour, family max_requests {family.max_requests}"
        )
    if offered < 50:
        raise _Reject(f"too idle to measure: {offered:.0f} requests offered over the run")
    knobs = _realism(family.realism, scenario, rng)
    try:
        scenario_from_mapping(scenario)
    except SpecError as exc:  # pragma: no cover - the probe above validated the same shape
        raise _Reject(f"invalid scenario: {exc}") from None
    regime = {
        "target": target.name,
        "hardware": f"{hw_class.name}x{tp}",
        "replicas": replicas,
        "load_band": _band(fraction),
        "load_fraction": round(fraction, 3),
        "shape": shape,
        "drafters": "+".join(sorted({str(d["method"]) for d in drafters})),
        "objective": metric,
        "initial": initial,
        "losing": losing,
        "routes": len(routes),
        "events": "+".join(sorted({str(e["kind"]) for e in events if e["kind"] != "load"}))
        or "none",
    }
    if knobs:
        regime["realism"] = "+".join(knobs)
    return scenario, regime


def _realism(prior: RealismPrior, scenario: dict[str, Any], rng: Rng) -> list[str]:
    """Turn on the realism knobs this world draws; the names of those on.

    Drawn after everything else, so a family whose knobs are all off draws the same worlds
    as before the knobs existed (no draw is spent on a knob whose share is 0).
    """
    on: list[str] = []
    if prior.speed_spread > 0 and rng.uniform() < prior.speed_spread:
        scenario["hardware"]["speed_spread"] = round(prior.spread.draw(rng), 3)
        on.append("speed_spread")
    if prior.cuda_graphs > 0 and rng.uniform() < prior.cuda_graphs:
        scenario["hardware"]["cuda_graph_max_batch"] = 512
        on.append("cuda_graphs")
    if prior.two_population > 0:
        for route in scenario["routes"]:
            for acc in route["acceptance"].values():
                if rng.uniform() < prior.two_population:
                    acc["second"] = {
                        "share": round(prior.second_share.draw(rng), 3),
                        "alpha": round(acc["alpha"] * prior.second_scale.draw(rng), 3),
                        "spread": acc["spread"],
                    }
                    if "two_population" not in on:
                        on.append("two_population")
    if prior.scrape_offsets > 0 and rng.uniform() < prior.scrape_offsets:
        scenario["fleet"]["scrape_offset_s"] = round(prior.scrape_interval.draw(rng), 1)
        on.append("scrape_offsets")
    return on


def _pick(options: Sequence[HardwareClass | TargetClass], rng: Rng) -> int:
    w = np.array([o.weight for o in options], dtype=float)
    if w.sum() <= 0:
        raise _Reject("no option has a positive weight")
    return int(rng.choice(len(options), p=w / w.sum()))


def _hardware(hw: HardwareClass, target: TargetClass, rng: Rng) -> tuple[dict[str, Any], int]:
    util = 0.9
    for tp in sorted(hw.tp):
        if target.weights_gib <= WEIGHTS_SHARE * hw.memory_gib * tp * util:
            eff = TP_EFFICIENCY ** math.log2(tp)
            return {
                "memory_gib": round(hw.memory_gib * tp, 1),
                "gpu_memory_utilization": util,
                "bandwidth_tbs": round(hw.bandwidth_tbs * tp * eff, 3),
                "tflops": round(hw.tflops * tp * eff, 1),
                "step_overhead_ms": round(_num(hw.step_overhead_ms, rng), 2),
                "draft_step_overhead_ms": round(_num(hw.draft_step_overhead_ms, rng), 2),
                "activation_reserve_gib": round(2.0 * tp, 1),
            }, tp
    raise _Reject(f"{target.name} does not fit on {hw.name} at tensor-parallel sizes {hw.tp}")


def _drafters(family: Family, target: TargetClass, rng: Rng) -> list[dict[str, Any]]:
    classes = [d for d in family.drafters if d.name in target.drafters]
    want = min(int(_choose(family.drafter_count, rng)), len(classes))
    chosen = rng.choice(len(classes), size=want, replace=False)
    out = []
    for j in sorted(int(c) for c in chosen):
        d = classes[j]
        entry: dict[str, Any] = {"name": d.name, "method": d.method}
        if d.model is not None:
            entry["model"] = d.model
        if d.method in ("ngram", "suffix"):
            entry["cpu_ms_per_step"] = round(_num(d.cpu_ms_per_step, rng), 3)
        else:
            if d.params_b is not None:
                params = _num(d.params_b, rng)
            elif d.params_fraction is not None:
                params = target.params_b * _num(d.params_fraction, rng)
            else:
                raise _Reject(f"drafter {d.name}: neither params_b nor params_fraction")
            if params >= target.params_b / 2:
                raise _Reject(f"drafter {d.name} ({params:.1f}B) is not smaller than the target")
            entry["params_b"] = round(params, 3)
            entry["weights_gib"] = round(2.0 * params * 1e9 / GIB, 3)  # bf16
            entry["kv_bytes_per_token"] = int(target.kv_bytes_per_token * _num(d.kv_fraction, rng))
        entry["max_k"] = int(rng.choice(d.max_k))
        out.append(entry)
    return out


def _routes(
    family: Family, drafters: list[dict[str, Any]], scale: float, rng: Rng
) -> list[dict[str, Any]]:
    n = min(int(_choose(family.route_count, rng)), len(family.routes))
    w = np.array([r.weight for r in family.routes], dtype=float)
    picked = rng.choice(len(family.routes), size=n, replace=False, p=w / w.sum())
    shares = rng.dirichlet(np.full(n, 2.0))
    out = []
    for j, share in zip(sorted(int(p) for p in picked), shares, strict=True):
        r = family.routes[j]
        prompt = _num(r.prompt_mean, rng)
        output = _num(r.output_mean, rng)
        acceptance = {}
        for d in drafters:
            prior = r.acceptance.get(str(d["method"]))
            if prior is None:
                continue
            acceptance[str(d["name"])] = {
                "alpha": round(min(0.98, _num(prior.alpha, rng) * scale), 3),
                "decay": round(min(1.0, _num(prior.decay, rng)), 3),
                "spread": round(_num(prior.spread, rng), 2),
            }
        out.append(
            {
                "name": r.name,
                "share": round(float(share), 3),
                "prompt_tokens": {
                    "dist": "lognormal",
                    "mean": round(prompt),
                    "sigma": round(_num(r.prompt_sigma, rng), 2),
                    "max": int(min(32768, 6 * prompt)),
                },
                "output_tokens": {
                    "dist": "lognormal",
                    "mean": round(output),
                    "sigma": round(_num(r.output_sigma, rng), 2),
                    "max": int(min(8192, 5 * output)),
                },
                "acceptance": acceptance,
            }
        )
    return out


def _initial(kind: str, drafters: list[dict[str, Any]], rng: Rng) -> dict[str, Any]:
    if kind == "off" or not drafters:
        return {"drafter": "off"}
    d = drafters[int(rng.integers(len(drafters)))]
    max_k = int(d["max_k"])
    k = max_k if kind == "past_peak" else max(1, round(max_k / 2))
    return {"drafter": d["name"], "k": k}


def _check_arms(s: Scenario) -> None:
    initial = s.initial_arm
    failure = arm_physics(s, initial).failure
    if failure is not None:
        raise _Reject(f"the initial arm {initial} cannot start: {failure}")
    others = [Arm(None)] + [Arm(d.name, 1) for d in s.drafters]
    if not any(a != initial and arm_physics(s, a).failure is None for a in others):
        raise _Reject("no arm but the initial one can start: nothing to tune")


def off_capacity(s: Scenario) -> float:
    r"""Requests per second one replica serves with speculation off at its largest batch.

    The batch is capped by ``max_num_seqs`` and by the KV pool at the routes' mean context
    (prompt plus half the output). At batch :math:`B` with mean context :math:`C` a decode
    step takes :math:`t(B) = t_0 + \max(W/BW, 2PB/F) + \kappa B C / BW` (DESIGN.md §4), and
    a request costs its output's share of steps plus its prefill, compute-bound:

    .. math:: \text{capacity} = 1 / (\bar o \, t(B) / B + 2 P \bar p / F)

    An estimate (no queueing, no chunked-prefill interference), used only to place a
    sampled world's load between idle and past saturation.
    """
    phys = arm_physics(s, Arm(None))
    prompt, output = s.mean_lengths()
    context = prompt + output / 2.0
    batch = max(1.0, min(float(s.target.max_num_seqs), phys.kv_tokens / max(context, 1.0)))
    step = phys.target.time(batch, batch * context)
    prefill = phys.target.per_token_s * prompt
    return 1.0 / (output * step / batch + prefill)


def _load(
    shape: str, rate: float, factor: float, duration: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    third = round(duration / 3.0)
    r = round(rate, 4)
    if shape == "constant":
        return [{"at_s": 0, "requests_per_s": r}], []
    if shape in ("step_up", "step_down"):
        after = r * factor if shape == "step_up" else r / factor
        return [{"at_s": 0, "requests_per_s": r}], [
            {"at_s": third, "kind": "load", "requests_per_s": round(after, 4)}
        ]
    if shape in ("ramp_up", "ramp_down"):
        a, b = (r, r * factor) if shape == "ramp_up" else (r, r / factor)
        return [{"at_s": 0, "requests_per_s": round(a, 4)}], [
            {
                "at_s": third,
                "kind": "load",
                "requests_per_s": round(a, 4),
                "ramp_to": round(b, 4),
                "over_s": third,
            },
            {"at_s": 2 * third, "kind": "load", "requests_per_s": round(b, 4)},
        ]
    # diurnal: a trough at the start and the end, the peak (rate × factor) in the middle
    peak = round(r * factor, 4)
    half = round(duration / 2.0)
    return [{"at_s": 0, "requests_per_s": r, "ramp_to": peak, "over_s": half}], [
        {"at_s": half, "kind": "load", "requests_per_s": peak, "ramp_to": r, "over_s": half},
    ]


def _offered(load: list[dict[str, Any]], events: list[dict[str, Any]], duration: float) -> float:
    points = sorted(
        [*load] + [e for e in events if e["kind"] == "load"],
        key=lambda p: float(p["at_s"]),
    )
    total = 0.0
    for i, p in enumerate(points):
        start = float(p["at_s"])
        end = float(points[i + 1]["at_s"]) if i + 1 < len(points) else duration
        span = max(0.0, min(end, duration) - start)
        a = float(p["requests_per_s"])
        if p.get("ramp_to") is not None:
            over = float(p["over_s"])
            b = float(p["ramp_to"])
            ramp = min(span, over)
            at_end = a + (b - a) * ramp / over
            total += (a + at_end) / 2.0 * ramp + b * (span - ramp)
        else:
            total += a * span
    return total


def _scale_rates(scenario: dict[str, Any], factor: float) -> None:
    for p in [*scenario["load"], *(e for e in scenario["events"] if e["kind"] == "load")]:
        p["requests_per_s"] = round(float(p["requests_per_s"]) * factor, 4)
        if p.get("ramp_to") is not None:
            p["ramp_to"] = round(float(p["ramp_to"]) * factor, 4)


def _scale_times(scenario: dict[str, Any], factor: float) -> None:
    for p in [*scenario["load"], *scenario["events"]]:
        p["at_s"] = round(float(p["at_s"]) * factor)
        if p.get("over_s") is not None:
            p["over_s"] = round(float(p["over_s"]) * factor)


def _world_events(
    family: Family, scenario: dict[str, Any], duration: float, rng: Rng
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    drafters = [str(d["name"]) for d in scenario["drafters"]]
    if drafters and rng.uniform() < family.events.model_version:
        at = round(float(rng.uniform(0.4, 0.7)) * duration)
        out.append(
            {
                "at_s": at,
                "kind": "model_version",
                "version": "v2",
                "acceptance_scale": {
                    d: round(family.events.acceptance_scale.draw(rng), 3) for d in drafters
                },
            }
        )
    routes = [str(r["name"]) for r in scenario["routes"]]
    if len(routes) > 1 and rng.uniform() < family.events.route_mix:
        at = round(float(rng.uniform(0.4, 0.7)) * duration)
        shares = rng.dirichlet(np.full(len(routes), 1.0))
        out.append(
            {
                "at_s": at,
                "kind": "route_mix",
                "shares": {r: round(float(s), 3) for r, s in zip(routes, shares, strict=True)},
            }
        )
    # Drawn only when the family asks for them, so families without them draw as before.
    if (
        drafters
        and family.events.drafter_broken > 0
        and rng.uniform() < family.events.drafter_broken
    ):
        at = round(float(rng.uniform(0.4, 0.7)) * duration)
        broken = drafters[int(rng.integers(len(drafters)))]
        out.append({"at_s": at, "kind": "drafter_broken", "drafter": broken})
    if drafters and family.events.pod_decay > 0 and rng.uniform() < family.events.pod_decay:
        at = round(float(rng.uniform(0.1, 0.4)) * duration)
        pod = int(rng.integers(int(scenario["fleet"]["replicas"])))
        rate = round(family.events.pod_decay_per_hour.draw(rng), 3)
        out.append({"at_s": at, "kind": "pod_decay", "pod": pod, "acceptance_per_hour": rate})
    return out


def _band(fraction: float) -> str:
    if fraction < 0.15:
        return "idle"
    if fraction < 0.5:
        return "light"
    if fraction < 0.9:
        return "busy"
    return "saturated"
