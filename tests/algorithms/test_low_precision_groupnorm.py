"""LowPrecisionGroupNorm: GroupNorm computed in bf16 under autocast, equal to fp32 within bf16 precision."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from composer_bridge.algorithms import LowPrecisionGroupNorm, NoEffectWarning
from composer_bridge.algorithms.low_precision_groupnorm import LPGroupNorm
from composer_bridge.functional import apply_low_precision_groupnorm, apply_low_precision_layernorm


def test_under_autocast_it_runs_in_bf16_and_matches_fp32_groupnorm_within_bf16_tolerance() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.GroupNorm(2, 6))
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.5)
        model[0].bias.uniform_(-0.5, 0.5)
    gamma, beta = model[0].weight.detach().clone(), model[0].bias.detach().clone()
    assert apply_low_precision_groupnorm(model, precision="bf16-mixed") == 1
    assert isinstance(model[0], LPGroupNorm)
    x = torch.randn(3, 6, 4, 4) * 3 - 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x)
    assert y.dtype == torch.bfloat16
    groups = x.view(3, 2, -1)  # by hand: normalise each group of 3 channels over channels and space
    normed = ((groups - groups.mean(-1, keepdim=True)) / torch.sqrt(groups.var(-1, unbiased=False, keepdim=True) + 1e-5))
    fp32 = normed.view_as(x) * gamma[:, None, None] + beta[:, None, None]
    torch.testing.assert_close(y.float(), fp32, atol=0.05, rtol=0.02)
    torch.testing.assert_close(model(x), fp32, atol=1e-5, rtol=1e-5)  # no autocast: exact GroupNorm


def test_full_precision_changes_nothing_twice_equals_once_and_repr_evaluates_back() -> None:
    model = nn.Sequential(nn.GroupNorm(2, 4))
    with pytest.warns(NoEffectWarning, match="mixed precision"):
        assert apply_low_precision_groupnorm(model, precision=None) == 0
    apply_low_precision_groupnorm(model, precision="bf16-mixed")
    with pytest.warns(NoEffectWarning, match="nn.GroupNorm"):
        assert apply_low_precision_groupnorm(model, precision="bf16-mixed") == 0
    algorithm = LowPrecisionGroupNorm(apply_at="before_load")
    assert eval(repr(algorithm)) == algorithm and LowPrecisionGroupNorm.required_on_load()


@pytest.mark.parametrize("apply, norm", [
    (apply_low_precision_groupnorm, lambda: nn.GroupNorm(2, 4)),
    (apply_low_precision_layernorm, lambda: nn.LayerNorm(4)),
])
def test_both_no_effect_warnings_point_at_the_callers_line(apply, norm) -> None:
    with pytest.warns(NoEffectWarning, match="mixed precision") as fp32:
        apply(nn.Sequential(norm()), precision="32-true")
    with pytest.warns(NoEffectWarning, match="replaced no module") as nothing:
        apply(nn.Sequential(nn.Linear(4, 4)), precision="bf16-mixed")
    assert {record.filename for record in [*fp32, *nothing]} == {__file__}
