"""Preempted runs: a fit killed with SIGKILL at chosen steps, resumed from ``last.ckpt`` each time.

Shared by ``tests/lightning/resumption/test_preemption.py`` (kill chains, Lightning-AI/pytorch-lightning#19403,
the resume-time warning) and ``tests/lightning/resumption/test_preemption_slurm.py``.

Each *segment* of a chain runs in a forked child process (the parent's imports are reused, so a
segment costs a fit, not an interpreter start). A callback kills the child with ``SIGKILL`` from
inside its own run, in ``on_train_batch_start`` once ``global_step`` reaches the kill point: nothing
after it runs (no ``on_exception``, no teardown, no checkpoint on the way out), as when a spot
instance vanishes, and the point repeats exactly from run to run. The next segment resumes from
whatever ``last.ckpt`` Lightning had written. The last segment runs to the end and saves its
:class:`~helpers.resume_points.Outcome`.

The model is a plain ``LightningModule`` (the loss computed in ``training_step``), the data a
:class:`~helpers.support.ResumableLoader` (Lightning resumes it mid-epoch), 4 epochs of 3 batches.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from composer_bridge import Algorithm, AlgorithmEngineCallback
from composer_bridge.algorithms import EMA, CutOut, GradientClipping, LabelSmoothing, LayerFreezing, MixUp
from helpers.resume_points import Listen, Outcome, _bridge_state
from helpers.support import L, ResumableLoader, image_dataset

STEPS_PER_EPOCH = 3
EPOCHS = 4
BATCH = 8
SEED = 5


def six_algorithms() -> list[Algorithm]:
    """The recipe a preempted user runs: loss, data, weight and gradient algorithms together."""
    return [LabelSmoothing(0.1), MixUp(alpha=0.2), CutOut(length=0.25), EMA(half_life="2ba"),
            GradientClipping("norm", 1.0), LayerFreezing(freeze_start=0.3, freeze_level=0.5)]


#: ``"plain"``: Lightning alone (the oracle); ``"listen"``: the bridge hearing every event, drawing nothing
BRIDGES: dict[str, Callable[[], list[Algorithm]] | None] = {
    "plain": None, "listen": lambda: [Listen()], "six": six_algorithms,
}


class PlainClassifier(L.LightningModule):
    """A classifier written the usual Lightning way: ``F.cross_entropy`` inside ``training_step``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
            torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 64, 4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


@dataclass(frozen=True)
class Cadence:
    """One way ``ModelCheckpoint(save_last=True)`` keeps ``last.ckpt`` up to date."""

    name: str
    checkpoint: dict[str, Any]
    validation: bool = False


CADENCES: dict[str, Cadence] = {c.name: c for c in [
    # on_train_batch_end of each epoch's last batch (3 steps an epoch)
    Cadence("every_n_train_steps at an epoch's last batch", {"every_n_train_steps": STEPS_PER_EPOCH}),
    # on_train_batch_end, mid-epoch and at epoch ends (2 does not divide 3)
    Cadence("every_n_train_steps mid-epoch", {"every_n_train_steps": 2}),
    # on_train_epoch_end, no validation
    Cadence("end of epoch (save_on_train_epoch_end=True)", {"every_n_epochs": 1, "save_on_train_epoch_end": True}),
    # on_validation_end, after the epoch's last batch
    Cadence("after validation (save_on_train_epoch_end=False)",
            {"every_n_epochs": 1, "save_on_train_epoch_end": False}, validation=True),
    # on_train_batch_end once the (tiny) interval passed: every step
    Cadence("train_time_interval", {"train_time_interval": datetime.timedelta(microseconds=1)}),
]}


@dataclass
class Chain:
    """What a chain of segments left: each segment's exit code, every batch start seen, the outcome."""

    exit_codes: list[int]
    seen: list[tuple[int, int, int]]  # (current_epoch, batch_idx, global_step) at every on_train_batch_start
    outcome: Outcome
    checkpoints: list[str] = field(default_factory=list)


class KillAt(L.Callback):
    """Records every batch start; ``SIGKILL``s its own process before optimizer step ``step + 1``."""

    def __init__(self, step: int | None, record: Path) -> None:
        self.step, self.record = step, record

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        with self.record.open("a") as out:
            out.write(f"{trainer.current_epoch},{batch_idx},{trainer.global_step}\n")
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def segment(bridge: str, cadence: Cadence, directory: Path, kill_at: int | None, resume: Path | None,
            trainer_options: dict[str, Any] | None = None, extra: list[Any] | None = None,
            loader: str = "resumable") -> Outcome:
    """One process's part of a chain: fit (resumed from ``resume``), killed at ``kill_at`` if given.

    ``trainer_options`` adds to (or replaces) the Trainer's settings; ``extra`` callbacks are listed
    after the bridge; ``loader``: ``"resumable"`` (:class:`~helpers.support.ResumableLoader`, in order) or
    torchdata's ``StatefulDataLoader(shuffle=True)``: ``"stateful"`` (as users write it, drawing its
    order from the global generator) or ``"stateful, own generator"`` (``generator=`` a seeded one).
    """
    make = BRIDGES[bridge]
    callback = AlgorithmEngineCallback(make(), seed=SEED) if make is not None else None
    checkpoints = L.callbacks.ModelCheckpoint(dirpath=directory, filename="{epoch}-{step}", save_top_k=-1,
                                              save_last=True, **cadence.checkpoint)
    listed = [c for c in (callback, KillAt(kill_at, directory / "seen.txt"), *(extra or []), checkpoints) if c is not None]
    options: dict[str, Any] = dict(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, max_epochs=EPOCHS, limit_val_batches=1 if cadence.validation else 0,
        callbacks=listed,
    )
    options.update(trainer_options or {})
    trainer = L.Trainer(**options)
    model = PlainClassifier()
    data = image_dataset(n=STEPS_PER_EPOCH * BATCH, size=(8, 8))
    if loader == "resumable":
        train: Any = ResumableLoader(data, BATCH)
    else:
        from torchdata.stateful_dataloader import StatefulDataLoader

        generator = torch.Generator().manual_seed(SEED) if loader == "stateful, own generator" else None
        train = StatefulDataLoader(data, batch_size=BATCH, shuffle=True, generator=generator)
    val = DataLoader(image_dataset(n=BATCH, size=(8, 8), seed=1), batch_size=BATCH) if cadence.validation else None
    trainer.fit(model, train, val, ckpt_path=resume)
    return Outcome(
        weights={k: v.detach().clone() for k, v in model.state_dict().items()},
        optimizer=trainer.optimizers[0].state_dict(),
        bridge=_bridge_state(callback) if callback is not None else None,
    )


def _child(bridge: str, cadence: Cadence, directory: Path, kill_at: int | None, resume: Path | None,
           loader: str) -> None:
    torch.manual_seed(SEED)  # the process's global generator: what a shuffling loader without its own draws from
    outcome = segment(bridge, cadence, directory, kill_at, resume, loader=loader)
    torch.save(outcome, directory / "outcome.pt")


def run_chain(bridge: str, cadence: Cadence, directory: Path, kills: list[int], loader: str = "resumable") -> Chain:
    """The run killed at each step of ``kills`` in turn, resumed from ``last.ckpt`` after each kill.

    ``kills=[]`` is the uninterrupted run (in a child process too, so both are run the same way).
    """
    directory.mkdir(parents=True, exist_ok=True)
    context = multiprocessing.get_context("fork")
    exit_codes, resume = [], None
    for kill_at in [*kills, None]:
        child = context.Process(target=_child, args=(bridge, cadence, directory, kill_at, resume, loader))
        child.start()
        child.join(timeout=300)
        exit_codes.append(child.exitcode)
        resume = directory / "last.ckpt"
        assert kill_at is None or resume.exists(), f"no last.ckpt before the kill at step {kill_at}"
    assert exit_codes == [-signal.SIGKILL] * len(kills) + [0], f"exit codes {exit_codes} (killed segments: -9)"
    seen = [tuple(int(v) for v in line.split(",")) for line in (directory / "seen.txt").read_text().split()]
    outcome = torch.load(directory / "outcome.pt", weights_only=False)
    return Chain(exit_codes, seen, outcome, sorted(p.name for p in directory.glob("*.ckpt")))  # type: ignore[arg-type]


def uninterrupted_starts() -> list[tuple[int, int, int]]:
    """``(epoch, batch_idx, global_step)`` at every batch start of the uninterrupted run."""
    return [(s // STEPS_PER_EPOCH, s % STEPS_PER_EPOCH, s) for s in range(STEPS_PER_EPOCH * EPOCHS)]
