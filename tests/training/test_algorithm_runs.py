"""composer_bridge.training.algorithm_runs: an algorithm instance reused with a new run starts fresh; the same run keeps its state."""

from __future__ import annotations

from typing import Any

import torch

from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.state import State
from composer_bridge.training.algorithm_runs import bind, new_run_id


class Averaging(Algorithm):
    """Keeps state while it runs: a running average and a count, as EMA does."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self.seen: list[int] = []

    def match(self, event: Event, state: State) -> bool:
        return event is Event.BATCH_END

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        self.seen.append(int(state.timestamp.batch.value))
        self.average = torch.ones(2) * len(self.seen)


def test_run_ids_are_new_each_time() -> None:
    first, second = new_run_id(), new_run_id()
    assert first != second


def test_the_same_run_continues_with_the_state_it_left() -> None:
    algorithm, run = Averaging(), new_run_id()
    assert bind(algorithm, run) is False
    algorithm.apply(Event.BATCH_END, State(torch.nn.Linear(1, 1)), Logger())
    assert bind(algorithm, run) is False  # fit again, validate, a resumed checkpoint: same run
    assert algorithm.seen == [0] and torch.equal(algorithm.average, torch.ones(2))


def test_another_run_gets_the_instance_as_constructed_and_nothing_it_learned() -> None:
    algorithm = Averaging(decay=0.5)
    bind(algorithm, new_run_id())
    algorithm.decay = 0.7  # even a hyper-parameter changed during the first run
    algorithm.apply(Event.BATCH_END, State(torch.nn.Linear(1, 1)), Logger())
    assert bind(algorithm, new_run_id()) is True
    fresh: dict[str, Any] = {k: v for k, v in vars(algorithm).items() if not k.startswith("_composer_bridge")}
    assert fresh == {"decay": 0.5, "seen": []}  # no "average": an attribute added by the run is gone
    algorithm.apply(Event.BATCH_END, State(torch.nn.Linear(1, 1)), Logger())
    assert algorithm.seen == [0]


def test_a_reset_does_not_share_mutable_state_with_the_pristine_copy() -> None:
    algorithm = Averaging()
    bind(algorithm, new_run_id())
    algorithm.seen.append(1)  # mutates the list the instance had when constructed
    bind(algorithm, new_run_id())
    algorithm.seen.append(2)
    bind(algorithm, new_run_id())
    assert algorithm.seen == []
