"""Class targets as per-class probabilities, shared by LabelSmoothing, MixUp and CutMix.

Examples:
    >>> import torch
    >>> targets_as_probabilities(torch.zeros(2, 3), torch.tensor([2, 0])).tolist()
    [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["targets_and_kept_rows", "targets_as_probabilities"]


def targets_as_probabilities(logits: torch.Tensor, target: torch.Tensor, class_dim: int = 1) -> torch.Tensor:
    """``target`` as per-class probabilities shaped like ``logits``.

    Class indices (``target.ndim == logits.ndim - 1``, an integer dtype) become one-hot float32
    vectors along ``class_dim``: dimension 1 by default (``(N, C, ...)`` logits, as for images), or
    ``-1`` for logits with the classes last (Hugging Face's ``(batch, sequence, vocabulary)``). With
    ``class_dim=-1`` a negative index (Hugging Face's ``-100``) marks an ignored position: its row is
    all zeros. Targets already shaped like the logits are returned as floating tensors (their dtype
    kept, integers become float32).
    """
    probabilities, kept = targets_and_kept_rows(logits, target, class_dim)
    return probabilities if kept is None else probabilities * kept


def targets_and_kept_rows(logits: torch.Tensor, target: torch.Tensor,
                          class_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`targets_as_probabilities` before its ignored rows are zeroed, and which rows to keep.

    For class indices with ``class_dim=-1`` the mask is ``target >= 0`` with a trailing dimension
    of 1 (ignored positions are one-hot on class 0 until multiplied by it); otherwise it is ``None``
    (no row is ignored). A caller that transforms the rows further (label smoothing) applies the
    mask once, after its transform.
    """
    if target.shape == logits.shape:
        return (target if target.dtype.is_floating_point else target.float()), None
    if class_dim not in (1, -1):
        raise ValueError(f"class_dim={class_dim!r}: expected 1 (classes second) or -1 (classes last).")
    classes_last = class_dim == -1
    index_shape = logits.shape[:-1] if classes_last else logits.shape[:1] + logits.shape[2:]
    fits = target.shape == index_shape if classes_last else target.ndim == logits.ndim - 1
    if fits and not target.dtype.is_floating_point:
        if classes_last:  # clamp and mask instead of checking for negatives: no host-device sync
            one_hot = F.one_hot(target.long().clamp(min=0), num_classes=logits.shape[-1]).to(torch.float32)
            return one_hot, (target >= 0).unsqueeze(-1)
        one_hot = F.one_hot(target.long(), num_classes=logits.shape[1]).to(torch.float32)
        return (one_hot.movedim(-1, 1) if one_hot.ndim > 2 else one_hot), None
    layout = "(..., num_classes)" if classes_last else "(N, num_classes, ...)"
    raise ValueError(
        f"Cannot read targets of shape {tuple(target.shape)} ({target.dtype}) against outputs of shape "
        f"{tuple(logits.shape)}: expected class indices of shape {tuple(index_shape)} "
        f"(an integer dtype) or probabilities of shape {tuple(logits.shape)}. Check the target_key and that "
        f"the model's outputs are {layout} logits."
    )
