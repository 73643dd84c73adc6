"""LightningCLI: the callback and its algorithms configured in YAML.

    python examples/cli.py fit --config examples/configs/mild.yaml
    python examples/cli.py fit --config examples/configs/mild.yaml --trainer.max_epochs 3
    python examples/cli.py fit --config examples/configs/baseline.yaml
    python examples/cli.py fit --print_config --config examples/configs/mild.yaml   # the full config

The model (:class:`DigitsClassifier`) and data (:class:`DigitsDataModule`) take plain
arguments, so LightningCLI exposes them as ``--model.*`` / ``--data.*``. The YAML files add
``composer_bridge.AlgorithmEngineCallback`` to ``trainer.callbacks`` with ``class_path`` /
``init_args``, and each algorithm the same way, e.g.::

    trainer:
      callbacks:
        - class_path: composer_bridge.AlgorithmEngineCallback
          init_args:
            algorithms:
              - class_path: composer_bridge.algorithms.LabelSmoothing
                init_args: {smoothing: 0.08}
"""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI

from composer_bridge import ComposerClassifier
from composer_bridge.data import digits_loaders
from composer_bridge.models import ResNetCNN


class DigitsClassifier(ComposerClassifier):
    """ResNetCNN on 8x8 digits with SGD (Nesterov momentum) and a one-cycle learning rate.

    Args:
        lr: peak learning rate.
        widths: channels per ResNet stage.
        blocks_per_stage: residual blocks per stage.
    """

    def __init__(self, lr: float = 0.1, widths: tuple[int, ...] = (32, 64), blocks_per_stage: int = 2) -> None:
        super().__init__(ResNetCNN(num_classes=10, in_channels=1, widths=tuple(widths),
                                   blocks_per_stage=blocks_per_stage), num_classes=10)
        self.save_hyperparameters()
        self.lr = lr

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.lr, total_steps=total, pct_start=0.15)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class DigitsDataModule(L.LightningDataModule):
    """scikit-learn's digits (bundled, no download), split 80/20 with ``seed``."""

    def __init__(self, batch_size: int = 64, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.seed = seed

    def setup(self, stage: str) -> None:
        self._train, self._val = digits_loaders(batch_size=self.batch_size, seed=self.seed)

    def train_dataloader(self):
        return self._train

    def val_dataloader(self):
        return self._val


def main(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    """Build (and with ``run``, execute) the CLI; ``run=False`` takes no subcommand and only builds."""
    return LightningCLI(DigitsClassifier, DigitsDataModule, seed_everything_default=0, args=args, run=run,
                        save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    main()
