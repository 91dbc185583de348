"""Faults that must end safe (issue O items 1, 6, 7, 8), over the real tuning loop and fakes.

The tuning loop, controller, policy and status projection are real; the actuator, the
Prometheus source and the Secret reads are fakes (``fakes.py`` and a fake ``read_json``), so
each case asserts what a user of the SpecTuning sees: its conditions, its trials, its
events, and what the operator sent where.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from spectune.errors import (
    InputError,
    NoDataError,
    QueryRejectedError,
    SourceUnavailableError,
    UnauthorizedError,
)
from spectune.k8s import sources, tuning
from spectune.k8s.sources import ANNOTATION_PROMETHEUS_URL, LABEL_CREDENTIALS
from spectune.settings import Settings
from tests.unit.operator.fakes import FakeCustom, FakeWorld
from tests.unit.operator.test_tuning_loop import (
    TRIAL,
    FakeClock,
    _body,
    _condition,
    _mid_trial,
    _trials,
    _window,
)

TOKEN = "tok-of-the-db-team"


def _loop(world: FakeWorld, body: dict[str, Any], **settings: Any) -> tuning.TuningLoop:
    cfg = Settings(poll_s=1.0, metrics_port=0, liveness_port=0, **settings)

    def emit(kind: str, reason: str, message: str) -> None:
        world.events.append((kind, reason, message))

    loop = tuning.TuningLoop(None, body, cfg, FakeClock(), None, emit)  # type: ignore[arg-type]
    loop._custom = FakeCustom(world, body)  # type: ignore[assignment]
    return loop


def _bump_generation_on_sleep(loop: tuning.TuningLoop, body: dict[str, Any]) -> None:
    """``_invalid`` waits for the spec to change: the first sleep 'edits' it (a new
    generation), so one turn returns."""
    plain = loop._clock.sleep

    async def sleep(seconds: float) -> None:
        await plain(seconds)
        body["metadata"]["generation"] += 1

    loop._clock.sleep = sleep  # type: ignore[method-assign]


# -- item 1: credentials confinement ------------------------------------------------------------


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """A fake of the operator's Secret reads: name → the Secret as the API returns it."""
    store: dict[str, dict[str, Any]] = {}

    def read_json(call: object, name: str, namespace: str) -> dict[str, Any]:
        if name not in store:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(store[name])

    monkeypatch.setattr(sources, "read_json", read_json)
    return store


def _secret(labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "db", "labels": labels, "annotations": annotations or {}},
        "data": {"token": base64.b64encode(TOKEN.encode()).decode(), "other": "eA=="},
    }


def _prom(url: str) -> dict[str, Any]:
    return {"prometheus": {"url": url, "authSecretRef": {"name": "db"}}}


async def test_a_spectuning_cannot_make_the_operator_send_an_unlabelled_secret(
    world: FakeWorld, secrets: dict[str, dict[str, Any]]
) -> None:
    """The confused deputy: a SpecTuning names another team's Secret and its author's own
    listener. No source is ever built with the token, the status says the Secret must opt
    in, and names neither the Secret's keys nor anything of its data. Once the Secret is
    labelled (its owner's choice), it is used."""
    secrets["db"] = _secret({})
    body = _body(metrics=_prom("http://attacker.example:8080"))
    world.observation = _window(0.030)
    loop = _loop(world, body)
    await loop.turn()
    assert all(TOKEN not in str(h) for h in world.prom_headers), world.prom_headers
    cond = _condition(world, "MetricsAvailable")
    assert cond["status"] == "False" and cond["reason"] == "AuthSecretMissing", cond
    assert LABEL_CREDENTIALS in cond["message"]
    assert TOKEN not in str(world.status) and "other" not in cond["message"]
    assert not world.canaries

    secrets["db"] = _secret({LABEL_CREDENTIALS: "true"})
    await loop.turn()
    assert {"Authorization": f"Bearer {TOKEN}"} in world.prom_headers


async def test_a_secret_bound_to_its_prometheus_is_not_sent_to_another(
    world: FakeWorld, secrets: dict[str, dict[str, Any]]
) -> None:
    secrets["db"] = _secret(
        {LABEL_CREDENTIALS: "true"}, {ANNOTATION_PROMETHEUS_URL: "http://prom.monitoring:9090"}
    )
    world.observation = _window(0.030)
    loop = _loop(world, _body(metrics=_prom("http://attacker.example:8080")))
    await loop.turn()
    assert all(TOKEN not in str(h) for h in world.prom_headers), world.prom_headers
    cond = _condition(world, "MetricsAvailable")
    assert cond["reason"] == "AuthSecretMissing" and ANNOTATION_PROMETHEUS_URL in cond["message"]


async def test_a_prometheus_url_off_the_allowlist_is_an_invalid_spec(world: FakeWorld) -> None:
    """With SPECTUNE_PROMETHEUS_URL_ALLOWLIST set, any other URL is refused before a query
    is sent, naming the field and the setting."""
    body = _body(metrics={"prometheus": {"url": "http://10.0.0.1:8080"}})
    loop = _loop(world, body, prometheus_url_allowlist=("http://prom.monitoring:9090",))
    _bump_generation_on_sleep(loop, body)
    await loop.turn()
    assert not world.prom_headers, "a source was built for a URL off the allow-list"
    ready = _condition(world, "Ready")
    assert ready["reason"] == "InvalidSpec", ready
    assert "spec.metrics.prometheus.url" in ready["message"]
    assert "SPECTUNE_PROMETHEUS_URL_ALLOWLIST" in ready["message"]


# -- item 6: an error mid-trial ends safe ---------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (UnauthorizedError("Prometheus at u refused the credentials (HTTP 401)"), "Unauthorized"),
        (QueryRejectedError("Prometheus at u rejected a query (HTTP 400, bad_data)"),
         "QueryRejected"),
        (SourceUnavailableError("Prometheus at u answered an error (HTTP 500)"),
         "SourceUnavailable"),
        (InputError("pod p: counter vllm:x is nan"), "BadMetrics"),
    ],
)  # fmt: skip
async def test_a_metrics_error_mid_trial_holds_and_never_fails_the_spectuning(
    world: FakeWorld, error: Exception, reason: str
) -> None:
    """Credentials refused, a query rejected, a 500, a page with a NaN counter: each holds
    the setting (MetricsAvailable=False with its own reason), keeps the trial for now, and
    is never Failed/InvalidSpec — the user's spec is not what is wrong."""
    body = _body()
    _mid_trial(body)
    world.error = error
    loop = _loop(world, body, metrics_failures=2)
    await loop.turn()
    assert world.status["phase"] != "Failed", world.status
    cond = _condition(world, "MetricsAvailable")
    assert cond["status"] == "False" and cond["reason"] == reason, cond
    assert _condition(world, "Ready")["reason"] == "Tuning"
    assert _trials(world)[-1]["outcome"] == "running"
    await loop.turn()  # the second in a row ends the trial and removes its canary
    assert _trials(world)[-1]["outcome"] == "aborted" and not world.canaries
    assert world.status["phase"] != "Failed"


async def test_a_spec_made_invalid_mid_trial_removes_the_canary_first(world: FakeWorld) -> None:
    """The spec is edited into one that cannot be parsed while a trial runs: the canary
    goes (it would otherwise serve live traffic on an arm nobody judges until the spec is
    fixed), the trial is aborted with the reason, and then the status says InvalidSpec."""
    body = _body()
    _mid_trial(body)
    world.failing = True
    loop = _loop(world, body)
    await loop.turn()
    assert world.canaries and world.canaries[0].name == TRIAL
    body["spec"]["search"]["canaryReplicas"] = -3
    body["metadata"]["generation"] = 2
    _bump_generation_on_sleep(loop, body)
    await loop.turn()
    assert _condition(world, "Ready")["reason"] == "InvalidSpec"
    assert not world.canaries, "the canary outlived the spec that started it"
    trial = _trials(world)[-1]
    assert trial["arm"] == TRIAL and trial["outcome"] == "aborted", trial
    assert "TrialAborted" in world.reasons()


async def test_unusable_credentials_after_a_restart_remove_the_canary(
    world: FakeWorld, secrets: dict[str, dict[str, Any]]
) -> None:
    """An operator restarted mid-trial finds the Secret unusable: no window can be read,
    so the canary left from before the restart is removed while the loop waits."""
    body = _body(metrics=_prom("http://prom:9090"))
    _mid_trial(body)
    world.canaries = [tuning.parse_arm(TRIAL)]
    loop = _loop(world, body)
    await loop.turn()
    assert _condition(world, "MetricsAvailable")["reason"] == "AuthSecretMissing"
    assert not world.canaries


# -- item 7: no data is not healthy ---------------------------------------------------------------


async def test_auto_mode_with_no_series_for_the_target_holds_and_starts_no_trial(
    world: FakeWorld,
) -> None:
    """Prometheus answers, but has no series for the target's pods (a fake NoDataError, as
    the selector matching nothing gives): as in recommend mode the condition says NoData,
    and over many turns no trial starts, no canary is created, nothing is promoted."""
    world.error = NoDataError('the selector {namespace="ns"} matches no vllm series')
    loop = _loop(world, _body())
    for _ in range(12):
        await loop.turn()
        assert not world.canaries, world.events
    cond = _condition(world, "MetricsAvailable")
    assert cond["status"] == "False" and cond["reason"] == "NoData", cond
    assert "matches no" in cond["message"]
    assert world.status["phase"] == "Baseline"
    assert not _trials(world)
    assert not {"TrialStarted", "Promoted"} & set(world.reasons()), world.events


async def test_a_canary_with_no_data_yet_is_not_an_outage(world: FakeWorld) -> None:
    """The canary's pods may not have been scraped yet: its missing group is not the
    target's, and the trial goes on."""
    body = _body()
    _mid_trial(body)
    world.observation = _window(0.030)
    world.canary_error = NoDataError("no series for the canary yet")
    loop = _loop(world, body)
    await loop.turn()
    assert _condition(world, "MetricsAvailable")["status"] == "True"
    assert _trials(world)[-1]["outcome"] == "running"


# -- item 8: a counter reset is stated ----------------------------------------------------------


async def test_a_counter_reset_within_a_window_is_an_event(world: FakeWorld) -> None:
    from dataclasses import replace

    world.observation = replace(_window(0.030), resets=("llama-0",))
    loop = _loop(world, _body())
    await loop.turn()
    kind, _, message = next(e for e in world.events if e[1] == "CounterReset")
    assert kind == "Normal" and "llama-0" in message and "restarted" in message


async def test_tenant_headers_cluster_and_ca_of_the_spec_reach_every_prometheus_source(
    world: FakeWorld, secrets: dict[str, dict[str, Any]]
) -> None:
    """spec.metrics.prometheus.headers go with the Secret's Authorization, the cluster
    matcher and the CA bundle of tls.caSecretRef (an opted-in Secret) with every source."""
    import certifi  # a real PEM CA certificate

    pem = Path(certifi.where()).read_text().split("-----END CERTIFICATE-----")[0]
    pem += "-----END CERTIFICATE-----\n"
    secrets["db"] = _secret({LABEL_CREDENTIALS: "true"})
    secrets["ca"] = {
        "metadata": {"name": "ca", "labels": {LABEL_CREDENTIALS: "true"}},
        "data": {"ca.crt": base64.b64encode(pem.encode()).decode()},
    }
    prom = _prom("https://thanos.example:9091")
    prom["prometheus"] |= {
        "headers": [{"name": "X-Scope-OrgID", "value": "team-a"}],
        "cluster": "eu-west-1",
        "tls": {"caSecretRef": {"name": "ca"}},
    }
    world.observation = _window(0.030)
    await _loop(world, _body(metrics=prom)).turn()
    assert world.prom_headers, "no Prometheus source was built"
    for headers in world.prom_headers:
        assert headers == {"X-Scope-OrgID": "team-a", "Authorization": f"Bearer {TOKEN}"}
    for conn in world.prom_connections:
        assert conn["cluster"] == ("cluster", "eu-west-1")
        assert len(conn["tls"].get_ca_certs()) == 1  # only the Secret's CA is trusted
