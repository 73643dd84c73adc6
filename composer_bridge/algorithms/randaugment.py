"""RandAugment: a chain of ``depth`` random image augmentations per image (Cubuk et al., 2020).

Functional form :func:`randaugment_image`; the :class:`RandAugment` algorithm applies it to every
training micro-batch at ``AFTER_DATALOADER``, on the batch's device, and
:class:`RandAugmentTransform` to single images (tensors or Pillow images) in a ``Dataset``. Unlike
Composer's (Pillow operations in the data loader workers), the augmentations here are tensor
operations on the whole batch; each image still gets its own ops and magnitudes. The ops and Composer's severity scale are
described in :mod:`composer_bridge.algorithms._augment_ops`.

Examples:
    >>> import torch
    >>> twice = torch.rand(1, 3, 16, 16).repeat(2, 1, 1, 1)  # one image, twice in the batch
    >>> out = randaugment_image(twice, severity=9, depth=2, generator=torch.Generator().manual_seed(0))
    >>> torch.equal(out[0], out[1])  # each image drew its own ops and magnitudes
    False
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from composer_bridge.algorithms import _augment_ops
from composer_bridge.algorithms._image_augmentation import ImageAugmentation
from composer_bridge.core.batch import BatchKey

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

__all__ = ["RandAugment", "RandAugmentTransform", "randaugment_image"]


def _check(severity: float, depth: int, augmentation_set: str | Sequence[str], where: str) -> tuple[str, ...]:
    _augment_ops.check_severity(severity, where, 9)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ValueError(f"{where}(depth={depth!r}): depth is the number of ops per image, an int >= 0 (default 2).")
    return _augment_ops.check_augmentation_set(augmentation_set, where)


def randaugment_image(
    img: torch.Tensor | PILImage,
    severity: float = 9,
    depth: int = 2,
    augmentation_set: str | Sequence[str] = "all",
    generator: torch.Generator | None = None,
) -> torch.Tensor | PILImage:
    """Apply ``depth`` ops, each drawn uniformly (with replacement) from ``augmentation_set``, to every image.

    Each image draws its own ops and magnitudes (a level ``U(0.1, severity)`` per op, mapped onto
    the op's range as in Composer). The whole batch is processed at once on its device.

    Args:
        img: an image ``(C, H, W)`` or a batch ``(N, C, H, W)``: floating point with values in
            ``[0, 1]`` (values outside are clipped), or ``uint8``; or a Pillow image of mode
            ``"L"`` or ``"RGB"`` (it gets what its ``uint8`` tensor gets).
        severity: how strong each op is, from 0 to 10. Default ``9``.
        depth: ops per image. Default ``2``.
        augmentation_set: ``"all"`` (default), ``"safe"``, ``"original"``, or a sequence of op
            names (see :data:`~composer_bridge.algorithms._augment_ops.AUGMENTATION_SETS`).
        generator: the source of the draws (best on the images' device); ``None`` uses torch's
            global generator.

    Returns:
        A new tensor of ``img``'s shape and dtype, or a new Pillow image of ``img``'s mode.

    Examples:
        >>> import torch
        >>> x = torch.rand(3, 8, 8)
        >>> torch.equal(randaugment_image(x, depth=0), x)
        True
        >>> randaugment_image((x * 255).to(torch.uint8), depth=1).dtype
        torch.uint8
    """
    names = _check(severity, depth, augmentation_set, "randaugment_image")
    images, restore = _augment_ops.to_batch(img, "randaugment_image")
    if depth == 0:
        return restore(images.clone())
    steps = [_augment_ops.draw_step(images.shape[0], len(names), generator, images.device) for _ in range(depth)]
    out = torch.empty_like(images)
    for rows in _augment_ops.chunks(images):
        chunk = images[rows].clamp(0, 1)
        for draws in steps:
            chunk = _augment_ops.augment_step(chunk, names, draws.rows(rows), severity)
        out[rows] = chunk
    return restore(out)


class RandAugmentTransform(torch.nn.Module):
    """:func:`randaugment_image` as a dataset transform for single images: tensors or Pillow images.

    A Pillow image (mode ``"L"`` or ``"RGB"``, what torchvision's datasets give before
    ``ToTensor``) comes back as a Pillow image of its mode, with the pixels its ``uint8`` tensor
    would get. Draws from torch's global generator, which the ``DataLoader`` seeds in each worker.

    Args:
        severity: see :class:`RandAugment`. Default ``9``.
        depth: see :class:`RandAugment`. Default ``2``.
        augmentation_set: see :class:`RandAugment`. Default ``"all"``.

    Examples:
        >>> import torch
        >>> transform = RandAugmentTransform(severity=9, depth=2)
        >>> transform(torch.rand(3, 32, 32)).shape
        torch.Size([3, 32, 32])
    """

    def __init__(self, severity: float = 9, depth: int = 2, augmentation_set: str | Sequence[str] = "all") -> None:
        super().__init__()
        _check(severity, depth, augmentation_set, "RandAugmentTransform")
        self.severity = severity
        self.depth = depth
        self.augmentation_set = augmentation_set

    def forward(self, img: torch.Tensor | PILImage) -> torch.Tensor | PILImage:
        return randaugment_image(img, self.severity, self.depth, self.augmentation_set)

    def extra_repr(self) -> str:
        return f"severity={self.severity!r}, depth={self.depth!r}, augmentation_set={self.augmentation_set!r}"


class RandAugment(ImageAugmentation):
    """Apply ``depth`` random augmentations to every image of every training batch at ``AFTER_DATALOADER``.

    Each image draws its own ops and magnitudes from the run's generator on the batch's device,
    so the augmentation costs no data-loader worker time and resumes exactly. The images must be
    in ``[0, 1]``; for a batch that the data already normalised, give ``mean`` and ``std`` and the
    images are taken back to ``[0, 1]``, augmented, and normalised again.

    Args:
        severity: how strong each op is, from 0 to 10 (``M`` in the paper). Default ``9``.
        depth: ops per image (``N`` in the paper). Default ``2``.
        augmentation_set: ``"all"`` (default), ``"safe"`` (leaves out the blends that also make
            the ImageNet-C/CIFAR-10-C corruptions), ``"original"`` (the AugMix paper's blend
            factors), or a sequence of op names.
        mean: per-channel means the batch was normalised with (or one number), or ``None``
            (default) for images in ``[0, 1]``.
        std: per-channel standard deviations the batch was normalised with, with ``mean``.
        input_key: where the images are in the batch.

    Examples:
        >>> RandAugment(severity=9, depth=1)
        RandAugment(severity=9, depth=1, augmentation_set='all', mean=None, std=None, input_key=0)
    """

    def __init__(
        self,
        severity: float = 9,
        depth: int = 2,
        augmentation_set: str | Sequence[str] = "all",
        mean: float | Sequence[float] | None = None,
        std: float | Sequence[float] | None = None,
        input_key: BatchKey = 0,
    ) -> None:
        _check(severity, depth, augmentation_set, "RandAugment")
        super().__init__(augmentation_set, mean, std, input_key)
        self.severity = severity
        self.depth = depth

    def augment(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return randaugment_image(images, self.severity, self.depth, self.augmentation_set, generator)
