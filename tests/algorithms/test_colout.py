"""ColOut: colout_batch against rows and columns picked by hand from the same draws, and the algorithm."""

from __future__ import annotations

import doctest

import pytest
import torch

import composer_bridge.algorithms.colout as colout_module
from composer_bridge import Event, Logger, State
from composer_bridge.algorithms import ColOut, ColOutTransform
from composer_bridge.functional import colout_batch


def kept_by_hand(height: int, width: int, p_row: float, p_col: float, seed: int) -> tuple[list[int], list[int]]:
    """Composer's recipe: a random permutation of the rows (then columns), keep the first int((1-p)*size), sorted."""
    generator = torch.Generator().manual_seed(seed)
    rows = sorted(torch.randperm(height, generator=generator)[: max(1, int((1 - p_row) * height))].tolist())
    cols = sorted(torch.randperm(width, generator=generator)[: max(1, int((1 - p_col) * width))].tolist())
    return rows, cols


def select_by_hand(x: torch.Tensor, rows: list[int], cols: list[int]) -> torch.Tensor:
    out = torch.empty(*x.shape[:-2], len(rows), len(cols), dtype=x.dtype)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            out[..., i, j] = x[..., r, c]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 2, 11, 7), (1, 3, 8, 8), (3, 9, 13)], ids=["non-square", "batch-of-1", "single-image"])
def test_colout_batch_keeps_the_drawn_rows_and_columns_in_order(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape).to(dtype)
    out = colout_batch(x, p_row=0.3, p_col=0.2, generator=torch.Generator().manual_seed(4))
    rows, cols = kept_by_hand(shape[-2], shape[-1], 0.3, 0.2, seed=4)
    assert out.dtype == dtype
    assert torch.equal(out, select_by_hand(x, rows, cols))


def test_segmentation_targets_lose_the_same_rows_and_columns() -> None:
    x, y = torch.randn(2, 3, 10, 12), torch.randint(0, 5, (2, 10, 12))
    out_x, out_y = colout_batch((x, y), 0.2, 0.25, generator=torch.Generator().manual_seed(0))
    rows, cols = kept_by_hand(10, 12, 0.2, 0.25, seed=0)
    assert torch.equal(out_x, select_by_hand(x, rows, cols))
    assert torch.equal(out_y, select_by_hand(y, rows, cols)) and out_y.dtype == y.dtype


def test_class_targets_and_resize_target_false_leave_the_targets_alone() -> None:
    x, labels, masks = torch.randn(2, 3, 10, 12), torch.tensor([1, 2]), torch.zeros(2, 10, 12)
    assert colout_batch((x, labels))[1] is labels
    assert colout_batch((x, masks), resize_target=False)[1] is masks


def test_dropping_everything_still_keeps_one_row_and_one_column() -> None:
    assert colout_batch(torch.randn(2, 1, 5, 4), p_row=1.0, p_col=1.0).shape == (2, 1, 1, 1)


@pytest.mark.parametrize("kwargs, match", [({"p_row": 1.5}, r"p_row=1.5.*\[0, 1\]"),
                                          ({"p_col": -0.1}, r"p_col=-0.1.*\[0, 1\]"),
                                          ({"resize_target": "yes"}, r"resize_target='yes'")])
def test_bad_hyper_parameters_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ColOut(**kwargs)


def test_the_algorithm_shrinks_dict_batches_with_their_segmentation_masks() -> None:
    state = State(torch.nn.Identity(), seed=2)
    state.batch = {"image": torch.randn(4, 3, 20, 10), "mask": torch.randint(0, 2, (4, 20, 10))}
    algorithm = ColOut(input_key="image", target_key="mask")
    assert algorithm.match(Event.AFTER_DATALOADER, state)
    algorithm.apply(Event.AFTER_DATALOADER, state, Logger())
    assert state.batch["image"].shape == (4, 3, 17, 8)
    assert state.batch["mask"].shape == (4, 17, 8)


def test_repr_evaluates_back_to_an_equal_algorithm() -> None:
    algorithm = ColOut(p_row=0.1, p_col=0.3, resize_target=True, input_key="x", target_key="y")
    assert eval(repr(algorithm)) == algorithm
    assert algorithm.unique and not algorithm.needs_loss_events


def test_docstring_examples_run() -> None:
    assert doctest.testmod(colout_module).failed == 0


def coded_images(n: int, channels: int, height: int, width: int) -> torch.Tensor:
    """Pixel values that name their own position: 10000 * image + 100 * row + column (+ 0.5 per channel)."""
    n_, c_, r_, w_ = torch.meshgrid(*(torch.arange(k) for k in (n, channels, height, width)), indexing="ij")
    return (10000 * n_ + 100 * r_ + w_ + 0.5 * c_).double()


def test_per_sample_mode_keeps_an_independent_ordered_choice_for_each_image_and_its_mask() -> None:
    n, height, width = 64, 10, 8
    images = coded_images(n, 2, height, width)
    masks = coded_images(n, 1, height, width)[:, 0]
    out, out_masks = colout_batch((images, masks), p_row=0.3, p_col=0.25, per_sample=True,
                                  generator=torch.Generator().manual_seed(0))
    assert out.shape == (n, 2, 7, 6) and out_masks.shape == (n, 7, 6)
    row_choices, col_choices, row_counts = set(), set(), torch.zeros(height)
    for i in range(n):
        rows, cols = (out[i, 0, :, 0] % 10000) // 100, out[i, 0, 0, :] % 100
        assert rows.tolist() == sorted(set(rows.tolist())) and cols.tolist() == sorted(set(cols.tolist()))
        expected = images[i][:, rows.long()][:, :, cols.long()]  # image i with exactly those rows and columns
        assert torch.equal(out[i], expected) and torch.equal(out_masks[i], expected[0] - 0.0)
        row_choices.add(tuple(rows.tolist()))
        col_choices.add(tuple(cols.tolist()))
        row_counts[rows.long()] += 1
    assert len(row_choices) > n // 2 and len(col_choices) > n // 4, "images get different rows and columns"
    # each row is kept by about 7 of 10 images (binomial, n=64: 3.6 standard deviations is about 0.2)
    assert ((row_counts / n - 0.7).abs() < 0.21).all(), row_counts
    with pytest.raises(ValueError, match=r"per_sample=True\) needs a batch"):
        colout_batch(torch.randn(3, 8, 8), per_sample=True)


def test_the_algorithm_with_batch_false_draws_per_image_from_the_run_generator() -> None:
    def run(seed: int) -> dict:
        state = State(torch.nn.Identity(), seed=seed)
        state.batch = {"image": coded_images(6, 3, 20, 10), "mask": coded_images(6, 1, 20, 10)[:, 0]}
        ColOut(batch=False, input_key="image", target_key="mask").apply(Event.AFTER_DATALOADER, state, Logger())
        return state.batch

    batch = run(2)
    assert batch["image"].shape == (6, 3, 17, 8) and batch["mask"].shape == (6, 17, 8)
    assert torch.equal(batch["mask"], batch["image"][:, 0])
    assert not all(torch.equal(batch["image"][0] % 10000, batch["image"][i] % 10000) for i in range(1, 6))
    assert torch.equal(run(2)["image"], batch["image"]) and not torch.equal(run(3)["image"], batch["image"])
    assert eval(repr(ColOut(batch=False))) == ColOut(batch=False)
    with pytest.raises(TypeError, match="batch='no'"):
        ColOut(batch="no")


def test_the_dataset_transform_drops_rows_and_columns_of_one_image_and_its_mask() -> None:
    image, mask = coded_images(1, 3, 12, 9)[0], coded_images(1, 1, 12, 9)[0, 0]
    transform = ColOutTransform(p_row=0.25, p_col=1 / 3, generator=torch.Generator().manual_seed(5))
    small, small_mask = transform((image, mask))
    rows, cols = kept_by_hand(12, 9, 0.25, 1 / 3, seed=5)
    assert torch.equal(small, select_by_hand(image, rows, cols)) and torch.equal(small_mask, select_by_hand(mask, rows, cols))
    label = torch.tensor(3)
    assert transform((image, label))[1] is label  # class labels are left alone
    assert transform(image).shape == (3, 9, 6)
    assert repr(transform) == "ColOutTransform(p_row=0.25, p_col=0.3333333333333333, resize_target='auto')"
    with pytest.raises(TypeError, match="tensors .* and Pillow images, got object"):
        transform(object())
    with pytest.raises(ValueError, match="p_row=2"):
        ColOutTransform(p_row=2)
