"""Issue [O] on a real API server: a SpecTuning cannot make the operator disclose a Secret,
and a Prometheus without the target's series is no data, not a reason to tune.

``spectune run`` runs as the ServiceAccount of ``deploy/rbac.yaml`` against the real API
server; the "attacker's listener" is a plain HTTP server on loopback that records the
``Authorization`` headers it receives and answers like a Prometheus with no series (the
operator is granted ``get`` on Secrets in the namespace, as the chart's
``rbac.prometheusCredentials`` does); the
no-data case uses the real Prometheus of the fixture, which scrapes nothing of the target.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from spectune.k8s.sources import LABEL_CREDENTIALS
from tests.fixtures.cluster import Cluster, wait_for
from tests.fixtures.prometheus import Prometheus
from tests.fixtures.recording import RecordingServer
from tests.integration.operator.conftest import SA, SA_NAMESPACE, OperatorProcess
from tests.integration.operator.helpers import MODEL, Env, diagnostics, spectuning

TOKEN = "tok-of-the-db-team-5f1c"
WINDOW_S = 10.0
_EMPTY = b'{"status":"success","data":{"resultType":"matrix","result":[]}}'


class Listener(RecordingServer):
    """An HTTP server of the SpecTuning's author: records every Authorization header."""

    def __init__(self) -> None:
        super().__init__(_EMPTY)

    @property
    def authorizations(self) -> list[str]:
        return [headers.get("Authorization") or "" for headers, _ in self.seen]


@pytest.fixture
def listener() -> Iterator[Listener]:
    one = Listener()
    try:
        yield one
    finally:
        one.close()


def _grant_secret_reads(cluster: Cluster, namespace: str) -> None:
    """``get`` on Secrets for the operator in ``namespace``, as the chart's
    ``rbac.prometheusCredentials=true`` grants it: the case where the operator may read
    Secrets that a SpecTuning's author may not (the confused deputy's precondition)."""
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="spectune-prometheus-credentials"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["secrets"], verbs=["get"])],
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="spectune-prometheus-credentials"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io",
                kind="Role",
                name="spectune-prometheus-credentials",
            ),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=SA, namespace=SA_NAMESPACE)],
        ),
    )


def _secret(env: Env, labels: dict[str, str] | None = None) -> None:
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name="db-creds", labels=labels),
        data={"token": base64.b64encode(TOKEN.encode()).decode()},
    )
    env.core.create_namespaced_secret(env.ns, body)


def test_a_spectuning_cannot_send_an_unlabelled_secret_to_its_authors_listener(
    cluster: Cluster,
    namespace: str,
    listener: Listener,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """The confused deputy of issue [O] item 1: a SpecTuning names a Secret of its namespace
    (which its author may not read) and a URL of the author's. The operator reads the
    Secret (it may) and refuses it for want of the opt-in label: the listener never sees
    the token, and the status names the label and nothing of the Secret. Once the Secret's
    owner labels it, it is used, which shows the listener would have seen it."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    _grant_secret_reads(cluster, namespace)
    _secret(env)
    op = start_operator(namespace)
    spt = spectuning(listener.url)
    spt["spec"]["metrics"]["prometheus"]["authSecretRef"] = {"name": "db-creds"}
    env.create_spt(spt)
    why = diagnostics(env, op)
    cond = wait_for(
        lambda: (
            (c := env.condition("MetricsAvailable")) and c["reason"] == "AuthSecretMissing" and c
        ),
        timeout=60,
        message=lambda: f"MetricsAvailable=False, AuthSecretMissing; {why()}",
    )
    assert LABEL_CREDENTIALS in cond["message"], cond
    # Two windows more: nothing is sent, nothing of the Secret is in the status.
    time.sleep(2 * WINDOW_S)
    assert not any(TOKEN in h for h in listener.authorizations), listener.authorizations
    assert TOKEN not in json.dumps(env.status())
    assert not env.canaries()

    env.core.patch_namespaced_secret(
        "db-creds", namespace, {"metadata": {"labels": {LABEL_CREDENTIALS: "true"}}}
    )
    wait_for(
        lambda: f"Bearer {TOKEN}" in listener.authorizations,
        timeout=WINDOW_S * 4 + 20,
        message=lambda: f"the labelled Secret used; seen={listener.authorizations}; {why()}",
    )


def test_no_series_for_the_target_holds_in_auto_mode_and_starts_no_trial(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """A real Prometheus that answers, with no series for the target's pods (no pod of it
    is scraped): MetricsAvailable=False, reason NoData, phase Baseline, and over several
    windows no canary and no trial — nothing is tuned on nothing measured."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    op = start_operator(namespace)
    env.create_spt(spectuning(prometheus.url))
    why = diagnostics(env, op)
    cond = wait_for(
        lambda: (c := env.condition("MetricsAvailable")) and c["status"] == "False" and c,
        timeout=WINDOW_S * 3 + 30,
        message=lambda: f"MetricsAvailable=False; {why()}",
    )
    assert cond["reason"] == "NoData" and "matches no" in cond["message"], cond
    end = time.monotonic() + 3 * WINDOW_S
    while time.monotonic() < end:
        assert not env.canaries(), f"a canary was started on no data; {why()}"
        time.sleep(0.5)
    status = env.status()
    assert status.get("phase") == "Baseline", why()
    assert not status.get("trials"), why()
    assert env.condition("MetricsAvailable")["reason"] == "NoData"  # type: ignore[index]
    assert not {"TrialStarted", "Promoted"} & env.reasons(), env.reasons()
