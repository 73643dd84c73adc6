"""The random draws the data-augmenting algorithms share (composer_bridge/algorithms/_draws.py)."""

from __future__ import annotations

import math

import pytest
import torch

from composer_bridge.algorithms import _augment_ops as ops
from composer_bridge.algorithms._draws import log_gamma, sample_beta


@pytest.mark.parametrize("shape", [0.3, 1.0, 4.0])
def test_the_gamma_sampler_has_the_gamma_mean_and_variance(shape: float) -> None:
    draws = log_gamma(shape, (40000,), torch.Generator().manual_seed(0), torch.device("cpu")).exp()
    assert draws.mean().item() == pytest.approx(shape, rel=0.04)
    assert draws.var().item() == pytest.approx(shape, rel=0.08)


def test_tiny_shapes_stay_finite_in_log_space() -> None:
    draws = log_gamma(0.01, (1000,), torch.Generator().manual_seed(0))
    assert torch.isfinite(draws).all() and draws.dtype == torch.float64


@pytest.mark.parametrize("alpha", [0.2, 1.0, 3.0])
def test_mixups_beta_and_augmixs_beta_are_the_same_draw_of_the_one_gamma_sampler(alpha: float) -> None:
    """MixUp/CutMix (sample_beta) and AugMix (sample_symmetric_beta) read one sampler: same generator, same value."""
    scalar = sample_beta(alpha, torch.Generator().manual_seed(5))
    rows = ops.sample_symmetric_beta(alpha, 1, torch.Generator().manual_seed(5), torch.device("cpu"))
    log_x, log_y = log_gamma(alpha, (2,), torch.Generator().manual_seed(5)).tolist()
    assert scalar == pytest.approx(float(rows[0]), abs=1e-15)
    assert scalar == pytest.approx(1 / (1 + math.exp(log_y - log_x)), abs=1e-15)


def test_a_beta_draw_takes_a_fixed_number_of_values_from_the_generator() -> None:
    """Whatever the draws are, a generator stands at the same place after one: resuming it needs no draw count."""
    states = set()
    for seed in range(5):
        a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        sample_beta(0.4, a)
        torch.rand(2, generator=b, dtype=torch.float64)  # the boost of shapes below 1
        torch.randn(2, 8, generator=b, dtype=torch.float64)  # the proposals
        torch.rand(2, 8, generator=b, dtype=torch.float64)  # their acceptance draws
        assert torch.equal(a.get_state(), b.get_state())
        states.add(bytes(a.get_state().numpy()))
    assert len(states) == 5
