"""Per-step cost of the loss algorithms on a plain LightningModule against the ComposerModule path.

The same network (a small ResNet-style CNN, 1x16x16 images, batch 32, 10 classes) trains with
``LabelSmoothing(0.1)`` and ``MixUp(0.2)`` in three arms, side by side in one run:

- ``composer``: ``ComposerClassifier(net)``: the bridge calls ``forward(batch)`` and ``loss``;
- ``composer-again``: the same again, a control: its ratio to ``composer`` is the noise floor of
  the comparison (two identical arms differ only by when they ran);
- ``plain``: a LightningModule written the usual way (``self.criterion(self(x), y)`` in
  ``training_step``): the bridge watches the criterion's ``F.cross_entropy`` call
  (``composer_bridge/lightning/plain_loss/``).

Every round runs each arm once for ``--steps`` steps, in a new seeded random order; ``--rounds``
rounds are run. A step is timed in the training thread's CPU time (``time.thread_time_ns``) from
``on_train_batch_start`` to ``on_train_batch_end`` (forward, loss, backward, optimizer step: the
part where the two paths differ), after ``--warmup`` steps. Each arm-run is summarised by the
lower decile of its steps (an undisturbed step: other tenants of a shared machine only ever add
time) and by the mean; the ratio to the ``composer`` run of the same round is reported as the
median over rounds with the lowest and highest round.

Usage::

    .venv/bin/python benchmarks/plain_loss_overhead.py             # 200 steps x 9 rounds, ~2 min on 2 cores
    .venv/bin/python benchmarks/plain_loss_overhead.py --net linear --steps 300   # the bridge's own cost in us
    .venv/bin/python benchmarks/plain_loss_overhead.py --quick     # smoke run
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import AlgorithmEngineCallback, ComposerClassifier
from composer_bridge.algorithms import LabelSmoothing, MixUp
from composer_bridge.models import ResNetCNN

CLASSES = 10


NETWORK = {"net": "cnn"}  # --net; "linear" makes the step so cheap that the bridge's own work dominates it


def network() -> torch.nn.Module:
    torch.manual_seed(0)
    if NETWORK["net"] == "linear":
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16 * 16, CLASSES))
    return ResNetCNN(num_classes=CLASSES, in_channels=1, widths=(16, 32), blocks_per_stage=1)


class Plain(L.LightningModule):
    """A classifier written the usual Lightning way."""

    def __init__(self) -> None:
        super().__init__()
        self.net = network()
        self.criterion = torch.nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.criterion(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Composer(ComposerClassifier):
    def __init__(self) -> None:
        super().__init__(network(), CLASSES, optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))

    def update_train_metrics(self, outputs: Any, batch: Any, loss: torch.Tensor) -> None:
        pass  # the plain arm computes no metric either


ARMS: dict[str, Callable[[], L.LightningModule]] = {"composer": Composer, "composer-again": Composer, "plain": Plain}


class StepTimer(L.Callback):
    def __init__(self) -> None:
        self.times: list[int] = []
        self._start = 0

    def on_train_batch_start(self, *args: Any) -> None:
        self._start = time.thread_time_ns()

    def on_train_batch_end(self, *args: Any) -> None:
        self.times.append(time.thread_time_ns() - self._start)


def loader(steps: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, CLASSES, (steps * 32,), generator=g)
    x = torch.randn(steps * 32, 1, 16, 16, generator=g) + y.view(-1, 1, 1, 1) / CLASSES
    return DataLoader(TensorDataset(x, y), batch_size=32)


def run_arm(arm: str, steps: int, warmup: int) -> tuple[float, float, L.LightningModule]:
    """(lower decile, mean) of the step CPU times in milliseconds, and the trained module."""
    timer = StepTimer()
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[AlgorithmEngineCallback([LabelSmoothing(0.1), MixUp(0.2)], seed=0), timer])
    model = ARMS[arm]()
    trainer.fit(model, loader(steps))
    times = sorted(t / 1e6 for t in timer.times[warmup:])
    return times[len(times) // 10], statistics.fmean(times), model


def patch_cost_us(repeats: int = 20000) -> float:
    """CPU microseconds one step spends entering and leaving the scoped patch and dispatching one call through it."""
    import torch.nn.functional as F

    from composer_bridge.lightning.plain_loss import torch_functions

    logits, targets = torch.zeros(2, 3), torch.tensor([0, 1])

    def through(name: str, original: Any, input: Any, target: Any, args: Any, kwargs: Any) -> Any:
        return original(input, target, *args, **kwargs)

    def timed(patched: bool) -> float:
        start = time.thread_time_ns()
        for _ in range(repeats):
            if patched:
                with torch_functions.intercept(through):
                    F.cross_entropy(logits, targets)
            else:
                F.cross_entropy(logits, targets)
        return (time.thread_time_ns() - start) / repeats / 1e3

    return min(timed(True) for _ in range(3)) - min(timed(False) for _ in range(3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--net", choices=["cnn", "linear"], default="cnn",
                        help="cnn: the small ResNet (about 12 ms a step on one CPU thread); linear: one Linear layer, "
                        "whose step is mostly the bridge's and Lightning's own work (the difference in us is the cost)")
    parser.add_argument("--quick", action="store_true", help="20 steps x 2 rounds")
    args = parser.parse_args()
    NETWORK["net"] = args.net
    if args.quick:
        args.steps, args.rounds, args.warmup = 20, 2, 2
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    order = random.Random(0)
    results: dict[str, list[tuple[float, float]]] = {arm: [] for arm in ARMS}
    for _ in range(args.rounds):
        arms = list(ARMS)
        order.shuffle(arms)
        for arm in arms:
            results[arm].append(run_arm(arm, args.steps, args.warmup)[:2])
    print(f"torch {torch.__version__}, lightning {L.__version__}, --net {args.net}, {args.steps} steps x "
          f"{args.rounds} rounds, 1 torch thread; step CPU time in ms")
    print(f"the scoped patch alone (enter, one dispatched call, leave): {patch_cost_us():.1f} us per step")
    base = results["composer"]
    for arm, runs in results.items():
        for index, summary in enumerate(("decile", "mean")):
            values = [run[index] for run in runs]
            ratios = sorted(run[index] / ref[index] for run, ref in zip(runs, base, strict=True))
            differences = sorted((run[index] - ref[index]) * 1e3 for run, ref in zip(runs, base, strict=True))
            print(f"{arm:15s} {summary:6s} median {statistics.median(values):7.3f} ms   ratio to composer: median "
                  f"{statistics.median(ratios):.4f}x (rounds {ratios[0]:.4f}-{ratios[-1]:.4f}), difference median "
                  f"{statistics.median(differences):+.0f} us")


if __name__ == "__main__":
    main()
