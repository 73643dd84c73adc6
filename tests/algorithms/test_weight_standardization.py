"""WeightStandardization: convolutions see zero-mean, unit-variance filters."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from composer_bridge.algorithms import NoEffectWarning, WeightStandardization
from composer_bridge.functional import apply_weight_standardization


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 1))


def test_forward_uses_standardised_filters() -> None:
    model = net()
    raw = model[0].weight.detach().clone()
    param = model[0].weight
    assert apply_weight_standardization(model) == 3
    standard = torch.empty_like(raw)
    for o in range(raw.shape[0]):  # per output channel: (w - mean) / sqrt(biased var + 1e-10)
        w = raw[o]
        standard[o] = (w - w.mean()) / torch.sqrt(((w - w.mean()) ** 2).mean() + 1e-10)
    x = torch.randn(2, 3, 6, 6)
    torch.testing.assert_close(model[0](x), F.conv2d(x, standard, model[0].bias))
    assert model[0].parametrizations.weight.original is param  # the parameter is kept


def test_last_layers_can_be_left_alone_and_applying_twice_equals_once() -> None:
    model = net()
    assert apply_weight_standardization(model, n_last_layers_ignore=1) == 2
    assert not hasattr(model[4], "parametrizations")
    keys = list(model.state_dict())
    with pytest.warns(NoEffectWarning):
        assert apply_weight_standardization(model, n_last_layers_ignore=1) == 0
    assert list(model.state_dict()) == keys


def test_bad_argument_is_named_and_repr_evaluates_back() -> None:
    with pytest.raises(ValueError, match="n_last_layers_ignore=-1"):
        WeightStandardization(-1)
    algorithm = WeightStandardization(n_last_layers_ignore=2)
    assert eval(repr(algorithm)) == algorithm
    assert WeightStandardization.required_on_load() and WeightStandardization.unique
