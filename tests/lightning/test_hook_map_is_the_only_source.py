"""HOOK_EVENTS is the only place that says which event a hook fires: the adapter names no event itself."""

from __future__ import annotations

import ast
import importlib
import inspect

from composer_bridge.lightning.hook_map import HOOK_EVENTS

# The modules that fire events from Lightning's hooks (the callback's and those installed on the module).
FIRING = ["callback", "run", "training_loop", "run_checkpoint", "steps", "module_hooks", "plain_loss.step_events"]


def _tree(name: str) -> ast.Module:
    return ast.parse(inspect.getsource(importlib.import_module(f"composer_bridge.lightning.{name}")))


def test_no_module_that_fires_events_names_an_event_member() -> None:
    named = {
        (name, f"Event.{node.attr}")
        for name in FIRING
        for node in ast.walk(_tree(name))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Event"
    }
    assert not named, f"events named outside hook_map.HOOK_EVENTS: {sorted(named)}"


def test_every_row_of_the_table_is_read_by_the_code_that_fires_it() -> None:
    strings = {
        node.value
        for name in FIRING
        for node in ast.walk(_tree(name))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    unread = []
    for key in HOOK_EVENTS:
        hook, _, variant = key.partition("[")
        # a "[standalone]" variant is read as f"{hook}[standalone]"
        if key not in strings and not (variant and hook in strings and f"[{variant}" in strings):
            unread.append(key)
    assert not unread, f"rows of HOOK_EVENTS no code reads: {unread}"
