"""Per-step overhead of AlgorithmEngineCallback in a real lightning.Trainer, side by side in one run.

Runs a tiny Linear(32, 2) model for ``--steps`` CPU steps under five configurations and repeats
them interleaved (``--repeats`` rounds), reporting the median step time of each:

- plain Lightning;
- + one bare ``lightning.Callback()`` (Lightning's own cost of dispatching every hook to a callback);
- Lightning + ``AlgorithmEngineCallback([])``;
- + 4 and + 16 always-matching no-op algorithms through the bridge (every event of the step);
- + 16 no-op Lightning callbacks (6 hooks each), the alternative of writing each algorithm as
  its own Lightning callback.

Usage::

    python benchmarks/callback_overhead.py --steps 2000 --repeats 5
"""

from __future__ import annotations

import argparse
import logging
import platform
import random
import statistics
import time
import warnings
from typing import Any

import lightning as L
import torch

from composer_bridge import Algorithm, AlgorithmEngineCallback, ComposerModule, Event, State


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(32, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class TinyComposer(ComposerModule):
    """The same model in Composer's forward/loss convention (the bridge then fires every event)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(32, 2)

    def forward(self, batch: Any) -> torch.Tensor:
        return self.net(batch[0])

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs, batch[1])

    def update_train_metrics(self, outputs: Any, batch: Any, loss: torch.Tensor) -> None:
        pass  # the plain module logs nothing either

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class NoOp(Algorithm):
    def match(self, event: Event, state: State) -> bool:
        return True

    def apply(self, event: Event, state: State, logger: Any) -> None:
        return None


class NoOpCallback(L.Callback):
    def on_train_batch_start(self, *args: Any) -> None: ...
    def on_train_batch_end(self, *args: Any) -> None: ...
    def on_before_backward(self, *args: Any) -> None: ...
    def on_after_backward(self, *args: Any) -> None: ...
    def on_before_optimizer_step(self, *args: Any) -> None: ...
    def on_before_zero_grad(self, *args: Any) -> None: ...


def loader(steps: int) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * 8, 32, generator=g)
    y = torch.randint(0, 2, (steps * 8,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def time_fit(callbacks: list[L.Callback], steps: int, composer: bool = False) -> float:
    """Seconds per step, measured between the first and last step (setup excluded)."""
    marks: list[float] = []

    class Clock(L.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            if not marks:
                marks.append(time.perf_counter())

        def on_train_end(self, *args: Any) -> None:
            marks.append(time.perf_counter())

    trainer = L.Trainer(
        accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[Clock(), *callbacks],
    )
    trainer.fit(TinyComposer() if composer else Tiny(), loader(steps))
    return (marks[1] - marks[0]) / (steps - 1)


CONFIGS: dict[str, Any] = {
    "plain Lightning": lambda: ([], False),
    "+ 1 bare Lightning callback (no hooks)": lambda: ([L.Callback()], False),
    "+ AlgorithmEngineCallback([])": lambda: ([AlgorithmEngineCallback([])], False),
    "+ bridge, 4 no-op algorithms": lambda: ([AlgorithmEngineCallback([NoOp() for _ in range(4)])], False),
    "+ bridge, 16 no-op algorithms": lambda: ([AlgorithmEngineCallback([NoOp() for _ in range(16)])], False),
    "+ 16 no-op Lightning callbacks": lambda: ([NoOpCallback() for _ in range(16)], False),
    "ComposerModule + bridge, 16 no-op algorithms": lambda: ([AlgorithmEngineCallback([NoOp() for _ in range(16)])], True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    results: dict[str, list[float]] = {name: [] for name in CONFIGS}
    time_fit([], 50)  # warm-up
    order = random.Random(0)  # each round runs the configurations in a new order: no fixed position bias
    for _ in range(args.repeats):
        names = list(CONFIGS)
        order.shuffle(names)
        for name in names:
            callbacks, composer = CONFIGS[name]()
            results[name].append(time_fit(callbacks, args.steps, composer))
    plain = results["plain Lightning"]
    base = statistics.median(plain)
    print(f"{args.steps} steps x {args.repeats} interleaved repeats; {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, torch {torch.__version__}, lightning {L.__version__}\n")
    print("Overhead: the median over rounds of (configuration - plain Lightning) within a round; "
          "range: the lowest and highest round.\n")
    print("| configuration | median µs/step | overhead vs plain (µs/step) | range (µs/step) | overhead (% of plain) |")
    print("|---|---:|---:|---:|---:|")
    for name, values in results.items():
        paired = [(value - p) * 1e6 for value, p in zip(values, plain, strict=True)]
        overhead = statistics.median(paired)
        print(f"| {name} | {statistics.median(values) * 1e6:.0f} | {overhead:+.0f} | {min(paired):+.0f}..{max(paired):+.0f} "
              f"| {overhead / (base * 1e6) * 100:+.1f} % |")


if __name__ == "__main__":
    main()
