"""A click-through-rate model on synthetic Criteo-like rows: the DLRM-small-style tabular workload.

Each row has 13 dense float features (heavy-tailed, ``log1p``-compressed as Criteo pipelines do) and 8
categorical features with vocabularies of 50 to 1,000 ids drawn with a Zipf-like skew. A hidden
random teacher (its own embeddings, a linear read of the dense features and a small tanh MLP) gives
each row a click probability ``sigmoid(teacher logit)``; the label is one Bernoulli draw of it, so
there is irreducible noise and the best achievable validation loss is the teacher's own entropy.
Everything is drawn from ``torch.Generator().manual_seed(0)``: 49,152 training rows and 4,096
validation rows, the same for every seed. The student is like AlgoPerf's Criteo DLRM-small: one
``nn.Embedding`` table of dimension 16 per categorical feature, a bottom MLP taking the dense features
to 16, the 9 vectors concatenated, a top MLP to one logit, and binary cross-entropy with logits.
Quality is the mean validation BCE (``val/loss``, lower is better).

Calibration (one CPU thread, ``time.process_time``, batch 64, seed 0): 4,000 steps took about 9 s of
training (11 s with Lightning's loop). The teacher's own validation loss is 0.488, a constant
predictor's 0.681. Validation loss at lr 1e-3: 0.510 at 2,000 steps, 0.509 at 4,000, 0.629 at 8,000
(the embeddings over-fit the fixed rows past about 5 epochs). At 4,000 steps: lr 3e-4 -> 0.525,
1e-3 -> 0.509, 3e-3 -> 0.525; a 1,500-step run at 3e-3 reached 0.500. So B = 2,000 steps (about 5 s),
the start of the flat stretch, before the over-fitting a longer run brings.

Examples:
    from workloads.ctr import WORKLOAD
    train_loader, val_loader = WORKLOAD.make_data(0)
    module = WORKLOAD.make_module(WORKLOAD.budget_steps, WORKLOAD.lr_grid[1])
"""

from __future__ import annotations

import functools

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from workloads.base import Workload, adamw_warmup_cosine, seeded_loaders

BATCH_SIZE = 64
NUM_DENSE = 13
VOCAB_SIZES = (50, 80, 100, 200, 300, 500, 700, 1000)
EMBED_DIM = 16
TRAIN_ROWS = 49_152
VAL_ROWS = 4_096


def _draw_rows(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` rows: dense ``(n, 13)`` float features and categorical ``(n, 8)`` ids."""
    scales = torch.exp(torch.linspace(0.0, 4.0, NUM_DENSE))
    raw = torch.exp(torch.randn(n, NUM_DENSE, generator=generator)) * scales  # heavy-tailed counts
    dense = torch.log1p(raw)
    dense = (dense - dense.mean(0)) / dense.std(0)
    columns = []
    for vocab in VOCAB_SIZES:
        weights = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float) ** 0.8  # Zipf-like popularity
        ids = torch.multinomial(weights, n, replacement=True, generator=generator)
        columns.append(torch.randperm(vocab, generator=generator)[ids])
    return dense, torch.stack(columns, dim=1)


def _teacher_logits(dense: torch.Tensor, categorical: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The hidden teacher: random embeddings (dim 8) and a dense read, through a tanh MLP, to one logit."""
    dim = 8
    tables = [torch.randn(vocab, dim, generator=generator) for vocab in VOCAB_SIZES]
    embedded = [table[categorical[:, i]] for i, table in enumerate(tables)]
    dense_proj = dense @ (torch.randn(NUM_DENSE, dim, generator=generator) / NUM_DENSE ** 0.5)
    features = torch.cat([dense_proj, *embedded], dim=1)
    w1 = torch.randn(features.shape[1], 32, generator=generator) / features.shape[1] ** 0.5
    w2 = torch.randn(32, 1, generator=generator) / 32 ** 0.5
    hidden = torch.tanh(features @ w1)
    linear = dense[:, :4].sum(1, keepdim=True) * 0.3 + embedded[0][:, :1]  # a few first-order effects
    logits = 2.5 * (hidden @ w2) + 0.5 * linear
    return (logits - 1.0).squeeze(1)  # a base click rate around a third


class DLRMSmall(nn.Module):
    """Embedding tables, a bottom MLP for the dense features, concatenation and a top MLP to one logit."""

    def __init__(self, vocab_sizes: tuple[int, ...] = VOCAB_SIZES, num_dense: int = NUM_DENSE,
                 embed_dim: int = EMBED_DIM):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(vocab, embed_dim) for vocab in vocab_sizes)
        self.bottom = nn.Sequential(nn.Linear(num_dense, 64), nn.ReLU(), nn.Linear(64, embed_dim), nn.ReLU())
        width = embed_dim * (len(vocab_sizes) + 1)
        self.top = nn.Sequential(nn.Linear(width, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1))
        for table in self.embeddings:
            nn.init.normal_(table.weight, std=embed_dim ** -0.5)

    def forward(self, dense: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        vectors = [self.bottom(dense)] + [table(categorical[:, i]) for i, table in enumerate(self.embeddings)]
        return self.top(torch.cat(vectors, dim=1)).squeeze(1)


class CTRModule(L.LightningModule):
    """DLRM-small trained with binary cross-entropy on logits and the benchmark's AdamW schedule."""

    def __init__(self, total_steps: int, lr: float):
        super().__init__()
        self.total_steps = total_steps
        self.lr = lr
        self.model = DLRMSmall()

    def forward(self, dense: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        return self.model(dense, categorical)

    def training_step(self, batch, batch_idx):
        dense, categorical, y = batch
        loss = F.binary_cross_entropy_with_logits(self(dense, categorical), y)
        self.log("train/loss", loss, batch_size=len(y))
        return loss

    def validation_step(self, batch, batch_idx):
        dense, categorical, y = batch
        logits = self(dense, categorical)
        self.log("val/loss", F.binary_cross_entropy_with_logits(logits, y), batch_size=len(y))
        self.log("val/acc", ((logits > 0).float() == y).float().mean(), batch_size=len(y))

    def configure_optimizers(self):
        return adamw_warmup_cosine(self.parameters(), self.lr, self.total_steps)


@functools.lru_cache(maxsize=1)
def _tensors() -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """All rows, their labels and the teacher's click probabilities (for the Bayes-optimal loss)."""
    generator = torch.Generator().manual_seed(0)
    dense, categorical = _draw_rows(TRAIN_ROWS + VAL_ROWS, generator)
    probability = torch.sigmoid(_teacher_logits(dense, categorical, generator))
    labels = torch.bernoulli(probability, generator=generator)
    return (dense, categorical, labels), probability


def bayes_val_loss() -> float:
    """The validation loss of the teacher itself: the floor no model can beat on average."""
    (_, _, labels), probability = _tensors()
    p, y = probability[TRAIN_ROWS:], labels[TRAIN_ROWS:]
    return float(F.binary_cross_entropy(p, y))


@functools.lru_cache(maxsize=1)
def _datasets() -> tuple[TensorDataset, TensorDataset]:
    (dense, categorical, labels), _ = _tensors()
    train = TensorDataset(dense[:TRAIN_ROWS], categorical[:TRAIN_ROWS], labels[:TRAIN_ROWS])
    val = TensorDataset(dense[TRAIN_ROWS:], categorical[TRAIN_ROWS:], labels[TRAIN_ROWS:])
    return train, val


def make_module(total_steps: int, lr: float) -> CTRModule:
    return CTRModule(total_steps, lr)


def make_data(seed: int) -> tuple[DataLoader, DataLoader]:
    return seeded_loaders(*_datasets(), batch_size=BATCH_SIZE, seed=seed)


WORKLOAD = Workload(
    name="ctr",
    description="DLRM-small (8 embedding tables dim 16, bottom+top MLP) on synthetic CTR rows",
    make_module=make_module,
    make_data=make_data,
    monitor="val/loss",
    mode="min",
    budget_steps=2000,
    lr_grid=(3e-4, 1e-3, 3e-3),
    requires=(),
)
