"""CutOut: zero out square holes in the training images (DeVries and Taylor, 2017).

Functional form :func:`cutout_batch`; the :class:`CutOut` algorithm applies it to every training
micro-batch at ``AFTER_DATALOADER``. The same holes are cut from every image of a batch.

Examples:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> out = cutout_batch(torch.ones(2, 3, 8, 8), num_holes=1, length=0.5, generator=g)
    >>> int((out[0, 0] == 0).sum()) <= 16, torch.equal(out[0], out[1])
    (True, True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from composer_bridge.algorithms._boxes import random_box
from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.batch import BatchKey
from composer_bridge.core.event import Event

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["CutOut", "cutout_batch"]


def _check(num_holes: int, length: float, where: str) -> None:
    if isinstance(num_holes, bool) or not isinstance(num_holes, int) or num_holes < 0:
        raise ValueError(f"{where}(num_holes={num_holes!r}): the number of holes must be an int >= 0 (default 1).")
    if isinstance(length, bool) or not isinstance(length, (int, float)) or not 0 <= length <= 1:
        raise ValueError(
            f"{where}(length={length!r}): length is the hole's side as a fraction of the image's shorter side "
            "and must be in [0, 1] (default 0.5)."
        )


def cutout_batch(
    input: torch.Tensor,
    num_holes: int = 1,
    length: float = 0.5,
    uniform_sampling: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Set ``num_holes`` square holes of side ``int(length * min(H, W))`` to zero, the same in every image.

    Each hole is centred on a random pixel (or, with ``uniform_sampling``, on a random point of
    the image grown by half a hole on each side, so every pixel is equally likely to be covered)
    and clipped at the edges; holes may overlap.

    Args:
        input: an image ``(C, H, W)`` or a batch ``(N, C, H, W)`` (any ``(..., H, W)``).
        num_holes: how many holes. Default ``1``.
        length: the hole's side as a fraction of the shorter image side, in ``[0, 1]``. Default ``0.5``.
        uniform_sampling: draw centres so that every pixel is equally likely to be covered.
        generator: the source of the hole positions (a CPU generator keeps them off the device).

    Returns:
        A new tensor: ``input`` with the holes set to zero.

    Examples:
        >>> import torch
        >>> out = cutout_batch(torch.ones(1, 1, 4, 6), length=0.5, generator=torch.Generator().manual_seed(1))
        >>> out.shape, 1 <= int((out == 0).sum()) <= 4  # one hole of at most 2x2 pixels
        (torch.Size([1, 1, 4, 6]), True)
    """
    _check(num_holes, length, "cutout_batch")
    height, width = input.shape[-2], input.shape[-1]
    side = int(min(height, width) * length)
    output = input.clone()
    for _ in range(num_holes):  # a handful of holes, each one slice of the whole batch
        r0, c0, r1, c1 = random_box(height, width, side, side, uniform_sampling, generator)
        output[..., r0:r1, c0:c1] = 0
    return output


class CutOut(Algorithm):
    """Zero out ``num_holes`` random squares of every training batch at ``AFTER_DATALOADER``.

    Positions are drawn from the run's generator, once per micro-batch, and shared by all images
    of the micro-batch. Only the inputs change; targets (including per-pixel ones) are untouched.

    Args:
        num_holes: holes per batch. Default ``1``.
        length: the hole's side as a fraction of the shorter image side, in ``[0, 1]``. Default ``0.5``.
        uniform_sampling: every pixel equally likely to be covered. Default ``False``.
        input_key: where the images are in the batch.

    Examples:
        >>> CutOut(num_holes=1, length=0.25)
        CutOut(num_holes=1, length=0.25, uniform_sampling=False, input_key=0)
    """

    needs = frozenset({"image"})
    unique = True
    augments_data = True

    def __init__(
        self, num_holes: int = 1, length: float = 0.5, uniform_sampling: bool = False, input_key: BatchKey = 0
    ) -> None:
        _check(num_holes, length, "CutOut")
        if not isinstance(uniform_sampling, bool):
            raise TypeError(f"CutOut(uniform_sampling={uniform_sampling!r}): must be True or False.")
        self.num_holes = num_holes
        self.length = length
        self.uniform_sampling = uniform_sampling
        self.input_key = input_key

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        images = state.batch_get_item(self.input_key)
        if not isinstance(images, torch.Tensor) or images.ndim < 2:
            raise TypeError(
                f"CutOut needs an image tensor (N, C, H, W) at input_key={self.input_key!r}, got "
                f"{type(images).__name__}{tuple(images.shape) if isinstance(images, torch.Tensor) else ''}."
            )
        generator = state.generator(type(self).__name__, "cpu")
        state.batch_set_item(
            self.input_key, cutout_batch(images, self.num_holes, self.length, self.uniform_sampling, generator)
        )
