"""Per-engine knowledge: metric catalogues and command-line argument handling.

Pure: names in, names out; argv in, argv out. No I/O and no network clients.
"""

from spectune.engines.catalogue import (
    SGLANG,
    TRTLLM,
    VLLM_V0,
    VLLM_V1,
    Catalogue,
    Dialect,
    PageIdentity,
    catalogue_for,
    detect_dialect,
    identify_page,
)

__all__ = [
    "SGLANG",
    "TRTLLM",
    "VLLM_V0",
    "VLLM_V1",
    "Catalogue",
    "Dialect",
    "PageIdentity",
    "catalogue_for",
    "detect_dialect",
    "identify_page",
]
