"""The examples in the engine core's docstrings run and print what they claim."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import composer_bridge.core

MODULES = sorted(
    [f"composer_bridge.core.{info.name}" for info in pkgutil.iter_modules(composer_bridge.core.__path__)]
    + ["composer_bridge.core", "composer_bridge.passes"]
)
WITHOUT_EXAMPLES = {"composer_bridge.core", "composer_bridge.passes"}  # re-exports only


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples in {name} failed (see output)"
    if name not in WITHOUT_EXAMPLES:
        assert result.attempted > 0, f"{name} has no runnable docstring example"
