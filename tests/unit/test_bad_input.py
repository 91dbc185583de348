"""Bad input across every layer a user feeds: one table, one rule.

Whatever a user hands spectune — a SpecTuning, the operator's environment, a /metrics page,
a pair of pages that make a window, a scenario file, an arm name, an event for a running
simulated pod — a bad one must be refused with ONE line that names the field, variable,
pod or line at fault (never a traceback), and must change nothing: the input object is left
as it was. The table reuses the SpecTuning cases of ``tests/unit/api/bad_specs.py`` (which
the integration tier also sends to the real API server) rather than copying them, and adds
what no layer's own tests had in one place. Cases the product gets wrong today are marked
``xfail(strict=True)`` with the reason, so fixing one turns its row red until the mark goes.

The cluster-side cases (invalid SpecTunings sent to the real API server, a ``targetRef`` to a
Deployment that does not exist) need the operator: ``tests/integration/k8s`` sends
``bad_specs`` to the API server, and ``tests/integration/operator/test_faults.py`` covers a
target Deployment that goes missing while tuning (the status names it; tuning resumes when
it returns).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from spectune.api.spec import parse_spec
from spectune.errors import SpecTuneError
from spectune.metrics import observation_from_pages, parse_page
from spectune.search.arms import parse_arm
from spectune.settings import Settings
from spectune.sim.scenario import injectable_event, load_scenario, scenario_from_mapping
from tests.unit.api.bad_specs import BAD_SPECS
from tests.unit.api.bad_specs import BASE as SPEC
from tests.unit.metrics.test_windows import vllm_page
from tests.unit.sim.conftest import BASE as SCENARIO

PAGES = Path(str(resources.files("spectune") / "examples" / "pages"))
PAGE = (PAGES / "vllm-eagle3-k7" / "after" / "pod-0.prom").read_text()


@dataclass(frozen=True)
class Case:
    """One bad input: the layer that reads it, the input, and what the message must name."""

    layer: str
    id: str
    input: Any
    names: tuple[str, ...]
    """Substrings the one-line message must contain (the field, line, pod or value)."""
    xfail: str | None = None
    """Why the product gets this case wrong today (a strict xfail)."""


def _spec(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    for path, value in changes.items():
        node = spec
        *head, last = path.split("__")
        for key in head:
            node = node[key]
        node[last] = value
    return spec


def _scenario(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(SCENARIO)
    data.update(changes)
    return data


def _scenario_text(mutate: Callable[[str], str]) -> str:
    return mutate(yaml.safe_dump(SCENARIO, sort_keys=False))


# --- the layers: each reads its input the way the product does ---------------------------


def read_spec(spec: dict[str, Any]) -> None:
    parse_spec(spec)


def read_env(env: dict[str, str]) -> None:
    Settings.from_env(env)


def read_page(text: str) -> None:
    parse_page(text, pod="llama-70b-7d9c-abcde")


def read_window(pages: tuple[str, str]) -> None:
    before, after = (parse_page(t, "llama-70b-7d9c-abcde") for t in pages)
    obs = observation_from_pages([before], [after], 60)
    if obs.resets:
        # A restart is not an error: the window counts the new process from zero, and says so.
        raise SpecTuneError(f"counter reset on {', '.join(obs.resets)}; counted from zero")


def read_scenario(source: Any) -> None:
    if isinstance(source, str):
        load_scenario(source)
    else:
        scenario_from_mapping(source)


def read_arm(text: str) -> None:
    parse_arm(text)


def read_sim_event(event: Any) -> None:
    injectable_event(scenario_from_mapping(SCENARIO), event)


LAYERS: dict[str, Callable[[Any], None]] = {
    "spectuning": read_spec,
    "operator-env": read_env,
    "metrics-page": read_page,
    "metrics-window": read_window,
    "scenario": read_scenario,
    "arm": read_arm,
    "sim-event": read_sim_event,
}

_CUT = PAGE.index("vllm:spec_decode")

CASES: list[Case] = [
    # SpecTunings: the shared table (wrong types, ranges, enums, cross-field rules, formats)
    *(Case("spectuning", b.id, b.spec(), (b.path,)) for b in BAD_SPECS),
    # ...plus what it lacks
    Case(
        "spectuning", "targetRef-name-number", _spec(targetRef__name=42), ("spec.targetRef.name",)
    ),
    Case(
        "spectuning",
        "prometheus-url-ftp",
        _spec(metrics__prometheus__url="ftp://prometheus:9090"),
        ("spec.metrics.prometheus.url", "ftp://prometheus:9090"),
    ),
    Case(
        "spectuning",
        "prometheus-url-port-out-of-range",
        _spec(metrics__prometheus__url="http://prometheus:99999"),
        ("spec.metrics.prometheus.url", "99999"),
    ),
    Case(
        "spectuning",
        "selector-without-braces",
        _spec(metrics__prometheus__selector='namespace="llm"'),
        ("spec.metrics.prometheus.selector",),
    ),
    Case(
        "spectuning",
        "selector-unclosed",
        _spec(metrics__prometheus__selector='{namespace="llm"'),
        ("spec.metrics.prometheus.selector",),
    ),
    Case(
        "spectuning",
        "selector-unquoted-value",
        _spec(metrics__prometheus__selector="{namespace=llm}"),
        ("spec.metrics.prometheus.selector", "namespace=llm"),
    ),
    Case(
        "spectuning",
        "selector-empty",
        _spec(metrics__prometheus__selector="{}"),
        ("spec.metrics.prometheus.selector",),
    ),
    # the operator's environment
    Case(
        "operator-env",
        "prometheus-url-not-a-url",
        {"SPECTUNE_PROMETHEUS_URL": "prometheus:9090"},
        ("SPECTUNE_PROMETHEUS_URL", "http://"),
    ),
    Case(
        "operator-env", "poll-negative", {"SPECTUNE_POLL_SECONDS": "-1"}, ("SPECTUNE_POLL_SECONDS",)
    ),
    Case(
        "operator-env", "time-scale-word", {"SPECTUNE_TIME_SCALE": "fast"}, ("SPECTUNE_TIME_SCALE",)
    ),
    Case(
        "operator-env",
        "port-too-big",
        {"SPECTUNE_METRICS_PORT": "70000"},
        ("SPECTUNE_METRICS_PORT",),
    ),
    # /metrics pages: garbage, truncated, from another program
    Case("metrics-page", "empty", "", ("llama-70b-7d9c-abcde", "empty")),
    Case(
        "metrics-page",
        "html-login-page",
        "<html><body>Login</body></html>",
        ("llama-70b-7d9c-abcde",),
    ),
    Case("metrics-page", "binary", "\x00\x01\x02\xff garbage", ("llama-70b-7d9c-abcde", "garbage")),
    Case(
        "metrics-page",
        "prometheus-api-json",
        '{"status":"success","data":{"result":[]}}',
        ("llama-70b-7d9c-abcde", "not a valid Prometheus exposition page"),
    ),
    Case(
        "metrics-page",
        "truncated-mid-line",
        PAGE[: PAGE.index("\nvllm:request_time_per_output_token_seconds_bucket") + 40],
        ("llama-70b-7d9c-abcde", "vllm:request_time_per_output"),
    ),
    Case(
        "metrics-page",
        "truncated-in-labels",
        PAGE[: PAGE.index("{", _CUT) + 6],
        ("llama-70b-7d9c-abcde", "not a valid Prometheus exposition page"),
    ),
    Case(
        "metrics-page",
        "node-exporter",
        '# TYPE node_cpu_seconds_total counter\nnode_cpu_seconds_total{cpu="0"} 12\n',
        ("not from a serving engine", "vllm:"),
    ),
    Case(
        "metrics-page",
        "the-operators-own-metrics",
        '# TYPE spectune_phase gauge\nspectune_phase{name="t",phase="Monitoring"} 1\n',
        ("not from a serving engine",),
    ),
    # windows: counters that go backwards
    Case(
        "metrics-window",
        "every-counter-backwards-is-a-restart",
        (vllm_page(50_000, [40_000, 30_000]), vllm_page(1_000, [700, 400])),
        ("llama-70b-7d9c-abcde", "reset"),
    ),
    Case(
        "metrics-window",
        "one-counter-backwards-others-forward",
        (vllm_page(50_000, [40_000, 30_000]), vllm_page(49_000, [40_500, 30_200])),
        ("llama-70b-7d9c-abcde", "vllm:spec_decode_num_drafts_total"),
    ),
    Case(
        "metrics-window",
        "end-page-truncated-before-the-spec-counters",
        (PAGE, PAGE[: PAGE.rindex("\n", 0, _CUT) + 1]),
        ("llama-70b-7d9c-abcde", "spec_decode"),
    ),
    # scenario files
    Case(
        "scenario",
        "yaml-syntax",
        _scenario_text(lambda t: t.replace("duration_s: 300", "duration_s: [300")),
        ("line",),
    ),
    Case("scenario", "unknown-field", _scenario(durration_s=300), ("durration_s",)),
    Case(
        "scenario",
        "missing-routes",
        {k: v for k, v in SCENARIO.items() if k != "routes"},
        ("routes",),
    ),
    Case(
        "scenario",
        "number-with-unit",
        _scenario(hardware={**SCENARIO["hardware"], "memory_gib": "320GiB"}),
        ("hardware.memory_gib",),
    ),
    Case(
        "scenario",
        "initial-k-above-max-k",
        _scenario(initial={"drafter": "ngram", "k": 9}),
        ("initial",),
    ),
    Case(
        "scenario",
        "route-acceptance-unknown-drafter",
        _scenario(
            routes=[
                {
                    **SCENARIO["routes"][0],
                    "acceptance": {"medusa": {"alpha": 0.5, "decay": 0.9, "spread": 4}},
                }
            ]
        ),
        ("routes[0].acceptance", "medusa"),
    ),
    Case(
        "scenario",
        "event-after-the-end",
        _scenario(events=[{"at_s": 999, "kind": "route_mix", "shares": {"chat": 1}}]),
        ("events[0].at_s",),
    ),
    Case(
        "scenario",
        "negative-load",
        _scenario(load=[{"at_s": 0, "requests_per_s": -1}]),
        ("load[0]",),
    ),
    Case("scenario", "not-a-mapping", "- just\n- a list\n", ("mapping",)),
    # arm names (the bench's --policy static:<arm>, sim run --arm)
    Case("arm", "k-zero", "eagle3/0", ("eagle3/0",)),
    Case("arm", "k-not-a-number", "eagle3/three", ("eagle3/three",)),
    # events for a running simulated pod (sim serve's POST /sim/events)
    Case(
        "sim-event",
        "load-cannot-be-injected",
        {"kind": "load", "requests_per_s": 3},
        ("event.kind",),
    ),
    Case(
        "sim-event",
        "unknown-drafter",
        {"kind": "model_version", "version": "v2", "acceptance_scale": {"medusa": 0.5}},
        ("event.acceptance_scale.medusa",),
    ),
]


def _params() -> list[Any]:
    out = []
    for c in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else []
        out.append(pytest.param(c, id=f"{c.layer}:{c.id}", marks=marks))
    return out


@pytest.mark.parametrize("case", _params())
def test_bad_input_is_refused_naming_what_is_wrong_and_changes_nothing(case: Case) -> None:
    given = copy.deepcopy(case.input)
    with pytest.raises(SpecTuneError) as err:
        LAYERS[case.layer](given)
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message, message
    for part in case.names:
        assert part in message, f"{part!r} not named in: {message}"
    assert given == case.input, "the reader changed its input"


def test_the_table_covers_every_layer_and_counts_its_cases() -> None:
    assert set(LAYERS) == {c.layer for c in CASES}
    ids = [f"{c.layer}:{c.id}" for c in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    assert len(CASES) >= 60, len(CASES)
