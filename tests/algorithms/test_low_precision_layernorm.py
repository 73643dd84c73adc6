"""LowPrecisionLayerNorm: LayerNorm computed in bf16 under autocast, equal to fp32 within bf16 precision."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.tolerances import EPS_BF16, assert_within, normalization_bound
from torch import nn

from composer_bridge.algorithms import LowPrecisionLayerNorm, NoEffectWarning
from composer_bridge.algorithms.low_precision_layernorm import LPLayerNorm
from composer_bridge.core.event import Event
from composer_bridge.functional import apply_low_precision_layernorm


def net() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 4))
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.5, 0.5)
    return model


def test_under_autocast_it_runs_in_bf16_and_matches_fp32_layernorm_within_bf16_tolerance() -> None:
    model = net()
    reference = copy.deepcopy(model[1])
    weight = model[1].weight
    assert apply_low_precision_layernorm(model, precision="bf16-mixed") == 1
    assert isinstance(model[1], LPLayerNorm) and model[1].weight is weight  # shared parameters
    x = torch.randn(8, 32) * 4 + 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model[1](x)
    assert y.dtype == torch.bfloat16
    # Against LayerNorm in float64, within what bf16 may change (helpers/tolerances.py): x, the weight and the bias
    # rounded to bf16 (unit roundoff 2**-8, the same on every CPU), the output rounded once more; the statistics are
    # summed in float32 (in another order on another CPU, 32 x eps, nothing beside bf16's rounding).
    x64, gamma, beta = x.double(), reference.weight.detach().double(), reference.bias.detach().double()
    sd = (x64.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    xhat = (x64 - x64.mean(-1, keepdim=True)) / sd
    unit = EPS_BF16 / 2
    bound = normalization_bound(x64.abs().amax(-1, keepdim=True), xhat, sd, gamma, beta, 2 * unit, unit)
    assert_within(y, gamma * xhat + beta, bound, "bf16 LayerNorm")
    assert torch.equal(model[1](x), reference(x))  # without autocast: LayerNorm's own kernel, on the same input


def test_full_precision_changes_nothing_and_says_so() -> None:
    model = net()
    with pytest.warns(NoEffectWarning, match="mixed precision"):
        assert apply_low_precision_layernorm(model, precision="32-true") == 0
    assert type(model[1]) is nn.LayerNorm


def test_applying_twice_equals_once() -> None:
    model = net()
    apply_low_precision_layernorm(model, precision="16-mixed")
    before = repr(model)
    with pytest.warns(NoEffectWarning, match="nn.LayerNorm"):
        assert apply_low_precision_layernorm(model, precision="16-mixed") == 0
    assert repr(model) == before


def test_apply_at_is_checked_and_repr_evaluates_back() -> None:
    with pytest.raises(ValueError, match="apply_at='fit_start'"):
        LowPrecisionLayerNorm(apply_at="fit_start")
    algorithm = LowPrecisionLayerNorm(apply_at=Event.AFTER_LOAD)
    assert algorithm.apply_at == "after_load" and eval(repr(algorithm)) == algorithm
    assert LowPrecisionLayerNorm.required_on_load() and LowPrecisionLayerNorm.unique and algorithm.runs_last
