"""What a workload of the workloads benchmark is, and the baseline optimizer every workload uses.

A :class:`Workload` is a LightningModule factory, a data factory, the validation metric that decides
quality and its direction, and the reference budget ``budget_steps`` (optimizer steps at which the
baseline reaches its plateau). Every workload's module trains with :func:`adamw_warmup_cosine`: AdamW,
linear warm-up over the first 5 % of the run, cosine decay to zero at its end, the learning rate
chosen from ``lr_grid`` on the tuning seeds by ``benchmarks/run_workloads.py`` and then frozen.

Examples:
    >>> import torch
    >>> net = torch.nn.Linear(2, 2)
    >>> config = adamw_warmup_cosine(net.parameters(), lr=1e-3, total_steps=100)
    >>> config["lr_scheduler"]["interval"]
    'step'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Workload", "adamw_warmup_cosine", "seeded_loaders", "warmup_cosine"]


@dataclass(frozen=True)
class Workload:
    """One task of the benchmark.

    Args:
        name: the workload's name (its module's name under ``benchmarks/workloads/``).
        description: one line for tables: model, data, metric.
        make_module: ``make_module(total_steps, lr)`` -> a fresh LightningModule whose schedule is
            ``total_steps`` optimizer steps long.
        make_data: ``make_data(seed)`` -> ``(train_loader, val_loader)``. The data set is the same for
            every seed; ``seed`` only orders the training batches (initialisation follows the global seed).
        monitor: the metric validation logs (``"val/acc"``, ``"val/loss"``).
        mode: ``"max"`` or ``"min"``: which direction of ``monitor`` is better.
        budget_steps: the reference budget B, in optimizer steps: the baseline is near its plateau there.
        lr_grid: AdamW learning rates tried on the tuning seeds.
        requires: modules the workload imports (``"transformers"``); left out with a note when missing.
        family: ``"language"`` for the language models (Muon's single variants are measured there only).
    """

    name: str
    description: str
    make_module: Callable[..., Any]
    make_data: Callable[[int], tuple[Any, Any]]
    monitor: str
    mode: str
    budget_steps: int
    lr_grid: tuple[float, ...]
    requires: tuple[str, ...] = field(default_factory=tuple)
    family: str = "other"

    def better(self, a: float, b: float) -> bool:
        """Is quality ``a`` at least as good as ``b``?"""
        return a >= b if self.mode == "max" else a <= b


def warmup_cosine(total_steps: int, warmup_fraction: float = 0.05) -> Callable[[int], float]:
    """The learning-rate factor at each step: linear warm-up, then cosine decay to zero at ``total_steps``.

    Examples:
        >>> f = warmup_cosine(100)
        >>> round(f(0), 2), round(f(5), 2), round(f(100), 2)
        (0.2, 1.0, 0.0)
    """
    warmup = max(1, round(warmup_fraction * total_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def adamw_warmup_cosine(params: Iterable[Any], lr: float, total_steps: int, weight_decay: float = 0.05,
                        betas: tuple[float, float] = (0.9, 0.999), warmup_fraction: float = 0.05) -> dict[str, Any]:
    """What ``configure_optimizers`` returns for the benchmark's baseline: AdamW with warm-up and cosine decay.

    Biases and normalisation weights (parameters with fewer than 2 dimensions) get no weight decay.
    """
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total_steps, warmup_fraction))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def seeded_loaders(train: Any, val: Any, batch_size: int, seed: int, val_batch_size: int = 512,
                   collate_fn: Callable[..., Any] | None = None) -> tuple[Any, Any]:
    """``(train, val)`` loaders: the training batches shuffled by a generator seeded with ``seed`` (whole batches
    only), the validation set in order. The data sets are the same for every seed.

    Examples:
        >>> data = torch.utils.data.TensorDataset(torch.arange(10.0))
        >>> train, val = seeded_loaders(data, data, batch_size=4, seed=0)
        >>> len(train), len(val)
        (2, 1)
    """
    train_loader = torch.utils.data.DataLoader(train, batch_size=batch_size, shuffle=True, drop_last=True,
                                               collate_fn=collate_fn, generator=torch.Generator().manual_seed(seed))
    return train_loader, torch.utils.data.DataLoader(val, batch_size=val_batch_size, collate_fn=collate_fn)
