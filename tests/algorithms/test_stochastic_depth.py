"""StochasticDepth: residual branches dropped at random in training, scaled in evaluation."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from composer_bridge.algorithms import NoEffectWarning, StochasticDepth
from composer_bridge.algorithms.stochastic_depth import StochasticBlock
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
    with pytest.raises(ValueError, match=r"registered: \['BasicBlock', 'Bottleneck', 'ResNetBottleneck'\].*policy=\{YourBlock: fn\}"):
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


# Local stand-ins for torchvision.models.resnet's blocks: same class names, attribute names and forward.
class BasicBlockReplica(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class BottleneckReplica(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


BasicBlockReplica.__name__ = BasicBlockReplica.__qualname__ = "BasicBlock"
BottleneckReplica.__name__ = BottleneckReplica.__qualname__ = "Bottleneck"


def torchvision_style_resnet() -> nn.Sequential:
    torch.manual_seed(0)
    down = nn.Sequential(nn.Conv2d(8, 16, 1, stride=2, bias=False), nn.BatchNorm2d(16))
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
        BasicBlockReplica(8, 8),
        BottleneckReplica(8, 4, stride=2, downsample=down),
        BottleneckReplica(16, 4),
    )
    for m in model.modules():  # non-trivial BatchNorm statistics so evaluation mode is a real check
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
    return model


def bottleneck_branch(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = torch.relu(block.bn1(block.conv1(x)))
    out = torch.relu(block.bn2(block.conv2(out)))
    return block.bn3(block.conv3(out))


def test_torchvision_bottlenecks_are_recognised_by_name_and_layout_and_scaled_in_evaluation() -> None:
    model = torchvision_style_resnet().eval()
    original = copy.deepcopy(model)
    x = torch.randn(2, 3, 8, 8)
    assert apply_stochastic_depth(model, "ResNetBottleneck", drop_rate=0.4) == 2  # Composer's name for it
    assert isinstance(model[2], BasicBlockReplica)  # a Bottleneck target leaves BasicBlocks alone
    assert [model[3].drop_rate, model[4].drop_rate] == pytest.approx([0.2, 0.4])
    h = original[2](original[1](original[0](x)))
    first, second = original[3], original[4]
    h = torch.relu(0.8 * bottleneck_branch(first, h) + first.downsample(h))
    expected = torch.relu(0.6 * bottleneck_branch(second, h) + h)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected)
    other = torchvision_style_resnet()
    assert apply_stochastic_depth(other, "Bottleneck", drop_rate=0.4) == 2
    assert apply_stochastic_depth(other, "BasicBlock", drop_rate=0.4) == 1
    assert isinstance(other[2].block, BasicBlockReplica)


def test_torchvision_blocks_in_training_drop_to_the_shortcut_as_the_generator_says() -> None:
    model = torchvision_style_resnet().train()
    original = copy.deepcopy(model).train()
    apply_stochastic_depth(model, "Bottleneck", drop_rate=0.5, drop_distribution="uniform",
                           generator=torch.Generator().manual_seed(3))
    replay = torch.Generator().manual_seed(3)
    x = torch.relu(torch.randn(4, 8, 8, 8))
    outcomes = []
    for _ in range(10):
        drop = bool(torch.rand((), generator=replay) < 0.5)
        expected = torch.relu(original[3].downsample(x)) if drop else original[3](x.clone())
        torch.testing.assert_close(model[3](x), expected)
        outcomes.append(drop)
    assert any(outcomes) and not all(outcomes)


def test_a_module_named_like_a_torchvision_block_but_laid_out_differently_is_left_alone() -> None:
    class Bottleneck(nn.Module):  # no bn3, no downsample attribute
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1, self.relu = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2), nn.ReLU()

    with pytest.warns(NoEffectWarning):
        assert apply_stochastic_depth(nn.Sequential(Bottleneck()), "Bottleneck") == 0


def test_a_dropped_torchvision_block_passes_its_input_through_as_composers_does() -> None:
    model = torchvision_style_resnet().train()
    apply_stochastic_depth(model, "Bottleneck", drop_rate=1.0, drop_distribution="uniform")
    x = torch.randn(2, 16, 4, 4)  # negative values too: no activation on the identity path
    assert model[4](x) is x
    y = torch.randn(2, 8, 8, 8)
    torch.testing.assert_close(model[3](y), torch.relu(model[3].block.downsample(y)))
    kept = torchvision_style_resnet().train()
    reference = copy.deepcopy(kept)
    apply_stochastic_depth(kept, "Bottleneck", drop_rate=0.0)
    torch.testing.assert_close(kept[4](x), reference[4](x.clone()))
