"""The committed CRD is what the models generate, and is a schema Kubernetes accepts."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spectune.api.command import register
from spectune.api.crd import CRD_PATH, crd_manifest, render_crd

REPO = Path(__file__).resolve().parents[3]


def _schema() -> dict[str, Any]:
    version = crd_manifest()["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, prop in node.get("properties", {}).items():
        yield from _walk(prop, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


def test_committed_crd_is_what_the_models_generate() -> None:
    committed = (REPO / CRD_PATH).read_text(encoding="utf-8")
    assert committed == render_crd(), (
        f"{CRD_PATH} is out of date with operator/spectune/api; "
        f"run `spectune crd --out {CRD_PATH}` and commit the result"
    )


def test_the_yaml_is_the_manifest() -> None:
    assert yaml.safe_load(render_crd()) == crd_manifest()


def test_schema_is_structural() -> None:
    forbidden = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "const", "title"}
    forbidden |= {"additionalProperties", "uniqueItems"}
    for path, node in _walk(_schema(), "openAPIV3Schema"):
        assert not forbidden & node.keys(), f"{path}: {sorted(forbidden & node.keys())}"
        free = node.get("x-kubernetes-preserve-unknown-fields") is True
        assert "type" in node or free, f"{path}: no type"
        if "properties" in node:
            assert node["type"] == "object", path
            assert set(node.get("required", [])) <= node["properties"].keys(), path
        if node.get("type") == "array":
            assert "items" in node, path
        for key in ("nullable", "exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(key, True) is True, f"{path}.{key} must be the boolean true"
        if "default" in node and node["default"] is None:
            pytest.fail(f"{path}: a null default")


def test_free_form_fields_keep_unknown_fields() -> None:
    nodes = dict(_walk(_schema(), ""))
    for path in (".status.diagnosis[].evidence",):
        assert nodes[path] == nodes[path] | {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
    # status.history takes any JSON value: the string the operator writes (memory version
    # 2) and the object operators before it wrote (version 1), which it still reads.
    history = nodes[".status.history"]
    assert "type" not in history
    assert history["x-kubernetes-preserve-unknown-fields"] is True


def test_every_spec_field_is_described_with_its_default() -> None:
    for path, node in _walk(_schema()["properties"]["spec"], "spec"):
        assert node.get("description"), f"{path}: no description"
        if "default" in node:
            value = node["default"]
            shown = value if isinstance(value, str) else yaml.safe_dump(value).split("\n")[0]
            shown = {"{}": "{}", "[]": "[]"}.get(shown, shown)
            assert f"Default {shown}" in node["description"], (
                f"{path}: the description does not say 'Default {shown}'"
            )


def test_duration_fields_carry_the_pattern_and_the_positive_rule() -> None:
    nodes = dict(_walk(_schema(), ""))
    for path in (".spec.search.window", ".spec.retune.every", ".spec.retune.drift.for"):
        node = nodes[path]
        assert node["type"] == "string" and node["pattern"].startswith("^("), path
        rules = [r["rule"] for r in node["x-kubernetes-validations"]]
        assert rules[0] == "self.matches('[1-9]')", path
        # The window alone has a minimum (30 s), written as a CEL rule on Go durations.
        assert rules[1:] == (
            ["self.contains('d') || duration(self) >= duration('30s')"]
            if path == ".spec.search.window"
            else []
        ), path


def test_resource_names_status_subresource_and_printer_columns() -> None:
    crd = crd_manifest()
    assert crd["metadata"]["name"] == "spectunings.spectune.io"
    spec = crd["spec"]
    assert spec["group"] == "spectune.io" and spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "SpecTuning",
        "listKind": "SpecTuningList",
        "plural": "spectunings",
        "singular": "spectuning",
        "shortNames": ["spt"],
        "categories": ["spectune"],  # `kubectl get spectune` lists them
    }
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = [(c["name"].upper(), c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("PHASE", ".status.phase"),
        ("DRAFTER", ".status.applied.drafter"),
        ("K", ".status.applied.k"),
        ("ACCEPTANCE", ".status.acceptance.rate"),
        ("SPEEDUP", ".status.applied.speedup"),
        ("READY", '.status.conditions[?(@.type=="Ready")].status'),
        ("REASON", '.status.conditions[?(@.type=="Ready")].reason'),
        ("AGE", ".metadata.creationTimestamp"),
        ("TARGET", ".spec.targetRef.name"),
        ("TRIAL", '.status.trials[?(@.outcome=="running")].arm'),
        ("PLACEMENT", '.status.conditions[?(@.type=="LoadMatched")].reason'),
        ("EXPECTED", ".status.recommendation.expectedSpeedup"),
        ("LOADRATIO", ".status.trials[-1:].loadRatio"),
    ]
    # The target, the arm on trial, the placement, the recommendation's expected speedup
    # and the load ratio are for `kubectl get spt -o wide` only.
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1]
    assert wide == ["Target", "Trial", "Placement", "Expected", "LoadRatio"]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="spectune")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_crd_command_prints_the_crd(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(["crd"])
    assert args.func(args) == 0
    assert capsys.readouterr().out == render_crd()


def test_crd_command_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "crd.yaml"
    args = _parse(["crd", "--out", str(out)])
    assert args.func(args) == 0
    assert out.read_text(encoding="utf-8") == render_crd()
    assert capsys.readouterr().out == ""


def test_registering_the_command_loads_neither_pydantic_nor_yaml() -> None:
    code = (
        "import sys, spectune.api.command; "
        "print(sorted(m for m in ('pydantic', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_a_union_kubernetes_cannot_express_is_refused() -> None:
    from pydantic import BaseModel

    from spectune.api.crd import structural_schema

    class IntOrText(BaseModel):
        value: int | str

    class Optional(BaseModel):
        value: int | None = None

    with pytest.raises(ValueError, match=r"IntOrText\.value: a union of 2 types"):
        structural_schema(IntOrText)
    assert structural_schema(Optional)["properties"]["value"] == {
        "type": "integer",
        "nullable": True,
    }
