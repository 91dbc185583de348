"""Deployment objects as the operator changes them: canary clones, promotion patches, fingerprints.

Pure functions over Kubernetes objects as plain dicts (what the API returns as JSON), so
they are tested without a cluster and used by the operator's actuator (``k8s/actuator.py``)
with the real API. Arms become container args through ``spectune.engines.args`` only.

Conventions (documented for users in the README):

* a canary is a Deployment ``<target>-spt-<arm-slug>`` whose pod template keeps every label
  of the target's template (so the target's Service sends it live traffic in proportion to
  its replicas) and adds ``spectune.io/role=canary``; its own selector adds that label too;
* every object the operator creates carries an ownerReference to its SpecTuning and the
  fingerprint annotation; a Deployment that carries the canary labels without both is not
  the operator's (:func:`owned_by`), and is never deleted or patched;
* the annotation ``spectune.io/fingerprint`` holds the fingerprint of the speculative
  setting the operator last applied; a target whose args no longer match it was edited by
  a human, and tuning pauses instead of overwriting the edit.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spectune.engines.args import (
    SpecConfig,
    parse_sglang_args,
    parse_vllm_args,
    render_sglang_args,
    render_vllm_args,
    trusts_remote_code,
)
from spectune.errors import SpecError
from spectune.k8s.commands import engine_command, runs_an_engine
from spectune.search.arms import Arm
from spectune.search.spellings import arm_extra, arm_of_config

__all__ = [
    "ANNOTATION_FINGERPRINT",
    "ANNOTATION_MODEL_VERSION",
    "LABEL_ROLE",
    "DrafterArgs",
    "arm_from_spec",
    "canary_deployment",
    "canary_name",
    "container_argv",
    "current_spec",
    "edit_guard",
    "fingerprint",
    "human_edit",
    "model_version",
    "owned_by",
    "promote_patch",
    "remote_code_refusal",
    "spec_config_for",
]

ANNOTATION_FINGERPRINT = "spectune.io/fingerprint"
ANNOTATION_MODEL_VERSION = "spectune.io/model-version"
ANNOTATION_ARM = "spectune.io/arm"
LABEL_ROLE = "spectune.io/role"
LABEL_OWNER = "spectune.io/spectuning"

Obj = dict[str, Any]


REMOTE_CODE_UNCHECKED = (
    "no allow-list was consulted for it (SPECTUNE_DRAFTER_MODEL_ALLOW_LIST, "
    "spec.trustRemoteCode.allowedDrafterModels)"
)


@dataclass(frozen=True)
class DrafterArgs:
    """What the engine needs to run one drafter (from the SpecTuning's ``drafters``).

    ``remote_code_refused`` says why the drafter's ``model`` may not run on a target started
    with ``--trust-remote-code`` (None: it may); see :func:`remote_code_refusal`. It fails
    closed: a drafter built without the allow-lists is refused there.
    """

    name: str
    method: str
    model: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    remote_code_refused: str | None = REMOTE_CODE_UNCHECKED


def remote_code_refusal(
    target: Obj, container: str | None, engine: str, drafter: DrafterArgs
) -> str | None:
    """Why ``drafter`` may not run on ``target``'s pods, or None.

    A drafter's checkpoint is loaded with the target's ``--trust-remote-code``, so on such a
    target a drafter ``model`` is code the canary (and, once promoted, the target) runs with
    the pods' GPUs, service account and mounted secrets. It runs only when the target
    already runs that model as its drafter (its owner chose it), or when it is allowed (the
    SpecTuning lists it and the operator's allow-list matches it: ``drafters_of``).
    """
    if drafter.model is None or drafter.remote_code_refused is None:
        return None
    _, argv = container_argv(target, container)
    if not trusts_remote_code(argv):
        return None
    running = _parse(engine, argv)
    if running is not None and running.model == drafter.model:
        return None
    return (
        f"spec.drafters: drafter {drafter.name!r} (model {drafter.model!r}) would run with the "
        f"target's --trust-remote-code, and {drafter.remote_code_refused}; allow it, or "
        "remove the drafter. Nothing was created"
    )


def _check_remote_code(
    target: Obj, arm: Arm, drafters: Mapping[str, DrafterArgs], container: str | None, engine: str
) -> None:
    d = drafters.get(arm.drafter) if arm.drafter is not None else None
    if d is not None and (why := remote_code_refusal(target, container, engine, d)):
        raise SpecError(why)


def spec_config_for(arm: Arm, drafters: Mapping[str, DrafterArgs]) -> SpecConfig | None:
    """The engine-neutral speculative config of an arm (None for ``off``)."""
    if arm.drafter is None:
        return None
    d = drafters.get(arm.drafter)
    if d is None:
        known = ", ".join(sorted(drafters)) or "none"
        raise SpecError(f"arm {arm.name}: unknown drafter {arm.drafter!r}; drafters: {known}")
    return SpecConfig(
        method=d.method,
        num_speculative_tokens=arm.k,
        model=d.model,
        prompt_lookup_min=d.prompt_lookup_min,
        prompt_lookup_max=d.prompt_lookup_max,
        per_batch_size=arm.schedule,
        extra=arm_extra(arm),
    )


def _container(pod_spec: Obj, name: str | None) -> Obj:
    """The engine container: the one named, else the only one, else the one that runs
    vllm/sglang/trtllm-serve (never merely the first: a sidecar listed first would be
    patched and the engine never tuned)."""
    containers: list[Obj] = pod_spec.get("containers") or []
    if not containers:
        raise SpecError("the target Deployment has no containers")
    names = ", ".join(str(c.get("name")) for c in containers)
    if name is None:
        if len(containers) == 1:
            return containers[0]
        engines = [c for c in containers if runs_an_engine(c)]
        if len(engines) == 1:
            return engines[0]
        which = "none of them runs" if not engines else "more than one runs"
        raise SpecError(
            f"spec.targetRef.container: the target has containers {names} and {which} "
            "vllm, sglang or trtllm-serve in its command; name the engine's container"
        )
    for c in containers:
        if c.get("name") == name:
            return c
    raise SpecError(f"spec.targetRef.container: no container {name!r}; containers: {names}")


def _template_spec(deployment: Obj) -> Obj:
    spec: Obj = deployment.get("spec", {}).get("template", {}).get("spec", {})
    return spec


def container_argv(deployment: Obj, container: str | None) -> tuple[str, list[str]]:
    """Which list holds the engine flags (``args`` or ``command``) and the engine's command
    line (read inside a shell script where the container wraps it: ``k8s/commands.py``)."""
    cmd = engine_command(_container(_template_spec(deployment), container))
    return cmd.field, list(cmd.argv)


def _write_arm(c: Obj, engine: str, spec: SpecConfig | None) -> None:
    """Write ``spec`` into engine container ``c`` (in place), then read it back.

    The read-back parses the container as :func:`current_spec` will read the Deployment,
    so an arm is never applied unless the rendered command line runs it: a render that
    landed where the engine ignores it (after a shell script) would have the canary run
    the incumbent while the search believed it tried another arm.
    """
    cmd = engine_command(c)
    c[cmd.field] = cmd.render(_render(engine, cmd.argv, spec))
    back = _parse(engine, engine_command(c).argv)
    if fingerprint(back) != fingerprint(spec):
        raise SpecError(
            f"container {c.get('name')!r}: the rewritten command line reads back as "
            f"{'off' if back is None else back.to_json()}, not "
            f"{'off' if spec is None else spec.to_json()}; nothing was applied"
        )


def _parse(engine: str, argv: Sequence[str]) -> SpecConfig | None:
    parsed = parse_sglang_args(argv) if engine == "sglang" else parse_vllm_args(argv)
    return parsed.spec


def current_spec(deployment: Obj, container: str | None, engine: str) -> SpecConfig | None:
    """The speculative config the Deployment's container runs now."""
    _, argv = container_argv(deployment, container)
    return _parse(engine, argv)


def fingerprint(spec: SpecConfig | None) -> str:
    """A short, stable hash of a speculative setting (unrelated args do not change it)."""
    canonical = "off" if spec is None else spec.to_json()
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _render(engine: str, argv: Sequence[str], spec: SpecConfig | None) -> list[str]:
    return render_sglang_args(argv, spec) if engine == "sglang" else render_vllm_args(argv, spec)


def model_version(deployment: Obj, container: str | None, engine: str) -> str:
    """What identifies the served model: the annotation if set, else image + ``--model``.

    A change re-opens the search (a new checkpoint has new acceptance).
    """
    meta = deployment.get("metadata", {})
    template_meta = deployment.get("spec", {}).get("template", {}).get("metadata", {})
    for notes in (meta.get("annotations") or {}, template_meta.get("annotations") or {}):
        if ANNOTATION_MODEL_VERSION in notes:
            return str(notes[ANNOTATION_MODEL_VERSION])
    # The drafter's checkpoint is not part of it: which drafter runs is the operator's own
    # choice (promoting an arm must not look like a new model), and a new drafter checkpoint
    # arrives as a change of the SpecTuning's spec.drafters, which re-opens the search itself.
    c = _container(_template_spec(deployment), container)
    _, argv = container_argv(deployment, container)
    parts = [str(c.get("image", "")), _model_arg(argv)]
    return "sha-" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def _model_arg(argv: Sequence[str]) -> str:
    """The served model: ``--model X``/``--model-path X`` or the positional after ``serve``."""
    for i, tok in enumerate(argv):
        for flag in ("--model", "--model-path"):
            if tok == flag and i + 1 < len(argv):
                return argv[i + 1]
            if tok.startswith(flag + "="):
                return tok.split("=", 1)[1]
    for i, tok in enumerate(argv[:-1]):
        if tok == "serve":
            return argv[i + 1]
    return ""


def canary_name(target: str, arm: Arm) -> str:
    """``<target>-spt-<arm slug>``, a valid DNS-1123 name of at most 63 characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", arm.name.lower()).strip("-")
    name = f"{target}-spt-{slug}"
    if len(name) > 63:
        digest = hashlib.sha256(arm.name.encode()).hexdigest()[:8]
        # A cut name may end in '.' or '-'; a DNS label must start and end alphanumeric.
        name = f"{target[: 63 - 14].rstrip('.-')}-spt-{digest}"
    return name


def managing_controller(target: Obj) -> str | None:
    """``Kind/name`` of the controller that owns ``target`` (its ownerReference with
    ``controller: true``), or None. Such a controller reconciles the Deployment from its
    own object, so a patch of the engine's arguments is reverted, or fights it."""
    for ref in target.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return f"{ref.get('kind')}/{ref.get('name')}"
    return None


def owned_by(obj: Obj, uid: str) -> bool:
    """Whether the operator made ``obj`` for the SpecTuning whose uid is ``uid``.

    Both marks are required: an ownerReference to that uid (which only the creator of an
    object, or someone allowed to edit it, can set) and the fingerprint annotation every
    canary is created with. Labels alone are no proof: anyone who may create a Deployment
    in the namespace can copy the canary labels, and a label selector matches them all.
    """
    meta = obj.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    owned = any(isinstance(r, dict) and r.get("uid") == uid for r in refs)
    return bool(uid) and owned and ANNOTATION_FINGERPRINT in (meta.get("annotations") or {})


def _owner(spt: Obj) -> Obj:
    meta = spt["metadata"]
    return {
        "apiVersion": spt.get("apiVersion", "spectune.io/v1alpha1"),
        "kind": spt.get("kind", "SpecTuning"),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def canary_deployment(
    target: Obj,
    arm: Arm,
    drafters: Mapping[str, DrafterArgs],
    spt: Obj,
    replicas: int,
    container: str | None,
    engine: str,
) -> Obj:
    """A canary Deployment running ``arm``, cloned from the target.

    Keeps the target's pod template (image, resources, volumes, env, every label the Service
    selects on), renders the arm into the engine container's flags, and owns it by the
    SpecTuning so it disappears with it. A drafter model the target's ``--trust-remote-code``
    may not run (:func:`remote_code_refusal`) raises :class:`~spectune.errors.SpecError`.
    """
    spec = spec_config_for(arm, drafters)
    _check_remote_code(target, arm, drafters, container, engine)
    name = canary_name(target["metadata"]["name"], arm)
    template = copy.deepcopy(target["spec"]["template"])
    tmeta = template.setdefault("metadata", {})
    labels = dict(tmeta.get("labels") or {})
    labels[LABEL_ROLE] = "canary"
    tmeta["labels"] = labels
    annotations = dict(tmeta.get("annotations") or {})
    annotations[ANNOTATION_ARM] = arm.name
    tmeta["annotations"] = annotations
    _write_arm(_container(template["spec"], container), engine, spec)
    selector = copy.deepcopy(target["spec"]["selector"])
    match = dict(selector.get("matchLabels") or {})
    match[LABEL_ROLE] = "canary"
    selector["matchLabels"] = match
    spt_name = spt["metadata"]["name"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": target["metadata"]["namespace"],
            "labels": {LABEL_OWNER: spt_name, LABEL_ROLE: "canary"},
            "annotations": {ANNOTATION_ARM: arm.name, ANNOTATION_FINGERPRINT: fingerprint(spec)},
            "ownerReferences": [_owner(spt)],
        },
        "spec": {
            "replicas": replicas,
            "selector": selector,
            "template": template,
            "strategy": copy.deepcopy(target["spec"].get("strategy", {"type": "RollingUpdate"})),
            "progressDeadlineSeconds": target["spec"].get("progressDeadlineSeconds", 600),
        },
    }


def promote_patch(
    target: Obj,
    arm: Arm,
    drafters: Mapping[str, DrafterArgs],
    container: str | None,
    engine: str,
) -> Obj:
    """A strategic-merge patch that rolls the target onto ``arm`` and records its fingerprint.

    Only the engine container's flag list and two annotations change; the Deployment's
    rolling-update strategy replaces the pods. A drafter model the target's
    ``--trust-remote-code`` may not run raises :class:`~spectune.errors.SpecError`.
    """
    spec = spec_config_for(arm, drafters)
    _check_remote_code(target, arm, drafters, container, engine)
    c = copy.deepcopy(_container(_template_spec(target), container))
    _write_arm(c, engine, spec)
    field = engine_command(c).field
    return {
        "metadata": {
            "annotations": {ANNOTATION_FINGERPRINT: fingerprint(spec), ANNOTATION_ARM: arm.name}
        },
        "spec": {"template": {"spec": {"containers": [{"name": c["name"], field: c[field]}]}}},
    }


def edit_guard(target: Obj, container: str | None, engine: str) -> str | None:
    """Why the operator must not write the target's speculative setting now, or None.

    The operator writes the target only over a setting it applied itself: the fingerprint
    annotation must be there (it is written when tuning adopts the target) and match the
    arguments the target runs. A missing annotation means someone removed it to adopt a hand
    edit, which the next turn records before anything is written; a mismatch is a hand
    edit, which is never overwritten.
    """
    annotations = target.get("metadata", {}).get("annotations") or {}
    name = target.get("metadata", {}).get("name", "the target")
    if ANNOTATION_FINGERPRINT not in annotations:
        return (
            f"Deployment {name} carries no {ANNOTATION_FINGERPRINT} annotation (it was removed "
            "to adopt an edit); nothing is written until tuning has adopted the setting"
        )
    if human_edit(target, container, engine):
        return f"the speculative arguments of Deployment {name} were edited by hand"
    return None


def human_edit(target: Obj, container: str | None, engine: str) -> bool:
    """Whether the target's speculative setting differs from what the operator applied."""
    annotations = target.get("metadata", {}).get("annotations") or {}
    applied = annotations.get(ANNOTATION_FINGERPRINT)
    if applied is None:
        return False  # never touched by the operator
    return bool(fingerprint(current_spec(target, container, engine)) != applied)


def arm_from_spec(spec: SpecConfig | None, drafters: Mapping[str, DrafterArgs]) -> Arm:
    """The arm a speculative config runs, naming its drafter as the SpecTuning does.

    A drafter is recognised by its model (model-based methods) or its method (n-gram,
    suffix, MTP). A config that matches no listed drafter raises
    :class:`~spectune.errors.SpecError`: the target runs something the SpecTuning does not
    list, and the user should add it.
    """
    if spec is None:
        return Arm(None)
    for d in drafters.values():
        same_model = d.model is not None and d.model == spec.model
        same_method = d.model is None and spec.model is None and d.method == spec.method
        if same_model or same_method:
            return arm_of_config(d.name, spec)
    what = spec.model or spec.method
    raise SpecError(
        f"the target runs drafter {what!r}, which spec.drafters does not list; add it so "
        "spectune can compare against it"
    )
