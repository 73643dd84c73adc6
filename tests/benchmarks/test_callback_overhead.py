"""benchmarks/callback_overhead.py: the in-run A/B really runs each step with or without the guest."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import pytest
from helpers.support import load_script

BUSY = 0.03  # seconds of CPU time: far above a plain step of this benchmark (about 1 ms)


@pytest.fixture(scope="module")
def overhead():
    return load_script("benchmarks/callback_overhead.py", "callback_overhead_under_test")


class Counter(L.Callback):
    """Records the steps in which Lightning called the guest's two per-step hooks."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.calls.append((trainer.global_step, "start"))

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.calls.append((trainer.global_step - 1, "end"))
        spin_until = time.thread_time() + BUSY  # CPU work that marks the steps the guest took part in
        while time.thread_time() < spin_until:
            pass


def test_in_run_ab_calls_the_guest_exactly_in_the_steps_it_counts_as_with(overhead, monkeypatch) -> None:
    modules: list[Any] = []
    original = overhead.Toggling.__init__

    def remember(self: Any, *args: Any) -> None:
        original(self, *args)
        modules.append(self)

    monkeypatch.setattr(overhead.Toggling, "__init__", remember)
    guest = Counter()
    result = overhead.in_run_ab([guest], steps=45, block=10, warmup=0)
    present = modules[0].present
    assert present == [(i // 10) % 2 == 0 for i in range(45)]
    # A step's end hook runs in that step's own set-up; the next step's start hook still belongs to it
    # (the switch comes after Lightning's callback loop), so the guest's start hooks lag by one step.
    ends = sorted(step for step, hook in guest.calls if hook == "end")
    assert ends == [i for i in range(45) if present[i]]
    starts = sorted(step for step, hook in guest.calls if hook == "start")
    assert starts == [0] + [i for i in range(1, 45) if present[i - 1]]  # step 0: in the Trainer from the start
    # every timed step (from one start to the next) is sorted into the set it ran in
    assert len(result.with_guests) == sum(present[:44]) and len(result.without) == 44 - sum(present[:44])
    assert min(result.with_guests) >= BUSY and max(result.without) < BUSY


def test_the_parts_benchmark_times_every_configuration_against_plain_lightning() -> None:
    parts = load_script("benchmarks/callback_overhead_parts.py", "callback_overhead_parts_under_test")
    extra = parts.measure(steps=30, rounds=1)
    assert list(extra) == list(parts.CONFIGS) and extra["plain Lightning"] == 0.0
    assert all(isinstance(value, float) for value in extra.values())


def test_in_run_groups_runs_the_steps_without_the_bridge_as_plain_lightning(overhead) -> None:
    """An active bridge also fires events from hooks it sets on the module (batch transfer, training_step,
    backward). In the steps counted as without it, none of its events may run, neither the callback's nor the
    module's; in each step counted as with it, all of them."""
    from composer_bridge import Algorithm, Event

    modules: list[Any] = []
    seen: list[tuple[int, Event]] = []  # (the timed step the event ran in, the event)

    class Count(Algorithm):
        def match(self, event: Event, state: Any) -> bool:
            return event in (Event.AFTER_DATALOADER, Event.BEFORE_BACKWARD, Event.BATCH_END)

        def apply(self, event: Event, state: Any, logger: Any) -> None:
            seen.append((len(modules[0].slots) - 1, event))  # step i: from the module's hook of i to that of i+1

    original = overhead.Toggling.__init__

    def remember(self: Any, *args: Any) -> None:
        original(self, *args)
        modules.append(self)

    overhead.Toggling.__init__ = remember
    try:
        overhead.in_run_groups([[overhead.AlgorithmEngineCallback([Count()])], [Counter()]], steps=60, block=10,
                               warmup=0)
    finally:
        overhead.Toggling.__init__ = original
    slots = modules[0].slots
    assert slots == [[0, 1, -1][(i // 10) % 3] for i in range(60)]
    with_bridge = [i for i in range(59) if slots[i] == 0]  # (step 59 has no next batch)
    for event in (Event.AFTER_DATALOADER, Event.BEFORE_BACKWARD, Event.BATCH_END):
        steps = sorted(step for step, e in seen if e is event and 0 <= step < 59)
        assert steps == with_bridge, event
