"""The examples in composer_bridge.hf's docstrings run and print what they claim."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["composer_bridge.hf", "composer_bridge.hf.alibi", "composer_bridge.hf.conv1d",
           "composer_bridge.hf.feed_forward", "composer_bridge.hf.module", "composer_bridge.hf.qk_norm"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
