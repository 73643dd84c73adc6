"""The trace store in core: records an engine's traces per step and per key, with no Lightning involved."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from composer_bridge.core import Algorithm, Engine, Event, Logger, State
from composer_bridge.core.trace_store import TraceStore


class Code(Algorithm):
    def __init__(self, exit_code=None):
        self.exit_code = exit_code

    def match(self, event, state):
        return event == Event.BATCH_END

    def apply(self, event, state, logger):
        return self.exit_code


def test_the_store_keeps_two_instances_of_one_class_apart():
    store = TraceStore()
    logger = Logger([store])
    engine = Engine(State(torch.nn.Linear(1, 1), algorithms=[Code(None), Code(7)]), logger)
    for step in range(3):
        logger.step = step
        engine.run_event(Event.BATCH_END)
    assert store.keys_at(2) == ["Code#2/BATCH_END", "Code/BATCH_END"]  # an after-event: reversed
    first, second = store.stats["Code/BATCH_END"], store.stats["Code#2/BATCH_END"]
    assert (first.count, first.last_exit_code, first.orders) == (3, None, {1})
    assert (second.count, second.last_exit_code, second.orders) == (3, 7, {0})
    assert store.timeline.rows == {"Code#2/BATCH_END": [1, 1, 1], "Code/BATCH_END": [1, 1, 1]}


def test_core_modules_import_no_lightning():
    import composer_bridge.core as core

    for path in Path(core.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] in ("lightning", "pytorch_lightning")], path.name
