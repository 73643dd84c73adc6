"""LabelSmoothing: train against targets shrunk towards the uniform distribution (Szegedy et al., 2016).

Functional form :func:`smooth_labels`; the :class:`LabelSmoothing` algorithm swaps the batch's
targets for smoothed ones at ``BEFORE_LOSS`` and puts the originals back at ``AFTER_LOSS``, so
metrics and other algorithms see the real labels. Outputs may be a logits tensor (classes along
dimension 1) or, as Hugging Face models return, an object with a ``logits`` attribute or key
(classes last, labels ``-100`` ignored).

Examples:
    >>> import torch
    >>> logits = torch.zeros(2, 4)
    >>> smooth_labels(logits, torch.tensor([0, 3]), smoothing=0.2)
    tensor([[0.8500, 0.0500, 0.0500, 0.0500],
            [0.0500, 0.0500, 0.0500, 0.8500]])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from composer_bridge.algorithms._targets import targets_and_kept_rows
from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.batch import BatchKey
from composer_bridge.core.event import Event

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["LabelSmoothing", "smooth_labels"]


def smooth_labels(
    logits: torch.Tensor, target: torch.Tensor, smoothing: float = 0.1, class_dim: int = 1
) -> torch.Tensor:
    """Shrink ``target`` towards uniform: ``(1 - smoothing) * one_hot(target) + smoothing / num_classes``.

    Args:
        logits: the model's outputs (or any tensor of their shape), ``(N, num_classes, ...)``, or
            ``(..., num_classes)`` with ``class_dim=-1``.
        target: class indices (the logits' shape without the class dimension) or probabilities
            shaped like ``logits``.
        smoothing: in ``[0, 1]``; 0 leaves the targets unchanged, 1 makes them uniform.
        class_dim: ``1`` (default; image and ``(N, C)`` logits) or ``-1`` (classes last, as in
            Hugging Face's ``(batch, sequence, vocabulary)`` logits). With ``-1``, negative indices
            (Hugging Face's ``-100``) are ignored positions: their rows stay all zeros, which
            ``HuggingFaceModel``'s loss leaves out of its mean.

    Returns:
        The smoothed targets, shaped like ``logits``: float32 for index targets, the targets'
        dtype for probability targets.

    Examples:
        >>> import torch
        >>> out = smooth_labels(torch.zeros(1, 5), torch.tensor([2]), smoothing=0.5)
        >>> tuple(round(p, 3) for p in out[0].tolist())
        (0.1, 0.1, 0.6, 0.1, 0.1)
        >>> smooth_labels(torch.zeros(1, 2, 4), torch.tensor([[3, -100]]), 0.5, class_dim=-1).tolist()
        [[[0.125, 0.125, 0.125, 0.625], [0.0, 0.0, 0.0, 0.0]]]
    """
    _check_smoothing(smoothing)
    probabilities, kept = targets_and_kept_rows(logits, target, class_dim)
    smoothed = probabilities * (1.0 - smoothing) + smoothing / logits.shape[class_dim]
    return smoothed if kept is None else smoothed * kept  # ignored rows (label -100) stay all zeros


def _check_smoothing(smoothing: float) -> None:
    # ``not 0 <= x <= 1`` also rejects NaN.
    if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 <= smoothing <= 1:
        raise ValueError(
            f"smoothing={smoothing!r} is outside [0, 1]: it is the weight of the uniform distribution in the "
            "smoothed targets (0 = no smoothing, 1 = uniform targets). Typical values are 0.05 to 0.2."
        )


class LabelSmoothing(Algorithm):
    """Train on smoothed targets: at ``BEFORE_LOSS`` the targets become :func:`smooth_labels` of them.

    The original targets are restored at ``AFTER_LOSS``. Needs a
    :class:`~composer_bridge.ComposerModule` (separate ``forward`` and ``loss``) whose loss
    accepts probability targets, as :class:`~composer_bridge.ComposerClassifier`'s and
    ``composer_bridge.hf.HuggingFaceModel``'s do.

    Tensor outputs are logits with the classes along dimension 1. Outputs with a ``logits``
    attribute or key (Hugging Face's output objects) have the classes along the last dimension;
    their labels may be ``-100`` (ignored: the smoothed row is all zeros). For Hugging Face
    batches pass ``target_key="labels"``.

    Args:
        smoothing: weight of the uniform distribution, in ``[0, 1]``. Default ``0.1``.
        target_key: where the targets are in the batch (index, dict key or ``(getter, setter)``).

    Examples:
        >>> algorithm = LabelSmoothing(smoothing=0.1)
        >>> algorithm
        LabelSmoothing(smoothing=0.1, target_key=1)
    """

    unique = True
    needs_loss_events = True
    replaces_targets = True  # probability targets at BEFORE_LOSS

    def __init__(self, smoothing: float = 0.1, target_key: BatchKey = 1) -> None:
        _check_smoothing(smoothing)
        self.smoothing = smoothing
        self.target_key = target_key
        self.original_labels: Any = None

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.BEFORE_LOSS, Event.AFTER_LOSS)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.BEFORE_LOSS:
            logits, class_dim = _logits_of(state.outputs)
            try:
                labels = state.batch_get_item(self.target_key)
            except KeyError as err:
                if class_dim == -1 and isinstance(state.batch, Mapping) and "labels" in state.batch:
                    raise KeyError(f"{err.args[0]} For Hugging Face batches pass LabelSmoothing("
                                   "target_key='labels').") from None
                raise
            if not isinstance(logits, torch.Tensor) or not isinstance(labels, torch.Tensor):
                raise TypeError(
                    f"LabelSmoothing needs tensor outputs (or an output object with a .logits tensor) and "
                    f"tensor targets, got outputs of type {type(state.outputs).__name__} and targets of type "
                    f"{type(labels).__name__}."
                )
            if class_dim == 1 and (logits.ndim < 2 or logits.shape[1] < 2):
                raise ValueError(
                    f"LabelSmoothing spreads smoothing over the classes along dimension 1, but the outputs have shape "
                    f"{tuple(logits.shape)} (one binary logit per example?): there is no other class to give it to. "
                    "Fix: output one logit per class (N, 2) with cross-entropy, or leave LabelSmoothing out."
                )
            self.original_labels = labels
            state.batch_set_item(self.target_key, smooth_labels(logits, labels, self.smoothing, class_dim))
        elif self.original_labels is not None:
            state.batch_set_item(self.target_key, self.original_labels)
            self.original_labels = None


def _logits_of(outputs: Any) -> tuple[Any, int]:
    """The logits in ``outputs`` and their class dimension: 1 for a tensor, -1 for a ``.logits``/``["logits"]``."""
    if isinstance(outputs, torch.Tensor):
        return outputs, 1
    logits = getattr(outputs, "logits", None)
    if logits is None and isinstance(outputs, Mapping):
        logits = outputs.get("logits")
    return (logits, -1) if logits is not None else (outputs, 1)
