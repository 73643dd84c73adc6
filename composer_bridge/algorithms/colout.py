"""ColOut: drop random rows and columns of the training images, shrinking them a little.

Functional form :func:`colout_batch`; the :class:`ColOut` algorithm applies it to every training
micro-batch at ``AFTER_DATALOADER`` (the same rows and columns for every image of the batch, and
for per-pixel targets when they have the images' height and width).

Example:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> images, masks = colout_batch((torch.randn(4, 3, 20, 10), torch.zeros(4, 20, 10)), generator=g)
    >>> images.shape, masks.shape
    (torch.Size([4, 3, 17, 8]), torch.Size([4, 17, 8]))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.batch import BatchKey
from composer_bridge.core.event import Event

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["ColOut", "colout_batch"]


def _check_fraction(name: str, value: float, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(
            f"{where}({name}={value!r}): the fraction of {'rows' if name == 'p_row' else 'columns'} to drop "
            "must be in [0, 1] (default 0.15)."
        )


def _check_resize_target(resize_target: bool | str, where: str) -> None:
    if not isinstance(resize_target, bool) and resize_target != "auto":
        raise ValueError(f"{where}(resize_target={resize_target!r}): must be True, False or 'auto'.")


def _should_resize_target(input: torch.Tensor, target: object, resize_target: bool | str) -> bool:
    """``'auto'``: drop the same rows/columns from targets that have the inputs' height and width."""
    if isinstance(resize_target, bool):
        return resize_target
    return isinstance(target, torch.Tensor) and target.ndim > 2 and target.shape[-2:] == input.shape[-2:]


def _kept_indices(size: int, p_drop: float, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """Sorted indices of the ``int((1 - p_drop) * size)`` rows (or columns) kept; at least one."""
    kept = max(1, int((1.0 - p_drop) * size))
    if generator is None:
        order = torch.randperm(size, device=device)
    else:
        order = torch.randperm(size, generator=generator, device=generator.device).to(device)
    return order[:kept].sort().values


def colout_batch(
    sample: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    p_row: float = 0.15,
    p_col: float = 0.15,
    resize_target: bool | str = "auto",
    generator: torch.Generator | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Drop the same random rows and columns from a batch of images (and optionally its targets).

    ``int((1 - p_row) * H)`` rows and ``int((1 - p_col) * W)`` columns are kept (at least one
    each), in their original order.

    Args:
        sample: images ``(N, C, H, W)`` or one image ``(C, H, W)``, or a pair ``(images, targets)``.
        p_row: fraction of rows to drop, in ``[0, 1]``. Default ``0.15``.
        p_col: fraction of columns to drop, in ``[0, 1]``. Default ``0.15``.
        resize_target: for a pair, whether to drop the same rows and columns from the targets;
            ``'auto'`` (default) does so when the targets have the images' height and width.
        generator: the source of the draws (best on the images' device).

    Returns:
        The smaller images, or the pair ``(images, targets)`` when ``sample`` is a pair
        (targets unchanged unless resized).

    Example:
        >>> import torch
        >>> colout_batch(torch.randn(2, 3, 10, 10), p_row=0.5, p_col=0.2).shape
        torch.Size([2, 3, 5, 8])
    """
    _check_fraction("p_row", p_row, "colout_batch")
    _check_fraction("p_col", p_col, "colout_batch")
    _check_resize_target(resize_target, "colout_batch")
    pair = isinstance(sample, (tuple, list))
    if pair and len(sample) != 2:
        raise ValueError(f"colout_batch takes images or an (images, targets) pair, got a sequence of {len(sample)}.")
    images = sample[0] if pair else sample
    if not isinstance(images, torch.Tensor) or images.ndim < 2:
        raise TypeError(f"colout_batch needs image tensors (N, C, H, W) or (C, H, W), got {type(images).__name__}.")
    rows = _kept_indices(images.shape[-2], p_row, images.device, generator)
    cols = _kept_indices(images.shape[-1], p_col, images.device, generator)
    smaller = images.index_select(-2, rows).index_select(-1, cols)
    if not pair:
        return smaller
    target = sample[1]
    if _should_resize_target(images, target, resize_target):
        target = target.index_select(-2, rows).index_select(-1, cols)
    return smaller, target


class ColOut(Algorithm):
    """Drop random rows and columns of every training batch at ``AFTER_DATALOADER``.

    The kept rows and columns are drawn from the run's generator once per micro-batch and shared
    by all its images (and by per-pixel targets, see ``resize_target``). A small fraction barely
    changes what the image shows but makes it smaller (faster) and adds variety.

    Args:
        p_row: fraction of rows to drop, in ``[0, 1]``. Default ``0.15``.
        p_col: fraction of columns to drop, in ``[0, 1]``. Default ``0.15``.
        batch: must be ``True`` (drop per batch on the device). Composer's per-sample mode adds
            a torchvision dataset transform; here, call :func:`colout_batch` on ``(image, target)``
            in your ``Dataset`` instead.
        resize_target: drop the same rows and columns from the targets: ``True``, ``False``, or
            ``'auto'`` (default: when the targets have the images' height and width).
        input_key: where the inputs are in the batch (index, dict key or ``(getter, setter)``).
        target_key: where the targets are in the batch.

    Example:
        >>> ColOut(p_row=0.15, p_col=0.15)
        ColOut(p_row=0.15, p_col=0.15, batch=True, resize_target='auto', input_key=0, target_key=1)
    """

    unique = True

    def __init__(
        self,
        p_row: float = 0.15,
        p_col: float = 0.15,
        batch: bool = True,
        resize_target: bool | str = "auto",
        input_key: BatchKey = 0,
        target_key: BatchKey = 1,
    ) -> None:
        _check_fraction("p_row", p_row, "ColOut")
        _check_fraction("p_col", p_col, "ColOut")
        _check_resize_target(resize_target, "ColOut")
        if batch is not True:
            raise ValueError(
                f"ColOut(batch={batch!r}): only batch=True is supported. Composer's batch=False installs a "
                "torchvision dataset transform, and composer_bridge does not depend on torchvision; to drop "
                "rows and columns per sample, call composer_bridge.functional.colout_batch((image, target)) in "
                "your Dataset's __getitem__ instead."
            )
        self.p_row = p_row
        self.p_col = p_col
        self.batch = batch
        self.resize_target = resize_target
        self.input_key = input_key
        self.target_key = target_key

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        images = state.batch_get_item(self.input_key)
        if not isinstance(images, torch.Tensor) or images.ndim < 3:
            raise TypeError(
                f"ColOut needs an image tensor (N, C, H, W) at input_key={self.input_key!r}, got "
                f"{type(images).__name__}{tuple(images.shape) if isinstance(images, torch.Tensor) else ''}."
            )
        target = state.batch_get_item(self.target_key) if self.resize_target is not False else None
        resize = _should_resize_target(images, target, self.resize_target)
        generator = state.generator(type(self).__name__, images.device)
        if resize:
            if not isinstance(target, torch.Tensor):
                raise TypeError(f"ColOut(resize_target=True) needs a target tensor, got {type(target).__name__}.")
            new_images, new_target = colout_batch((images, target), self.p_row, self.p_col, True, generator)
            state.batch_set_item(self.input_key, new_images)
            state.batch_set_item(self.target_key, new_target)
        else:
            state.batch_set_item(self.input_key, colout_batch(images, self.p_row, self.p_col, False, generator))
