"""ProgressiveResizing on models with a fixed or minimum input size: refused at the first batch, before any
step, with the model's limit and the fix, never torch's message alone.

The models are written here in the shapes of a ViT (a fixed grid of position embeddings, timm's size
assertion) and a ConvNeXt (a patchify stem and stride-2 downsampling convolutions, which fail on
images smaller than their kernels); torchvision and timm are not dependencies.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import ComposerClassifier, L, image_dataset, quiet_trainer
from torch.utils.data import DataLoader

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import ProgressiveResizing
from composer_bridge.core.algorithm import AlgorithmError

SIZE, CLASSES = 16, 4


class TinyViT(torch.nn.Module):
    def __init__(self, patch: int = 4, dim: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.patch = torch.nn.Conv2d(1, dim, patch, stride=patch)
        self.position = torch.nn.Parameter(torch.randn(1, (SIZE // patch) ** 2, dim) * 0.02)
        self.head = torch.nn.Linear(dim, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[-2] == SIZE, f"Input height ({x.shape[-2]}) doesn't match model ({SIZE})."  # as timm's PatchEmbed
        tokens = self.patch(x).flatten(2).transpose(1, 2) + self.position
        return self.head(tokens.mean(1))


class TinyConvNeXt(torch.nn.Module):
    def __init__(self, dim: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = torch.nn.Conv2d(1, dim, 4, stride=4)  # 16 -> 4
        self.down = torch.nn.Sequential(torch.nn.GELU(), torch.nn.Conv2d(dim, dim, 2, stride=2))  # 4 -> 2
        self.head = torch.nn.Linear(dim, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.down(self.stem(x)).mean((-2, -1)))


class Plain(L.LightningModule):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    return DataLoader(image_dataset(32, size=(SIZE, SIZE), classes=CLASSES), batch_size=8)


def fit(module: L.LightningModule, algorithm: ProgressiveResizing) -> None:
    quiet_trainer(max_steps=3, callbacks=[AlgorithmEngineCallback([algorithm], seed=0)]).fit(module, loader())


def wrap(kind: str, net: torch.nn.Module) -> L.LightningModule:
    return Plain(net) if kind == "plain" else ComposerClassifier(net, CLASSES)


@pytest.mark.parametrize("kind", ["plain", "ComposerClassifier"])
def test_a_fixed_size_vit_is_refused_with_its_limit_and_the_fix(kind: str) -> None:
    module = wrap(kind, TinyViT())
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(AlgorithmError, match=r"ProgressiveResizing\(initial_scale=0.5, mode='resize'\) starts the run "
                       r"on 8x8 images \(from 16x16\), but (Plain|ComposerClassifier) fails on them \(AssertionError: Input height \(8\).*"
                       r"it takes only the full 16x16. Fix: remove ProgressiveResizing, or use a model that takes any "
                       r"image size .*dynamic_img_size=True"):
        fit(module, ProgressiveResizing(initial_scale=0.5, size_increment=4))
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())


@pytest.mark.parametrize("kind", ["plain", "ComposerClassifier"])
def test_a_convnext_with_a_minimum_size_is_refused_naming_the_initial_scale_that_works(kind: str) -> None:
    module = wrap(kind, TinyConvNeXt())
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(AlgorithmError, match=r"starts the run on 4x4 images \(from 16x16\), but (Plain|ComposerClassifier) fails on "
                       r"them \(RuntimeError: .*[Kk]ernel size.*the smallest size it takes is 8x8 \(scale 0.5\)\. "
                       r"Fix: ProgressiveResizing\(initial_scale=0.5\) or larger"):
        fit(module, ProgressiveResizing(initial_scale=0.25, size_increment=4, mode="crop"))
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())
    module = wrap(kind, TinyConvNeXt())
    fit(module, ProgressiveResizing(initial_scale=0.5, size_increment=4, mode="crop"))  # the fix it names trains
    assert not all(torch.equal(v, before[k]) for k, v in module.state_dict().items())


@pytest.mark.parametrize("mode", ["resize", "crop"])
def test_the_probe_changes_nothing_a_model_that_takes_any_size_trains_as_before(mode: str) -> None:
    """The probe runs in eval mode without gradients and draws no random number: BatchNorm statistics,
    dropout masks and the weights end as without it."""

    def net() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                   torch.nn.Dropout(0.5), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                   torch.nn.Linear(4, CLASSES))

    probed = Plain(net())
    fit(probed, ProgressiveResizing(mode, initial_scale=0.5, size_increment=4))
    unprobed = Plain(net())
    algorithm = ProgressiveResizing(mode, initial_scale=0.5, size_increment=4)
    algorithm._size_checked = True  # as if the probe had already run
    fit(unprobed, algorithm)
    for (key, got), want in zip(probed.state_dict().items(), unprobed.state_dict().values(), strict=True):
        assert torch.equal(got, want), key
