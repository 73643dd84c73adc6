"""Pillow images in and out of the tensor code (ColOut, RandAugment and AugMix transforms).

torchvision pipelines transform Pillow images before ``ToTensor``, so the dataset transforms take
them as Composer's do. Pillow stays optional: nothing here imports it. A Pillow image can only
exist once ``PIL.Image`` is imported, so :func:`is_pil_image` looks for that module in
``sys.modules``; the conversions run only on such images (and use numpy, which Pillow's array
interface needs anyway).

- :func:`pil_array` / :func:`pil_from_array`: the raw pixels of any mode as a ``(H, W)`` or
  ``(H, W, bands)`` numpy array and back into an image of the same mode (palette and ``info``
  kept), for operations that only move pixels (ColOut);
- :func:`pil_to_levels` / :func:`levels_to_pil`: an 8-bit ``"L"`` or ``"RGB"`` image as a ``uint8``
  ``(C, H, W)`` tensor and back, for the augmentations, which compute on channel levels.

Examples:
    >>> import torch
    >>> from PIL import Image
    >>> image = Image.new("RGB", (4, 3), (10, 20, 30))
    >>> is_pil_image(image), is_pil_image(torch.zeros(3))
    (True, False)
    >>> levels = pil_to_levels(image, "example")
    >>> levels.shape, levels.dtype, levels[:, 0, 0].tolist()
    (torch.Size([3, 3, 4]), torch.uint8, [10, 20, 30])
    >>> levels_to_pil(levels, image).tobytes() == image.tobytes()
    True
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import numpy as np
    from PIL.Image import Image

__all__ = ["LEVEL_MODES", "is_pil_image", "levels_to_pil", "pil_array", "pil_from_array", "pil_to_levels"]

#: The Pillow modes the augmentations take: 8 bits per channel, every channel a colour.
LEVEL_MODES = ("L", "RGB")


def is_pil_image(obj: object) -> bool:
    """Whether ``obj`` is a Pillow image (without importing Pillow)."""
    module = sys.modules.get("PIL.Image")
    return module is not None and isinstance(obj, module.Image)


def pil_array(image: Image) -> np.ndarray:
    """The pixels of ``image``, any mode, as a ``(H, W)`` or ``(H, W, bands)`` numpy array (mode ``"1"``: bools)."""
    import numpy as np

    return np.asarray(image)


def pil_from_array(array: np.ndarray, like: Image) -> Image:
    """An image of ``like``'s mode, palette and ``info`` holding ``array`` (laid out as :func:`pil_array` gives it)."""
    import numpy as np
    from PIL import Image

    height, width = array.shape[:2]
    if like.mode == "1":  # one bit per pixel, each row padded to whole bytes
        data = np.packbits(array, axis=1).tobytes()
    else:
        data = np.ascontiguousarray(array).tobytes()
    out = Image.frombytes(like.mode, (width, height), data)
    if like.palette is not None and like.mode in ("P", "PA"):
        out.putpalette(like.getpalette(rawmode=like.palette.mode), rawmode=like.palette.mode)
    out.info.update(like.info)
    return out


def _refuse_mode(image: Any, where: str) -> None:
    if image.mode not in LEVEL_MODES:
        raise TypeError(
            f"{where} takes Pillow images of mode {' or '.join(repr(m) for m in LEVEL_MODES)} (8-bit grey or "
            f"colour), got mode {image.mode!r}; convert it first, e.g. image.convert('RGB') (or pass a tensor)."
        )


def pil_to_levels(image: Image, where: str) -> torch.Tensor:
    """An ``"L"`` or ``"RGB"`` image as a ``uint8`` ``(C, H, W)`` tensor of its levels; other modes are refused."""
    _refuse_mode(image, where)
    array = pil_array(image)
    levels = torch.tensor(array, dtype=torch.uint8)
    return levels.unsqueeze(0) if levels.ndim == 2 else levels.permute(2, 0, 1).contiguous()


def levels_to_pil(levels: torch.Tensor, like: Image) -> Image:
    """A ``uint8`` ``(C, H, W)`` tensor as an image of ``like``'s mode (the inverse of :func:`pil_to_levels`)."""
    array = levels.detach().to("cpu", torch.uint8).permute(1, 2, 0)
    if like.mode == "L":
        array = array[..., 0]
    return pil_from_array(array.contiguous().numpy(), like)
