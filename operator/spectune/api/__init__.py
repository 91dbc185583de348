"""The SpecTuning resource: spec and status models, the generated CRD, and conversions.

Who uses what:

* the operator's handlers: :func:`parse_spec` (every event), :func:`parse_status` (resume),
  :class:`SpecTuningStatus` (what they write), and :mod:`spectune.api.names` for the
  resource's group, version and plural;
* the operator's daemon: :func:`to_search_space`, :func:`to_objective` and
  :func:`to_controller_config` (``api/convert.py``) to build the controller;
* ``spectune crd`` (``api/command.py``) and the golden test: :func:`render_crd`.

This layer never imports kopf, kubernetes, httpx or prometheus_api_client. The names below
load on first use, so importing :mod:`spectune.api.command` (which the CLI does at start-up)
does not load pydantic or YAML.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from spectune.api.names import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION

if TYPE_CHECKING:
    from spectune.api.convert import to_controller_config, to_objective, to_search_space
    from spectune.api.crd import crd_manifest, render_crd
    from spectune.api.spec import SpecTuningSpec, parse_spec
    from spectune.api.status import SpecTuningStatus, parse_status
    from spectune.api.validation import FieldProblem, InvalidSpecError

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "FieldProblem",
    "InvalidSpecError",
    "SpecTuningSpec",
    "SpecTuningStatus",
    "crd_manifest",
    "parse_spec",
    "parse_status",
    "render_crd",
    "to_controller_config",
    "to_objective",
    "to_search_space",
]

_LAZY = {
    "FieldProblem": "spectune.api.validation",
    "InvalidSpecError": "spectune.api.validation",
    "SpecTuningSpec": "spectune.api.spec",
    "parse_spec": "spectune.api.spec",
    "SpecTuningStatus": "spectune.api.status",
    "parse_status": "spectune.api.status",
    "crd_manifest": "spectune.api.crd",
    "render_crd": "spectune.api.crd",
    "to_controller_config": "spectune.api.convert",
    "to_objective": "spectune.api.convert",
    "to_search_space": "spectune.api.convert",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'spectune.api' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
