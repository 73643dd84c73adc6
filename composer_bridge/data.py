"""Data that ships with the installed packages, for the demo, examples, tests and benchmarks.

Nothing is downloaded: the digits come with scikit-learn, the text is Python's own standard
library source. Point the same loaders at your data by building the tensors yourself.

Example:
    >>> train, test = digits_datasets(test_fraction=0.2, seed=0)
    >>> x, y = train[0]
    >>> x.shape, y.dtype
    (torch.Size([1, 8, 8]), torch.int64)
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

__all__ = ["digits_datasets", "digits_loaders"]


def digits_datasets(test_fraction: float = 0.2, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's bundled 8x8 digits (1,797 images, 10 classes) as normalised ``(N, 1, 8, 8)`` tensors.

    The split is stratified-free but seeded; pixel values are scaled to zero mean, unit variance
    with the training split's statistics.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction!r} must be between 0 and 1 (exclusive).")
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "The digits data ships with scikit-learn: pip install scikit-learn (or composer-bridge[demo])."
        ) from error
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1)
    labels = torch.tensor(digits.target, dtype=torch.long)
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
