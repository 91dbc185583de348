"""The chart's files agree with their sources: the CRD, values.yaml, its schema and README."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "spectune"


def _readme_tool() -> ModuleType:
    return load_script("hack/chart-readme.py")


def test_chart_crds_are_byte_identical_to_the_generated_crds() -> None:
    source = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    copy = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert copy == source
    for name in source:
        assert (CHART / "crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes(), (
            f"charts/spectune/crds/{name} differs from crds/{name}: "
            "cp crds/*.yaml charts/spectune/crds/"
        )


def test_every_values_key_has_a_doc_comment() -> None:
    keys = dict(_readme_tool().documented_keys((CHART / "values.yaml").read_text()))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for top in values:
        assert top in keys, f"values.yaml: {top} has no '# --' comment"
    assert all(desc for desc in keys.values())


def test_a_key_without_comment_is_refused() -> None:
    with pytest.raises(ValueError, match="'b' has no"):
        _readme_tool().documented_keys("# -- a\na: 1\nb: 2\n")


def test_readme_values_table_is_up_to_date() -> None:
    tool = _readme_tool()
    readme = (CHART / "README.md").read_text()
    assert tool.render(readme, (CHART / "values.yaml").read_text()) == readme, (
        "charts/spectune/README.md is out of date: run python hack/chart-readme.py"
    )


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, sub in schema.get("properties", {}).items():
        out.add(prefix + key)
        if sub.get("additionalProperties") is False:
            out |= _schema_paths(sub, f"{prefix}{key}.")
    return out


def test_schema_describes_exactly_the_documented_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    documented = {k for k, _ in _readme_tool().documented_keys((CHART / "values.yaml").read_text())}
    assert _schema_paths(schema) == documented
