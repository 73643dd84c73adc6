"""The bridge's per-step work, counted (not timed): Python calls per training step into the package.

A timing benchmark (``benchmarks/callback_overhead.py``) cannot tell a few extra calls per step
from the noise of a shared machine; counting can. Every Python function call made while a step
runs is counted by the file it belongs to (``sys.setprofile``), over steps in the middle of a
fit, and compared with a budget per file. A change that adds a layer to the hot path (a wrapper
around a hook, a property read at every dispatch, a capability checked at every step, a call per
algorithm inside the engine) fails here with the file and count that grew. If the extra call is
worth its cost, measure it with the benchmark and raise the budget in the same commit.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
from helpers.support import L, PlainLinear, quiet_trainer
from torch.utils.data import DataLoader, TensorDataset

import composer_bridge
from composer_bridge import Algorithm, AlgorithmEngineCallback, Event, State

PACKAGE = Path(composer_bridge.__file__).parent
STEP_EVENTS = frozenset({
    Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_TRAIN_BATCH,
    Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH, Event.BATCH_END,
    Event.BATCH_CHECKPOINT,
})  # the per-step events a plain LightningModule receives
FIRST, LAST = 10, 30  # counted steps: inside the engine's first 64 runs of a plan, which it times in full


class StepNoOp(Algorithm):
    def match(self, event: Event, state: State) -> bool:
        return event in STEP_EVENTS

    def apply(self, event: Event, state: State, logger: Any) -> None:
        return None


def distinct_no_ops(n: int) -> list[Algorithm]:
    """``n`` no-op algorithms of ``n`` distinct classes (each has its own trace keys and cost entries)."""
    return [type(f"StepNoOp{i:02d}", (StepNoOp,), {})() for i in range(n)]


def calls_per_step(callbacks: list[Any], **trainer_options: Any) -> dict[str, float]:
    """Python calls per training step (steps FIRST..LAST of a fit), by file: the package's files relative
    to it, ``"algorithms"`` for the no-op algorithms' ``match`` and ``apply``, and ``"package"`` for the
    package's total (Lightning's, torch's and this file's other calls are left out)."""
    counts: collections.Counter[str] = collections.Counter()
    this_file = __file__
    package = str(PACKAGE) + "/"

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(package):
                counts[name[len(package):]] += 1
            elif name == this_file and frame.f_code.co_name in ("match", "apply"):
                counts["algorithms"] += 1
            else:
                counts["other"] += 1

    class Window(L.Callback):
        step = 0

        def on_train_batch_start(self, *args: Any) -> None:
            self.step += 1
            if self.step == FIRST:
                sys.setprofile(profile)
            elif self.step == LAST:
                sys.setprofile(None)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(8 * (LAST + 2), 4, generator=g), torch.randint(0, 2, (8 * (LAST + 2),), generator=g))
    trainer = quiet_trainer(max_steps=LAST + 2, callbacks=[Window(), *callbacks], **trainer_options)
    try:
        trainer.fit(PlainLinear(lr=0.01), DataLoader(data, batch_size=8))
    finally:
        sys.setprofile(None)
    steps = LAST - FIRST
    return {name: count / steps for name, count in counts.items() if name != "other"} | {
        "package": sum(c for n, c in counts.items() if n not in ("other", "algorithms")) / steps}


def over_budget(counted: dict[str, float], budget: dict[str, float]) -> dict[str, tuple[float, float]]:
    """The entries of ``counted`` above their budget (a file absent from ``budget`` may make no call)."""
    return {name: (count, budget.get(name, 0)) for name, count in counted.items() if count > budget.get(name, 0)}


# Counted on lightning 2.6.6 / pytorch_lightning 2.6.6 (the same on both). Lightning calls one
# callback hook per step of an idle bridge (on_train_batch_end): the step clock, and the check
# whether anything listens now.
IDLE_BUDGET = {
    "package": 11,
    "lightning/callback.py": 1, "lightning/training_loop.py": 1, "lightning/module.py": 1,
    "lightning/_compat.py": 1, "lightning/run.py": 1, "training/resume_position.py": 1,
    "training/step_clock.py": 3, "core/state.py": 1, "core/engine.py": 1,
}

# 9 per-step events reach a plain module. Per event, the engine: fire, _run_algorithms, its match
# list, and the cost report's markers (begin_run per timed event, a finish per apply: their start
# is a C call; the first 64 runs of a plan are timed in full, later ones one in eight); the trace
# path: the engine logger, the Lightning destination and the store (log_traces each). At the step's
# end the store records a step of the same plans as the one before in one go (_drain, its step list,
# the timeline's column, add_group and _count, and the comparison). Per step: the callback's three
# shown hooks and the module's four (data transfer, training_step, backward), the training loop, the
# clock. Nothing per algorithm but its own two calls and its cost marker's finish.
ACTIVE_BUDGET = {
    "package": 263,
    "algorithms": 2 * 16 * 9,  # each algorithm's match and apply at each event, nothing else
    "core/engine.py": 9 * 3 + 1,
    "core/profiler.py": 16 * 9 + 9,
    "core/logger.py": 9,
    "lightning/traces.py": 9 + 1,
    "core/trace_store.py": 9 + 7,
    "lightning/steps.py": 9, "lightning/callback.py": 4, "lightning/training_loop.py": 4,
    "lightning/module_patches.py": 4, "lightning/module_hooks.py": 4, "lightning/_compat.py": 4,
    "lightning/run.py": 1, "lightning/module.py": 1, "training/step_clock.py": 4,
    "training/resume_position.py": 2, "core/state.py": 4, "core/time.py": 6,
}


def test_an_idle_bridge_makes_at_most_eleven_python_calls_per_step() -> None:
    counted = calls_per_step([AlgorithmEngineCallback([])])
    assert not over_budget(counted, IDLE_BUDGET), (
        f"an idle bridge's step makes more Python calls than before: {over_budget(counted, IDLE_BUDGET)} "
        "(count, budget); see this file's docstring"
    )


def test_sixteen_algorithms_cost_the_engine_and_the_trace_store_nothing_per_algorithm_but_their_calls() -> None:
    counted = calls_per_step([AlgorithmEngineCallback(distinct_no_ops(16))])
    assert not over_budget(counted, ACTIVE_BUDGET), (
        "the bridge's step with 16 algorithms makes more Python calls than before: "
        f"{over_budget(counted, ACTIVE_BUDGET)} (count, budget); see this file's docstring"
    )
    assert counted["algorithms"] == 2 * 16 * 9


@pytest.mark.parametrize("measure_cost", [False, True])
def test_the_bridge_adds_no_python_call_per_algorithm_beyond_the_cost_markers(measure_cost: bool) -> None:
    few = calls_per_step([AlgorithmEngineCallback(distinct_no_ops(2), measure_cost=measure_cost)])
    many = calls_per_step([AlgorithmEngineCallback(distinct_no_ops(16), measure_cost=measure_cost)])
    timed = (16 - 2) * 9 if measure_cost else 0  # a cost marker's finish per apply, timed in full here
    assert many["package"] - few["package"] == timed, {
        name: (few.get(name, 0), count) for name, count in many.items() if count != few.get(name, 0)}


def test_with_a_lightning_logger_the_traces_logged_once_cost_no_call_per_event(tmp_path: Path) -> None:
    """The Trainer's default has a logger; in summary mode each trace key goes to it once, so in later steps the
    Lightning destination makes no call per event beyond its own (the loggers' summary is skipped, not asked)."""
    logger = L.loggers.CSVLogger(str(tmp_path))
    counted = calls_per_step([AlgorithmEngineCallback(distinct_no_ops(16))], logger=logger)
    assert counted["lightning/traces.py"] == ACTIVE_BUDGET["lightning/traces.py"], counted
    assert not over_budget(counted, ACTIVE_BUDGET), over_budget(counted, ACTIVE_BUDGET)
