"""ChannelsLast: the layout of 4-d weights changes, the outputs do not."""

from __future__ import annotations

import copy

import pytest
import torch

from composer_bridge.algorithms import ChannelsLast, NoEffectWarning
from composer_bridge.functional import apply_channels_last
from composer_bridge.models import ResNetCNN


def test_outputs_are_unchanged_and_conv_weights_are_channels_last() -> None:
    torch.manual_seed(0)
    model = ResNetCNN(num_classes=4, in_channels=3, widths=(8, 16), blocks_per_stage=1).eval()
    original = copy.deepcopy(model)
    convs = sum(1 for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    assert apply_channels_last(model) == convs
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            assert m.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(3, 3, 9, 9)
    torch.testing.assert_close(model(x), original(x))
    torch.testing.assert_close(model(x.to(memory_format=torch.channels_last)), original(x))


def test_applying_twice_equals_once_and_the_second_time_warns() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    apply_channels_last(model)
    stride = model[0].weight.stride()
    with pytest.warns(NoEffectWarning, match="ChannelsLast replaced no module"):
        assert apply_channels_last(model) == 0
    assert model[0].weight.stride() == stride


def test_algorithm_has_no_hyperparameters_and_is_a_unique_required_surgery() -> None:
    assert eval(repr(ChannelsLast())) == ChannelsLast()
    assert ChannelsLast.required_on_load() and ChannelsLast.unique
