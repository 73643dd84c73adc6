"""AugMix: the batched functional form against a loop over images with the same draws, the mixing
weights' distributions, the algorithm on a batch, the dataset transform and the hyper-parameter checks."""

from __future__ import annotations

import doctest

import pytest
import torch

import composer_bridge.algorithms.augmix as augmix_module
from composer_bridge import Event, Logger, State
from composer_bridge.algorithms import AugmentAndMixTransform, AugMix
from composer_bridge.algorithms import _augment_ops as ops
from composer_bridge.functional import augmix_image

N, C, H, W = 4, 3, 16, 16
CPU = torch.device("cpu")

PRIMITIVE_OF = {
    "autocontrast": lambda x, v: ops.autocontrast(x), "equalize": lambda x, v: ops.equalize(x),
    "posterize": ops.posterize, "solarize": ops.solarize, "rotate": ops.rotate, "shear_x": ops.shear_x,
    "shear_y": ops.shear_y, "translate_x": ops.translate_x, "translate_y": ops.translate_y, "color": ops.color,
    "contrast": ops.contrast, "brightness": ops.brightness, "sharpness": ops.sharpness,
}


def images(seed: int = 0, n: int = N) -> torch.Tensor:
    return torch.rand(n, C, H, W, generator=torch.Generator().manual_seed(seed))


def one_image_at_a_time(x: torch.Tensor, severity: float, depth: int, width: int, alpha: float, seed: int) -> torch.Tensor:
    """AugMix written per image, consuming the generator in augmix_image's order."""
    names = ops.AUGMENTATION_SETS["all"]
    n = x.shape[0]
    generator = torch.Generator().manual_seed(seed)
    weights = ops.sample_dirichlet(alpha, n, width, generator, CPU).float()
    mixing = ops.sample_symmetric_beta(alpha, n, generator, CPU).float()
    lengths = torch.randint(1, 4, (n, width), generator=generator) if depth == -1 else torch.full((n, width), depth)
    steps = 3 if depth == -1 else depth
    chains = [[x[i : i + 1].clone() for _ in range(width)] for i in range(n)]
    for chain in range(width):
        for step in range(steps):
            draws = ops.draw_step(n, len(names), generator, CPU)
            for i in range(n):
                if step >= int(lengths[i, chain]):
                    continue
                name = names[int(draws.choice[i])]
                value = ops.magnitudes(name, draws, severity, H, W)[i : i + 1]
                chains[i][chain] = PRIMITIVE_OF[name](chains[i][chain], value)
    out = torch.empty_like(x)
    for i in range(n):
        combination = sum(float(weights[i, k]) * chains[i][k][0] for k in range(width))
        out[i] = (1 - float(mixing[i])) * x[i] + float(mixing[i]) * combination
    return out


@pytest.mark.parametrize("depth, width, alpha", [(-1, 3, 1.0), (2, 2, 0.5)])
def test_the_batch_gets_what_a_loop_over_its_images_gives(depth: int, width: int, alpha: float) -> None:
    x = images(n=10)
    out = augmix_image(x, 3, depth, width, alpha, generator=torch.Generator().manual_seed(4))
    reference = one_image_at_a_time(x, 3, depth, width, alpha, seed=4)
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-5)


def test_the_result_is_a_convex_mix_of_the_image_and_its_chains() -> None:
    # With the brightness op only at severity 10, every chain is the image scaled by a factor in
    # (0.1, 7.5]; the mix is the image scaled per pixel within the same range, clipped to [0, 1].
    x = images() * 0.1
    out = augmix_image(x, severity=10, depth=1, width=3, augmentation_set=["brightness"],
                       generator=torch.Generator().manual_seed(0))
    ratio = out / x
    per_image = ratio.flatten(1)
    assert torch.allclose(per_image, per_image[:, :1], atol=1e-4)  # one factor per image
    assert (per_image[:, 0] > 0.1).all() and (per_image[:, 0] <= 7.5).all()


def test_each_image_draws_its_own_chains_and_the_generator_makes_it_repeatable() -> None:
    x = images(1, n=1).expand(6, C, H, W).contiguous()
    out = augmix_image(x, generator=torch.Generator().manual_seed(0))
    assert len({tuple(o.flatten()[:64].tolist()) for o in out}) == 6
    assert torch.equal(out, augmix_image(x, generator=torch.Generator().manual_seed(0)))


def test_shapes_and_dtypes() -> None:
    x = images()
    assert augmix_image(x[0]).shape == (C, H, W)
    as_bytes = (x * 255).round().to(torch.uint8)
    assert augmix_image(as_bytes).dtype == torch.uint8
    assert augmix_image(x.to(torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(3, 6, 5), (4, 3, 6, 5)], ids=["single", "batch"])
def test_both_functional_forms_keep_type_dtype_and_odd_shapes(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    # What Composer's own tests ask of augmix_image and randaugment_image, on tensors.
    from composer_bridge.functional import randaugment_image

    x = torch.randint(0, 256, shape).to(dtype) if dtype == torch.uint8 else torch.rand(shape).to(dtype)
    for augment in (augmix_image, randaugment_image):
        for seed in range(3):
            out = augment(x, generator=torch.Generator().manual_seed(seed))
            assert type(out) is torch.Tensor and out.shape == x.shape and out.dtype == dtype
            assert torch.isfinite(out.float()).all() and 0 <= out.float().min() and out.float().max() <= 255


@pytest.mark.parametrize("kwargs, match", [
    ({"severity": 10.5}, r"severity=10.5.*\[0, 10\]"),
    ({"depth": 0}, r"depth=0.*>= 1, or -1"),
    ({"depth": -2}, r"depth=-2"),
    ({"width": 0}, r"width=0.*>= 1"),
    ({"alpha": 0.0}, r"alpha=0.0.*> 0"),
    ({"alpha": float("inf")}, r"alpha=inf"),
    ({"augmentation_set": ["rotate", "zoom"]}, r"unknown ops \['zoom'\]"),
])
def test_bad_hyper_parameters_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AugMix(**kwargs)
    with pytest.raises(ValueError, match=match):
        AugmentAndMixTransform(**kwargs)


def test_the_transform_uses_torchs_generator() -> None:
    transform = AugmentAndMixTransform(severity=3, width=3)
    x = images()[0]
    torch.manual_seed(5)
    first = transform(x)
    torch.manual_seed(5)
    assert torch.equal(first, transform(x)) and not torch.equal(first, x)
    assert "width=3" in repr(transform)


def test_the_algorithm_augments_the_inputs_with_the_runs_generator_and_leaves_the_targets() -> None:
    x, y = images(), torch.arange(N)
    state = State(torch.nn.Identity(), seed=3)
    state.batch = (x, y)
    algorithm = AugMix(severity=3, width=2)
    assert algorithm.match(Event.AFTER_DATALOADER, state) and not algorithm.match(Event.BEFORE_LOSS, state)
    algorithm.apply(Event.AFTER_DATALOADER, state, Logger())
    expected = augmix_image(x, 3, -1, 2, 1.0, "all", State(torch.nn.Identity(), seed=3).generator("AugMix", "cpu"))
    assert torch.equal(state.batch[0], expected)
    assert state.batch[1] is y


def test_a_normalised_batch_is_augmented_in_0_1_and_normalised_again() -> None:
    x = images()
    state = State(torch.nn.Identity(), seed=4)
    state.batch = ((x - 0.5) / 0.25, torch.arange(N))
    AugMix(mean=0.5, std=0.25).apply(Event.AFTER_DATALOADER, state, Logger())
    expected = augmix_image(x, generator=State(torch.nn.Identity(), seed=4).generator("AugMix", "cpu"))
    torch.testing.assert_close(state.batch[0], (expected - 0.5) / 0.25, rtol=0, atol=1e-5)


def test_repr_evaluates_back_to_an_equal_algorithm() -> None:
    algorithm = AugMix(severity=4, depth=2, width=2, alpha=0.5, augmentation_set="safe", input_key="x")
    assert eval(repr(algorithm)) == algorithm
    assert algorithm.unique and not algorithm.needs_loss_events


def test_docstring_examples_run() -> None:
    assert doctest.testmod(augmix_module).failed == 0
