"""Vision example: a small ResNet on scikit-learn's digits, with or without a Composer recipe.

    python examples/vision.py --recipe mild
    python examples/vision.py --recipe none --max-epochs 3
    python examples/vision.py --recipe medium --accelerator gpu --devices 2 --strategy ddp --precision bf16-mixed

The recipes are :mod:`composer_bridge.recipes`' Mosaic ResNet recipes with three changes for
8x8 images and a run this short (a few hundred optimizer steps instead of ImageNet's tens of
thousands), each measured on this example:

- EMA's half-life follows the run length (its ``"auto"`` default: 5% of the run, here 14
  steps) instead of ImageNet's fixed ``100ba``, which would average over a third of the run; it
  updates every ``3ba``, keeping the recipe's ratio of update interval to half-life (1/5);
- ProgressiveResizing starts at 6x6 (``initial_scale=0.75``) instead of half size: a network
  trained on 4x4 digits scores at chance on 8x8 ones until it has trained at full size for a
  while, which cost more time than the smaller images saved;
- ProgressiveResizing grows the images in 2-pixel steps (``size_increment=2``), not 4.

:func:`train` is also what ``benchmarks/time_to_accuracy.py`` runs.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only

from composer_bridge import AlgorithmEngineCallback, ComposerClassifier, recipes
from composer_bridge.data import digits_loaders
from composer_bridge.models import ResNetCNN

RECIPES = ("none", "mild", "medium", "hot")

#: What the digits runs change in the published ImageNet recipes (see the module docstring).
DIGITS_OVERRIDES: dict[str, Any] = {
    "ema": {"half_life": "auto", "update_interval": "3ba"},
    "progressive_resizing": {"initial_scale": 0.75, "size_increment": 2},
    # The digits are normalised (zero mean, unit variance); RandAugment works on [0, 1] pixels, so it
    # is told the normalisation (the training split's mean and std in [0, 1] units) to undo and redo.
    "randaugment": {"mean": 0.3056, "std": 0.3761},
}


def recipe_algorithms(recipe: str) -> list[Any]:
    """The algorithms of ``recipe`` (``"none"`` → no algorithm), adjusted for the digits runs."""
    if recipe == "none":
        return []
    if recipe not in RECIPES:
        raise ValueError(f"recipe={recipe!r}: choose one of {RECIPES}.")
    # missing="drop": should this version of the library lack one of the recipe's algorithms,
    # run without it (a MissingAlgorithmWarning names it) rather than not at all.
    return recipes.vision(recipe, missing="drop", **DIGITS_OVERRIDES)


class Point(NamedTuple):
    """One validation during ``fit``."""

    epoch: int
    step: int
    seconds: float  #: training wall time so far (validation left out)
    cpu_seconds: float  #: CPU time of this process while training (validation left out)
    acc: float  #: ``val/acc``


class AccuracyTimeline(L.Callback):
    """Records, at every validation during ``fit``, the training time so far and ``val/acc``.

    Training time is wall time since the start of training with the validation runs left out,
    so the number compares how fast each run *trains*, not how often it is measured. The CPU
    time of the process is recorded alongside: on a machine shared with other jobs it varies
    less than wall time.
    """

    def __init__(self) -> None:
        self.points: list[Point] = []
        self.train_seconds = 0.0
        self.train_cpu_seconds = 0.0
        self._since: tuple[float, float] | None = None

    def _sync(self, trainer: L.Trainer) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def _resume(self) -> None:
        self._since = (time.perf_counter(), time.process_time())

    def _pause(self, trainer: L.Trainer) -> None:
        if self._since is not None:
            self._sync(trainer)
            self.train_seconds += time.perf_counter() - self._since[0]
            self.train_cpu_seconds += time.process_time() - self._since[1]
            self._since = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(trainer)
        self._resume()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        acc = trainer.callback_metrics.get("val/acc")
        if acc is not None:
            self.points.append(Point(trainer.current_epoch + 1, trainer.global_step, self.train_seconds,
                                     self.train_cpu_seconds, float(acc)))
        self._resume()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause(trainer)


@dataclass
class RunResult:
    """What one training run measured."""

    recipe: str
    seed: int
    final_acc: float
    train_seconds: float
    train_cpu_seconds: float
    wall_seconds: float
    points: list[Point] = field(default_factory=list)
    callback: AlgorithmEngineCallback | None = None

    def time_to_reach(self, accuracy: float, cpu: bool = False) -> float | None:
        """Training seconds (CPU seconds with ``cpu``) at the first validation with accuracy ≥ ``accuracy``."""
        for point in self.points:
            if point.acc >= accuracy - 1e-9:
                return point.cpu_seconds if cpu else point.seconds
        return None


def make_module(max_epochs: int, steps_per_epoch: int, lr: float = 0.1) -> ComposerClassifier:
    """ResNetCNN in a ComposerClassifier: SGD with Nesterov momentum, one-cycle learning rate."""
    total_steps = max(1, max_epochs * steps_per_epoch)
    return ComposerClassifier(
        ResNetCNN(num_classes=10, in_channels=1),
        num_classes=10,
        optimizer=lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4),
        scheduler=lambda opt: torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=lr, total_steps=total_steps, pct_start=0.15),
    )


def train(
    recipe: str = "none",
    *,
    seed: int = 0,
    max_epochs: int = 12,
    max_steps: int = -1,
    batch_size: int = 64,
    algorithms: list[Any] | None = None,
    accelerator: str = "auto",
    devices: Any = "auto",
    strategy: Any = "auto",
    precision: Any = None,
    logger: Any = False,
    enable_progress_bar: bool = False,
    limit_val_batches: Any = None,
) -> RunResult:
    """Train the digits ResNet with ``recipe`` (or explicit ``algorithms``) and return what it measured."""
    L.seed_everything(seed, workers=True, verbose=False)
    train_loader, val_loader = digits_loaders(batch_size=batch_size, seed=seed)
    if algorithms is None:
        algorithms = recipe_algorithms(recipe)
    epochs_for_schedule = max_epochs if max_steps < 0 else max(1, -(-max_steps // len(train_loader)))
    model = make_module(epochs_for_schedule, len(train_loader))
    timeline = AccuracyTimeline()
    bridge = AlgorithmEngineCallback(algorithms, seed=seed) if algorithms else None
    trainer = L.Trainer(
        max_epochs=max_epochs,
        max_steps=max_steps,
        accelerator=accelerator,
        devices=devices,
        strategy=strategy,
        precision=precision,
        logger=logger,
        callbacks=[timeline] + ([bridge] if bridge is not None else []),
        enable_checkpointing=False,
        enable_progress_bar=enable_progress_bar,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=limit_val_batches,
        # A run shorter than an epoch (tests, --max-steps) still validates once, at its end.
        val_check_interval=max_steps if 0 < max_steps < len(train_loader) else None,
    )
    started = time.perf_counter()
    trainer.fit(model, train_loader, val_loader)
    wall = time.perf_counter() - started
    final = timeline.points[-1].acc if timeline.points else float("nan")
    return RunResult(recipe, seed, final, timeline.train_seconds, timeline.train_cpu_seconds, wall,
                     timeline.points, bridge)


def main(argv: list[str] | None = None) -> RunResult:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", choices=RECIPES, default="mild")
    parser.add_argument("--accelerator", default="auto", help="cpu, gpu, tpu, mps or auto (default)")
    parser.add_argument("--devices", default="auto", help="number of devices, a list, or auto")
    parser.add_argument("--strategy", default="auto", help="auto, ddp, ddp_spawn, fsdp, ...")
    parser.add_argument("--precision", default=None, help="32-true, bf16-mixed, 16-mixed, ...")
    parser.add_argument("--max-epochs", type=int, default=12)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    devices: Any = int(args.devices) if str(args.devices).isdigit() else args.devices
    result = train(
        args.recipe, seed=args.seed, max_epochs=args.max_epochs, max_steps=args.max_steps,
        batch_size=args.batch_size, accelerator=args.accelerator, devices=devices, strategy=args.strategy,
        precision=args.precision, enable_progress_bar=True,
    )
    if rank_zero_only.rank != 0:  # with --strategy ddp, every process gets here; one report is enough
        return result
    print(f"recipe={args.recipe}: val/acc {result.final_acc:.4f} after {result.train_seconds:.1f} s of training")
    if result.callback is not None:
        print(result.callback.plan())
        print(result.callback.cost_report())
    return result


if __name__ == "__main__":
    main()
