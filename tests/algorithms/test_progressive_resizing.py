"""ProgressiveResizing: resize_batch against nearest-neighbour and crops by hand, and the size schedule."""

from __future__ import annotations

import doctest
from typing import Any

import pytest
import torch

import composer_bridge.algorithms.progressive_resizing as progressive_resizing_module
from composer_bridge import Event, Logger, State, Timestamp
from composer_bridge.algorithms import ProgressiveResizing
from composer_bridge.functional import resize_batch


def nearest_by_hand(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Output pixel (i, j) reads input pixel (floor(i / scale), floor(j / scale)); int(scale * side) pixels."""
    height, width = int(scale * x.shape[-2]), int(scale * x.shape[-1])
    out = torch.empty(*x.shape[:-2], height, width, dtype=x.dtype)
    for i in range(height):
        for j in range(width):
            out[..., i, j] = x[..., int(i / scale), int(j / scale)]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape, scale", [((3, 2, 12, 8), 0.5), ((1, 3, 9, 9), 0.5), ((2, 1, 13, 22), 0.25)],
                         ids=["non-square", "batch-of-1", "odd-sizes"])
def test_resize_mode_is_nearest_neighbour_to_int_scale_times_each_side(dtype: torch.dtype, shape: tuple[int, ...],
                                                                     scale: float) -> None:
    x, y = torch.randn(shape).to(dtype), torch.arange(shape[0])
    out, same_y = resize_batch(x, y, scale)
    assert out.shape[-2:] == (int(scale * shape[-2]), int(scale * shape[-1]))
    assert out.dtype == dtype and same_y is y
    assert torch.equal(out, nearest_by_hand(x, scale))


def test_segmentation_targets_are_resized_with_the_images_and_stay_indices() -> None:
    x, y = torch.randn(2, 3, 8, 12), torch.randint(0, 5, (2, 8, 12))
    out_x, out_y = resize_batch(x, y, 0.5, resize_targets=True)
    assert out_x.shape == (2, 3, 4, 6) and out_y.dtype == y.dtype
    assert torch.equal(out_y, nearest_by_hand(y, 0.5))


def test_crop_mode_takes_one_window_of_the_scaled_size_from_images_and_targets() -> None:
    x, y = torch.randn(2, 3, 10, 6), torch.randint(0, 5, (2, 10, 6))
    out_x, out_y = resize_batch(x, y, 0.5, mode="crop", resize_targets=True,
                                generator=torch.Generator().manual_seed(1))
    generator = torch.Generator().manual_seed(1)
    top = int(torch.randint(0, 10 - 5 + 1, (), generator=generator))
    left = int(torch.randint(0, 6 - 3 + 1, (), generator=generator))
    assert torch.equal(out_x, x[..., top:top + 5, left:left + 3])
    assert torch.equal(out_y, y[..., top:top + 5, left:left + 3])


def test_every_crop_position_is_possible() -> None:
    x = torch.arange(4.0).view(1, 1, 1, 4)
    starts = {int(resize_batch(x, x, 0.5, mode="crop", generator=torch.Generator().manual_seed(s))[0][0, 0, 0, 0])
              for s in range(40)}
    assert starts == {0.0, 1.0, 2.0}


def test_a_factor_of_one_or_more_changes_nothing() -> None:
    x, y = torch.randn(2, 1, 4, 4), torch.arange(2)
    assert resize_batch(x, y, 1.0)[0] is x


def test_bad_arguments_are_refused() -> None:
    x = torch.randn(2, 1, 4, 4)
    with pytest.raises(ValueError, match="mode='bilinear'"):
        resize_batch(x, x, 0.5, mode="bilinear")
    with pytest.raises(ValueError, match="resize_targets=False for class labels"):
        resize_batch(x, torch.arange(2), 0.5, resize_targets=True)
    for kwargs, match in [
        ({"mode": "bilinear"}, "mode='bilinear'"),
        ({"initial_scale": 0}, r"initial_scale=0.*\(0, 1\]"),
        ({"delay_fraction": 0.6, "finetune_fraction": 0.5}, "sum must be at most 1"),
        ({"delay_fraction": 1.5}, r"delay_fraction=1.5.*\[0, 1\]"),
        ({"finetune_fraction": "10sec"}, "not 'sec'"),
        ({"delay_fraction": "soon"}, "time string"),
        ({"size_increment": 0}, r"size_increment=0.*>= 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            ProgressiveResizing(**kwargs)


def state_at(batch: int, max_duration: str = "100ba", dataloader_len: int | None = None) -> State:
    state = State(torch.nn.Identity(), max_duration=max_duration, seed=0)
    state.timestamp = Timestamp(batch=batch, batch_in_epoch=batch)
    state.dataloader_len = dataloader_len
    return state


def scale_by_formula(elapsed: float, initial: float, delay: float, finetune: float) -> float:
    if elapsed < delay:
        return initial
    return initial + (1 - initial) * min((elapsed - delay) / (1 - delay - finetune), 1.0)


def test_the_scale_holds_then_grows_linearly_then_stays_at_full_size() -> None:
    algorithm = ProgressiveResizing(initial_scale=0.25, delay_fraction=0.2, finetune_fraction=0.3)
    for batch in range(0, 101, 5):
        assert algorithm.scale_at(state_at(batch)) == pytest.approx(scale_by_formula(batch / 100, 0.25, 0.2, 0.3))


@pytest.mark.parametrize("delay", [0.4, "0.4dur", "40ba", "4ep"])
def test_schedule_points_may_be_fractions_or_time_strings(delay: Any) -> None:
    algorithm = ProgressiveResizing(initial_scale=0.5, delay_fraction=delay, finetune_fraction="0.1dur")
    for batch in (0, 39, 40, 60, 95):
        state = state_at(batch, dataloader_len=10)
        assert algorithm.scale_at(state) == pytest.approx(scale_by_formula(batch / 100, 0.5, 0.4, 0.1))


class Recorder:
    def __init__(self) -> None:
        self.metrics: list[dict[str, Any]] = []

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self.metrics.append(metrics)


def test_the_algorithm_rounds_widths_to_the_size_increment_and_logs_the_size() -> None:
    algorithm = ProgressiveResizing(initial_scale=0.3, delay_fraction=0.5, finetune_fraction=0.2,
                                    size_increment=8, input_key="x", target_key="y", resize_targets=True)
    recorder = Recorder()
    state = state_at(10)
    state.batch = {"x": torch.randn(2, 3, 48, 64), "y": torch.randint(0, 3, (2, 48, 64))}
    assert algorithm.match(Event.AFTER_DATALOADER, state)
    algorithm.apply(Event.AFTER_DATALOADER, state, Logger([recorder]))
    # 64 * 0.3 = 19.2 pixels -> 2 increments of 8 = 16 pixels wide, the height scaled by 16 / 64.
    assert state.batch["x"].shape == (2, 3, 12, 16) and state.batch["y"].shape == (2, 12, 16)
    assert recorder.metrics == [{"ProgressiveResizing/height": 12, "ProgressiveResizing/width": 16,
                                 "ProgressiveResizing/scale_factor": pytest.approx(0.3)}]


def test_tiny_images_keep_at_least_one_size_increment() -> None:
    algorithm = ProgressiveResizing(initial_scale=0.1, size_increment=4)
    state = state_at(0)
    state.batch = (torch.randn(2, 1, 8, 8), torch.arange(2))
    algorithm.apply(Event.AFTER_DATALOADER, state, Logger())
    assert state.batch[0].shape == (2, 1, 4, 4)


class GeneratorCount(State):
    """A real State that counts the generators asked of it."""

    asked = 0

    def generator(self, key: str, device: Any = None) -> torch.Generator:
        self.asked += 1
        return super().generator(key, device)


@pytest.mark.parametrize("mode, batch, asked", [("resize", 10, 0), ("crop", 99, 0), ("crop", 10, 1)])
def test_a_generator_is_made_only_for_a_crop_that_shrinks(mode: str, batch: int, asked: int) -> None:
    state = GeneratorCount(torch.nn.Identity(), max_duration="100ba", seed=0)
    state.timestamp = Timestamp(batch=batch, batch_in_epoch=batch)
    state.batch = (torch.randn(2, 1, 16, 16), torch.arange(2))
    ProgressiveResizing(mode=mode).apply(Event.AFTER_DATALOADER, state, Logger())
    assert state.asked == asked
    assert state.batch[0].shape[-1] == (16 if batch == 99 else 8)


def test_crops_are_positional_so_a_fresh_state_at_the_same_step_crops_the_same_window() -> None:
    crops = []
    for _ in range(2):
        state = state_at(10)
        state.batch = (torch.arange(256.0).view(1, 1, 16, 16), torch.arange(1))
        ProgressiveResizing(mode="crop").apply(Event.AFTER_DATALOADER, state, Logger())
        crops.append(state.batch[0])
    assert torch.equal(*crops)


def test_repr_evaluates_back_to_an_equal_algorithm() -> None:
    algorithm = ProgressiveResizing(mode="crop", initial_scale=0.6, finetune_fraction="2ep", delay_fraction=0.1,
                                    size_increment=2, resize_targets=True, input_key="x", target_key="y")
    assert eval(repr(algorithm)) == algorithm
    assert algorithm.unique and not algorithm.needs_loss_events


def test_docstring_examples_run() -> None:
    assert doctest.testmod(progressive_resizing_module).failed == 0
