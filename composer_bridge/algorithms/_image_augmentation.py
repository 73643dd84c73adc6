"""What RandAugment and AugMix share as algorithms: every training batch's images augmented on their device.

:class:`ImageAugmentation` is their base: it checks and keeps the batch's normalisation (``mean``,
``std``), the op set and where the images are (``input_key``), fires at ``AFTER_DATALOADER`` and hands
the images, back in ``[0, 1]``, to the subclass's :meth:`~ImageAugmentation.augment` with the run's
generator (:func:`~composer_bridge.algorithms._augment_ops.augment_batch`).

Examples:
    >>> import torch
    >>> class Invert(ImageAugmentation):
    ...     def __init__(self, augmentation_set="all", mean=None, std=None, input_key=0):
    ...         super().__init__(augmentation_set, mean, std, input_key)
    ...     def augment(self, images, generator):
    ...         return 1 - images
    >>> Invert(augmentation_set=["rotate"])
    Invert(augmentation_set=('rotate',), mean=None, std=None, input_key=0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from composer_bridge.algorithms._augment_ops import augment_batch, check_normalization
from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.batch import BatchKey
from composer_bridge.core.event import Event

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["ImageAugmentation"]


class ImageAugmentation(Algorithm):
    """An algorithm that augments the images of every training batch at ``AFTER_DATALOADER``, on their device.

    A subclass checks its own arguments, calls ``super().__init__`` with these, keeps its own and
    defines :meth:`augment`. ``augmentation_set`` is kept as given if a string, else as a tuple.
    """

    needs = frozenset({"image"})
    unique = True
    augments_data = True

    def __init__(
        self,
        augmentation_set: str | Sequence[str],
        mean: float | Sequence[float] | None,
        std: float | Sequence[float] | None,
        input_key: BatchKey,
    ) -> None:
        self.mean, self.std = check_normalization(mean, std, type(self).__name__)
        self.augmentation_set = augmentation_set if isinstance(augmentation_set, str) else tuple(augmentation_set)
        self.input_key = input_key

    def augment(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The augmented ``(N, C, H, W)`` images, in ``[0, 1]`` as they are, drawn from ``generator``."""
        raise NotImplementedError(f"{type(self).__name__} must define augment(images, generator).")

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        augment_batch(state, self.input_key, self.mean, self.std, type(self).__name__, self.augment)
