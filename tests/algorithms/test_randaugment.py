"""RandAugment: the batched functional form against a loop over images with the same draws, the
algorithm on a batch (normalised or not), the dataset transform, and the hyper-parameter checks."""

from __future__ import annotations

import doctest

import pytest
import torch

import composer_bridge.algorithms.randaugment as randaugment_module
from composer_bridge import Event, Logger, State
from composer_bridge.algorithms import RandAugment, RandAugmentTransform
from composer_bridge.algorithms import _augment_ops as ops
from composer_bridge.functional import randaugment_image

N, C, H, W = 4, 3, 16, 16

PRIMITIVE_OF = {
    "autocontrast": lambda x, v: ops.autocontrast(x), "equalize": lambda x, v: ops.equalize(x),
    "posterize": ops.posterize, "solarize": ops.solarize, "rotate": ops.rotate, "shear_x": ops.shear_x,
    "shear_y": ops.shear_y, "translate_x": ops.translate_x, "translate_y": ops.translate_y, "color": ops.color,
    "contrast": ops.contrast, "brightness": ops.brightness, "sharpness": ops.sharpness,
    "color_original": ops.color, "contrast_original": ops.contrast, "brightness_original": ops.brightness,
    "sharpness_original": ops.sharpness,
}


def images(seed: int = 0, n: int = N) -> torch.Tensor:
    return torch.rand(n, C, H, W, generator=torch.Generator().manual_seed(seed))


def one_image_at_a_time(x: torch.Tensor, severity: float, depth: int, names: tuple[str, ...], seed: int) -> torch.Tensor:
    """The same draws as randaugment_image, applied image by image with the primitives."""
    generator = torch.Generator().manual_seed(seed)
    out = x.clone()
    for _ in range(depth):
        draws = ops.draw_step(x.shape[0], len(names), generator, torch.device("cpu"))
        for i in range(x.shape[0]):
            name = names[int(draws.choice[i])]
            value = ops.magnitudes(name, draws, severity, H, W)[i : i + 1]
            out[i : i + 1] = PRIMITIVE_OF[name](out[i : i + 1], value)
    return out


@pytest.mark.parametrize("augmentation_set", ["all", "safe", "original"])
def test_the_batch_gets_what_a_loop_over_its_images_gives(augmentation_set: str) -> None:
    x = images(n=12)
    out = randaugment_image(x, 9, 2, augmentation_set, generator=torch.Generator().manual_seed(3))
    reference = one_image_at_a_time(x, 9, 2, ops.AUGMENTATION_SETS[augmentation_set], seed=3)
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-5)


def test_each_image_draws_its_own_ops_and_the_generator_makes_it_repeatable() -> None:
    x = images(1, n=1).expand(8, C, H, W).contiguous()
    out = randaugment_image(x, generator=torch.Generator().manual_seed(0))
    assert len({tuple(o.flatten()[:64].tolist()) for o in out}) >= 6  # identical inputs, different results
    again = randaugment_image(x, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    assert not torch.equal(out, randaugment_image(x, generator=torch.Generator().manual_seed(1)))


def test_shapes_dtypes_and_depth_zero() -> None:
    x = images()
    assert torch.equal(randaugment_image(x, depth=0), x)
    single = randaugment_image(x[0], generator=torch.Generator().manual_seed(0))
    assert single.shape == (C, H, W)
    as_bytes = (x * 255).round().to(torch.uint8)
    out = randaugment_image(as_bytes, generator=torch.Generator().manual_seed(0))
    assert out.dtype == torch.uint8
    # uint8 in, uint8 out: the float result rounded to the nearest level.
    reference = randaugment_image(as_bytes.float() / 255, generator=torch.Generator().manual_seed(0))
    assert (out.float() - reference * 255).abs().max() <= 0.5 + 1e-3
    assert randaugment_image(x.to(torch.bfloat16), depth=1).dtype == torch.bfloat16


def test_a_channels_last_batch_gives_the_same_images_in_its_own_layout() -> None:
    x = images()
    channels_last = x.to(memory_format=torch.channels_last)
    out = randaugment_image(channels_last, generator=torch.Generator().manual_seed(2))
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, randaugment_image(x, generator=torch.Generator().manual_seed(2)), rtol=0, atol=1e-6)


def test_an_explicit_list_of_ops_is_drawn_from() -> None:
    x = images()
    out = randaugment_image(x, severity=9, depth=1, augmentation_set=["solarize"],
                            generator=torch.Generator().manual_seed(0))
    # Solarize only: every pixel is either unchanged or inverted.
    assert torch.all((out == x) | torch.isclose(out, 1 - x))


@pytest.mark.parametrize("kwargs, match", [
    ({"severity": 11}, r"severity=11.*\[0, 10\]"),
    ({"severity": -1}, r"severity=-1"),
    ({"depth": -1}, r"depth=-1.*int >= 0"),
    ({"depth": 1.5}, r"depth=1.5"),
    ({"augmentation_set": "most"}, r"augmentation_set='most'.*\['all', 'original', 'safe'\]"),
    ({"mean": (0.5, 0.5, 0.5)}, r"std=None.*mean and std together"),
    ({"mean": 0.5, "std": 0.0}, r"std=0.0.*> 0"),
])
def test_bad_hyper_parameters_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RandAugment(**kwargs)


def test_the_transform_checks_its_arguments_and_uses_torchs_generator() -> None:
    with pytest.raises(ValueError, match=r"RandAugmentTransform\(depth=-2\)"):
        RandAugmentTransform(depth=-2)
    transform = RandAugmentTransform(severity=9, depth=2)
    x = images()[0]
    torch.manual_seed(5)
    first = transform(x)
    torch.manual_seed(5)
    assert torch.equal(first, transform(x)) and first.shape == x.shape and not torch.equal(first, x)
    assert "severity=9, depth=2" in repr(transform)


def test_the_algorithm_augments_the_inputs_with_the_runs_generator_and_leaves_the_targets() -> None:
    x, y = images(), torch.arange(N)
    state = State(torch.nn.Identity(), seed=1)
    state.batch = {"image": x, "label": y}
    algorithm = RandAugment(severity=9, depth=2, input_key="image")
    assert algorithm.match(Event.AFTER_DATALOADER, state) and not algorithm.match(Event.BEFORE_FORWARD, state)
    algorithm.apply(Event.AFTER_DATALOADER, state, Logger())
    expected = randaugment_image(x, 9, 2, "all", State(torch.nn.Identity(), seed=1).generator("RandAugment", "cpu"))
    assert torch.equal(state.batch["image"], expected)
    assert state.batch["label"] is y


def test_a_normalised_batch_is_augmented_in_0_1_and_normalised_again() -> None:
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    x = images()
    m, s = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    state = State(torch.nn.Identity(), seed=2)
    state.batch = ((x - m) / s, torch.arange(N))
    RandAugment(mean=mean, std=std).apply(Event.AFTER_DATALOADER, state, Logger())
    expected = randaugment_image(x, generator=State(torch.nn.Identity(), seed=2).generator("RandAugment", "cpu"))
    torch.testing.assert_close(state.batch[0], (expected - m) / s, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"mean/std have 2 values but the images have 3 channels"):
        RandAugment(mean=(0.1, 0.2), std=(1.0, 1.0)).apply(Event.AFTER_DATALOADER, state, Logger())


def test_the_algorithm_refuses_a_batch_without_images() -> None:
    state = State(torch.nn.Identity(), seed=0)
    state.batch = (torch.rand(4, 10), torch.arange(4))
    with pytest.raises(TypeError, match=r"RandAugment needs an image tensor \(N, C, H, W\) at input_key=0, got Tensor\(4, 10\)"):
        RandAugment().apply(Event.AFTER_DATALOADER, state, Logger())


def test_repr_evaluates_back_to_an_equal_algorithm() -> None:
    algorithm = RandAugment(severity=5, depth=1, augmentation_set=["rotate", "color"], mean=0.5, std=0.25,
                            input_key="x")
    assert eval(repr(algorithm)) == algorithm
    assert algorithm.unique and not algorithm.needs_loss_events


def test_docstring_examples_run() -> None:
    assert doctest.testmod(randaugment_module).failed == 0
