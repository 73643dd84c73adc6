"""AugMix: mix each image with several random augmentation chains of itself (Hendrycks et al., 2020).

Functional form :func:`augmix_image`; the :class:`AugMix` algorithm applies it to every training
micro-batch at ``AFTER_DATALOADER``, on the batch's device, and :class:`AugmentAndMixTransform`
to single images (tensors or Pillow images) in a ``Dataset``. Unlike Composer's (Pillow operations
in the data loader workers), the augmentations here are tensor operations on the whole batch;
each image still gets its own chains, ops, magnitudes and mixing weights.

Examples:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> out = augmix_image(torch.rand(4, 3, 16, 16), severity=3, width=3, generator=g)
    >>> out.shape, bool(out.min() >= 0 and out.max() <= 1)
    (torch.Size([4, 3, 16, 16]), True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from composer_bridge.algorithms import _augment_ops
from composer_bridge.algorithms._image_augmentation import ImageAugmentation
from composer_bridge.core.batch import BatchKey

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

__all__ = ["AugMix", "AugmentAndMixTransform", "augmix_image"]

_RANDOM_DEPTH = (1, 3)  # a chain's length when depth == -1, uniform over this range (Composer's)


def _check(severity: float, depth: int, width: int, alpha: float, augmentation_set: str | Sequence[str],
           where: str) -> tuple[str, ...]:
    _augment_ops.check_severity(severity, where, 3)
    if isinstance(depth, bool) or not isinstance(depth, int) or not (depth == -1 or depth >= 1):
        raise ValueError(
            f"{where}(depth={depth!r}): depth is the number of ops per chain, an int >= 1, or -1 (default) for a "
            f"random length from {_RANDOM_DEPTH[0]} to {_RANDOM_DEPTH[1]} per chain."
        )
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"{where}(width={width!r}): width is the number of chains mixed, an int >= 1 (default 3).")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < math.inf:
        raise ValueError(
            f"{where}(alpha={alpha!r}): alpha must be a finite number > 0; it is the Dirichlet and Beta "
            "concentration of the mixing weights (1 is uniform, small values favour one chain). The default is 1.0."
        )
    return _augment_ops.check_augmentation_set(augmentation_set, where)


def augmix_image(
    img: torch.Tensor | PILImage,
    severity: float = 3,
    depth: int = -1,
    width: int = 3,
    alpha: float = 1.0,
    augmentation_set: str | Sequence[str] = "all",
    generator: torch.Generator | None = None,
) -> torch.Tensor | PILImage:
    """AugMix every image: ``(1 - m) * x + m * sum_i w_i * chain_i(x)``.

    For each image: ``width`` chains of ``depth`` ops (or 1 to 3 ops each when ``depth == -1``),
    each op drawn uniformly from ``augmentation_set`` at a level ``U(0.1, severity)``; chain
    weights ``w ~ Dirichlet(alpha, ..., alpha)`` and the mixing weight ``m ~ Beta(alpha, alpha)``.
    The whole batch is processed at once on its device.

    Args:
        img: an image ``(C, H, W)`` or a batch ``(N, C, H, W)``: floating point with values in
            ``[0, 1]`` (values outside are clipped), or ``uint8``; or a Pillow image of mode
            ``"L"`` or ``"RGB"`` (it gets what its ``uint8`` tensor gets).
        severity: how strong each op is, from 0 to 10. Default ``3``.
        depth: ops per chain, ``>= 1``, or ``-1`` (default) for 1 to 3 at random per chain.
        width: chains per image. Default ``3``.
        alpha: concentration of the chain and mixing weights, ``> 0``. Default ``1.0``.
        augmentation_set: ``"all"`` (default), ``"safe"``, ``"original"``, or a sequence of op names.
        generator: the source of the draws (best on the images' device); ``None`` uses torch's
            global generator.

    Returns:
        A new tensor of ``img``'s shape and dtype, or a new Pillow image of ``img``'s mode.

    Examples:
        >>> import torch
        >>> x = torch.rand(2, 3, 8, 8)
        >>> out = augmix_image(x, severity=0, depth=1, width=1, augmentation_set=["translate_x"])
        >>> torch.allclose(out, x)  # severity 0 shifts by int(0.1 * 8 / 30) = 0 pixels: the mix is x itself
        True
    """
    names = _check(severity, depth, width, alpha, augmentation_set, "augmix_image")
    images, restore = _augment_ops.to_batch(img, "augmix_image")
    n = images.shape[0]
    where = generator.device if generator is not None else images.device
    weights = _augment_ops.sample_dirichlet(alpha, n, width, generator, images.device).to(images.device, images.dtype)
    mixing = _augment_ops.sample_symmetric_beta(alpha, n, generator, images.device).to(images.device, images.dtype)
    lengths = None
    if depth == -1:
        lengths = torch.randint(_RANDOM_DEPTH[0], _RANDOM_DEPTH[1] + 1, (n, width), generator=generator, device=where)
    steps = depth if depth > 0 else _RANDOM_DEPTH[1]
    chains = [[_augment_ops.draw_step(n, len(names), generator, images.device) for _ in range(steps)]
              for _ in range(width)]
    out = torch.empty_like(images)
    for rows in _augment_ops.chunks(images):
        chunk = images[rows].clamp(0, 1)
        combination = torch.zeros_like(chunk)
        for chain, chain_draws in enumerate(chains):
            augmented = chunk
            for step, draws in enumerate(chain_draws):
                active = None if lengths is None else lengths[rows, chain] > step
                augmented = _augment_ops.augment_step(augmented, names, draws.rows(rows), severity, active)
            combination += weights[rows, chain].view(-1, 1, 1, 1) * augmented
        m = mixing[rows].view(-1, 1, 1, 1)
        out[rows] = ((1 - m) * chunk + m * combination).clamp_(0, 1)
    return restore(out)


class AugmentAndMixTransform(torch.nn.Module):
    """:func:`augmix_image` as a dataset transform for single images: tensors or Pillow images.

    A Pillow image (mode ``"L"`` or ``"RGB"``, what torchvision's datasets give before
    ``ToTensor``) comes back as a Pillow image of its mode, with the pixels its ``uint8`` tensor
    would get. Draws from torch's global generator, which the ``DataLoader`` seeds in each worker.

    Args:
        severity: see :class:`AugMix`. Default ``3``.
        depth: see :class:`AugMix`. Default ``-1``.
        width: see :class:`AugMix`. Default ``3``.
        alpha: see :class:`AugMix`. Default ``1.0``.
        augmentation_set: see :class:`AugMix`. Default ``"all"``.

    Examples:
        >>> import torch
        >>> AugmentAndMixTransform(severity=3, width=3)(torch.rand(3, 32, 32)).shape
        torch.Size([3, 32, 32])
    """

    def __init__(self, severity: float = 3, depth: int = -1, width: int = 3, alpha: float = 1.0,
                 augmentation_set: str | Sequence[str] = "all") -> None:
        super().__init__()
        _check(severity, depth, width, alpha, augmentation_set, "AugmentAndMixTransform")
        self.severity = severity
        self.depth = depth
        self.width = width
        self.alpha = alpha
        self.augmentation_set = augmentation_set

    def forward(self, img: torch.Tensor | PILImage) -> torch.Tensor | PILImage:
        return augmix_image(img, self.severity, self.depth, self.width, self.alpha, self.augmentation_set)

    def extra_repr(self) -> str:
        return (f"severity={self.severity!r}, depth={self.depth!r}, width={self.width!r}, alpha={self.alpha!r}, "
                f"augmentation_set={self.augmentation_set!r}")


class AugMix(ImageAugmentation):
    """AugMix every image of every training batch at ``AFTER_DATALOADER``, on the batch's device.

    Each image draws its own chains, ops, magnitudes and weights from the run's generator, so
    the augmentation costs no data-loader worker time and resumes exactly. The images must be in
    ``[0, 1]``; for a batch the data already normalised, give ``mean`` and ``std``.

    Only the augmented images are trained on: the Jensen-Shannon consistency loss of the AugMix
    paper (which needs the clean and two augmented copies of each image) is not part of the
    algorithm, as in Composer.

    Args:
        severity: how strong each op is, from 0 to 10. Default ``3``.
        depth: ops per chain, ``>= 1``, or ``-1`` (default) for 1 to 3 at random per chain.
        width: chains mixed per image. Default ``3``.
        alpha: concentration of the Dirichlet chain weights and the Beta mixing weight, ``> 0``.
            Default ``1.0``.
        augmentation_set: ``"all"`` (default), ``"safe"``, ``"original"``, or a sequence of op names.
        mean: per-channel means the batch was normalised with (or one number), or ``None``
            (default) for images in ``[0, 1]``.
        std: per-channel standard deviations the batch was normalised with, with ``mean``.
        input_key: where the images are in the batch.

    Examples:
        >>> AugMix(severity=3, width=3)
        AugMix(severity=3, depth=-1, width=3, alpha=1.0, augmentation_set='all', mean=None, std=None, input_key=0)
    """

    def __init__(
        self,
        severity: float = 3,
        depth: int = -1,
        width: int = 3,
        alpha: float = 1.0,
        augmentation_set: str | Sequence[str] = "all",
        mean: float | Sequence[float] | None = None,
        std: float | Sequence[float] | None = None,
        input_key: BatchKey = 0,
    ) -> None:
        _check(severity, depth, width, alpha, augmentation_set, "AugMix")
        super().__init__(augmentation_set, mean, std, input_key)
        self.severity = severity
        self.depth = depth
        self.width = width
        self.alpha = alpha

    def augment(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return augmix_image(images, self.severity, self.depth, self.width, self.alpha, self.augmentation_set, generator)
