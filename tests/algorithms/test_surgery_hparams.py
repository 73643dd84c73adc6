"""Surgery counts reach every Lightning logger's hyper-parameters under Composer's keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from helpers.support import image_loader, quiet_trainer
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from composer_bridge import AlgorithmEngineCallback, ComposerClassifier
from composer_bridge.algorithms import BlurPool, Factorize, SqueezeExcite
from composer_bridge.algorithms.blurpool import BlurConv2d, BlurMaxPool2d
from composer_bridge.algorithms.factorize import FactorizedConv2d, FactorizedLinear
from composer_bridge.algorithms.squeeze_excite import SqueezeExciteConv2d


def small_cnn() -> ComposerClassifier:
    """Two strided convolutions, one max-pool, two wide convolutions and one wide linear layer."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 16, 3, stride=2, padding=1), nn.ReLU(),  # strided: blurred
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),  # strided and wide
        nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),  # wide
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, 32), nn.ReLU(),  # wide
        nn.Linear(32, 4),  # too narrow to factorise (4 outputs)
    )
    return ComposerClassifier(net, num_classes=4, optimizer=lambda p: torch.optim.SGD(p, lr=0.01))


CASES: list[tuple[Any, dict[str, int], dict[str, type]]] = [
    (lambda: BlurPool(min_channels=1),
     {"blurpool/num_blurpool_layers": 1, "blurpool/num_blurconv_layers": 2},
     {"blurpool/num_blurpool_layers": BlurMaxPool2d, "blurpool/num_blurconv_layers": BlurConv2d}),
    (lambda: BlurPool(replace_convs=False, min_channels=1),
     {"blurpool/num_blurpool_layers": 1, "blurpool/num_blurconv_layers": 0},
     {"blurpool/num_blurpool_layers": BlurMaxPool2d, "blurpool/num_blurconv_layers": BlurConv2d}),
    (lambda: SqueezeExcite(latent_channels=8, min_channels=16),
     {"squeeze_excite/num_squeeze_excite_layers": 2},
     {"squeeze_excite/num_squeeze_excite_layers": SqueezeExciteConv2d}),
    (lambda: Factorize(min_channels=32, latent_channels=4, min_features=32, latent_features=4),
     {"factorize/num_conv2d_replacements": 1, "factorize/num_linear_replacements": 1},
     {"factorize/num_conv2d_replacements": FactorizedConv2d, "factorize/num_linear_replacements": FactorizedLinear}),
    (lambda: Factorize(factorize_linears=False, min_channels=32, latent_channels=4),
     {"factorize/num_conv2d_replacements": 1},
     {"factorize/num_conv2d_replacements": FactorizedConv2d}),
]


@pytest.mark.parametrize("factory, expected, counted", CASES, ids=["blurpool", "blurpool-pools", "se", "factorize",
                                                                   "factorize-convs"])
def test_surgery_counts_reach_a_csv_loggers_hparams_under_composers_keys(
    factory: Any, expected: dict[str, int], counted: dict[str, type], tmp_path: Path,
) -> None:
    model = small_cnn()
    callback = AlgorithmEngineCallback([factory()])
    trainer = quiet_trainer(logger=CSVLogger(tmp_path, name="run"), limit_train_batches=1, callbacks=[callback])
    trainer.fit(model, image_loader(n=8, batch_size=8))
    hparams = yaml.safe_load(Path(trainer.logger.log_dir, "hparams.yaml").read_text())
    logged = {key: value for key, value in hparams.items() if key.split("/")[0] in {"blurpool", "squeeze_excite",
                                                                                    "factorize"}}
    assert logged == expected
    # the counts are the layers the trained model holds
    assert {key: sum(isinstance(m, cls) for m in model.modules()) for key, cls in counted.items()} == expected
