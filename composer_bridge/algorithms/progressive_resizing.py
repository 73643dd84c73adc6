"""ProgressiveResizing: train on smaller images early, growing them to full size on a schedule.

Functional form :func:`resize_batch`; the :class:`ProgressiveResizing` algorithm shrinks every
training micro-batch at ``AFTER_DATALOADER`` by a factor that holds at ``initial_scale`` until
``delay_fraction`` of the run, grows linearly to 1 by ``1 - finetune_fraction``, and stays at 1
(full size) for the final ``finetune_fraction``. Widths are rounded to multiples of
``size_increment``.

Schedule points accept what Composer takes (fractions of the run, ``0.5``) and time strings
(``"0.5dur"``, or ``"3ep"``/``"200ba"``, converted with the run's length).

Examples:
    >>> import torch
    >>> x, y = resize_batch(torch.randn(2, 3, 8, 12), torch.tensor([0, 1]), scale_factor=0.5)
    >>> x.shape, y.tolist()
    (torch.Size([2, 3, 4, 6]), [0, 1])
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from composer_bridge.algorithms._draws import random_int
from composer_bridge.algorithms._schedule import elapsed_fraction, fraction_of_run, schedule_point
from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.batch import BatchKey, set_batch_item
from composer_bridge.core.event import Event
from composer_bridge.core.time import TimeUnit

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["ProgressiveResizing", "resize_batch"]

_MODES = ("crop", "resize")


# --- the functional form -----------------------------------------------------------------------

def _forward_inputs(model: torch.nn.Module, batch: object, input_key: BatchKey, inputs: torch.Tensor) -> object:
    """The model's outputs on ``inputs`` in the batch's place, called the way the model is called.

    A model with ``loss(outputs, batch)`` (a ComposerModule) gets the batch with the inputs
    replaced; any other model (a plain LightningModule, ``self(x)``) gets the inputs alone.
    """
    if callable(getattr(model, "loss", None)):
        return model(set_batch_item(copy.copy(batch), input_key, inputs))
    return model(inputs)


def _nearest(tensor: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """Nearest-neighbour resize to ``int(scale_factor * side)``; output pixel ``i`` reads ``floor(i / scale_factor)``."""
    height, width = tensor.shape[-2], tensor.shape[-1]
    if int(scale_factor * height) >= 1 and int(scale_factor * width) >= 1:
        return F.interpolate(tensor, scale_factor=scale_factor, mode="nearest", recompute_scale_factor=False)
    size = (max(1, int(scale_factor * height)), max(1, int(scale_factor * width)))
    return F.interpolate(tensor, size=size, mode="nearest")


def _crop(tensor: torch.Tensor, top: int, left: int, height: int, width: int) -> torch.Tensor:
    return tensor[..., top:top + height, left:left + width]


def resize_batch(
    input: torch.Tensor,
    target: torch.Tensor,
    scale_factor: float,
    mode: str = "resize",
    resize_targets: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shrink images (and optionally per-pixel targets) by ``scale_factor``, by resizing or cropping.

    The new size is ``int(scale_factor * H) x int(scale_factor * W)`` (at least 1x1). ``'resize'``
    uses nearest-neighbour interpolation (output pixel ``i`` reads input pixel ``floor(i / scale_factor)``); ``'crop'`` takes a random crop, the same for the whole
    batch (and the matching region of the targets). A factor ``>= 1`` returns the inputs unchanged.

    Args:
        input: ``(N, C, H, W)`` images.
        target: the targets; resized only if ``resize_targets`` (then ``(N, H, W)`` class
            indices or ``(N, C, H, W)``, any spatial size).
        scale_factor: the size factor, ``> 0``.
        mode: ``'resize'`` (default) or ``'crop'``.
        resize_targets: resize (or crop) the targets too. Default ``False``.
        generator: the source of the crop position (a CPU generator keeps it off the device).

    Returns:
        ``(input_resized, target_resized_or_unchanged)``.

    Examples:
        >>> import torch
        >>> x, y = resize_batch(torch.randn(2, 3, 8, 8), torch.zeros(2, 8, 8, dtype=torch.long), 0.5,
        ...                     mode="crop", resize_targets=True, generator=torch.Generator().manual_seed(0))
        >>> x.shape, y.shape, y.dtype
        (torch.Size([2, 3, 4, 4]), torch.Size([2, 4, 4]), torch.int64)
    """
    if mode not in _MODES:
        raise ValueError(f"resize_batch(mode={mode!r}): mode must be one of {_MODES}.")
    if isinstance(scale_factor, bool) or not isinstance(scale_factor, (int, float)) or not scale_factor > 0:
        raise ValueError(f"resize_batch(scale_factor={scale_factor!r}): must be a number > 0.")
    if input.ndim < 3:
        raise ValueError(f"resize_batch needs images (N, C, H, W), got shape {tuple(input.shape)}.")
    if resize_targets and target.ndim < 3:
        raise ValueError(
            f"resize_batch(resize_targets=True) needs per-pixel targets (N, H, W) or (N, C, H, W), got shape "
            f"{tuple(target.shape)}; use resize_targets=False for class labels."
        )
    if scale_factor >= 1:
        return input, target
    height, width = input.shape[-2], input.shape[-1]
    new_height, new_width = max(1, int(scale_factor * height)), max(1, int(scale_factor * width))
    index_targets = resize_targets and not target.dtype.is_floating_point
    if mode == "crop":
        top = random_int(0, height - new_height + 1, generator)
        left = random_int(0, width - new_width + 1, generator)
        resized = _crop(input, top, left, new_height, new_width)
        if not resize_targets:
            return resized, target
        # The same region of targets that may have another resolution than the images.
        t_height, t_width = target.shape[-2], target.shape[-1]
        return resized, _crop(
            target, int(top * t_height / height), int(left * t_width / width),
            max(1, int(scale_factor * t_height)), max(1, int(scale_factor * t_width)),
        )
    resized = _nearest(input, scale_factor)
    if not resize_targets:
        return resized, target
    if index_targets:
        # interpolate works on floating channels: add a channel, resize, and go back to indices.
        as_float = target.unsqueeze(1).to(torch.float32)
        return resized, _nearest(as_float, scale_factor).squeeze(1).to(target.dtype)
    return resized, _nearest(target, scale_factor)


class ProgressiveResizing(Algorithm):
    """Train on downscaled images that grow back to full size over the run.

    At every training micro-batch (``AFTER_DATALOADER``) the scale is ``initial_scale`` until
    ``delay_fraction``, then grows linearly to 1 at ``1 - finetune_fraction``, and is 1 after;
    the new width is rounded to a multiple of ``size_increment`` (at least one increment) and the
    height scaled by the same factor. Logs ``ProgressiveResizing/height``, ``/width`` and
    ``/scale_factor``.

    Args:
        mode: ``'resize'`` (nearest-neighbour, default) or ``'crop'`` (a random crop per batch).
        initial_scale: the starting size factor, in ``(0, 1]``. Default ``0.5``.
        finetune_fraction: the final part of the run at full size: a fraction, or a time string
            (``"0.2dur"``, ``"2ep"``, ``"100ba"``). Default ``0.2``.
        delay_fraction: the first part of the run at ``initial_scale``, same forms. Default ``0.5``.
        size_increment: widths are multiples of this many pixels. Default ``4``.
        resize_targets: resize per-pixel targets too (segmentation). Default ``False``.
        input_key: where the inputs are in the batch (index, dict key or ``(getter, setter)``).
        target_key: where the targets are in the batch.

    Examples:
        >>> ProgressiveResizing(initial_scale=0.5, delay_fraction="0.3dur")
        ProgressiveResizing(mode='resize', initial_scale=0.5, finetune_fraction=0.2, delay_fraction='0.3dur', \
size_increment=4, resize_targets=False, input_key=0, target_key=1)
    """

    needs = frozenset({"image"})
    unique = True
    augments_data = True
    needs_run_length = True  # the schedule is placed by fractions of the run

    def __init__(
        self,
        mode: str = "resize",
        initial_scale: float = 0.5,
        finetune_fraction: float | str = 0.2,
        delay_fraction: float | str = 0.5,
        size_increment: int = 4,
        resize_targets: bool = False,
        input_key: BatchKey = 0,
        target_key: BatchKey = 1,
    ) -> None:
        where = "ProgressiveResizing"
        if mode not in _MODES:
            raise ValueError(f"{where}(mode={mode!r}): mode must be 'resize' (interpolate) or 'crop' (random crop).")
        if isinstance(initial_scale, bool) or not isinstance(initial_scale, (int, float)) or not 0 < initial_scale <= 1:
            raise ValueError(
                f"{where}(initial_scale={initial_scale!r}): the starting size factor must be in (0, 1] (default 0.5)."
            )
        self._finetune = schedule_point(finetune_fraction, "finetune_fraction", where)
        self._delay = schedule_point(delay_fraction, "delay_fraction", where)
        if (self._finetune.unit == self._delay.unit == TimeUnit.DURATION
                and self._finetune.value + self._delay.value > 1):
            raise ValueError(
                f"{where}(delay_fraction={delay_fraction!r}, finetune_fraction={finetune_fraction!r}): together "
                "they exceed the whole run; their sum must be at most 1."
            )
        if isinstance(size_increment, bool) or not isinstance(size_increment, int) or size_increment < 1:
            raise ValueError(f"{where}(size_increment={size_increment!r}): must be an int >= 1 (pixels; default 4).")
        if not isinstance(resize_targets, bool):
            raise TypeError(f"{where}(resize_targets={resize_targets!r}): must be True or False.")
        self.mode = mode
        self.initial_scale = initial_scale
        self.finetune_fraction = finetune_fraction
        self.delay_fraction = delay_fraction
        self.size_increment = size_increment
        self.resize_targets = resize_targets
        self.input_key = input_key
        self.target_key = target_key
        self._size_checked = False

    def scale_at(self, state: State) -> float:
        """The schedule's size factor at the current point of the run (before rounding the width)."""
        where = type(self).__name__
        elapsed = elapsed_fraction(state, where)
        delay = fraction_of_run(self._delay, state, where)
        finetune = fraction_of_run(self._finetune, state, where)
        ramp = 1.0 - finetune - delay
        if elapsed < delay:
            progress = 0.0
        elif ramp <= 0:
            progress = 1.0
        else:
            progress = min((elapsed - delay) / ramp, 1.0)
        return self.initial_scale + (1.0 - self.initial_scale) * progress

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def _pinned(self, scale: float, width: int) -> float:
        """``scale`` rounded so that the width is a multiple of ``size_increment``."""
        increments = max(1, round(width * scale / self.size_increment))
        return increments * self.size_increment / width

    def _check_model_takes_smallest(self, state: State, input: torch.Tensor) -> None:
        """Refuse, with the model's limit and the fix, a model that does not take the smallest size of the schedule.

        One example goes through the model without gradients, in eval mode (no BatchNorm statistics
        change, no dropout draw), at full size and at ``initial_scale``. Where the full size fails too,
        the model takes more than the images alone, and nothing is concluded.
        """
        smallest = self._pinned(self.initial_scale, input.shape[-1])
        if smallest >= 1:
            return
        model = state.model
        example = input[:1]

        def runs(scale: float) -> Exception | None:
            # the size alone matters: resize (a crop would draw from the global generator)
            images = resize_batch(example, example, scale, "resize")[0] if scale < 1 else example
            try:
                _forward_inputs(model, state.batch, self.input_key, images)
            except Exception as error:  # torch's message, reported in ours
                return error
            return None

        training = bool(getattr(model, "training", False))
        model.eval()
        try:
            with torch.no_grad():
                if runs(1.0) is not None:
                    return
                error = runs(smallest)
                if error is None:
                    return
                steps = range(round(input.shape[-1] * smallest / self.size_increment) + 1,
                              round(input.shape[-1] / self.size_increment) + 1)
                accepted = next((self._pinned(k * self.size_increment / input.shape[-1], input.shape[-1])
                                 for k in steps if runs(k * self.size_increment / input.shape[-1]) is None), 1.0)
        finally:
            model.train(training)
        height, width = input.shape[-2], input.shape[-1]
        small = f"{max(1, int(smallest * height))}x{max(1, int(smallest * width))}"
        limit = (
            f"it takes only the full {height}x{width}" if accepted >= 1
            else f"the smallest size it takes is {max(1, int(accepted * height))}x{max(1, int(accepted * width))} "
                 f"(scale {accepted:g})"
        )
        fix = (
            "remove ProgressiveResizing, or use a model that takes any image size (a ViT with interpolated position "
            "embeddings, e.g. timm's dynamic_img_size=True)" if accepted >= 1
            else f"ProgressiveResizing(initial_scale={accepted:g}) or larger, or a model that takes smaller images "
                 "(timm's dynamic_img_size=True for ViTs)"
        )
        raise ValueError(
            f"ProgressiveResizing(initial_scale={self.initial_scale}, mode={self.mode!r}) starts the run on "
            f"{small} images (from {height}x{width}), but {type(model).__name__} fails on them "
            f"({type(error).__name__}: {' '.join(str(error).split())}); {limit}. Fix: {fix}."
        )

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        input = state.batch_get_item(self.input_key)
        target = state.batch_get_item(self.target_key)
        if not isinstance(input, torch.Tensor) or input.ndim < 3:
            raise TypeError(
                f"ProgressiveResizing needs an image tensor (N, C, H, W) at input_key={self.input_key!r}, got "
                f"{type(input).__name__}{tuple(input.shape) if isinstance(input, torch.Tensor) else ''}."
            )
        if not self._size_checked:  # the first batch: before any step, try the smallest size on the model
            self._size_checked = True
            self._check_model_takes_smallest(state, input)
        scale = self.scale_at(state)
        pinned = self._pinned(scale, input.shape[-1])
        # Only a crop that shrinks draws anything; its generator is positional, so skipping it elsewhere
        # changes no draw (resumed runs still crop where the uninterrupted run did).
        draws = self.mode == "crop" and pinned < 1
        generator = state.generator(type(self).__name__, "cpu") if draws else None
        new_input, new_target = resize_batch(input, target, pinned, self.mode, self.resize_targets, generator)
        state.batch_set_item(self.input_key, new_input)
        if self.resize_targets:
            state.batch_set_item(self.target_key, new_target)
        logger.log_metrics({
            "ProgressiveResizing/height": new_input.shape[-2],
            "ProgressiveResizing/width": new_input.shape[-1],
            "ProgressiveResizing/scale_factor": scale,
        })
