"""A small Hugging Face Llama on Python's standard-library source, written as users write it: the hf_llama workload.

``transformers.LlamaForCausalLM`` built from a small ``LlamaConfig`` (vocabulary 128, hidden 64, 2
layers, 4 heads, SwiGLU intermediate 172, RMSNorm, rotary positions, untied head, no dropout, SDPA
attention) in a plain LightningModule whose ``training_step`` returns ``self.model(**batch).loss``. The
data is :mod:`workloads.text` with ``shifted=False``: ``input_ids == labels`` = a window of 65
characters (Hugging Face shifts the labels itself), so the loss is the mean cross-entropy over the same
64 next-character predictions per chunk as ``char_gpt``'s and the two ``val/loss`` are comparable.
Batch 8. The module declares ``batch_keys`` so the algorithms that read the batch find its inputs and
targets. Quality: ``val/loss`` in nats per character over 64 validation chunks (lower is better).

Calibration (one CPU thread, torch 2.13, transformers 5.24, ``time.process_time``, seed 0; training
only): B = 800 steps take 9.8-10.5 s (about 12-13 ms a step; SDPA attention, about 10 % faster than
eager here). At lr 3e-3 ``val/loss`` is 2.09 at B/2 = 400, 1.60 at B = 800 and 1.31 at 2B = 1600: not
at its plateau at B (2B gains 0.29 nats), which a ~10 s budget cannot reach for this model. Learning
rates at B: 1e-3 -> 1.60, 1.7e-3 -> 1.52, 3e-3 -> 1.60, 1e-2 -> 2.02; the grid is centred on 1.7e-3.
One validation pass (64 chunks, one batch): about 0.04 s.

Examples:
    from workloads.hf_llama import WORKLOAD
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


class HFLlama(L.LightningModule):
    """``LlamaForCausalLM`` trained on its own ``.loss`` with the benchmark's AdamW schedule."""

    #: where the algorithms that read the batch find its inputs and targets (composer_bridge.lightning.batch_keys)
    batch_keys = {"input_key": "input_ids", "target_key": "labels"}

    def __init__(self, total_steps: int, lr: float) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        self.total_steps, self.lr = total_steps, lr
        config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=BLOCK_SIZE + 1,
                             attention_dropout=0.0, use_cache=False)
        self.model = LlamaForCausalLM._from_config(config, attn_implementation=ATTENTION)

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


def make_module(total_steps: int, lr: float) -> HFLlama:
    return HFLlama(total_steps, lr)


def make_data(seed: int) -> tuple[DataLoader, DataLoader]:
    return text_loaders(BLOCK_SIZE, BATCH_SIZE, seed, shifted=False)


WORKLOAD = Workload(
    name="hf_llama",
    description="HF LlamaForCausalLM (hidden 64, 2 layers) on stdlib source, 64 chars, batch 8",
    make_module=make_module,
    make_data=make_data,
    monitor="val/loss",
    mode="min",
    budget_steps=800,
    lr_grid=(6e-4, 1.7e-3, 5e-3),
    requires=("transformers",),
    family="language",
)
