"""Class targets as per-class probabilities, shared by LabelSmoothing, MixUp and CutMix.

Example:
    >>> import torch
    >>> targets_as_probabilities(torch.zeros(2, 3), torch.tensor([2, 0])).tolist()
    [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["targets_as_probabilities"]


def targets_as_probabilities(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``target`` as per-class probabilities shaped like ``logits`` (``(N, C, ...)``).

    Class indices (``target.ndim == logits.ndim - 1``, an integer dtype) become one-hot float32
    vectors along dimension 1, with ``C = logits.shape[1]``; targets already shaped like the
    logits are returned as floating tensors (their dtype kept, integers become float32).
    """
    if target.shape == logits.shape:
        return target if target.dtype.is_floating_point else target.float()
    if target.ndim == logits.ndim - 1 and not target.dtype.is_floating_point:
        one_hot = F.one_hot(target.long(), num_classes=logits.shape[1]).to(torch.float32)
        return one_hot.movedim(-1, 1) if one_hot.ndim > 2 else one_hot
    raise ValueError(
        f"Cannot read targets of shape {tuple(target.shape)} ({target.dtype}) against outputs of shape "
        f"{tuple(logits.shape)}: expected class indices of shape {tuple(logits.shape[:1] + logits.shape[2:])} "
        f"(an integer dtype) or probabilities of shape {tuple(logits.shape)}. Check the target_key and that "
        "the model's outputs are (N, num_classes, ...) logits."
    )
