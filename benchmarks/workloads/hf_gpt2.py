"""A small Hugging Face GPT-2 on Python's standard-library source, written as users write it: the hf_gpt2 workload.

``transformers.GPT2LMHeadModel`` built from a small ``GPT2Config`` (vocabulary 128, n_embd 64, 2 layers,
4 heads, feed-forward 256, learned positions, tied head, no dropout, SDPA attention; its projections
are transformers' ``Conv1D``, not ``nn.Linear``) in a plain LightningModule whose ``training_step``
returns ``self.model(**batch).loss``. The data is :mod:`workloads.text` with ``shifted=False``:
``input_ids == labels`` = a window of 65 characters (Hugging Face shifts the labels itself), so the loss
is the mean cross-entropy over the same 64 next-character predictions per chunk as ``char_gpt``'s.
Batch 8. The module declares ``batch_keys`` so the algorithms that read the batch find its inputs and
targets. Quality: ``val/loss`` in nats per character over 64 validation chunks (lower is better).

Calibration (one CPU thread, torch 2.13, transformers 5.24, ``time.process_time``, seed 0; training
only): B = 700 steps take 9.0-9.2 s (about 13 ms a step; SDPA and eager attention cost the same here).
At lr 3e-3 ``val/loss`` is 2.37 at B/2 = 350, 1.97 at B = 700 and 1.60 at 2B = 1400: not at its
plateau at B (2B gains 0.37 nats), which a ~10 s budget cannot reach for this model. Learning rates at
B: 1e-3 -> 2.10, 3e-3 -> 1.97, 1e-2 -> 2.30. One validation pass (64 chunks, one batch): about 0.05 s.

Examples:
    from workloads.hf_gpt2 import WORKLOAD
    train_loader, val_loader = WORKLOAD.make_data(0)
    module = WORKLOAD.make_module(WORKLOAD.budget_steps, WORKLOAD.lr_grid[1])
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from workloads.base import Workload, adamw_warmup_cosine
from workloads.text import VOCAB_SIZE, text_loaders

BLOCK_SIZE = 64  # characters predicted per chunk; the model sees BLOCK_SIZE + 1
BATCH_SIZE = 8
ATTENTION = "sdpa"


class HFGPT2(L.LightningModule):
    """``GPT2LMHeadModel`` trained on its own ``.loss`` with the benchmark's AdamW schedule."""

    #: where the algorithms that read the batch find its inputs and targets (composer_bridge.lightning.batch_keys)
    batch_keys = {"input_key": "input_ids", "target_key": "labels"}

    def __init__(self, total_steps: int, lr: float) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        self.total_steps, self.lr = total_steps, lr
        config = GPT2Config(vocab_size=VOCAB_SIZE, n_embd=64, n_layer=2, n_head=4, n_positions=BLOCK_SIZE + 1,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                            bos_token_id=None, eos_token_id=None)
        self.model = GPT2LMHeadModel._from_config(config, attn_implementation=ATTENTION)

    def forward(self, **batch: torch.Tensor) -> Any:
        return self.model(**batch)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        self.log("train/loss", loss, batch_size=len(batch["input_ids"]))
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val/loss", self.model(**batch).loss, batch_size=len(batch["input_ids"]))

    def configure_optimizers(self) -> Any:
        return adamw_warmup_cosine(self.parameters(), self.lr, self.total_steps)


def make_module(total_steps: int, lr: float) -> HFGPT2:
    return HFGPT2(total_steps, lr)


def make_data(seed: int) -> tuple[DataLoader, DataLoader]:
    return text_loaders(BLOCK_SIZE, BATCH_SIZE, seed, shifted=False)


WORKLOAD = Workload(
    name="hf_gpt2",
    description="HF GPT2LMHeadModel (n_embd 64, 2 layers) on stdlib source, 64 chars, batch 8",
    make_module=make_module,
    make_data=make_data,
    monitor="val/loss",
    mode="min",
    budget_steps=700,
    lr_grid=(1e-3, 3e-3, 1e-2),
    requires=("transformers",),
    family="language",
)
