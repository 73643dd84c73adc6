"""ColOut: drop random rows and columns of the training images, shrinking them a little.

Functional form :func:`colout_batch`; the :class:`ColOut` algorithm applies it to every training
micro-batch at ``AFTER_DATALOADER`` (the same rows and columns for every image of the batch, or,
with ``batch=False``, different ones for each image; per-pixel targets with the images' height and
width lose the same ones as their image). :class:`ColOutTransform` does it to single samples in a
``Dataset``: tensors, or Pillow images as torchvision pipelines hold them before ``ToTensor``
(any mode; the result is an image of the same mode holding exactly the kept pixels). Pillow is
never imported here, only recognised when given.

Examples:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> images, masks = colout_batch((torch.randn(4, 3, 20, 10), torch.zeros(4, 20, 10)), generator=g)
    >>> images.shape, masks.shape
    (torch.Size([4, 3, 17, 8]), torch.Size([4, 17, 8]))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from composer_bridge.algorithms._pil_images import is_pil_image, pil_array, pil_from_array
from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.batch import BatchKey
from composer_bridge.core.event import Event

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["ColOut", "ColOutTransform", "colout_batch"]


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
        # Sorted where drawn, then moved: the sort never runs on the target device (XLA on the CPU
        # aborts on sorting a freshly transferred index tensor).
        order = torch.randperm(size, generator=generator, device=generator.device)
        return order[:kept].sort().values.to(device)
    return order[:kept].sort().values


def _kept_per_sample(
    n: int, size: int, p_drop: float, device: torch.device, generator: torch.Generator | None
) -> torch.Tensor:
    """``(n, kept)`` sorted indices: each row an independent uniform choice of ``kept`` of ``size`` positions."""
    kept = max(1, int((1.0 - p_drop) * size))
    gen_device = generator.device if generator is not None else device
    scores = torch.rand(n, size, generator=generator, device=gen_device)
    return scores.argsort(dim=1)[:, :kept].sort(dim=1).values.to(device)


def _take_per_sample(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``x[i, ..., rows[i], :][..., cols[i]]`` for every sample ``i`` of ``x`` (``(N, ..., H, W)``)."""
    flat = x.reshape(x.shape[0], -1, x.shape[-2], x.shape[-1])
    n, c, _, width = flat.shape
    flat = flat.gather(2, rows[:, None, :, None].expand(n, c, rows.shape[1], width))
    flat = flat.gather(3, cols[:, None, None, :].expand(n, c, rows.shape[1], cols.shape[1]))
    return flat.reshape(*x.shape[:-2], rows.shape[1], cols.shape[1])


def _spatial_size(image: Any) -> tuple[int, int] | None:
    """``(H, W)`` of a Pillow image or of a tensor's last two dimensions; ``None`` for anything else."""
    if is_pil_image(image):
        return image.height, image.width
    if isinstance(image, torch.Tensor) and image.ndim >= 2:
        return image.shape[-2], image.shape[-1]
    return None


def _take(image: Any, rows: torch.Tensor, cols: torch.Tensor) -> Any:
    """The kept rows and columns of one Pillow image (same mode) or tensor ``(..., H, W)``."""
    if is_pil_image(image):
        kept = rows.cpu().numpy(), cols.cpu().numpy()
        return pil_from_array(pil_array(image)[kept[0]][:, kept[1]], image)
    return image.index_select(-2, rows.to(image.device)).index_select(-1, cols.to(image.device))


def _colout_pil(
    image: PILImage, target: Any, pair: bool, p_row: float, p_col: float, resize_target: bool | str,
    generator: torch.Generator | None,
) -> Any:
    """:func:`colout_batch` for one Pillow image: the rows and columns the same draws give its tensor."""
    height, width = image.height, image.width
    rows = _kept_indices(height, p_row, torch.device("cpu"), generator)
    cols = _kept_indices(width, p_col, torch.device("cpu"), generator)
    smaller = _take(image, rows, cols)
    if not pair:
        return smaller
    resize = resize_target if isinstance(resize_target, bool) else _spatial_size(target) == (height, width)
    if resize and _spatial_size(target) is None:
        raise TypeError(
            f"colout_batch(resize_target=True) needs a target Pillow image or tensor (..., H, W), got "
            f"{type(target).__name__}."
        )
    return smaller, (_take(target, rows, cols) if resize else target)


def colout_batch(
    sample: torch.Tensor | PILImage | tuple[torch.Tensor | PILImage, Any],
    p_row: float = 0.15,
    p_col: float = 0.15,
    resize_target: bool | str = "auto",
    generator: torch.Generator | None = None,
    *,
    per_sample: bool = False,
) -> torch.Tensor | PILImage | tuple[torch.Tensor | PILImage, Any]:
    """Drop random rows and columns from a batch of images (and optionally its targets).

    ``int((1 - p_row) * H)`` rows and ``int((1 - p_col) * W)`` columns are kept (at least one
    each), in their original order: the same ones for every image, or, with ``per_sample=True``,
    an independent choice for each image of an ``(N, C, H, W)`` batch (its target loses the
    same ones as its image). The output keeps one size either way.

    A Pillow image (``sample`` or the first of a pair) is one image: its pixels are kept or dropped
    as those of its tensor would be with the same draws, and it comes back as a Pillow image of its
    mode; a Pillow target of the same size (or a tensor ``(..., H, W)``) loses the same rows and
    columns under ``'auto'``.

    Args:
        sample: images ``(N, C, H, W)`` or one image ``(C, H, W)`` or a Pillow image, or a pair
            ``(images, targets)``.
        p_row: fraction of rows to drop, in ``[0, 1]``. Default ``0.15``.
        p_col: fraction of columns to drop, in ``[0, 1]``. Default ``0.15``.
        resize_target: for a pair, whether to drop the same rows and columns from the targets;
            ``'auto'`` (default) does so when the targets have the images' height and width.
        generator: the source of the draws (best on the images' device).
        per_sample: draw the rows and columns separately for each image of the batch (Composer's
            ``batch=False`` behaviour, done on the batch's device).

    Returns:
        The smaller images, or the pair ``(images, targets)`` when ``sample`` is a pair
        (targets unchanged unless resized).

    Examples:
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
    if is_pil_image(images):
        if per_sample:
            raise ValueError(
                "colout_batch(per_sample=True) needs a batch of images (N, C, H, W); a Pillow image is one sample "
                "already: use per_sample=False."
            )
        return _colout_pil(images, sample[1] if pair else None, pair, p_row, p_col, resize_target, generator)
    if not isinstance(images, torch.Tensor) or images.ndim < 2:
        raise TypeError(
            f"colout_batch needs image tensors (N, C, H, W) or (C, H, W), or a Pillow image, got "
            f"{type(images).__name__}."
        )
    if per_sample and images.ndim < 4:
        raise ValueError(
            f"colout_batch(per_sample=True) needs a batch of images (N, C, H, W), got shape {tuple(images.shape)}; "
            "a single image is one sample already: use per_sample=False."
        )
    target = sample[1] if pair else None
    resize = pair and _should_resize_target(images, target, resize_target)
    if resize and (not isinstance(target, torch.Tensor) or target.ndim < 2):
        raise TypeError(f"colout_batch(resize_target=True) needs a target tensor (..., H, W), got {type(target).__name__}.")
    if per_sample:
        rows = _kept_per_sample(images.shape[0], images.shape[-2], p_row, images.device, generator)
        cols = _kept_per_sample(images.shape[0], images.shape[-1], p_col, images.device, generator)
        smaller = _take_per_sample(images, rows, cols)
        if resize:
            target = _take_per_sample(target, rows.to(target.device), cols.to(target.device))
    else:
        rows = _kept_indices(images.shape[-2], p_row, images.device, generator)
        cols = _kept_indices(images.shape[-1], p_col, images.device, generator)
        smaller = images.index_select(-2, rows).index_select(-1, cols)
        if resize:
            target = target.index_select(-2, rows.to(target.device)).index_select(-1, cols.to(target.device))
    return (smaller, target) if pair else smaller


class ColOutTransform:
    """Drop random rows and columns from one sample: a dataset transform.

    Call it on an image (a ``(C, H, W)`` tensor or a Pillow image) or an ``(image, target)`` pair,
    e.g. in a ``Dataset``'s ``__getitem__`` or a torchvision ``Compose``, before or after
    ``ToTensor``: a Pillow image comes back as a Pillow image of its mode, holding exactly the
    pixels its tensor would keep with the same draws. Each call draws afresh (from ``generator``
    if given, else torch's global generator, seeded per worker by the DataLoader).

    Args:
        p_row: fraction of rows to drop, in ``[0, 1]``. Default ``0.15``.
        p_col: fraction of columns to drop, in ``[0, 1]``. Default ``0.15``.
        resize_target: drop the same rows and columns from the target: ``True``, ``False`` or
            ``'auto'`` (default: when the target's last two dimensions are the image's height and
            width, e.g. an ``(H, W)`` mask, or the target is a Pillow image of the image's size).
        generator: an optional source of the draws.

    Examples:
        >>> import torch
        >>> transform = ColOutTransform(p_row=0.5, p_col=0.25)
        >>> image, mask = transform((torch.randn(3, 8, 8), torch.zeros(8, 8)))
        >>> image.shape, mask.shape
        (torch.Size([3, 4, 6]), torch.Size([4, 6]))
        >>> from PIL import Image
        >>> smaller = transform(Image.new("RGB", (8, 8)))  # Pillow's size is (width, height)
        >>> smaller.mode, smaller.size
        ('RGB', (6, 4))
    """

    def __init__(
        self,
        p_row: float = 0.15,
        p_col: float = 0.15,
        resize_target: bool | str = "auto",
        generator: torch.Generator | None = None,
    ) -> None:
        _check_fraction("p_row", p_row, "ColOutTransform")
        _check_fraction("p_col", p_col, "ColOutTransform")
        _check_resize_target(resize_target, "ColOutTransform")
        self.p_row = p_row
        self.p_col = p_col
        self.resize_target = resize_target
        self.generator = generator

    def __call__(
        self, sample: torch.Tensor | PILImage | tuple[torch.Tensor | PILImage, Any]
    ) -> torch.Tensor | PILImage | tuple[torch.Tensor | PILImage, Any]:
        """``sample``: an image (tensor ``(C, H, W)`` or Pillow image) or an ``(image, target)`` pair."""
        pair = isinstance(sample, (tuple, list))
        images = sample[0] if pair else sample
        if is_pil_image(images):
            return colout_batch(sample, self.p_row, self.p_col, self.resize_target, self.generator)
        if not isinstance(images, torch.Tensor):
            raise TypeError(
                f"ColOutTransform works on tensors (C, H, W) and Pillow images, got {type(images).__name__}."
            )
        resize = self.resize_target
        if pair and resize == "auto":  # one sample: an (H, W) mask is per-pixel too
            target = sample[1]
            resize = isinstance(target, torch.Tensor) and target.ndim >= 2 and target.shape[-2:] == images.shape[-2:]
        return colout_batch(sample, self.p_row, self.p_col, resize, self.generator)

    def __repr__(self) -> str:
        return (f"ColOutTransform(p_row={self.p_row!r}, p_col={self.p_col!r}, "
                f"resize_target={self.resize_target!r})")


class ColOut(Algorithm):
    """Drop random rows and columns of every training batch at ``AFTER_DATALOADER``.

    The kept rows and columns are drawn from the run's generator once per micro-batch and shared
    by all its images (and by per-pixel targets, see ``resize_target``). A small fraction barely
    changes what the image shows but makes it smaller (faster) and adds variety.

    Args:
        p_row: fraction of rows to drop, in ``[0, 1]``. Default ``0.15``.
        p_col: fraction of columns to drop, in ``[0, 1]``. Default ``0.15``.
        batch: ``True`` (default): the same rows and columns for every image of the micro-batch.
            ``False``: an independent choice for each image (Composer's per-sample mode), still
            at ``AFTER_DATALOADER`` on the batch's device; Composer instead installs a dataset
            transform (use :class:`ColOutTransform` in your ``Dataset`` for that).
        resize_target: drop the same rows and columns from the targets: ``True``, ``False``, or
            ``'auto'`` (default: when the targets have the images' height and width).
        input_key: where the inputs are in the batch (index, dict key or ``(getter, setter)``).
        target_key: where the targets are in the batch.

    Examples:
        >>> ColOut(p_row=0.15, p_col=0.15)
        ColOut(p_row=0.15, p_col=0.15, batch=True, resize_target='auto', input_key=0, target_key=1)
    """

    needs = frozenset({"image"})
    unique = True
    augments_data = True

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
        if not isinstance(batch, bool):
            raise TypeError(
                f"ColOut(batch={batch!r}): must be True (the same rows and columns for the whole micro-batch) or "
                "False (a separate choice for each image)."
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
            new_images, new_target = colout_batch(
                (images, target), self.p_row, self.p_col, True, generator, per_sample=not self.batch
            )
            state.batch_set_item(self.input_key, new_images)
            state.batch_set_item(self.target_key, new_target)
        else:
            new_images = colout_batch(images, self.p_row, self.p_col, False, generator, per_sample=not self.batch)
            state.batch_set_item(self.input_key, new_images)
