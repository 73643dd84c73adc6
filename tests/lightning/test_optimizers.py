"""The hand-over of the user's optimizers and schedulers (lightning/optimizers.py) and the Lightning reaches it uses."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.support import ComposerClassifier, L, image_loader, quiet_trainer, tiny_classifier

from composer_bridge import Algorithm, AlgorithmEngineCallback, Event
from composer_bridge.lightning import _compat
from composer_bridge.lightning.optimizers import changed
from composer_bridge.models import ResNetCNN


class StepCounter(L.Callback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.lrs.append(optimizer.param_groups[0]["lr"])


def with_scheduler() -> Any:
    """The vision classifier with SGD(lr=0.1) and a StepLR halving it every step."""
    torch.manual_seed(0)
    return ComposerClassifier(ResNetCNN(num_classes=4, in_channels=1, widths=(8, 16), blocks_per_stage=1), num_classes=4,
                              optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                              scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5))


def test_set_strategy_schedulers_drops_a_scheduler_lightning_then_neither_steps_nor_saves(tmp_path: Path) -> None:
    class Drop(L.Callback):
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            _compat.set_strategy_schedulers(trainer, [])

    counter = StepCounter()
    trainer = quiet_trainer(max_steps=3, max_epochs=-1, callbacks=[Drop(), counter])
    trainer.fit(with_scheduler(), image_loader(n=48))
    assert counter.lrs == [0.1, 0.1, 0.1], "Lightning stepped a scheduler set_strategy_schedulers dropped"
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    assert torch.load(tmp_path / "c.ckpt", weights_only=True)["lr_schedulers"] == []
    with pytest.raises(ValueError, match="can only keep or drop"):
        _compat.set_strategy_schedulers(trainer, [torch.optim.lr_scheduler.StepLR(trainer.optimizers[0], 1)])


def test_set_strategy_schedulers_keeps_the_ones_given() -> None:
    class Keep(L.Callback):
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            _compat.set_strategy_schedulers(trainer, [c.scheduler for c in trainer.lr_scheduler_configs])

    counter = StepCounter()
    quiet_trainer(max_steps=3, max_epochs=-1, callbacks=[Keep(), counter]).fit(with_scheduler(), image_loader(n=48))
    assert counter.lrs == [0.1, 0.05, 0.025]


def test_wrap_checkpoint_saves_surrounds_every_save_lightning_makes(tmp_path: Path) -> None:
    seen: list[str] = []

    @contextmanager
    def around() -> Any:
        seen.append("enter")
        yield
        seen.append("exit")

    class Record(L.Callback):
        def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
            seen.append("dump")  # inside dump_checkpoint: the weights are read here

    class Wrap(L.Callback):
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            _compat.wrap_checkpoint_saves(trainer, around)

    checkpoint = L.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    trainer = quiet_trainer(max_steps=2, max_epochs=-1, callbacks=[Wrap(), Record(), checkpoint], enable_checkpointing=True)
    trainer.fit(tiny_classifier(), image_loader(n=48))
    trainer.save_checkpoint(tmp_path / "mine.ckpt")
    assert seen == ["enter", "dump", "exit"] * 3


def test_hand_over_gives_lightning_the_optimizers_and_schedulers_an_algorithm_leaves() -> None:
    class Replace(Algorithm):
        def match(self, event: Event, state: Any) -> bool:
            return event == Event.FIT_START

        def apply(self, event: Event, state: Any, logger: Any) -> None:
            assert len(state.schedulers) == 1  # the user's, handed over
            state.optimizers = [torch.optim.SGD(state.model.parameters(), lr=0.3)]
            state.schedulers = []

    counter = StepCounter()
    trainer = quiet_trainer(max_steps=2, max_epochs=-1, callbacks=[AlgorithmEngineCallback([Replace()]), counter])
    trainer.fit(with_scheduler(), image_loader(n=48))
    assert counter.lrs == [0.3, 0.3] and trainer.lr_scheduler_configs == []
    a, b = object(), object()  # identity, not equality
    assert not changed([a], [a]) and changed([a], [b]) and changed([a], [])
