"""ScheduleFree on a plain LightningModule with BatchNorm: the statistics are recomputed at the averaged weights from
the inputs found in the user's own batches (tuple or dict with batch_keys), as on a ComposerModule; refused, naming
the fix, only where no input can be found or the module has no forward."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import L, assert_same_weights, image_loader, quiet_trainer, weights_of
from torch.utils.data import DataLoader

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import ScheduleFree
from composer_bridge.models import ResNetCNN

schedulefree = pytest.importorskip("schedulefree")


class PlainResNet(L.LightningModule):
    """Written the usual way: forward(x), an inline loss, tuple batches (or dict batches with batch_keys)."""

    def __init__(self, dict_batches: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = ResNetCNN(num_classes=4, in_channels=1, widths=(8, 16), blocks_per_stage=1)
        self.dict_batches = dict_batches
        if dict_batches:
            self.batch_keys = {"input_key": "pixels", "target_key": "label"}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = (batch["pixels"], batch["label"]) if self.dict_batches else batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> Any:
        return schedulefree.AdamWScheduleFree(self.parameters(), lr=0.01)


def as_dicts(loader: DataLoader) -> DataLoader:
    return DataLoader([{"pixels": x, "label": y} for x, y in loader], batch_size=None)


@pytest.mark.parametrize("dict_batches", [False, True])
def test_a_plain_module_gets_the_statistics_at_x_from_its_last_training_inputs(dict_batches: bool) -> None:
    model = PlainResNet(dict_batches)
    data = image_loader(n=64, batch_size=16)
    loader = as_dicts(data) if dict_batches else data
    callback = AlgorithmEngineCallback([ScheduleFree(batchnorm_batches=2)], seed=1)
    quiet_trainer(max_steps=4, max_epochs=-1, callbacks=[callback]).fit(model, loader)
    # by hand: the weights after fit are x; a plain average of the statistics over the last 2 batches' inputs
    expected = copy.deepcopy(model)
    norms = [m for m in expected.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    expected.train()
    with torch.no_grad():
        for x, _ in list(image_loader(n=64, batch_size=16))[2:4]:
            expected(x)
    assert_same_weights(weights_of(expected), weights_of(model))


def test_without_the_recomputation_the_statistics_are_those_of_training() -> None:
    """The oracle can tell: with batchnorm_batches=0 the statistics are not the by-hand ones."""
    model = PlainResNet()
    callback = AlgorithmEngineCallback([ScheduleFree(batchnorm_batches=0)], seed=1)
    quiet_trainer(max_steps=4, max_epochs=-1, callbacks=[callback]).fit(model, image_loader(n=64, batch_size=16))
    expected = copy.deepcopy(model)
    for m in expected.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    expected.train()
    with torch.no_grad():
        for x, _ in list(image_loader(n=64, batch_size=16))[2:4]:
            expected(x)
    norm = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    by_hand = next(m for m in expected.modules() if isinstance(m, torch.nn.BatchNorm2d))
    assert not torch.equal(norm.running_mean, by_hand.running_mean)


def test_a_dict_batch_without_batch_keys_is_refused_naming_batch_keys() -> None:
    model = PlainResNet(dict_batches=True)
    del model.batch_keys
    callback = AlgorithmEngineCallback([ScheduleFree()], seed=1)
    with pytest.raises(Exception, match=r"no input tensor at input_key=0.*batch_keys = \{'input_key'"):
        quiet_trainer(max_steps=2, max_epochs=-1, callbacks=[callback]).fit(model, as_dicts(image_loader(n=32)))


class NoForward(L.LightningModule):
    """Calls its network inside training_step and defines no forward."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = ResNetCNN(num_classes=4, in_channels=1, widths=(8, 16), blocks_per_stage=1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        return schedulefree.AdamWScheduleFree(self.parameters(), lr=0.01)


def test_a_module_without_forward_is_refused_at_fit_start() -> None:
    callback = AlgorithmEngineCallback([ScheduleFree()], seed=1)
    trainer = quiet_trainer(max_steps=2, max_epochs=-1, callbacks=[callback])
    with pytest.raises(Exception, match=r"NoForward defines no forward.*batchnorm_batches=0"):
        trainer.fit(NoForward(), image_loader(n=32))
    assert trainer.global_step == 0  # before any training
