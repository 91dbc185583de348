"""The generated SpecTuning CRD on a real API server: examples accepted, bad specs refused.

Every bad spec of the unit tier's table is refused by the schema or a CEL rule with a message
naming the same field as ``parse_spec``; the defaults the API server fills in are the models'
defaults; the status subresource and the printer columns work as ``kubectl get spt`` shows.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from tests.fixtures.cluster import Cluster, wait_for
from tests.unit.api.bad_specs import BAD_SPECS, BASE, BadSpec

from spectune.api.crd import CRD_PATH
from spectune.api.names import API_VERSION, CRD_NAME, GROUP, KIND, PLURAL, VERSION
from spectune.api.spec import parse_spec
from spectune.api.status import parse_status
from spectune.errors import SpecError

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples").glob("spectuning*.yaml"))


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> Iterator[None]:
    """The committed CRD, applied and served; removed afterwards if this module installed it."""
    ext = client.ApiextensionsV1Api(cluster.api)
    try:
        ext.read_custom_resource_definition(CRD_NAME)
        existed = True
    except ApiException as exc:
        if exc.status != 404:
            raise
        existed = False
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / CRD_PATH))

    def established() -> bool:
        got = ext.read_custom_resource_definition(CRD_NAME)
        return any(
            c.type == "Established" and c.status == "True" for c in (got.status.conditions or [])
        )

    wait_for(established, timeout=60, message=f"CRD {CRD_NAME} Established")
    custom = client.CustomObjectsApi(cluster.api)
    wait_for(
        lambda: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL) is not None,
        timeout=60,
        message="the SpecTuning CRD to be served",
    )
    yield
    if not existed:
        ext.delete_custom_resource_definition(CRD_NAME)


def _resource(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}


def _cells(header: str, row: str) -> dict[str, str]:
    """``kubectl get`` output by column, read at the header's offsets (a cell may be empty)."""
    names = header.split()
    starts = [header.index(f" {n}") + 1 if i else 0 for i, n in enumerate(names)]
    ends = [*starts[1:], None]
    return {n: row[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)}


def _create(cluster: Cluster, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    custom = client.CustomObjectsApi(cluster.api)
    created: dict[str, Any] = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict"
    )
    return created


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_accepted_as_written(
    cluster: Cluster, namespace: str, crd: None, path: Path
) -> None:
    proc = cluster.kubectl("-n", namespace, "create", "-f", str(path), check=False)
    assert proc.returncode == 0, proc.stderr
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    got = client.CustomObjectsApi(cluster.api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    # What the API server stored still parses, and means what the file meant.
    assert parse_spec(got) == parse_spec(yaml.safe_load(path.read_text()))


def test_the_api_server_fills_in_the_models_defaults(
    cluster: Cluster, namespace: str, crd: None
) -> None:
    minimal = {"targetRef": {"name": "llama-8b"}, "metrics": {"scrape": {"port": 8000}}}
    stored = _create(cluster, namespace, _resource("minimal", minimal))["spec"]
    assert stored == parse_spec(minimal).model_dump(mode="json", exclude_none=True)
    assert stored["search"]["window"] == "5m"
    assert stored["retune"]["drift"] == {
        "threshold": 0.15, "for": "30m", "action": "retune",
        "podAction": "alert", "minReadyPods": 1,
    }  # fmt: skip


def test_a_null_guardrail_is_kept_and_means_unchecked(
    cluster: Cluster, namespace: str, crd: None
) -> None:
    spec = copy.deepcopy(BASE)
    spec["objective"] = {"guardrails": {"maxQueueP95Regression": None}}
    stored = _create(cluster, namespace, _resource("no-queue-guard", spec))
    guardrails = parse_spec(stored).objective.guardrails
    assert guardrails.max_queue_p95_regression is None
    assert guardrails.max_ttft_p95_regression == 0.2


@pytest.mark.parametrize("case", BAD_SPECS, ids=lambda c: c.id)
def test_bad_specs_are_refused_naming_the_field(
    cluster: Cluster, namespace: str, crd: None, case: BadSpec
) -> None:
    with pytest.raises(ApiException) as err:
        _create(cluster, namespace, _resource(case.id.lower(), case.spec()))
    # 422 from the schema and the CEL rules; 400 from strict decoding of an unknown field
    assert err.value.status in (400, 422), err.value.body
    message = json.loads(err.value.body)["message"]
    assert case.api_server_path in message, message


# Edge cases where the CEL rules and the models could disagree: nulls (stored by the API
# server for nullable fields, and read by CEL's has() as unset), optional models, durations.
AGREEMENT = {
    "eagle3-with-null-model": {"name": "e3", "method": "eagle3", "model": None},
    "ngram-with-null-model": {"name": "ng", "method": "ngram", "model": None},
    "mtp-without-model": {"name": "mtp", "method": "mtp", "maxK": 2},
    "ngram-with-null-lookup-min": {
        "name": "ng",
        "method": "ngram",
        "promptLookupMin": None,
        "promptLookupMax": 3,
    },
    "ngram-with-equal-lookups": {
        "name": "ng",
        "method": "ngram",
        "promptLookupMin": 3,
        "promptLookupMax": 3,
    },
    "suffix-at-k-16": {"name": "sfx", "method": "suffix", "maxK": 16},
}


@pytest.mark.parametrize("drafter", AGREEMENT.values(), ids=AGREEMENT.keys())
def test_the_api_server_and_parse_spec_agree_on_edge_cases(
    cluster: Cluster, namespace: str, crd: None, drafter: dict[str, Any]
) -> None:
    spec = copy.deepcopy(BASE)
    spec["drafters"] = [drafter]
    spec["search"]["window"] = "1h30m"
    spec["retune"]["every"] = "0.5d"
    try:
        parse_spec(spec)
        models_accept = True
    except SpecError:
        models_accept = False
    try:
        _create(cluster, namespace, _resource("edge", spec))
        server_accepts = True
    except ApiException as exc:
        assert exc.status == 422, exc.body
        server_accepts = False
    assert server_accepts == models_accept


def test_status_subresource_and_printer_columns(
    cluster: Cluster, namespace: str, crd: None
) -> None:
    custom = client.CustomObjectsApi(cluster.api)
    _create(cluster, namespace, _resource("with-status", copy.deepcopy(BASE)))
    status = {
        "phase": "Converged",
        "applied": {
            "drafter": "eagle3",
            "k": 3,
            "arm": "eagle3/3",
            "fingerprint": "9f2c1a",
            "speedup": 1.38,
        },
        "recommendation": {
            "arm": "eagle3/3",
            "drafter": "eagle3",
            "k": 3,
            "expectedSpeedup": 1.42,
            "interval": {"low": 1.31, "high": 1.55},
            "reason": "best tpotP95 within 2 % at 95 %",
        },
        "acceptance": {
            "rate": 0.71,
            "perPosition": [0.82, 0.7, 0.61],
            "meanAcceptedLength": 3.13,
            "window": "5m",
        },
        "diagnosis": [
            {"code": "HEALTHY", "message": "speculation pays", "evidence": {"speedup": 1.42}}
        ],
        "trials": [
            {
                "arm": "eagle3/3",
                "outcome": "measured",
                "startedAt": "2025-01-02T03:04:05Z",
                "windows": 2,
                "canaryObjective": 0.031,
                "incumbentObjective": 0.044,
            }
        ],
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Converged",
                "message": "tuned",
                "lastTransitionTime": "2025-01-02T03:14:05Z",
                "observedGeneration": 1,
            }
        ],
        "history": {"version": 1, "trials": [{"arm": "eagle3/3", "windows": [{"x": 1}]}]},
    }
    parse_status(status)  # what the test writes is a valid status for the models too
    got = custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "with-status", {"status": status}
    )
    assert got["status"]["history"] == status["history"]  # free-form, kept as written
    assert parse_status(got).applied is not None

    table = cluster.kubectl("-n", namespace, "get", "spt", "with-status").stdout.splitlines()
    assert table[0].split() == [
        "NAME", "PHASE", "DRAFTER", "K", "ACCEPTANCE", "SPEEDUP", "READY", "REASON", "AGE"
    ]  # fmt: skip
    # SPEEDUP is the applied arm's measured gain; the recommendation's expected one is wide.
    assert table[1].split()[:6] == ["with-status", "Converged", "eagle3", "3", "0.71", "1.38"]
    wide = cluster.kubectl("-n", namespace, "get", "spt", "with-status", "-o", "wide").stdout
    cells = _cells(*wide.splitlines()[:2])
    assert cells["EXPECTED"] == "1.42"
    assert (cells["READY"], cells["REASON"]) == ("True", "Converged")
    assert cells["TARGET"] == BASE["targetRef"]["name"]
    assert cells["TRIAL"] == ""  # no trial running
    # The CRD's category: `kubectl get spectune` lists SpecTunings.
    listed = cluster.kubectl("-n", namespace, "get", "spectune").stdout
    assert "with-status" in listed, listed

    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "with-status", {"status": {"phase": "Happy"}}
        )
    assert "status.phase" in json.loads(err.value.body)["message"]
