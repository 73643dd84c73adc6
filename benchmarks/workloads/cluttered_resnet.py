"""Cluttered digits on a small ResNet: the vision task the published recipes were measured on, as a plain module.

:func:`composer_bridge.data.cluttered_digits_datasets` at 16x16 (scikit-learn's digits moved, rotated,
cluttered and noisy; 60 digits per class, 3 corrupted copies each: 1,800 training and 1,197 test
images) with :class:`composer_bridge.models.ResNetCNN` (widths 16 and 32), written as a plain
LightningModule with an inline ``F.cross_entropy``, batch 64. Quality: validation accuracy.

Calibration (one CPU thread, torch 2.13): see ``docs/benchmarks.md`` (the workloads benchmark); the
learning rate is chosen from ``lr_grid`` on the tuning seeds by ``benchmarks/run_workloads.py``.
"""

from __future__ import annotations

import functools
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F

from composer_bridge.data import cluttered_digits_datasets
from composer_bridge.models import ResNetCNN
from workloads.base import Workload, adamw_warmup_cosine, seeded_loaders


class ClutteredResNet(L.LightningModule):
    def __init__(self, total_steps: int, lr: float) -> None:
        super().__init__()
        self.total_steps, self.lr = total_steps, lr
        self.net = ResNetCNN(num_classes=10, in_channels=1, widths=(16, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits, y), batch_size=len(y))
        self.log("val/acc", (logits.argmax(-1) == y).float().mean(), batch_size=len(y))

    def configure_optimizers(self) -> Any:
        return adamw_warmup_cosine(self.parameters(), self.lr, self.total_steps)


@functools.lru_cache(maxsize=1)
def _datasets() -> tuple[Any, Any]:
    return cluttered_digits_datasets(image_size=16, copies=3, train_per_class=60, seed=0)


def make_module(total_steps: int, lr: float) -> ClutteredResNet:
    return ClutteredResNet(total_steps, lr)


def make_data(seed: int) -> tuple[Any, Any]:
    return seeded_loaders(*_datasets(), batch_size=64, seed=seed)


WORKLOAD = Workload(
    name="cluttered_resnet",
    description="ResNet (16, 32) on 16x16 cluttered digits",
    make_module=make_module, make_data=make_data, monitor="val/acc", mode="max",
    budget_steps=300, lr_grid=(1e-3, 3e-3, 1e-2),
)
