"""The SpecTuning resource's names: group, version, kind, plural, short names.

One place for the strings that the CRD generator (``api/crd.py``), the operator's kopf
handlers (``@kopf.on.create(GROUP, VERSION, PLURAL)``) and the tests all have to agree on.
Plain constants, so importing them costs nothing.
"""

from __future__ import annotations

__all__ = [
    "API_VERSION",
    "CRD_NAME",
    "GROUP",
    "KIND",
    "LIST_KIND",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
]

GROUP = "spectune.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "SpecTuning"
LIST_KIND = "SpecTuningList"
PLURAL = "spectunings"
SINGULAR = "spectuning"
SHORT_NAMES = ("spt",)
CRD_NAME = f"{PLURAL}.{GROUP}"
