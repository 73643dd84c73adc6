"""Memory held by the in-memory traces over a long run, per trace mode (a benchmark, not a test).

Drives an Engine with 4 always-matching algorithms through the 13 events of a training step for
20,000 steps, recording every event's traces in the callback's trace store, and reports the
memory the store holds (tracemalloc) and how many traces it keeps at 1k, 5k and 20k steps.

Usage::

    python benchmarks/long_run_traces.py --steps 20000
"""

from __future__ import annotations

import argparse
import tracemalloc
from typing import Any

import torch

from composer_bridge import Algorithm, Engine, Event, Logger, LoggerDestination, State
from composer_bridge.lightning.traces import TraceReporting

STEP_EVENTS = [
    Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_TRAIN_BATCH,
    Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD,
    Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH, Event.BATCH_END, Event.BATCH_CHECKPOINT,
]


def make_algorithm(name: str) -> Algorithm:
    def match(self: Any, event: Event, state: State) -> bool:
        return True

    def apply(self: Any, event: Event, state: State, logger: Any) -> None:
        return None

    return type(name, (Algorithm,), {"match": match, "apply": apply})()


class ToStore(LoggerDestination):
    def __init__(self, store: Any) -> None:
        self.store = store

    def log_traces(self, traces: Any, step: int | None = None) -> None:
        self.store.log_traces(traces, step)


def measure(mode: Any, steps: int, checkpoints: tuple[int, ...]) -> list[tuple[int, float, int]]:
    reporting = TraceReporting(mode)
    logger = Logger([ToStore(reporting.store)])
    engine = Engine(State(torch.nn.Linear(1, 1), algorithms=[make_algorithm(f"Algo{i}") for i in range(4)]), logger)
    rows = []
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for step in range(1, steps + 1):
        logger.step = step
        for event in STEP_EVENTS:
            engine.run_event(event)
        if step in checkpoints:
            held = tracemalloc.get_traced_memory()[0] - base
            kept = sum(len(v) for v in reporting.store.values())
            rows.append((step, held / 2**20, kept))
    tracemalloc.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000)
    args = parser.parse_args()
    checkpoints = tuple(s for s in (1_000, 5_000, 20_000) if s <= args.steps)
    print("| trace mode | steps | memory held (MiB) | traces kept in full |")
    print("|---|---:|---:|---:|")
    for mode in ("summary", "every_event"):
        for step, mib, kept in measure(mode, args.steps, checkpoints):
            print(f"| {mode} | {step:,} | {mib:.1f} | {kept:,} |")


if __name__ == "__main__":
    main()
