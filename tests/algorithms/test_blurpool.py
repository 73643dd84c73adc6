"""BlurPool: anti-aliased strided convolutions and max-pools, checked against a hand-written blur."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from composer_bridge.algorithms import BlurPool, NoEffectWarning
from composer_bridge.algorithms.blurpool import BlurConv2d, BlurMaxPool2d, BlurPool2d, blur_2d, blurmax_pool2d
from composer_bridge.functional import apply_blurpool


def blur_by_hand(x: torch.Tensor) -> torch.Tensor:
    """Each channel convolved with [1 2 1]^T [1 2 1] / 16, zero padding, written as a sum of shifts."""
    taps = [[1, 2, 1], [2, 4, 2], [1, 2, 1]]
    padded = F.pad(x, (1, 1, 1, 1))
    h, w = x.shape[-2:]
    return sum(taps[i][j] / 16 * padded[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3))


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.MaxPool2d(2),
        nn.Conv2d(16, 8, 3, stride=2, padding=1),
    )


def test_strided_conv_becomes_blur_then_the_same_conv() -> None:
    model = net()
    original = copy.deepcopy(model)
    weight = model[1].weight
    assert apply_blurpool(model) == 3
    assert isinstance(model[1], BlurConv2d) and isinstance(model[2], BlurMaxPool2d) and isinstance(model[3], BlurConv2d)
    assert isinstance(model[0], nn.Conv2d)  # stride 1: untouched
    x = torch.randn(2, 16, 12, 12)
    conv = original[1]
    expected = F.conv2d(blur_by_hand(x), conv.weight, conv.bias, stride=2, padding=1)
    torch.testing.assert_close(model[1](x), expected)
    assert model[1].conv.weight is weight  # the weights are kept, so optimizers stay valid


def test_blur_after_conv_runs_the_conv_at_stride_one_then_subsamples() -> None:
    model = net()
    conv = copy.deepcopy(model[1])
    apply_blurpool(model, blur_first=False, replace_maxpools=False)
    x = torch.randn(2, 16, 12, 12)
    expected = blur_by_hand(F.conv2d(x, conv.weight, conv.bias, stride=1, padding=1))[:, :, ::2, ::2]
    torch.testing.assert_close(model[1](x), expected)
    assert isinstance(model[2], nn.MaxPool2d)


def test_maxpool_becomes_max_at_stride_one_then_strided_blur() -> None:
    model = net()
    apply_blurpool(model, replace_convs=False)
    x = torch.randn(2, 16, 8, 8)
    expected = blur_by_hand(F.max_pool2d(x, 2, stride=1))[:, :, ::2, ::2]
    torch.testing.assert_close(model[2](x), expected)


def test_min_channels_spares_thin_layers_and_applying_twice_equals_once() -> None:
    with pytest.warns(NoEffectWarning):
        assert apply_blurpool(net(), min_channels=17, replace_maxpools=False) == 0
    model = net()
    apply_blurpool(model)
    once = repr(model), {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(NoEffectWarning, match="BlurPool replaced no module"):
        assert apply_blurpool(model) == 0
    assert repr(model) == once[0]
    assert model.state_dict().keys() == once[1].keys()


def test_nothing_to_blur_warns_and_bad_arguments_are_named() -> None:
    with pytest.warns(NoEffectWarning, match="strided Conv2d"):
        assert apply_blurpool(nn.Sequential(nn.Conv2d(3, 3, 3)), replace_maxpools=False) == 0
    with pytest.raises(ValueError, match="replace_convs=False, replace_maxpools=False"):
        BlurPool(replace_convs=False, replace_maxpools=False)
    with pytest.raises(ValueError, match="min_channels=-1"):
        BlurPool(min_channels=-1)


def test_algorithm_is_a_unique_required_surgery_whose_repr_evaluates_back() -> None:
    algorithm = BlurPool(blur_first=False, min_channels=4)
    assert eval(repr(algorithm)) == algorithm
    assert BlurPool.required_on_load() and BlurPool.unique


def test_from_conv2d_blurs_a_copy_and_leaves_the_original_alone() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1)
    x = torch.randn(2, 4, 10, 10)
    blurred = BlurConv2d.from_conv2d(conv, 0)  # Composer's (module, module_index, blur_first)
    torch.testing.assert_close(blurred(x), F.conv2d(blur_by_hand(x), conv.weight, conv.bias, stride=2, padding=1))
    assert blurred.conv is not conv and blurred.conv.weight is not conv.weight
    after = BlurConv2d.from_conv2d(conv, blur_first=False)
    assert conv.stride == (2, 2), "the original keeps its stride"
    expected = blur_by_hand(F.conv2d(x, conv.weight, conv.bias, padding=1))[:, :, ::2, ::2]
    torch.testing.assert_close(after(x), expected)
    with pytest.raises(TypeError, match="needs an nn.Conv2d"):
        BlurConv2d.from_conv2d(nn.Linear(2, 2))


def test_composers_constructor_arguments_build_a_fresh_convolution() -> None:
    layer = BlurConv2d(4, 6, 3, stride=2, padding=1, groups=2, bias=False)
    assert (layer.conv.in_channels, layer.conv.out_channels, layer.conv.kernel_size) == (4, 6, (3, 3))
    assert layer.conv.stride == (2, 2) and layer.conv.groups == 2 and layer.conv.bias is None and layer.blur_first
    x = torch.randn(1, 4, 8, 8)
    torch.testing.assert_close(layer(x), F.conv2d(blur_by_hand(x), layer.conv.weight, stride=2, padding=1, groups=2))
    late = BlurConv2d(4, 6, 2, blur_first=False)  # no stride: Composer's blur then strides by the kernel size
    assert late.conv.stride == (1, 1) and late.stride == (2, 2)
    with pytest.raises(ValueError, match="stride=None, blur_first=True"):
        BlurConv2d(4, 6, 3)
    with pytest.raises(TypeError, match="in_channels, out_channels and kernel_size"):
        BlurConv2d(4)


def test_blur_functions_take_composers_arguments_and_defaults() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 9, 9)
    torch.testing.assert_close(blur_2d(x, 5, 2), blur_by_hand(x)[:, :, ::2, ::2])  # (input, channels, stride)
    taps = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]) / 16
    torch.testing.assert_close(blur_2d(x, filter=taps), blur_by_hand(x))  # a 2-D filter serves every channel
    with pytest.raises(ValueError, match=r"channels=4\).*5 channels"):
        blur_2d(x, 4)
    # Composer's blurmax_pool2d strides by 2 whatever the kernel (the module follows nn.MaxPool2d instead)
    expected = blur_by_hand(F.max_pool2d(x, 3, stride=1))[:, :, ::2, ::2]
    torch.testing.assert_close(blurmax_pool2d(x, 3), expected)
    torch.testing.assert_close(blurmax_pool2d(x), blur_by_hand(F.max_pool2d(x, 2, stride=1))[:, :, ::2, ::2])
    assert BlurMaxPool2d.from_maxpool2d(nn.MaxPool2d(3), 0).stride == 3
    torch.testing.assert_close(BlurPool2d(channels=5)(x), blur_by_hand(x)[:, :, ::2, ::2])
    torch.testing.assert_close(BlurPool2d(stride=1)(x), blur_by_hand(x))
