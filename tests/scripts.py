"""Load a repository script (``hack/``, ``benchmarks/``) as a module, for tests of its functions.

The scripts are run as files, not imported as a package, so a test loads them by path.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def load_script(relative: str) -> ModuleType:
    """The script at ``relative`` (from the repository root), executed as a fresh module."""
    path = REPO / relative
    name = path.stem.replace("-", "_") + "_script"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
