"""CutOut: cutout_batch against holes placed by hand from the same draws, and the algorithm on a batch."""

from __future__ import annotations

import doctest

import pytest
import torch

import composer_bridge.algorithms.cutout as cutout_module
from composer_bridge import Event, Logger, State
from composer_bridge.algorithms import CutOut
from composer_bridge.functional import cutout_batch


def holes_by_hand(x: torch.Tensor, num_holes: int, length: float, seed: int) -> torch.Tensor:
    """Composer's recipe: a centre uniform over the pixels, a square of side L clipped at the edges."""
    generator = torch.Generator().manual_seed(seed)
    height, width = x.shape[-2:]
    side = int(min(height, width) * length)
    out = x.clone()
    for _ in range(num_holes):
        row = int(torch.randint(0, height, (), generator=generator))
        col = int(torch.randint(0, width, (), generator=generator))
        for r in range(max(row - side // 2, 0), min(row + side // 2, height)):
            for c in range(max(col - side // 2, 0), min(col + side // 2, width)):
                out[..., r, c] = 0
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape, num_holes", [((4, 3, 9, 14), 2), ((1, 1, 8, 8), 1), ((3, 10, 6), 3)],
    ids=["non-square-two-holes", "batch-of-1", "single-image"],
)
def test_cutout_batch_zeroes_the_same_squares_in_every_image(dtype: torch.dtype, shape: tuple[int, ...],
                                                              num_holes: int) -> None:
    x = (torch.rand(shape) + 0.5).to(dtype)
    for seed in range(5):
        out = cutout_batch(x, num_holes, 0.5, generator=torch.Generator().manual_seed(seed))
        assert out.dtype == dtype and out.shape == x.shape
        assert torch.equal(out, holes_by_hand(x, num_holes, 0.5, seed))
        assert torch.equal((out == 0).all(dim=tuple(range(out.ndim - 2))), (out == 0).any(dim=tuple(range(out.ndim - 2))))


def test_no_holes_or_zero_length_leave_the_images_alone() -> None:
    x = torch.rand(2, 3, 5, 5) + 1
    assert torch.equal(cutout_batch(x, num_holes=0), x)
    assert torch.equal(cutout_batch(x, length=0.0), x)


@pytest.mark.parametrize("kwargs, match", [({"length": 1.5}, r"length=1.5.*\[0, 1\]"),
                                          ({"num_holes": -1}, r"num_holes=-1.*>= 0"),
                                          ({"num_holes": 1.5}, r"num_holes=1.5")])
def test_bad_hyper_parameters_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CutOut(**kwargs)


def test_the_algorithm_cuts_holes_in_the_inputs_and_leaves_segmentation_targets_alone() -> None:
    x, y = torch.rand(4, 3, 8, 6) + 1, torch.randint(0, 3, (4, 8, 6))
    state = State(torch.nn.Identity(), seed=1)
    state.batch = {"image": x, "mask": y}
    algorithm = CutOut(num_holes=1, length=0.5, input_key="image")
    assert algorithm.match(Event.AFTER_DATALOADER, state) and not algorithm.match(Event.BEFORE_FORWARD, state)
    algorithm.apply(Event.AFTER_DATALOADER, state, Logger())
    out = state.batch["image"]
    zeros = int((out == 0).sum())
    assert 0 < zeros <= 4 * 3 * 3 * 3 and zeros % (4 * 3) == 0
    assert state.batch["mask"] is y


def test_repr_evaluates_back_to_an_equal_algorithm() -> None:
    algorithm = CutOut(num_holes=2, length=0.25, uniform_sampling=True, input_key="x")
    assert eval(repr(algorithm)) == algorithm
    assert algorithm.unique and not algorithm.needs_loss_events


def test_docstring_examples_run() -> None:
    assert doctest.testmod(cutout_module).failed == 0
