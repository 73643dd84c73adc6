"""benchmarks/callback_instructions.py: callgrind counts exactly the steps it divides by, with each configuration's guests."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.support import load_script


@pytest.fixture(scope="module")
def instructions():
    return load_script("benchmarks/callback_instructions.py", "callback_instructions_under_test")


@pytest.fixture
def algorithm_steps(monkeypatch) -> list[int]:
    """The global step at each call of the bridge's ``on_train_batch_start``, in order."""
    import composer_bridge

    original = composer_bridge.AlgorithmEngineCallback.on_train_batch_start
    steps: list[int] = []

    def record_step(self: Any, trainer: Any, *args: Any) -> None:
        steps.append(trainer.global_step)
        return original(self, trainer, *args)

    monkeypatch.setattr(composer_bridge.AlgorithmEngineCallback, "on_train_batch_start", record_step)
    return steps


def test_collection_spans_the_steps_counted_and_each_configuration_trains_its_guests(instructions,
                                                                                    algorithm_steps) -> None:
    seen: list[tuple[str, bool, int]] = []
    for config in instructions.CONFIGS:
        steps_before = len(algorithm_steps)

        def switch(on: bool, config: str = config) -> None:
            seen.append((config, on, len(algorithm_steps)))

        instructions.fit(config, switch)
        bridged = len(algorithm_steps) - steps_before
        # the 16 algorithms listen at every step (their hook is shown to Lightning); the other configurations do not
        assert bridged == (instructions.STEPS if config == "16 algorithms" else 0), (config, bridged)
    assert [(c, on) for c, on, _ in seen] == [(c, on) for c in instructions.CONFIGS for on in (True, False)]
    # the bridge's hook (called after the window's at each step; none ran before the 16-algorithm fit) ran FIRST
    # times before collection started and LAST - FIRST more before it stopped: the steps the count is divided by
    starts = {c: n for c, on, n in seen if on}
    stops = {c: n for c, on, n in seen if not on}
    assert starts["16 algorithms"] == instructions.FIRST
    assert stops["16 algorithms"] - starts["16 algorithms"] == instructions.LAST - instructions.FIRST


def test_a_window_moved_late_counts_its_own_steps(instructions, algorithm_steps) -> None:
    seen: list[tuple[bool, int]] = []
    instructions.fit("16 algorithms", lambda on: seen.append((on, len(algorithm_steps))), first=300, last=340)
    assert seen == [(True, 300), (False, 340)]
    assert len(algorithm_steps) == 340 + instructions.STEPS - instructions.LAST  # trained past the window's end
