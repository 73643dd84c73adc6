"""A tiny task for the recipe-search tests: a few-parameter CNN on 8x8 synthetic images, 3 classes.

Small enough that a fit of a few optimizer steps takes a fraction of a second; the class is in a
corner's brightness, so a handful of steps moves the accuracy and candidates change the curves.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import ComposerClassifier
from composer_bridge.search.candidates import Candidate

RUN_LENGTHS = [2, 4, 8]
#: At lr=3.0 the tiny task diverges now and then; tight gradient clipping steadies it, so on the search seeds it
#: wins clearly enough for the search to be sure (the tests that need a recipe to confirm use it).
CLIP = Candidate("GradientClipping", {"clipping_type": "norm", "clipping_threshold": 0.05}, name="Clip")
CANDIDATES = ["LabelSmoothing", "MixUp", "CutOut", "GhostBatchNorm"]


def tiny_network() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(16, 3))


def make_module(total_steps: int, lr: float = 0.3) -> ComposerClassifier:
    return ComposerClassifier(tiny_network(), num_classes=3,
                              optimizer=lambda p: torch.optim.SGD(p, lr=lr, momentum=0.9))


def _tensors(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 1, 8, 8, generator=g)
    x[:, 0, :3, :3] += 0.8 * (y.float() - 1).view(-1, 1, 1)
    return x, y


def make_data(seed: int) -> tuple[DataLoader, DataLoader]:
    x, y = _tensors(160, 123)  # the same task for every seed; the seed orders the batches
    return (DataLoader(TensorDataset(x[:96], y[:96]), batch_size=16, shuffle=True,
                       generator=torch.Generator().manual_seed(seed)),
            DataLoader(TensorDataset(x[96:], y[96:]), batch_size=64))


class TinyModule(ComposerClassifier):
    """The same model as a class, for the command's config (class_path / init_args)."""

    def __init__(self, total_steps: int = 8, lr: float = 0.3) -> None:
        super().__init__(tiny_network(), num_classes=3, optimizer=lambda p: torch.optim.SGD(p, lr=lr, momentum=0.9))


class TinyData(L.LightningDataModule):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = seed

    def train_dataloader(self) -> Any:
        return make_data(self.seed)[0]

    def val_dataloader(self) -> Any:
        return make_data(self.seed)[1]


class Counting:
    """``make_module`` that counts its calls and can raise KeyboardInterrupt at call ``interrupt_at``."""

    def __init__(self, interrupt_at: int | None = None, factory: Any = make_module) -> None:
        self.calls = 0
        self.interrupt_at = interrupt_at
        self.factory = factory

    def __call__(self, total_steps: int) -> Any:
        self.calls += 1
        if self.interrupt_at is not None and self.calls == self.interrupt_at:
            raise KeyboardInterrupt(f"interrupted at module {self.calls}")
        return self.factory(total_steps)


def search_kwargs(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        monitor="val/acc", mode="max", candidates=CANDIDATES, run_lengths=RUN_LENGTHS, max_fits=60,
        search_seeds=[0, 1], confirm_seeds=[10, 11, 12], clock="steps", progress=False,
        trainer_kwargs={"accelerator": "cpu", "devices": 1},
    )
    kwargs.update(overrides)
    return kwargs
