"""Data that ships with the installed packages, for the demo, examples, tests and benchmarks.

Nothing is downloaded: the digits come with scikit-learn, the text is Python's own standard
library source. Point the same loaders at your data by building the tensors yourself.

Examples:
    >>> train, test = digits_datasets(test_fraction=0.2, seed=0)
    >>> x, y = train[0]
    >>> x.shape, y.dtype
    (torch.Size([1, 8, 8]), torch.int64)
"""

from __future__ import annotations

import functools

import torch
from torch.utils.data import TensorDataset

__all__ = ["cluttered_digits_datasets", "cluttered_digits_loaders", "digits_datasets", "digits_loaders"]


def digits_datasets(test_fraction: float = 0.2, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's bundled 8x8 digits (1,797 images, 10 classes) as normalised ``(N, 1, 8, 8)`` tensors.

    The split is stratified-free but seeded; pixel values are scaled to zero mean, unit variance
    with the training split's statistics.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction!r} must be between 0 and 1 (exclusive).")
    images, labels = _digits_tensors()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_test = int(round(len(labels) * test_fraction))
    test_idx, train_idx = order[:n_test], order[n_test:]
    mean, std = images[train_idx].mean(), images[train_idx].std()
    images = (images - mean) / std
    return TensorDataset(images[train_idx], labels[train_idx]), TensorDataset(images[test_idx], labels[test_idx])


def digits_loaders(
    batch_size: int = 64, test_fraction: float = 0.2, seed: int = 0, num_workers: int = 0
) -> tuple[torch.utils.data.DataLoader, torch.utils.data.DataLoader]:
    """Train (shuffled with a seeded generator) and test loaders over :func:`digits_datasets`."""
    train, test = digits_datasets(test_fraction, seed)
    train_loader = torch.utils.data.DataLoader(
        train, batch_size=batch_size, shuffle=True, num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed),
    )
    test_loader = torch.utils.data.DataLoader(test, batch_size=256, num_workers=num_workers)
    return train_loader, test_loader


def cluttered_digits_datasets(
    image_size: int = 24, copies: int = 3, train_per_class: int = 60, noise: float = 0.35,
    max_rotation: float = 25.0, seed: int = 0, test_per_class: int | None = None,
) -> tuple[TensorDataset, TensorDataset]:
    """A harder vision task derived from the bundled digits: few, moved, cluttered, noisy, larger images.

    Each digit is upsampled to ``image_size`` x ``image_size`` (bilinear), then every copy gets a
    random rotation (up to ``max_rotation`` degrees), scale (0.7-1.1) and shift (up to a fifth of the
    side), a fragment of another digit pasted at half intensity as clutter, and Gaussian pixel noise
    of standard deviation ``noise`` (images in ``[0, 1]`` before it). Only ``train_per_class``
    digits of each class are kept for training (``copies`` corrupted copies of each); the test split
    is one corrupted copy of every remaining digit (with its own draws), or of ``test_per_class``
    of each class. Pixels are normalised with
    the training split's mean and standard deviation, as :func:`digits_datasets`.

    With the defaults: 1,800 training images and 1,197 test images of 24x24, 10 classes. A small
    ResNet (``ResNetCNN(widths=(16, 32))``) on one CPU thread still gains accuracy after several
    minutes of training (at 600 steps of batch 64) where the 8x8 digits saturate within a
    hundred steps, so speed-up methods that trade a little accuracy per step for robustness
    (label smoothing, MixUp, CutOut) can matter.

    Everything is drawn from ``torch.Generator().manual_seed(seed)``: the same arguments give the
    same tensors on every machine.

    Examples:
        >>> train, test = cluttered_digits_datasets(copies=1, train_per_class=5, test_per_class=3)
        >>> train.tensors[0].shape, test.tensors[0].shape, int(train.tensors[1].max()) + 1
        (torch.Size([50, 1, 24, 24]), torch.Size([30, 1, 24, 24]), 10)
    """
    for name, value, low in (("image_size", image_size, 8), ("copies", copies, 1), ("train_per_class", train_per_class, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"cluttered_digits_datasets({name}={value!r}): expected an int >= {low}.")
    if noise < 0 or max_rotation < 0:
        raise ValueError(f"cluttered_digits_datasets(noise={noise!r}, max_rotation={max_rotation!r}): expected values >= 0.")
    images, labels = _digits_tensors()
    images = images / 16.0
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(labels), generator=generator)
    train_idx = torch.cat([order[labels[order] == c][:train_per_class] for c in range(10)])
    test_mask = torch.ones(len(labels), dtype=torch.bool)
    test_mask[train_idx] = False
    test_idx = order[test_mask[order]]
    if test_per_class is not None:
        test_idx = torch.cat([test_idx[labels[test_idx] == c][:test_per_class] for c in range(10)])
    if len(test_idx) == 0:
        raise ValueError(f"cluttered_digits_datasets(train_per_class={train_per_class}): leaves no digit for testing.")
    big = torch.nn.functional.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
    train_x = _corrupt(big[train_idx.repeat(copies)], big, noise, max_rotation, generator)
    test_x = _corrupt(big[test_idx], big, noise, max_rotation, generator)
    mean, std = train_x.mean(), train_x.std()
    return (TensorDataset((train_x - mean) / std, labels[train_idx.repeat(copies)]),
            TensorDataset((test_x - mean) / std, labels[test_idx]))


def _corrupt(images: torch.Tensor, pool: torch.Tensor, noise: float, max_rotation: float,
             generator: torch.Generator) -> torch.Tensor:
    """Random affine moves, a pasted fragment of another digit and pixel noise (see the caller)."""
    n, _, side, _ = images.shape

    def uniform(low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, generator=generator)

    angle = uniform(-max_rotation, max_rotation) * torch.pi / 180
    scale = uniform(0.7, 1.1)
    shift = torch.stack([uniform(-0.4, 0.4), uniform(-0.4, 0.4)], dim=1)  # a fifth of the side each way
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = torch.nn.functional.affine_grid(theta, list(images.shape), align_corners=False)
    moved = torch.nn.functional.grid_sample(images, grid, align_corners=False)
    # Clutter: a half-side fragment of a random digit, at half intensity, somewhere in the image.
    half = side // 2
    others = pool[torch.randint(len(pool), (n,), generator=generator)]
    src = torch.randint(side - half + 1, (n, 2), generator=generator)
    dst = torch.randint(side - half + 1, (n, 2), generator=generator)
    clutter = torch.zeros_like(moved)
    for i in range(n):
        (sy, sx), (dy, dx) = src[i].tolist(), dst[i].tolist()
        clutter[i, :, dy:dy + half, dx:dx + half] = others[i, :, sy:sy + half, sx:sx + half]
    out = torch.maximum(moved, 0.5 * clutter)
    return out + noise * torch.randn(out.shape, generator=generator)


def cluttered_digits_loaders(
    batch_size: int = 64, seed: int = 0, num_workers: int = 0, **dataset_kwargs: object
) -> tuple[torch.utils.data.DataLoader, torch.utils.data.DataLoader]:
    """Train (shuffled by a generator seeded with ``seed``) and test loaders over :func:`cluttered_digits_datasets`.

    The data set itself is the same for every ``seed`` (drawn with ``dataset_kwargs.get("seed", 0)``
    unless given): ``seed`` only orders the training batches, so runs of different seeds differ in
    initialisation and data order, not in the task.

    Examples:
        >>> train, test = cluttered_digits_loaders(batch_size=32, copies=1, train_per_class=5)
        >>> next(iter(train))[0].shape
        torch.Size([32, 1, 24, 24])
    """
    train, test = _cached_cluttered(tuple(sorted(dataset_kwargs.items())))
    train_loader = torch.utils.data.DataLoader(
        train, batch_size=batch_size, shuffle=True, num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed),
    )
    return train_loader, torch.utils.data.DataLoader(test, batch_size=256, num_workers=num_workers)


@functools.lru_cache(maxsize=2)
def _cached_cluttered(items: tuple[tuple[str, object], ...]) -> tuple[TensorDataset, TensorDataset]:
    return cluttered_digits_datasets(**dict(items))  # type: ignore[arg-type]


def _digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 8x8 digits as ``(N, 1, 8, 8)`` float images (pixel values 0-16) and int64 labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "The digits data ships with scikit-learn: pip install scikit-learn (or composer-bridge[demo])."
        ) from error
    digits = load_digits()
    return torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1), torch.tensor(digits.target, dtype=torch.long)
