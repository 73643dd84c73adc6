"""Factorize: low-rank pairs initialised from the SVD; exact at full rank, replaced only where it pays."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from composer_bridge.algorithms import Factorize
from composer_bridge.algorithms.factorize import FactorizedConv2d, FactorizedLinear, factorizing_could_speedup
from composer_bridge.algorithms.surgery import NoEffectWarning
from composer_bridge.functional import apply_factorization
from composer_bridge.models import GPT


def test_factorised_linear_at_full_rank_reproduces_the_original() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(12, 7)
    full = FactorizedLinear.from_linear(linear, latent_features=7)
    x = torch.randn(5, 12)
    torch.testing.assert_close(full(x), linear(x), atol=1e-5, rtol=1e-5)


def test_factorised_conv_at_full_rank_reproduces_the_original() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1)
    full = FactorizedConv2d.from_conv2d(conv, latent_channels=6)
    x = torch.randn(2, 4, 9, 9)
    torch.testing.assert_close(full(x), conv(x), atol=1e-5, rtol=1e-5)


def test_low_rank_factors_are_the_truncated_svd() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(16, 16, bias=False)
    low = FactorizedLinear.from_linear(linear, latent_features=3)
    product = low.module1.weight @ low.module0.weight
    u, s, vh = torch.linalg.svd(linear.weight.detach().double())
    best = (u[:, :3] * s[:3]) @ vh[:3]  # Eckart-Young: the closest rank-3 matrix
    torch.testing.assert_close(product.double(), best, atol=1e-5, rtol=1e-5)


def test_surgery_replaces_only_layers_wide_enough_and_where_it_saves_work() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3), nn.Conv2d(16, 4, 1), nn.Flatten(), nn.Linear(64, 64), nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    old = [model[0].weight, model[3].weight]
    n = apply_factorization(model, min_channels=8, latent_channels=0.25, min_features=16, latent_features=0.25,
                            optimizers=opt)
    assert n == 2 and isinstance(model[0], FactorizedConv2d) and isinstance(model[3], FactorizedLinear)
    assert isinstance(model[1], nn.Conv2d) and isinstance(model[4], nn.Linear)  # too narrow
    assert model[0].latent_channels == 4 and model[3].latent_features == 16
    in_opt = {id(p) for p in opt.param_groups[0]["params"]}
    assert in_opt == {id(p) for p in model.parameters()} and not any(id(p) in in_opt for p in old)
    assert not factorizing_could_speedup(nn.Linear(8, 8), 4)  # 2 * 8 * 4 multiply-adds = 8 * 8
    assert factorizing_could_speedup(nn.Linear(8, 8), 3)


def test_tied_weights_and_attention_projections_are_left_alone_and_twice_equals_once() -> None:
    torch.manual_seed(0)
    gpt = GPT(vocab_size=64, block_size=8, d_model=64, n_layers=1, n_heads=2)
    apply_factorization(gpt, min_features=32, latent_features=8)
    assert isinstance(gpt.head, nn.Linear) and gpt.head.weight is gpt.tok_emb.weight
    assert isinstance(gpt.blocks[0].mlp.fc1, FactorizedLinear)
    mha = nn.Sequential(nn.MultiheadAttention(64, 2))
    with pytest.warns(NoEffectWarning):
        assert apply_factorization(mha, min_features=32, latent_features=8) == 0
    before = copy.deepcopy(gpt.state_dict())
    with pytest.warns(NoEffectWarning):
        assert apply_factorization(gpt, min_features=32, latent_features=8) == 0
    assert gpt.state_dict().keys() == before.keys()


def test_bad_arguments_are_named_and_repr_evaluates_back() -> None:
    with pytest.raises(ValueError, match="latent_channels=1.5"):
        Factorize(latent_channels=1.5)
    with pytest.raises(ValueError, match="min_features=0"):
        Factorize(min_features=0)
    with pytest.raises(ValueError, match="between 1 and 7"):
        FactorizedLinear(12, 7, latent_features=9)
    algorithm = Factorize(factorize_convs=False, min_features=32, latent_features=0.5)
    assert eval(repr(algorithm)) == algorithm and Factorize.required_on_load() and Factorize.unique
    assert Factorize().min_channels == 256 and Factorize().latent_features == 128  # Composer's class defaults
