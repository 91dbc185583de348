"""What the operator may touch and run: its own canaries, its own setting, allowed drafters.

Pure functions over plain Deployment dicts (``k8s/deployments.py``) and the drafters as the
tuning loop builds them (``k8s/tuning.py``): ownership of a canary, the guard before every
write of the target's speculative setting, and the confinement of a drafter model on a
target started with ``--trust-remote-code`` (issue [O] items 3, 4 and 9). The real API
server's side is in ``tests/integration/operator/test_ownership.py``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from spectune.api.spec import Engine, parse_spec
from spectune.engines.args import trusts_remote_code
from spectune.errors import SpecError
from spectune.k8s.deployments import (
    ANNOTATION_FINGERPRINT,
    canary_deployment,
    edit_guard,
    owned_by,
    promote_patch,
)
from spectune.k8s.tuning import check_remote_code, drafters_of
from spectune.search.arms import Arm
from tests.unit.operator.fakes import EAGLE, MODEL, adopted, target

SPT = {"apiVersion": "spectune.io/v1alpha1", "kind": "SpecTuning",
       "metadata": {"name": "tune", "namespace": "ns", "uid": "u-1"}}  # fmt: skip


def _canary_like(owner_uid: str | None, fingerprint: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "llama-spt-eagle3-3",
        "labels": {"spectune.io/spectuning": "tune", "spectune.io/role": "canary"},
        "annotations": {"spectune.io/arm": "eagle3/3"},
    }
    if fingerprint:
        meta["annotations"][ANNOTATION_FINGERPRINT] = "abc"
    if owner_uid is not None:
        meta["ownerReferences"] = [{"kind": "SpecTuning", "name": "tune", "uid": owner_uid}]
    return {"metadata": meta}


@pytest.mark.parametrize(
    ("owner", "fingerprint", "ours"),
    [
        (None, False, False),  # the labels alone: anyone can copy them
        (None, True, False),  # labels and a copied fingerprint, no owner
        ("u-1", False, False),  # owned but not made as a canary
        ("u-0", True, False),  # another (e.g. deleted and recreated) SpecTuning's
        ("u-1", True, True),
    ],
)
def test_a_canary_is_ours_only_with_both_marks(
    owner: str | None, fingerprint: bool, ours: bool
) -> None:
    assert owned_by(_canary_like(owner, fingerprint), "u-1") is ours


def test_a_canary_the_operator_builds_carries_both_marks() -> None:
    d = canary_deployment(target(), Arm("eagle3", 3), drafters_of(_spec()), SPT, 1, "vllm", "vllm")
    assert owned_by(d, "u-1")


def test_the_guard_refuses_a_hand_edit_and_a_removed_fingerprint() -> None:
    t = adopted(target())
    assert edit_guard(t, "vllm", "vllm") is None
    edited = copy.deepcopy(t)
    edited["spec"]["template"]["spec"]["containers"][0]["args"] += ["--speculative-config",
        json.dumps({"method": "ngram", "num_speculative_tokens": 2})]  # fmt: skip
    assert "edited by hand" in (edit_guard(edited, "vllm", "vllm") or "")
    assert "no spectune.io/fingerprint" in (edit_guard(target(), "vllm", "vllm") or "")


# -- drafter confinement (item 9) ----------------------------------------------------------------


def _spec(listed: list[str] | None = None) -> Any:
    body: dict[str, Any] = {
        "targetRef": {"name": "llama", "container": "vllm"},
        "metrics": {"scrape": {"port": 8000}},
        "drafters": [
            {"name": "eagle3", "method": "eagle3", "model": EAGLE, "maxK": 3},
            {"name": "ngram", "method": "ngram", "maxK": 3},
        ],
    }
    if listed is not None:
        body["trustRemoteCode"] = {"allowedDrafterModels": listed}
    return parse_spec(body)


def _trusting(*extra: str) -> dict[str, Any]:
    return target(["serve", MODEL, "--trust-remote-code", *extra])


@pytest.mark.parametrize(
    ("argv", "trusted"),
    [
        (["serve", MODEL], False),
        (["serve", MODEL, "--trust-remote-code"], True),
        (["serve", MODEL, "--trust_remote_code"], True),
        (["serve", MODEL, "--trust-remote-code", "--no-trust-remote-code"], False),
        (["serve", MODEL, "--trust-remote-code=false"], False),
        (["serve", MODEL, "--config", "/etc/vllm.yaml"], True),  # unknown contents: closed
        (["serve", MODEL, "--", "--trust-remote-code"], False),  # a positional after "--"
        (["--model-path", MODEL, "--trust-remote-code"], True),  # SGLang
    ],
)
def test_trust_remote_code_is_read_from_the_argv(argv: list[str], trusted: bool) -> None:
    assert trusts_remote_code(argv) is trusted


@pytest.mark.parametrize(
    ("listed", "allow", "refused_because"),
    [
        (None, (), "allowedDrafterModels does not list it and the operator's allow-list"),
        ([EAGLE], (), "the operator's allow-list does not match it"),
        ([], ("yuhuili/*",), "spec.trustRemoteCode.allowedDrafterModels does not list it"),
        # An author cannot allow themselves: listing a model is not enough, and neither is a
        # pattern of their own (the list holds models, compared exactly).
        (["yuhuili/*"], ("yuhuili/*",), "allowedDrafterModels does not list it"),
    ],
)
def test_a_drafter_model_on_a_trusting_target_needs_both_keys(
    listed: list[str] | None, allow: tuple[str, ...], refused_because: str
) -> None:
    spec = _spec(listed)
    with pytest.raises(SpecError) as err:
        check_remote_code(spec, _trusting(), Engine.VLLM, allow)
    message = str(err.value)
    assert "drafter 'eagle3'" in message and EAGLE in message, message
    assert refused_because in message and "Nothing was created" in message, message
    assert "ngram" not in message  # a drafter without a model runs no repository's code
    with pytest.raises(SpecError, match="drafter 'eagle3'"):
        canary_deployment(
            _trusting(), Arm("eagle3", 3), drafters_of(spec, allow), SPT, 1, "vllm", "vllm"
        )
    with pytest.raises(SpecError, match="drafter 'eagle3'"):
        promote_patch(_trusting(), Arm("eagle3", 3), drafters_of(spec, allow), "vllm", "vllm")


def test_a_drafter_model_runs_when_both_keys_agree_or_the_target_runs_it() -> None:
    allow = ("yuhuili/*",)
    check_remote_code(_spec([EAGLE]), _trusting(), Engine.VLLM, allow)
    canary_deployment(
        _trusting(), Arm("eagle3", 2), drafters_of(_spec([EAGLE]), allow), SPT, 1, "vllm", "vllm"
    )
    # Not trusting remote code: a model is weights only.
    check_remote_code(_spec(), target(), Engine.VLLM, ())
    # The target's owner already runs this drafter model with remote code: no new code.
    own = json.dumps({"method": "eagle3", "model": EAGLE, "num_speculative_tokens": 3})
    check_remote_code(_spec(), _trusting("--speculative-config", own), Engine.VLLM, ())
    # ngram drafts from the text.
    canary_deployment(_trusting(), Arm("ngram", 2), drafters_of(_spec()), SPT, 1, "vllm", "vllm")


@pytest.mark.parametrize("target_name", ["a" * 253, ("a" * 48) + ".b" + ("c" * 60), "x" * 63])
def test_every_canary_name_fits_a_dns_label(target_name: str) -> None:
    """A target name may be 253 characters of a DNS subdomain; its canaries' names are
    DNS labels of at most 63 characters, whatever the cut leaves at the end."""
    import re

    from spectune.k8s.deployments import canary_name

    for arm in (Arm("eagle3", 3), Arm(None), Arm("ngram", 16)):
        name = canary_name(target_name, arm)
        assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name), name
        assert ".-" not in name and "-." not in name, name
