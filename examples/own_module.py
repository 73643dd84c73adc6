"""Your own LightningModule, unchanged, with the algorithms that need no loss event.

    python examples/own_module.py
    python examples/own_module.py --max-epochs 3 --accelerator auto

``DigitsModule`` below is an ordinary LightningModule: its ``training_step`` runs the forward
pass and the loss together, so the callback cannot offer the ``BEFORE_FORWARD`` …
``AFTER_LOSS`` events that LabelSmoothing, MixUp or CutMix need (the callback would refuse them
at setup, saying so). Everything that acts on the data, the layers or the weights works as is:

- CutOut and ProgressiveResizing change each training batch at ``AFTER_DATALOADER``, before
  ``training_step`` receives it;
- BlurPool and ChannelsLast change the layers at ``INIT``, before ``configure_optimizers``;
- EMA keeps an average of the weights after every step and evaluates with it.
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F

from composer_bridge import AlgorithmEngineCallback, algorithms
from composer_bridge.algorithms import BlurPool, ChannelsLast, CutOut, ProgressiveResizing
from composer_bridge.data import digits_loaders
from composer_bridge.models import ResNetCNN


class DigitsModule(L.LightningModule):
    """A plain LightningModule: nothing in it knows about the callback."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.net = ResNetCNN(num_classes=10, in_channels=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits, y), prog_bar=True)
        self.log("val/acc", (logits.argmax(dim=1) == y).float().mean(), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, nesterov=True)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-epochs", type=int, default=6)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    L.seed_everything(args.seed, verbose=False)
    train_loader, val_loader = digits_loaders(batch_size=64, seed=args.seed)
    chosen = [
        BlurPool(),
        ChannelsLast(),
        CutOut(num_holes=1, length=0.25),
        ProgressiveResizing(initial_scale=0.75, size_increment=2),
    ]
    if hasattr(algorithms, "EMA"):  # weight averaging, where this version of the library has it
        chosen.append(algorithms.EMA())
    callback = AlgorithmEngineCallback(chosen)
    trainer = L.Trainer(
        max_epochs=args.max_epochs, max_steps=args.max_steps, accelerator=args.accelerator, devices=1,
        callbacks=[callback], logger=False, enable_checkpointing=False, num_sanity_val_steps=0,
        val_check_interval=args.max_steps if 0 < args.max_steps < len(train_loader) else None,
    )
    trainer.fit(DigitsModule(), train_loader, val_loader)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    print(f"val/acc {metrics.get('val/acc', float('nan')):.4f}")
    print(callback.plan())
    print(callback.cost_report())
    return metrics


if __name__ == "__main__":
    main()
