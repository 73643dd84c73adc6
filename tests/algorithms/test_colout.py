"""ColOut: colout_batch against rows and columns picked by hand from the same draws, and the algorithm."""

from __future__ import annotations

import doctest

import pytest
import torch

import composer_bridge.algorithms.colout as colout_module
from composer_bridge import Event, Logger, State
from composer_bridge.algorithms import ColOut
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
                                          ({"resize_target": "yes"}, r"resize_target='yes'"),
                                          ({"batch": False}, r"batch=False.*colout_batch")])
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
