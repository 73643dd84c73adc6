"""A 1-D convolutional network classifying noisy generated waveforms: the signal workload.

Six classes of one-channel signals of length 128: sine, square, sawtooth, triangle, linear chirp and
exponentially damped sine, each with a random frequency, phase and amplitude, shifted in time by a
random circular roll and buried in additive Gaussian noise of random strength. Everything is drawn
from ``torch.Generator().manual_seed(0)``: the data set (6,000 training and 1,200 validation signals)
is the same for every seed; the seed only orders the training batches. The noise makes the classes
overlap (a sine and a triangle, a square and a sine, look alike under it), so the baseline plateaus
well below 100 %. The model is four Conv1d + BatchNorm1d + ReLU blocks with max pooling, global
average pooling and a Linear head. Quality is validation accuracy.

Calibration (one CPU thread, ``time.process_time``, batch 64, seed 0): B = 500 steps, about 8.5-9.5 s
of training. Validation accuracy at lr 3e-3: 0.79 at 250 steps, 0.83 at 500, 0.865 at 1,000. At 500
steps: lr 1e-3 -> 0.79, 3e-3 -> 0.83, 1e-2 -> 0.86 (3e-2 untried). One validation pass: < 0.1 s.

Examples:
    from workloads.signal_cnn import WORKLOAD
    train_loader, val_loader = WORKLOAD.make_data(0)
    module = WORKLOAD.make_module(WORKLOAD.budget_steps, WORKLOAD.lr_grid[1])
"""

from __future__ import annotations

import functools
import math

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from workloads.base import Workload, adamw_warmup_cosine, seeded_loaders

BATCH_SIZE = 64
LENGTH = 128
NUM_CLASSES = 6
TRAIN_PER_CLASS = 1000
VAL_PER_CLASS = 200
NOISE = (0.25, 0.75)  # the standard deviation of the additive noise, drawn uniformly in this range


def generate_signals(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` noisy waveforms ``(n, 1, LENGTH)`` and their classes ``(n,)``, classes balanced and shuffled."""
    labels = torch.arange(n) % NUM_CLASSES
    labels = labels[torch.randperm(n, generator=generator)]

    def uniform(low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, 1, generator=generator)

    t = torch.linspace(0.0, 1.0, LENGTH).unsqueeze(0)
    freq, phase, amplitude = uniform(2.0, 8.0), uniform(0.0, 2 * math.pi), uniform(0.6, 1.4)
    cycles = freq * t + phase / (2 * math.pi)
    saw = 2.0 * (cycles - torch.floor(cycles)) - 1.0
    sine = torch.sin(2 * math.pi * cycles)
    f0, f1 = uniform(1.0, 4.0), uniform(6.0, 12.0)
    chirp = torch.sin(2 * math.pi * (f0 * t + 0.5 * (f1 - f0) * t * t) + phase)
    damped = torch.exp(-uniform(2.0, 5.0) * t) * sine * 1.5
    waves = torch.stack([sine, torch.sign(sine), saw, 2.0 * saw.abs() - 1.0, chirp, damped], dim=1)
    x = amplitude * waves[torch.arange(n), labels]
    shifts = torch.randint(LENGTH, (n,), generator=generator)
    index = (torch.arange(LENGTH).unsqueeze(0) - shifts.unsqueeze(1)) % LENGTH
    x = torch.gather(x, 1, index)
    x = x + uniform(*NOISE) * torch.randn(n, LENGTH, generator=generator)
    return x.unsqueeze(1), labels


def conv_block(c_in: int, c_out: int, kernel: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv1d(c_in, c_out, kernel, padding=kernel // 2, bias=False),
                         nn.BatchNorm1d(c_out), nn.ReLU(inplace=True))


class SignalCNN(nn.Module):
    """Conv1d + BatchNorm1d + ReLU blocks with max pooling, global average pooling and a Linear head."""

    def __init__(self, num_classes: int = NUM_CLASSES, widths: tuple[int, ...] = (32, 64, 64, 128)):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 1
        for i, width in enumerate(widths):
            layers.append(conv_block(c_in, width, 7 if i == 0 else 5 if i == 1 else 3))
            if i < len(widths) - 1:
                layers.append(nn.MaxPool1d(2))
            c_in = width
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.features(x)).flatten(1))


class SignalModule(L.LightningModule):
    """The 1-D CNN trained with cross-entropy and the benchmark's AdamW schedule."""

    def __init__(self, total_steps: int, lr: float):
        super().__init__()
        self.total_steps = total_steps
        self.lr = lr
        self.model = SignalCNN()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss, batch_size=len(y))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits, y), batch_size=len(y))
        self.log("val/acc", (logits.argmax(-1) == y).float().mean(), batch_size=len(y))

    def configure_optimizers(self):
        return adamw_warmup_cosine(self.parameters(), self.lr, self.total_steps)


@functools.lru_cache(maxsize=1)
def _datasets() -> tuple[TensorDataset, TensorDataset]:
    generator = torch.Generator().manual_seed(0)
    train = TensorDataset(*generate_signals(TRAIN_PER_CLASS * NUM_CLASSES, generator))
    val = TensorDataset(*generate_signals(VAL_PER_CLASS * NUM_CLASSES, generator))
    return train, val


def make_module(total_steps: int, lr: float) -> SignalModule:
    return SignalModule(total_steps, lr)


def make_data(seed: int) -> tuple[DataLoader, DataLoader]:
    return seeded_loaders(*_datasets(), batch_size=BATCH_SIZE, seed=seed)


WORKLOAD = Workload(
    name="signal_cnn",
    description="1-D CNN (4 Conv1d+BN blocks) on 6-class noisy generated waveforms, length 128",
    make_module=make_module,
    make_data=make_data,
    monitor="val/acc",
    mode="max",
    budget_steps=500,
    lr_grid=(3e-3, 1e-2, 3e-2),
    requires=(),
)
