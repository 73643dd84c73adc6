"""How algorithms reach a model's forward pass and loss when the model does not expose them apart.

A :class:`~composer_bridge.ComposerModule` has ``forward(batch)`` and ``loss(outputs, batch)``,
and the algorithms that need a second loss (``MixUp(interpolate_loss=True)``) or per-example
losses (``SelectiveBackprop``) call them. A plain module computes both inside its own training
step; the adapter that drives it watches the step and, where it can see the loss it uses, sets
``state.loss_source`` to an object with this interface. Algorithms prefer it to ``state.model``
when it is set.

Examples:
    >>> import torch
    >>> import torch.nn.functional as F
    >>> class CrossEntropySource:
    ...     def __init__(self, net): self.net = net
    ...     def forward(self, inputs): return self.net(inputs)
    ...     def loss(self, outputs, targets, reduction=None):
    ...         return F.cross_entropy(outputs, targets, reduction=reduction or "mean")
    >>> source = CrossEntropySource(torch.nn.Linear(3, 2))
    >>> isinstance(source, LossSource)
    True
    >>> source.loss(source.forward(torch.zeros(4, 3)), torch.zeros(4, dtype=torch.long), "none").shape
    torch.Size([4])
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["LossNotSeenYet", "LossSource"]


@runtime_checkable
class LossSource(Protocol):
    """The model's forward pass on the inputs alone, and its loss on given targets."""

    def forward(self, inputs: Any) -> Any:
        """The model's outputs for ``inputs`` (the batch's inputs, not the whole batch)."""

    def loss(self, outputs: Any, targets: Any, reduction: str | None = None) -> torch.Tensor:
        """The loss of ``outputs`` against ``targets``, reduced as the model reduces it (``None``) or as asked.

        ``reduction="none"`` gives one loss per example.
        """


class LossNotSeenYet(RuntimeError):
    """Raised by :meth:`LossSource.loss` before the source has seen the loss it stands for.

    A plain module's loss is learnt from its first training step; an algorithm that asks for it
    earlier (``SelectiveBackprop(start=0.0)``) catches this and leaves that step alone.
    """
