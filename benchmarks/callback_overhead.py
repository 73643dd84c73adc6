"""Per-step overhead of AlgorithmEngineCallback in a real lightning.Trainer, side by side in one run.

A tiny ``Linear(32, 2)`` model (a plain ``LightningModule``, batch 8) runs ``--steps`` CPU steps
under each configuration below; every round runs all of them once, in a new (seeded) random order,
and ``--repeats`` rounds are run:

- plain Lightning (no callback);
- + one bare ``lightning.Callback()`` (Lightning's own floor for adding any callback);
- + ``AlgorithmEngineCallback([])`` (an empty bridge);
- + the bridge with 16 no-op algorithms of 16 *distinct* classes, each matching the per-step
  events (so each has its own trace keys and cost entries, as 16 real algorithms would);
- + 16 no-op Lightning callbacks of 16 distinct classes (6 per-step hooks each): the alternative of
  writing each algorithm as its own Lightning callback;
- + the bridge with 16 instances of *one* no-op class (what this benchmark measured before: their
  traces and cost entries collapse into one key per event, so it understates the bridge's cost).

Step time is the training thread's CPU time (``time.thread_time``): the overheads measured here
are CPU work, and on a machine shared with other jobs wall time also counts the moments another
process held the core (single rounds then swing by more than a whole step). Wall time is recorded
too. Overheads are paired: within a round, a configuration's step time minus plain Lightning's;
the median over rounds is reported with the lowest and highest round. The targets of issue 17 are
checked at the end, with engine dispatch against PyTorch Ignite's measured in the same run
(``benchmarks/engine_dispatch.py``; needs ``pytorch-ignite``, the ``bench`` extra).

Usage::

    .venv/bin/python benchmarks/callback_overhead.py                 # 2000 steps x 11 rounds
    .venv/bin/python benchmarks/callback_overhead.py --quick         # a smoke run, ~1 min
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import platform
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from composer_bridge import Algorithm, AlgorithmEngineCallback, Event, State

# The events of one optimizer step (what a per-step algorithm such as EMA, LayerFreezing or MixUp
# matches); a plain LightningModule gets nine of them (not the forward/loss ones).
STEP_EVENTS = frozenset({
    Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_TRAIN_BATCH,
    Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD,
    Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH, Event.BATCH_END, Event.BATCH_CHECKPOINT,
})
N = 16


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(32, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StepNoOp(Algorithm):
    """Runs at every per-step event and does nothing: the engine's cost with no work in ``apply``."""

    def match(self, event: Event, state: State) -> bool:
        return event in STEP_EVENTS

    def apply(self, event: Event, state: State, logger: Any) -> None:
        return None


class NoOpCallback(L.Callback):
    def on_train_batch_start(self, *args: Any) -> None: ...
    def on_train_batch_end(self, *args: Any) -> None: ...
    def on_before_backward(self, *args: Any) -> None: ...
    def on_after_backward(self, *args: Any) -> None: ...
    def on_before_optimizer_step(self, *args: Any) -> None: ...
    def on_before_zero_grad(self, *args: Any) -> None: ...


# 16 distinct classes each (built once: a class per configuration run would only add noise).
DISTINCT_ALGORITHMS = [type(f"StepNoOp{i:02d}", (StepNoOp,), {}) for i in range(N)]
DISTINCT_CALLBACKS = [type(f"NoOpCallback{i:02d}", (NoOpCallback,), {}) for i in range(N)]


def loader(steps: int) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * 8, 32, generator=g)
    y = torch.randint(0, 2, (steps * 8,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def time_fit(callbacks: list[L.Callback], steps: int, wall: list[float] | None = None) -> float:
    """CPU seconds per step of the training thread, between the first and last step (setup excluded).

    The wall-clock seconds per step are appended to ``wall`` when it is given.
    """
    marks: list[tuple[float, float]] = []

    class Clock(L.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            if not marks:
                marks.append((time.thread_time(), time.perf_counter()))

        def on_train_end(self, *args: Any) -> None:
            marks.append((time.thread_time(), time.perf_counter()))

    trainer = L.Trainer(
        accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[Clock(), *callbacks],
    )
    trainer.fit(Tiny(), loader(steps))
    if wall is not None:
        wall.append((marks[1][1] - marks[0][1]) / (steps - 1))
    return (marks[1][0] - marks[0][0]) / (steps - 1)


PLAIN = "plain Lightning"
EMPTY = "+ AlgorithmEngineCallback([])"
ALGOS = f"+ bridge, {N} distinct no-op algorithms"
CALLBACKS = f"+ {N} no-op Lightning callbacks"
CONFIGS: dict[str, Callable[[], list[L.Callback]]] = {
    PLAIN: lambda: [],
    "+ 1 bare Lightning callback (no hooks)": lambda: [L.Callback()],
    EMPTY: lambda: [AlgorithmEngineCallback([])],
    ALGOS: lambda: [AlgorithmEngineCallback([cls() for cls in DISTINCT_ALGORITHMS])],
    CALLBACKS: lambda: [cls() for cls in DISTINCT_CALLBACKS],
    f"+ bridge, {N} instances of one no-op class (old benchmark)": lambda: [
        AlgorithmEngineCallback([StepNoOp() for _ in range(N)])],
}


def check_distinct_keys(steps: int) -> tuple[int, int]:
    """Run the 16-class bridge once; return its (trace keys, cost entries), which must be 16 per event."""
    bridge = AlgorithmEngineCallback([cls() for cls in DISTINCT_ALGORITHMS])
    time_fit([bridge], steps)
    traces, cost = len(bridge.traces.stats), len(bridge.cost)
    per_event = {key.split("/")[1] for key in bridge.traces.stats}
    if traces != N * len(per_event) or cost != traces:
        raise AssertionError(f"expected {N} trace keys and cost entries per event, got {traces} keys and "
                             f"{cost} cost entries over {len(per_event)} events")
    return traces, len(per_event)


def dispatch_vs_ignite(reps: int, runs: int) -> tuple[float, float, list[float]] | None:
    """Engine.run_event with 16 distinct no-op algorithms vs Ignite's dispatch to 16 handlers, interleaved.

    Returns (median µs per event ours, Ignite's, per-run Ignite ÷ ours), or None without Ignite.
    """
    if importlib.util.find_spec("ignite") is None:
        return None
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import engine_dispatch

    ours, theirs = engine_dispatch.bridge_algorithms(N), engine_dispatch.ignite_handlers(N)
    engine_dispatch.one_run(*ours, 10)
    engine_dispatch.one_run(*theirs, 10)
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(runs):
        samples[0].append(engine_dispatch.one_run(*ours, reps))
        samples[1].append(engine_dispatch.one_run(*theirs, reps))
    ratios = [t / o for o, t in zip(*samples, strict=True)]
    return statistics.median(samples[0]), statistics.median(samples[1]), ratios


def spread(values: list[float], fmt: str) -> str:
    return f"{min(values):{fmt}}..{max(values):{fmt}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000, help="training steps per configuration run")
    parser.add_argument("--repeats", type=int, default=11, help="interleaved rounds")
    parser.add_argument("--quick", action="store_true", help="smoke run: 300 steps x 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = 300, 3
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)

    keys, events = check_distinct_keys(50)  # also the warm-up
    results: dict[str, list[float]] = {name: [] for name in CONFIGS}
    walls: dict[str, list[float]] = {name: [] for name in CONFIGS}
    order = random.Random(0)  # each round runs the configurations in a new order: no fixed position bias
    started = time.perf_counter()
    for _ in range(args.repeats):
        names = list(CONFIGS)
        order.shuffle(names)
        for name in names:
            results[name].append(time_fit(CONFIGS[name](), args.steps, walls[name]))
    dispatch = dispatch_vs_ignite(reps=200 if args.quick else 2000, runs=3 if args.quick else 9)
    elapsed = time.perf_counter() - started

    plain = results[PLAIN]
    base = statistics.median(plain)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.steps} steps x {args.repeats} interleaved rounds ({elapsed:.0f} s); "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average {load:.1f}; "
          f"Python {platform.python_version()}, torch {torch.__version__}, lightning {L.__version__}")
    print(f"The {N}-class bridge recorded {keys} trace keys and as many cost entries ({N} per event, "
          f"{events} events per step).\n")
    print("Overhead: the median over rounds of (configuration - plain Lightning) in the same round, in CPU "
          "time of the training thread; range: the lowest and highest round; wall: the same median in wall time.\n")
    print("| configuration | median CPU µs/step | overhead vs plain (µs/step) | range (µs/step) | overhead (% of plain) "
          "| wall-time overhead (µs/step) |")
    print("|---|---:|---:|---:|---:|---:|")
    extra: dict[str, list[float]] = {}
    for name, values in results.items():
        extra[name] = [(value - p) * 1e6 for value, p in zip(values, plain, strict=True)]
        overhead = statistics.median(extra[name])
        rng = "" if name == PLAIN else spread(extra[name], "+.0f")
        wall = statistics.median((w - p) * 1e6 for w, p in zip(walls[name], walls[PLAIN], strict=True))
        print(f"| {name} | {statistics.median(values) * 1e6:.0f} | {overhead:+.0f} | {rng} "
              f"| {overhead / (base * 1e6) * 100:+.1f} % | {wall:+.0f} |")

    empty_ratio = [value / p for value, p in zip(results[EMPTY], plain, strict=True)]
    algos, callbacks = statistics.median(extra[ALGOS]), statistics.median(extra[CALLBACKS])
    paired = [a / c for a, c in zip(extra[ALGOS], extra[CALLBACKS], strict=True) if c > 0]
    rows = [
        ("empty bridge ÷ plain step", "≤ 1.03x", f"{statistics.median(empty_ratio):.3f}x",
         spread(empty_ratio, ".3f"), statistics.median(empty_ratio) <= 1.03),
        (f"extra of {N} algorithms ÷ extra of {N} Lightning callbacks", "< 1x", f"{algos / callbacks:.2f}x",
         spread(paired, ".2f") if paired else "", algos < callbacks),
    ]
    if dispatch is not None:
        ours, theirs, ratios = dispatch
        rows.append((f"Ignite dispatch ÷ engine dispatch, {N} handlers/algorithms ({ours:.2f} vs {theirs:.2f} µs/event)",
                     "> 1x", f"{theirs / ours:.2f}x", spread(ratios, ".2f"), theirs > ours))
    print("\n| target | wanted | measured (median) | range over rounds | met |")
    print("|---|---|---:|---:|---|")
    for name, wanted, measured, rng, met in rows:
        print(f"| {name} | {wanted} | {measured} | {rng} | {'yes' if met else 'NO'} |")
    if dispatch is None:
        print("\n(engine dispatch vs Ignite not measured: install the bench extra, pytorch-ignite)")


if __name__ == "__main__":
    main()
