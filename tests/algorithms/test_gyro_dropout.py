"""GyroDropout: dropout masks drawn from a fixed pool, a few active at a time, switched every period."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from composer_bridge.algorithms import GyroDropout, NoEffectWarning
from composer_bridge.algorithms.gyro_dropout import GyroDropoutLayer, gyro_period
from composer_bridge.core import Event, Logger, State, Timestamp
from composer_bridge.functional import apply_gyro_dropout


def masks_of(layer: nn.Module, batch: int = 8, features: int = 32) -> torch.Tensor:
    """The masks the layer applies, read off by passing ones (kept features come out as 1 / (1 - p))."""
    return (layer(torch.ones(batch, features)) != 0).float()


def test_evaluation_is_the_identity_and_training_keeps_features_scaled_by_one_over_keep() -> None:
    model = nn.Sequential(nn.Dropout(0.1))
    assert apply_gyro_dropout(model, iters_per_epoch=10, max_epoch=1, p=0.25, sigma=8, tau=2) == 1
    layer = model[0]
    x = torch.randn(8, 32)
    assert torch.equal(layer.eval()(x), x)
    y = layer.train()(x)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / 0.75)
    assert 0.5 < kept.float().mean() < 0.95


def test_tau_groups_of_samples_share_a_mask_from_a_pool_of_sigma() -> None:
    layer = GyroDropoutLayer(p=0.5, sigma=4, tau=2, period=1, seed=7).train()
    seen = set()
    for _ in range(40):  # a new selection every step
        masks = masks_of(layer)
        assert torch.equal(masks[0], masks[3]) and torch.equal(masks[4], masks[7])  # samples 0-3, 4-7
        seen.update({tuple(m.tolist()) for m in masks})
    assert len(seen) <= 4  # never more than sigma distinct sub-networks


def test_selection_changes_only_every_period_and_depends_only_on_the_step() -> None:
    layer = GyroDropoutLayer(p=0.5, sigma=64, tau=2, period=3, seed=1).train()
    per_step = [masks_of(layer) for _ in range(9)]
    for start in (0, 3, 6):
        assert torch.equal(per_step[start], per_step[start + 1]) and torch.equal(per_step[start], per_step[start + 2])
    assert not torch.equal(per_step[0], per_step[3])
    fresh = GyroDropoutLayer(p=0.5, sigma=64, tau=2, period=3, seed=1).train()
    fresh.training_step = 6  # a resumed run: same step, same masks
    assert torch.equal(masks_of(fresh), per_step[6])


def test_algorithm_sets_the_period_from_the_run_length_and_the_step_from_the_loop() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    state = State(model, seed=3, max_duration="4ep")
    algorithm = GyroDropout(sigma=8, tau=2)
    algorithm.apply(Event.INIT, state, Logger())
    state.dataloader_len = 10
    state.timestamp = Timestamp(batch=13)
    algorithm.apply(Event.AFTER_DATALOADER, state, Logger())
    assert model[1].period == gyro_period(40, 8, 2) == 10 and model[1].training_step == 13


def test_twice_equals_once_and_arguments_are_checked() -> None:
    model = nn.Sequential(nn.Dropout(0.5))
    apply_gyro_dropout(model, 1, 1, sigma=4, tau=2)
    with pytest.warns(NoEffectWarning, match="nn.Dropout"):
        assert apply_gyro_dropout(model, 1, 1, sigma=4, tau=2) == 0
    assert GyroDropout(sigma=4, tau=8).tau == 8  # as in Composer: the tau active masks are drawn with replacement
    with pytest.raises(ValueError, match="tau=0"):
        GyroDropout(tau=0)
    with pytest.raises(ValueError, match="p=1"):
        GyroDropout(p=1)
    algorithm = GyroDropout(p=0.3, sigma=32, tau=4)
    assert eval(repr(algorithm)) == algorithm and GyroDropout.required_on_load() and GyroDropout.unique


def test_the_layer_takes_composers_arguments_and_exposes_its_last_mask() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 48)
    layer = GyroDropoutLayer(196, 100, 0.5, 256, 16).train()  # Composer's positional order
    assert (layer.iters_per_epoch, layer.max_epoch, layer.p, layer.sigma, layer.tau) == (196, 100, 0.5, 256, 16)
    assert layer.period == int(196 * 100 / 256) * 16 == 1216
    y = layer(x)
    mask = layer.dropout_mask
    assert mask.shape == (64, 48) and set(mask.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(y, x * mask * (1 / (1 - 0.5)))  # Composer's check, element for element
    groups = mask.view(16, 4, 48)  # 16 active masks, each on 4 consecutive samples
    assert torch.equal(groups, groups[:, :1].expand(-1, 4, -1))
    assert GyroDropoutLayer(period=5).period == 5 and GyroDropoutLayer().period == 1
    with pytest.raises(ValueError, match=r"iters_per_epoch=10, max_epoch=None, period=3.*not both"):
        GyroDropoutLayer(10, period=3)
    with pytest.raises(ValueError, match=r"GyroDropoutLayer\(max_epoch=None\).*give both"):
        GyroDropoutLayer(10)
    with pytest.raises(ValueError, match=r"GyroDropoutLayer\(sigma=0\)"):
        GyroDropoutLayer(1, 1, 0.5, 0, 16)
    wide = GyroDropoutLayer(period=1, p=0.5, sigma=2, tau=8).train()  # tau > sigma: masks repeat
    masks = {tuple(m.tolist()) for m in (wide(torch.ones(8, 64)) != 0).float()}
    assert 1 <= len(masks) <= 2
