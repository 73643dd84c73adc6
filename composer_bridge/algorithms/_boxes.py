"""Random boxes in images, shared by CutMix (the pasted box) and CutOut (the holes).

A box is ``(row_start, col_start, row_end, col_end)``: rows index dimension ``-2`` (height),
columns dimension ``-1`` (width), ends excluded, so it selects ``x[..., r0:r1, c0:c1]``.

Examples:
    >>> import torch
    >>> r0, c0, r1, c1 = random_box(8, 8, 4, 4, False, torch.Generator().manual_seed(0))
    >>> 0 <= r0 <= r1 <= 8 and 0 <= c0 <= c1 <= 8 and r1 - r0 <= 4
    True
"""

from __future__ import annotations

import torch

from composer_bridge.algorithms._draws import random_int

__all__ = ["Box", "random_box"]

Box = tuple[int, int, int, int]


def random_box(
    height: int, width: int, cut_height: int, cut_width: int, uniform_sampling: bool,
    generator: torch.Generator | None,
) -> Box:
    """A ``cut_height x cut_width`` box around a random centre, clipped to the image.

    The centre is uniform over the image, or (``uniform_sampling``) over the image grown by half
    the box on every side, so that every pixel is equally likely to be covered.
    """
    if uniform_sampling:
        row = random_int(-(cut_height // 2), height + cut_height // 2, generator)
        col = random_int(-(cut_width // 2), width + cut_width // 2, generator)
    else:
        row = random_int(0, height, generator)
        col = random_int(0, width, generator)
    return (
        min(max(row - cut_height // 2, 0), height), min(max(col - cut_width // 2, 0), width),
        min(max(row + cut_height // 2, 0), height), min(max(col + cut_width // 2, 0), width),
    )
