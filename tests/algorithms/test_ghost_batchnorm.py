"""GhostBatchNorm: per-chunk statistics in training, plain batch norm in evaluation."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from composer_bridge.algorithms import GhostBatchNorm, NoEffectWarning
from composer_bridge.algorithms.ghost_batchnorm import GhostBatchNormWrapper
from composer_bridge.functional import apply_ghost_batchnorm


def net() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(36, 6), nn.BatchNorm1d(6))
    model.train()(torch.randn(32, 2, 5, 5))  # non-trivial running statistics
    return model


def test_in_evaluation_it_equals_the_original_batch_norm() -> None:
    model = net()
    original = copy.deepcopy(model).eval()
    assert apply_ghost_batchnorm(model, ghost_batch_size=4) == 2
    x = torch.randn(12, 2, 5, 5)
    torch.testing.assert_close(model.eval()(x), original(x))


def test_in_training_each_chunk_is_normalised_with_its_own_statistics() -> None:
    bn = nn.BatchNorm1d(3, affine=False)
    model = nn.Sequential(bn)
    apply_ghost_batchnorm(model, ghost_batch_size=4)
    x = torch.randn(12, 3) * 3 + 1
    y = model.train()(x)
    for chunk in range(3):  # (x - mean) / sqrt(var + eps), biased variance, per chunk of 4 samples
        part = x[4 * chunk:4 * chunk + 4]
        expected = (part - part.mean(0)) / torch.sqrt(part.var(0, unbiased=False) + bn.eps)
        torch.testing.assert_close(y[4 * chunk:4 * chunk + 4], expected)
    assert bn.momentum == 0.1  # restored after the forward


def test_running_statistics_move_about_as_fast_as_with_plain_batch_norm() -> None:
    x = torch.randn(64, 3) + 2
    plain, ghost = nn.BatchNorm1d(3), nn.Sequential(nn.BatchNorm1d(3))
    apply_ghost_batchnorm(ghost, ghost_batch_size=16)
    plain.train()(x)
    ghost.train()(x)
    torch.testing.assert_close(ghost[0].batchnorm.running_mean, plain.running_mean, atol=0.02, rtol=0.05)


def test_small_batches_are_normalised_whole_and_applying_twice_equals_once() -> None:
    model = net()
    apply_ghost_batchnorm(model, ghost_batch_size=32)
    assert isinstance(model[1], GhostBatchNormWrapper)
    model.train()(torch.randn(5, 2, 5, 5))  # fewer samples than ghost_batch_size: no error
    keys = list(model.state_dict())
    with pytest.warns(NoEffectWarning):
        assert apply_ghost_batchnorm(model, ghost_batch_size=32) == 0
    assert list(model.state_dict()) == keys


def test_bad_size_is_named_and_repr_evaluates_back() -> None:
    with pytest.raises(ValueError, match="ghost_batch_size=0"):
        GhostBatchNorm(0)
    algorithm = GhostBatchNorm(ghost_batch_size=8)
    assert eval(repr(algorithm)) == algorithm and GhostBatchNorm.required_on_load() and GhostBatchNorm.unique
