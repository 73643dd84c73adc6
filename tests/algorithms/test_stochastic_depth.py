"""StochasticDepth: residual branches dropped at random in training, scaled in evaluation."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from composer_bridge.algorithms import StochasticDepth
from composer_bridge.algorithms.stochastic_depth import StochasticBlock
from composer_bridge.algorithms.surgery import NoEffectWarning
from composer_bridge.core import Event, Logger, State, Timestamp
from composer_bridge.functional import apply_stochastic_depth
from composer_bridge.models import ResNetCNN
from composer_bridge.models.resnet import BasicBlock


def resnet() -> ResNetCNN:
    torch.manual_seed(0)
    return ResNetCNN(num_classes=3, in_channels=1, widths=(4, 8), blocks_per_stage=1)


def test_in_evaluation_the_residual_branch_is_scaled_by_the_keep_probability() -> None:
    model = resnet().eval()
    block = copy.deepcopy(model.layers[1])
    apply_stochastic_depth(model, drop_rate=0.4, drop_distribution="uniform")
    x = torch.relu(torch.randn(2, 4, 6, 6))
    expected = torch.relu(0.6 * block.residual(x) + block.shortcut(x))
    torch.testing.assert_close(model.layers[1](x), expected)


def test_block_mode_drops_whole_branches_as_the_generator_says() -> None:
    model = resnet().train()
    block = copy.deepcopy(model.layers[1]).train()
    apply_stochastic_depth(model, drop_rate=0.5, drop_distribution="uniform", generator=torch.Generator().manual_seed(3))
    replay = torch.Generator().manual_seed(3)
    x = torch.relu(torch.randn(2, 4, 6, 6))
    stochastic = model.layers[1]
    outcomes = []
    for _ in range(12):
        drop = bool(torch.rand((), generator=replay) < 0.5)
        expected = torch.relu(block.shortcut(x)) if drop else block(x)
        torch.testing.assert_close(stochastic(x), expected)
        outcomes.append(drop)
    assert any(outcomes) and not all(outcomes)


def test_sample_mode_zeroes_the_branch_of_each_dropped_sample() -> None:
    model = resnet().train()
    block = copy.deepcopy(model.layers[1]).train()
    apply_stochastic_depth(model, stochastic_method="sample", drop_rate=0.5, drop_distribution="uniform",
                           generator=torch.Generator().manual_seed(5))
    keep = torch.rand(16, generator=torch.Generator().manual_seed(5)) >= 0.5
    x = torch.relu(torch.randn(16, 4, 6, 6))
    residual = block.residual(x)
    expected = torch.relu(residual * keep.float()[:, None, None, None] + block.shortcut(x))
    torch.testing.assert_close(model.layers[1](x), expected)


def test_linear_distribution_grows_with_depth_and_twice_equals_once() -> None:
    model = ResNetCNN(widths=(4, 8, 8), blocks_per_stage=1)
    assert apply_stochastic_depth(model, drop_rate=0.3) == 3
    assert [b.drop_rate for b in model.layers] == pytest.approx([0.1, 0.2, 0.3])
    keys = list(model.state_dict())
    with pytest.warns(NoEffectWarning):
        assert apply_stochastic_depth(model, drop_rate=0.3) == 0
    assert list(model.state_dict()) == keys


class PlainBlock(nn.Module):
    """A user's residual block: ``x + branch(x)``, no shortcut module, no final activation."""

    def __init__(self) -> None:
        super().__init__()
        self.branch = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(x)


def test_users_register_their_own_blocks_through_the_policy_argument() -> None:
    policy = {PlainBlock: lambda block, rate, method: StochasticBlock(block, rate, method, residual="branch",
                                                                        shortcut=None, activation=None)}
    model = nn.Sequential(PlainBlock(), PlainBlock()).eval()
    original = copy.deepcopy(model)
    assert apply_stochastic_depth(model, "PlainBlock", drop_rate=0.5, policy=policy) == 2
    x = torch.randn(3, 4)
    inner = x + 0.75 * original[0].branch(x)  # linear: the first of two blocks drops with 0.25
    expected = inner + 0.5 * original[1].branch(inner)  # the second with the full 0.5
    torch.testing.assert_close(model[1](model[0](x)), expected)
    with pytest.raises(ValueError, match=r"registered: \['BasicBlock'\].*policy=\{YourBlock: fn\}"):
        StochasticDepth("PlainBlock")
    with pytest.raises(ValueError, match="no callable 'missing'"):
        StochasticBlock(PlainBlock(), 0.1, residual="missing")


def test_algorithm_draws_from_the_run_generator_and_warms_up_the_drop_rate() -> None:
    def run(seed: int) -> list[float]:
        model = resnet().train()
        state = State(model, seed=seed, max_duration="10ba")
        algorithm = StochasticDepth(drop_rate=0.5, drop_distribution="uniform", drop_warmup="0.5dur")
        logger = Logger()
        algorithm.apply(Event.INIT, state, logger)
        state.timestamp = Timestamp(batch=2)
        algorithm.apply(Event.BATCH_START, state, logger)
        assert [b.drop_rate for b in model.layers] == pytest.approx([0.2, 0.2])  # 2 of 5 warm-up steps done
        algorithm.apply(Event.AFTER_DATALOADER, state, logger)
        x = torch.relu(torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(0)))
        with torch.no_grad():
            return [float(model.layers[1](x).sum()) for _ in range(8)]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_block_mode_needs_unused_parameters_and_arguments_are_checked() -> None:
    assert StochasticDepth().find_unused_parameters
    assert not StochasticDepth(stochastic_method="sample").find_unused_parameters
    algorithm = StochasticDepth(drop_rate=0.1, drop_distribution="uniform", drop_warmup="0.1dur")
    assert eval(repr(algorithm)) == algorithm and StochasticDepth.required_on_load() and StochasticDepth.unique
    with pytest.raises(ValueError, match="drop_rate=1.5"):
        StochasticDepth(drop_rate=1.5)
    with pytest.raises(ValueError, match="stochastic_method='layer'"):
        StochasticDepth(stochastic_method="layer")
    with pytest.raises(ValueError, match="only works with stochastic_method='block'"):
        StochasticDepth(stochastic_method="sample", drop_warmup=0.2)
    assert isinstance(resnet().layers[0], BasicBlock)
