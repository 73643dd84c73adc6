"""The checkpoint points Lightning offers, as runs to resume from, and what an exact resumption compares.

Shared by the single-process matrix (``test_checkpoint_points.py``) and its DDP cross-section
(``test_checkpoint_points_ddp.py``, which runs this module inside both ranks).

The Lightning package is reached only through :func:`lightning_api`, so the tests can be run
against another package (``pytorch_lightning``) by swapping what it returns.

A *point* is one way a checkpoint comes to exist: a ``ModelCheckpoint`` setting, a
``trainer.save_checkpoint`` call, ``OnExceptionCheckpoint``. Every point is a :class:`Point`:
how the run that writes it is configured (``writer``), which file to resume from, and which
run is the uninterrupted one. Runs are 3 epochs of 3 batches (9 optimizer steps), so step 3 is
an epoch's last batch and step 5 is in the middle of epoch 1.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils.data import DataLoader

import composer_bridge.algorithms as library
from composer_bridge import Algorithm, AlgorithmEngineCallback
from helpers.support import ResumableLoader, image_dataset, tiny_classifier

STEPS_PER_EPOCH = 3
EPOCHS = 3
BATCH = 8
SEED = 3


def lightning_api(package: str = "lightning") -> SimpleNamespace:
    """The Lightning classes the matrix uses, all from one package: ``"lightning"`` or ``"pytorch_lightning"``."""
    import importlib

    if package not in ("lightning", "pytorch_lightning"):
        raise ValueError(f"lightning_api({package!r}): expected 'lightning' or 'pytorch_lightning'.")
    root = importlib.import_module("lightning.pytorch" if package == "lightning" else "pytorch_lightning")
    callbacks = importlib.import_module(f"{root.__name__}.callbacks")
    return SimpleNamespace(Trainer=root.Trainer, Callback=root.Callback, ModelCheckpoint=callbacks.ModelCheckpoint,
                           OnExceptionCheckpoint=callbacks.OnExceptionCheckpoint)


class Interrupted(RuntimeError):
    """The crash :func:`make_callbacks`' ``RaiseAtStep`` simulates."""


class Listen(Algorithm):
    """Hears every event and does nothing: the bridge runs all its hooks, and draws nothing."""

    def match(self, event: Any, state: Any) -> bool:
        return True

    def apply(self, event: Any, state: Any, logger: Any) -> None:
        return None


#: every algorithm of the library that draws random numbers while training this model; each runs alone
RANDOM_ALGORITHMS: dict[str, Callable[[], Algorithm]] = {
    "CutOut": lambda: library.CutOut(length=0.25),
    "MixUp": lambda: library.MixUp(alpha=0.2),
    "CutMix": lambda: library.CutMix(alpha=1.0),
    "ColOut": lambda: library.ColOut(p_row=0.2, p_col=0.2),
    "SelectiveBackprop": lambda: library.SelectiveBackprop(start=0.0, end=1.0, keep=0.5),
    "RandAugment": lambda: library.RandAugment(),
    "AugMix": lambda: library.AugMix(),
    "ProgressiveResizing": lambda: library.ProgressiveResizing(
        mode="crop", initial_scale=0.5, delay_fraction=0.0, finetune_fraction=0.2),
    "StochasticDepth": lambda: library.StochasticDepth(drop_rate=0.5),
    "GyroDropout": lambda: library.GyroDropout(sigma=8, tau=2),  # on a model with an nn.Dropout (see fit)
}
#: ``"plain"``: no bridge at all (Lightning alone, the oracle); ``"listen"``: the bridge with no random work
ALGORITHMS: dict[str, Callable[[], Algorithm] | None] = {"plain": None, "listen": Listen, **RANDOM_ALGORITHMS}


def make_callbacks(api: SimpleNamespace) -> SimpleNamespace:
    """The helper callbacks, built on ``api.Callback``."""

    class RaiseAtStep(api.Callback):  # type: ignore[misc,name-defined]
        """A crash: raises before the optimizer step ``step + 1`` (so ``step`` steps are done)."""

        def __init__(self, step: int) -> None:
            self.step = step

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step == self.step:
                raise Interrupted(f"interrupted at step {self.step}")

    class StopAfterEpoch(api.Callback):  # type: ignore[misc,name-defined]
        """Stops the fit cleanly at the end of epoch ``epoch``."""

        def __init__(self, epoch: int) -> None:
            self.epoch = epoch

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if trainer.current_epoch == self.epoch:
                trainer.should_stop = True

    class SaveAtStep(api.Callback):  # type: ignore[misc,name-defined]
        """``trainer.save_checkpoint`` from ``on_train_batch_end`` after optimizer step ``step``."""

        def __init__(self, step: int, path: Path) -> None:
            self.step, self.path = step, path

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step == self.step:
                trainer.save_checkpoint(self.path)

    return SimpleNamespace(RaiseAtStep=RaiseAtStep, StopAfterEpoch=StopAfterEpoch, SaveAtStep=SaveAtStep)


@dataclass(frozen=True)
class Point:
    """One checkpoint point: the writing run's setup, the file to resume from, and the reference run.

    ``callbacks(api, helpers, directory)`` gives the writing run's extra callbacks; ``interrupts``
    says the writing run is cut short (it is then not the uninterrupted run: that one runs with
    the same Trainer settings and no extra callbacks); ``after_fit`` saves with
    ``trainer.save_checkpoint`` once the writing run's ``fit`` returned; ``before_bridge`` lists the
    extra callbacks before the bridge (Lightning calls callbacks in list order, checkpoint callbacks last).
    """

    name: str
    callbacks: Callable[[SimpleNamespace, SimpleNamespace, Path], list[Any]]
    checkpoint: str
    validation: bool = False
    resumable_loader: bool = True
    interrupts: bool = False
    after_fit: bool = False
    before_bridge: bool = False
    epoch_scheduler: bool = False
    trainer: dict[str, Any] = field(default_factory=dict)


def _mc(api: SimpleNamespace, directory: Path, **kwargs: Any) -> Any:
    return api.ModelCheckpoint(dirpath=directory, filename="{step}", save_top_k=-1, **kwargs)


POINTS: dict[str, Point] = {p.name: p for p in [
    # on_train_batch_end of epoch 0's last batch, before the epoch's end
    Point("every_n_train_steps, epoch's last batch",
          lambda api, h, d: [_mc(api, d, every_n_train_steps=STEPS_PER_EPOCH)], "step=3.ckpt"),
    Point("every_n_train_steps, epoch's last batch, with validation",
          lambda api, h, d: [_mc(api, d, every_n_train_steps=STEPS_PER_EPOCH)], "step=3.ckpt", validation=True),
    Point("every_n_train_steps, epoch's last batch, gradient accumulation",
          lambda api, h, d: [_mc(api, d, every_n_train_steps=2)], "step=2.ckpt", trainer={"accumulate_grad_batches": 2}),
    Point("every_n_train_steps, epoch's last batch, epoch-interval LR scheduler",
          lambda api, h, d: [_mc(api, d, every_n_train_steps=STEPS_PER_EPOCH)], "step=3.ckpt", epoch_scheduler=True),
    Point("every_n_epochs, no validation, epoch-interval LR scheduler",
          lambda api, h, d: [_mc(api, d, every_n_epochs=1)], "step=3.ckpt", epoch_scheduler=True),
    Point("every_n_train_steps, mid-epoch, resumable loader",
          lambda api, h, d: [_mc(api, d, every_n_train_steps=5)], "step=5.ckpt"),
    Point("every_n_train_steps, mid-epoch, plain DataLoader",
          lambda api, h, d: [_mc(api, d, every_n_train_steps=5)], "step=5.ckpt", resumable_loader=False),
    # on_train_epoch_end (no validation: save_on_train_epoch_end defaults to True)
    Point("every_n_epochs, no validation",
          lambda api, h, d: [_mc(api, d, every_n_epochs=1)], "step=3.ckpt"),
    # on_validation_end, after the epoch's last batch and before on_train_epoch_end
    Point("every_n_epochs, validation (save_on_train_epoch_end=False)",
          lambda api, h, d: [_mc(api, d, every_n_epochs=1, save_on_train_epoch_end=False)], "step=3.ckpt",
          validation=True),
    Point("every_n_epochs, validation, save_on_train_epoch_end=True",
          lambda api, h, d: [_mc(api, d, every_n_epochs=1, save_on_train_epoch_end=True)], "step=3.ckpt",
          validation=True),
    # on_train_batch_end at every step once the (tiny) interval passed; resumed from the epoch's last batch
    Point("train_time_interval",
          lambda api, h, d: [_mc(api, d, train_time_interval=datetime.timedelta(microseconds=1))], "step=3.ckpt"),
    Point("trainer.save_checkpoint from on_train_batch_end",
          lambda api, h, d: [h.SaveAtStep(STEPS_PER_EPOCH, d / "step=3.ckpt")], "step=3.ckpt"),
    # the same, from a callback listed before the bridge: its on_train_batch_end runs before the bridge's
    Point("trainer.save_checkpoint from on_train_batch_end, callback listed first",
          lambda api, h, d: [h.SaveAtStep(STEPS_PER_EPOCH, d / "step=3.ckpt")], "step=3.ckpt", before_bridge=True),
    Point("trainer.save_checkpoint after fit (stopped at an epoch's end)",
          lambda api, h, d: [h.StopAfterEpoch(0)], "after_fit.ckpt", interrupts=True, after_fit=True),
    # an exception before step 5: OnExceptionCheckpoint saves at step 4, mid-epoch 1
    Point("OnExceptionCheckpoint after an interruption",
          lambda api, h, d: [api.OnExceptionCheckpoint(dirpath=d, filename="on_exception"), h.RaiseAtStep(4)],
          "on_exception.ckpt", interrupts=True),
    # the same interruption; save_last's last.ckpt is the step-3 one (epoch 0's last batch)
    Point("save_last after an interruption",
          lambda api, h, d: [_mc(api, d, every_n_train_steps=STEPS_PER_EPOCH, save_last=True), h.RaiseAtStep(4)],
          "last.ckpt", interrupts=True),
]}


@dataclass
class Outcome:
    """What a finished run leaves: weights, optimizer state, the bridge's state (``None`` without it)."""

    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    bridge: dict[str, Any] | None


#: Timestamp fields that are wall-clock: never equal between two runs
_NOT_COMPARED = {"total_wct", "iteration_wct", "epoch_wct", "batch_wct"}
#: Timestamp fields that count ``fit`` calls: a checkpoint written after ``fit`` returned holds that
#: fit's end (ITERATION_END moved the iteration on), and the resumed ``fit`` is another iteration
_PER_FIT = {"iteration", "epoch_in_iteration", "token_in_iteration"}


def _bridge_state(callback: AlgorithmEngineCallback) -> dict[str, Any]:
    saved = callback.state_dict()
    saved["timestamp"] = {k: v for k, v in saved["timestamp"].items() if k not in _NOT_COMPARED}
    return saved


def fit(api: SimpleNamespace, algorithm: str, point: Point, directory: Path, *, write: bool = False,
        resume_from: Path | None = None, trainer: dict[str, Any] | None = None) -> Outcome:
    """One fit of the matrix's model: the uninterrupted run, the run writing ``point``'s checkpoint, or the resumed one."""
    helpers = make_callbacks(api)
    make = ALGORITHMS[algorithm]
    bridge = AlgorithmEngineCallback([make()], seed=SEED) if make is not None else None
    extra = point.callbacks(api, helpers, directory) if write else []
    data = image_dataset(n=STEPS_PER_EPOCH * BATCH, size=(8, 8))
    train = ResumableLoader(data, BATCH) if point.resumable_loader else DataLoader(data, batch_size=BATCH)
    val = DataLoader(image_dataset(n=BATCH, size=(8, 8), seed=1), batch_size=BATCH) if point.validation else None
    options: dict[str, Any] = dict(
        # COMPOSER_BRIDGE_TEST_ACCELERATOR=gpu runs the matrix on a GPU (as support.quiet_trainer does)
        accelerator=os.environ.get("COMPOSER_BRIDGE_TEST_ACCELERATOR", "cpu"), devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, max_epochs=EPOCHS, enable_checkpointing=any(
            isinstance(c, (api.ModelCheckpoint, api.OnExceptionCheckpoint)) for c in extra),
        limit_val_batches=1 if point.validation else 0,
    )
    options.update(point.trainer)
    options.update(trainer or {})
    model = tiny_classifier()
    if algorithm == "GyroDropout":  # it replaces nn.Dropout layers; the CNN has none
        model.module.fc = torch.nn.Sequential(torch.nn.Dropout(0.5), model.module.fc)
    if point.epoch_scheduler:
        model.configure_optimizers = lambda: _halve_lr_every_epoch(model)  # type: ignore[method-assign]
    listed = [c for c in (bridge, *extra) if c is not None]
    if point.before_bridge and bridge is not None:
        listed = [*extra, bridge]
    run = api.Trainer(callbacks=listed, **options)
    try:
        run.fit(model, train, val, ckpt_path=resume_from)
    except Interrupted:
        if not (write and point.interrupts):
            raise
    if write and point.after_fit:
        run.save_checkpoint(directory / point.checkpoint)
    return Outcome(
        weights={k: v.detach().clone() for k, v in model.state_dict().items()},
        optimizer=run.optimizers[0].state_dict(),
        bridge=_bridge_state(bridge) if bridge is not None else None,
    )


def _halve_lr_every_epoch(model: torch.nn.Module) -> dict[str, Any]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


def resume(api: SimpleNamespace, algorithm: str, point: Point, directory: Path,
           trainer: dict[str, Any] | None = None) -> tuple[Outcome, Outcome]:
    """``(uninterrupted run, run resumed from point's checkpoint)`` for ``algorithm``; ``trainer``: extra Trainer settings."""
    written = fit(api, algorithm, point, directory, write=True, trainer=trainer)
    full = fit(api, algorithm, point, directory, trainer=trainer) if point.interrupts else written
    checkpoint = directory / point.checkpoint
    assert checkpoint.exists(), f"{point.name} wrote no {point.checkpoint}: {sorted(p.name for p in directory.iterdir())}"
    resumed = fit(api, algorithm, point, directory, resume_from=checkpoint, trainer=trainer)
    if point.after_fit:
        for outcome in (full, resumed):
            if outcome.bridge is not None:
                outcome.bridge["timestamp"] = {k: v for k, v in outcome.bridge["timestamp"].items() if k not in _PER_FIT}
    return full, resumed


def differences(a: Outcome, b: Outcome) -> list[str]:
    """What differs between two runs' outcomes (empty: bit-identical weights, optimizer and bridge state)."""
    found = [f"weight {k}" for k in a.weights if not torch.equal(a.weights[k], b.weights[k])]
    found += _state_differences(a.optimizer, b.optimizer, "optimizer")
    found += _state_differences(a.bridge, b.bridge, "bridge")
    return found


def _state_differences(a: Any, b: Any, where: str) -> list[str]:
    if isinstance(a, torch.Tensor):
        return [] if isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b) else [where]
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            return [f"{where} (keys)"]
        return [d for k in a for d in _state_differences(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return [f"{where} (length)"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _state_differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]
