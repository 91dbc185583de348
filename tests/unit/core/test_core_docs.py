"""The math core documents itself: every public name has worked examples, and they are true."""

from __future__ import annotations

import doctest
import importlib

import pytest

import spectune.core

MODULES = [
    "spectune.core",
    "spectune.core._acceptance",
    "spectune.core._speedup",
    "spectune.core._intervals",
    "spectune.core._capacity",
    "spectune.core._tail",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests_pass(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0


@pytest.mark.parametrize("name", spectune.core.__all__)
def test_every_public_name_is_documented_with_an_example(name):
    obj = getattr(spectune.core, name)
    doc = obj.__doc__ or ""
    if callable(obj) and not isinstance(obj, type):
        assert "Examples\n    --------" in doc, name
        assert ">>> " in doc, name
    else:
        assert "Attributes\n    ----------" in doc, name
