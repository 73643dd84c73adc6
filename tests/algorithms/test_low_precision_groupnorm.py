"""LowPrecisionGroupNorm: GroupNorm computed in bf16 under autocast, equal to fp32 within bf16 precision."""

from __future__ import annotations

import pytest
import torch
from helpers.tolerances import EPS32, EPS_BF16, assert_within, normalization_bound, rounding_bound
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
    groups = x.double().view(3, 2, -1)  # by hand, in float64: normalise each group of 3 channels over channels and space
    sd = (groups.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    xhat = ((groups - groups.mean(-1, keepdim=True)) / sd).view_as(x)
    x_max, sd = (t.expand_as(groups).reshape_as(x) for t in (groups.abs().amax(-1, keepdim=True), sd))
    gamma, beta = gamma.double()[:, None, None], beta.double()[:, None, None]
    exact = gamma * xhat + beta
    # Within what the computation may change (helpers/tolerances.py). Under autocast: x, the weight and the bias
    # rounded to bf16 (unit roundoff 2**-8, the same on every CPU) and the output once more; the statistics summed in
    # float32. Without: GroupNorm's float32 kernel, whose sums over a group's 3 x 16 values are ordered by the CPU's
    # vector width, off by 48 x eps, and the output's rounding.
    unit = EPS_BF16 / 2
    assert_within(y, exact, normalization_bound(x_max, xhat, sd, gamma, beta, 2 * unit, unit), "bf16 GroupNorm")
    float32 = normalization_bound(x_max, xhat, sd, gamma, beta, rounding_bound(48, 1.0), EPS32)
    assert_within(model(x), exact, float32, "GroupNorm without autocast")


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
