"""The seen call: one loss call a plain ``training_step`` was seen to make, read and recomputed on new targets.

:mod:`~composer_bridge.lightning.plain_loss.step_events` decides *which* call is the step's loss; this module
holds what it needs to recompute that call exactly: the call with its options (:class:`LossCall`),
probability targets with ignored positions (:func:`probability_loss`), and the tests on the call's
tensors (the batch's own targets, a flattened view of them, class indices derived from them, the
module's output, log-probabilities).

Examples:
    >>> import torch
    >>> import torch.nn.functional as F
    >>> y = torch.tensor([[1, 2], [0, -100]])
    >>> flattened_view(y.view(-1), y), flattened_view(y.clone().view(-1), y)
    (True, False)
    >>> logits = torch.zeros(4, 3)
    >>> probabilities = F.one_hot(y.view(-1).clamp(min=0), 3).float()
    >>> kept = y.view(-1) != -100
    >>> probability_loss("cross_entropy", F.cross_entropy, logits, probabilities, {}, kept)  # mean over 3 kept
    tensor(1.0986)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from composer_bridge.lightning.errors import BridgeConfigurationError

__all__ = [
    "LossCall", "as_loss_targets", "call_options", "class_indices_for", "flattened_view", "not_log_probabilities",
    "probability_loss", "same_tensor", "shares_storage", "weighted_mean_with_ignored_positions",
]


@dataclass
class LossCall:
    """A loss function the step was seen to call, with the options it was called with.

    ``classes_last``: the step called it on ``logits.view(-1, C)`` and ``y.view(-1)`` of ``(B, T)``
    targets; the bridge computes it on the same values laid out as ``(B, C, T)`` logits and the
    ``(B, T)`` targets themselves, so per-example losses (``reduction="none"``) come out per sample.
    """

    kind: str
    function: Callable[..., Any]
    options: dict[str, Any]
    classes_last: bool = False

    def __call__(self, outputs: Any, targets: Any, reduction: str | None = None,
                 kept: torch.Tensor | None = None) -> torch.Tensor:
        options = self.options if reduction is None else {**self.options, "reduction": reduction}
        if any(isinstance(v, torch.Tensor) and v.device != outputs.device for v in options.values()):
            options = {k: v.to(outputs.device) if isinstance(v, torch.Tensor) else v for k, v in options.items()}
        targets = as_loss_targets(self.kind, outputs, targets)
        probabilities = isinstance(targets, torch.Tensor) and targets.is_floating_point() and targets.shape == outputs.shape
        if probabilities and (self.kind == "nll_loss" or kept is not None):
            return probability_loss(self.kind, self.function, outputs, targets, options, kept)
        return self.function(outputs, targets, **options)


def probability_loss(kind: str, function: Callable[..., Any], outputs: torch.Tensor, targets: torch.Tensor,
                      options: Mapping[str, Any], kept: torch.Tensor | None) -> torch.Tensor:
    """Cross-entropy of ``targets`` (probabilities along dimension 1) where ``kept``, reduced over the kept positions.

    For ``cross_entropy`` the per-position losses are torch's own (``reduction="none"``); for
    ``nll_loss`` the outputs are log-probabilities and the loss is ``-sum_c p_c * log q_c``. With
    ``kept`` (the positions whose index target is not ``ignore_index``) the other positions
    contribute nothing and ``"mean"`` divides by the number kept, as torch does for index targets.
    """
    weight = options.get("weight")
    reduction = options.get("reduction", "mean")
    if kept is not None and weight is not None and reduction == "mean" and not bool(kept.all()):
        raise BridgeConfigurationError(weighted_mean_with_ignored_positions("the algorithms", f"the {kind} call"))
    if kept is not None:
        targets = targets * kept.unsqueeze(1).to(targets.dtype)
    if kind == "cross_entropy":
        loss = function(outputs, targets, weight=weight, reduction=reduction)
    else:
        if weight is not None:
            targets = targets * weight.view(1, -1, *([1] * (outputs.ndim - 2))).to(targets.dtype)
        losses = -(targets * outputs).sum(1)
        loss = losses if reduction == "none" else losses.sum() if reduction == "sum" else losses.mean()
    if reduction != "mean" or kept is None:
        return loss
    # torch's mean over all positions, times all/kept: the mean over the kept ones (times exactly 1 when none is ignored)
    return loss * (kept.numel() / kept.sum())


def weighted_mean_with_ignored_positions(names: str, where: str) -> str:
    """Why a class ``weight=`` with ignored positions and ``reduction="mean"`` cannot take probability targets.

    torch divides such a mean by the summed weights of the kept positions' target classes; with
    probability targets there is no target class to weigh, so the loss could not equal torch's.
    """
    return (
        f"{names} {'replace' if names == 'the algorithms' else 'replaces'} the targets by probabilities, but {where} has a class weight=, ignored positions "
        "(ignore_index) and reduction='mean': torch divides that mean by the summed weights of the kept "
        "positions' target classes, which probability targets do not have, so the loss would not be the one "
        "you wrote. Fix: use reduction='sum' (and divide by your own count), or drop weight= or ignore_index."
    )


def class_indices_for(kind: str, input: Any, target: Any, batch_target: torch.Tensor) -> bool:
    """A cross-entropy/nll call on class indices of the batch targets' dtype, one row of logits per index."""
    return (
        kind in ("cross_entropy", "nll_loss") and isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor)
        and target.dtype == batch_target.dtype and not target.dtype.is_floating_point
        and input.ndim == target.ndim + 1 and input.shape[:1] + input.shape[2:] == target.shape
    )


def flattened_view(candidate: Any, target: torch.Tensor) -> bool:
    """``candidate`` is ``(B, T, ...)`` ``target`` flattened without a copy (``y.view(-1)``, ``y.reshape(-1)``, ``y.flatten()``).

    The same storage, element for element: position ``i`` of ``candidate`` is sample ``i // T`` of the batch.
    """
    return (
        isinstance(candidate, torch.Tensor) and target.ndim >= 2 and candidate.ndim == 1
        and candidate.numel() == target.numel() and candidate.dtype == target.dtype
        and candidate.device == target.device and candidate.data_ptr() == target.data_ptr()
        and target.is_contiguous() and candidate.is_contiguous()
    )


def as_loss_targets(kind: str, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # ComposerClassifier's soft_cross_entropy gives probability targets to cross_entropy in the logits' dtype.
    if kind == "cross_entropy" and targets.dtype.is_floating_point and targets.shape == logits.shape:
        return targets.to(logits.dtype)
    return targets


def same_tensor(candidate: Any, target: torch.Tensor) -> bool:
    """``candidate`` is ``target`` or a same-shaped view of it (``y.view(-1)`` of a 1-D ``y``, ``y.long()`` of a long ``y``)."""
    if candidate is target:
        return True
    return (
        isinstance(candidate, torch.Tensor)
        and candidate.shape == target.shape
        and candidate.dtype == target.dtype
        and candidate.device == target.device
        and candidate.stride() == target.stride()
        and candidate.data_ptr() == target.data_ptr()
    )


def shares_storage(candidate: Any, output: Any) -> bool:
    """The loss's input is the module's output, or a reshaped view of it (``logits.view(-1, C)``)."""
    if candidate is output:
        return True
    return (
        isinstance(candidate, torch.Tensor) and isinstance(output, torch.Tensor)
        and candidate.data_ptr() == output.data_ptr() and candidate.numel() == output.numel()
    )


_SIGNATURES: dict[str, inspect.Signature] = {}


def call_options(kind: str, function: Callable[..., Any], input: Any, target: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> dict[str, Any]:
    if not args:  # the usual call, options by keyword: nothing to bind
        return dict(kwargs)
    signature = _SIGNATURES.get(kind)
    if signature is None:
        signature = _SIGNATURES[kind] = inspect.signature(function)
    bound = signature.bind(input, target, *args, **kwargs).arguments
    return {name: value for name, value in list(bound.items())[2:]}


def not_log_probabilities(input: Any, replacing: str, where: str) -> str | None:
    """Why probability targets cannot go into this ``nll_loss``: its input is not log-probabilities (checked once)."""
    if isinstance(input, torch.Tensor) and input.ndim >= 2 and input.shape[1] > 0:
        total = torch.logsumexp(input.detach().float(), dim=1)
        if bool(torch.allclose(total, torch.zeros_like(total), atol=1e-3)):
            return None
    return (
        f"{replacing} replaces the targets by probabilities, and {where} is nll_loss, whose loss for probability "
        "targets is -sum(p * input) only when its input is log-probabilities (log_softmax over dimension 1); this "
        "input's exp does not sum to 1 over the classes. Fix: give nll_loss F.log_softmax(logits, dim=1) (or "
        "nn.LogSoftmax(dim=1)), or return logits and use nn.CrossEntropyLoss / F.cross_entropy."
    )
