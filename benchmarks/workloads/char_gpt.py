"""The library's character-level GPT on Python's standard-library source: the char_gpt workload.

:class:`composer_bridge.models.gpt.GPT` (vocabulary 128, d_model 64, 2 layers, 4 heads, feed-forward
256, learned positions, tied head, no dropout) in a plain LightningModule with an inline
``F.cross_entropy``; the data is :mod:`workloads.text` (64 characters predicted per chunk, batch 8,
dict batches ``{"input_ids", "labels"}`` with the labels already shifted). Quality: ``val/loss``, the
mean cross-entropy in nats per character over 64 validation chunks (lower is better).

Calibration (one CPU thread, torch 2.13, ``time.process_time``, seed 0; training only, validation
left out): B = 900 steps take 9.9 s (about 11 ms a step; per CPU second batch 8 does as well as batch
16: 1.81 after 900 steps of 8, 1.82 after 600 steps of 16, 10 s each). At lr 3e-3 ``val/loss``
is 2.14 at B/2 = 450, 1.81 at B = 900 and 1.48 at 2B = 1800: the model is not at its plateau at B
(2B gains 0.33 nats); a plateau is out of reach of a ~10 s budget for this model, so B is the budget.
Learning rates at B: 1e-3 -> 2.03, 3e-3 -> 1.81, 1e-2 -> 2.22 (5e-3 at 600 steps of 16: 2.01, worse
than 3e-3's 1.82). One validation pass (64 chunks, one batch): about 0.03 s.

Examples:
    from workloads.char_gpt import WORKLOAD
    train_loader, val_loader = WORKLOAD.make_data(0)
    module = WORKLOAD.make_module(WORKLOAD.budget_steps, WORKLOAD.lr_grid[1])
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from composer_bridge.models.gpt import GPT
from workloads.base import Workload, adamw_warmup_cosine
from workloads.text import VOCAB_SIZE, text_loaders

BLOCK_SIZE = 64
BATCH_SIZE = 8


class CharGPT(L.LightningModule):
    """The GPT trained with next-character cross-entropy and the benchmark's AdamW schedule."""

    #: where the algorithms that read the batch find its inputs and targets (composer_bridge.lightning.batch_keys),
    #: as the Hugging Face workloads declare it: the one line the bridge's refusal of a dict batch asks for
    batch_keys = {"input_key": "input_ids", "target_key": "labels"}

    def __init__(self, total_steps: int, lr: float) -> None:
        super().__init__()
        self.total_steps, self.lr = total_steps, lr
        self.model = GPT(vocab_size=VOCAB_SIZE, block_size=BLOCK_SIZE, d_model=64, n_layers=2, n_heads=4)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = self(batch["input_ids"])
        return F.cross_entropy(logits.view(-1, logits.size(-1)), batch["labels"].view(-1))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, batch_size=len(batch["input_ids"]))
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val/loss", self._loss(batch), batch_size=len(batch["input_ids"]))

    def configure_optimizers(self) -> Any:
        return adamw_warmup_cosine(self.parameters(), self.lr, self.total_steps)


def make_module(total_steps: int, lr: float) -> CharGPT:
    return CharGPT(total_steps, lr)


def make_data(seed: int) -> tuple[DataLoader, DataLoader]:
    return text_loaders(BLOCK_SIZE, BATCH_SIZE, seed)


WORKLOAD = Workload(
    name="char_gpt",
    description="composer_bridge GPT (d 64, 2 layers) on stdlib source, 64 chars, batch 8",
    make_module=make_module,
    make_data=make_data,
    monitor="val/loss",
    mode="min",
    budget_steps=900,
    lr_grid=(1e-3, 3e-3, 1e-2),
    requires=(),
    family="language",
)
