"""SqueezeExcite: a channel gate after wide convolutions, checked against the formula."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from composer_bridge.algorithms import NoEffectWarning, SqueezeExcite
from composer_bridge.algorithms.squeeze_excite import SqueezeExciteConv2d
from composer_bridge.functional import apply_squeeze_excite


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.Conv2d(16, 16, 1))


def test_block_multiplies_each_channel_by_a_sigmoid_gate_of_its_mean() -> None:
    model = net()
    conv = model[2]
    assert apply_squeeze_excite(model, latent_channels=0.25, min_channels=8) == 2
    block = model[2]
    assert isinstance(block, SqueezeExciteConv2d) and block.conv is conv
    assert block.se.fc1.out_features == 4  # a quarter of the 16 output channels
    x = torch.randn(2, 8, 7, 7)
    y = conv(x)
    gate = torch.empty(2, 16)
    for n in range(2):  # per sample: mean per channel -> W1 -> relu -> W2 -> sigmoid
        pooled = y[n].mean(dim=(1, 2))
        gate[n] = torch.sigmoid(block.se.fc2.weight @ torch.relu(block.se.fc1.weight @ pooled))
    torch.testing.assert_close(block(x), y * gate[:, :, None, None])


def test_latent_channels_at_least_one_is_an_absolute_width() -> None:
    model = net()
    apply_squeeze_excite(model, latent_channels=5, min_channels=16)
    assert isinstance(model[3], SqueezeExciteConv2d) and model[3].se.fc1.out_features == 5
    assert isinstance(model[2], nn.Conv2d)  # in_channels 8 < 16


def test_optimizer_gains_the_new_gate_weights_and_applying_twice_equals_once() -> None:
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    apply_squeeze_excite(model, latent_channels=4, min_channels=8, optimizers=opt)
    assert {id(p) for p in opt.param_groups[0]["params"]} == {id(p) for p in model.parameters()}
    before = repr(model)
    with pytest.warns(NoEffectWarning):
        assert apply_squeeze_excite(model, latent_channels=4, min_channels=8, optimizers=opt) == 0
    assert repr(model) == before


def test_bad_arguments_are_named_and_repr_evaluates_back() -> None:
    with pytest.raises(ValueError, match="latent_channels=0"):
        SqueezeExcite(latent_channels=0)
    with pytest.raises(ValueError, match="min_channels=-3"):
        SqueezeExcite(min_channels=-3)
    algorithm = SqueezeExcite(latent_channels=0.5, min_channels=16)
    assert eval(repr(algorithm)) == algorithm and SqueezeExcite.required_on_load() and SqueezeExcite.unique


def test_the_blocks_are_exported_and_take_composers_arguments() -> None:
    from composer_bridge.algorithms import SqueezeExcite2d as Exported2d
    from composer_bridge.algorithms import SqueezeExciteConv2d as ExportedConv2d

    torch.manual_seed(0)
    assert ExportedConv2d is SqueezeExciteConv2d
    conv = nn.Conv2d(3, 16, 3)
    for layer in (ExportedConv2d(conv=conv, latent_channels=4), ExportedConv2d.from_conv2d(conv, 0, latent_channels=4),
                  ExportedConv2d(conv, 4)):
        assert layer.conv is conv and layer.se.fc1.out_features == 4
    built = ExportedConv2d(3, 16, 3, padding=1, latent_channels=0.5)
    assert built.conv.padding == (1, 1) and built.conv.out_channels == 16 and built.se.latent_channels == 8
    block = Exported2d(16, latent_channels=0.25)
    x = torch.randn(2, 16, 5, 5)
    gate = torch.sigmoid(torch.relu(x.mean(dim=(2, 3)) @ block.fc1.weight.T) @ block.fc2.weight.T)
    torch.testing.assert_close(block(x), x * gate[:, :, None, None])
    with pytest.raises(TypeError, match="not both"):
        ExportedConv2d(3, 16, 3, conv=conv)
