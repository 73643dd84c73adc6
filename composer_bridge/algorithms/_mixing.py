"""What the example-mixing algorithms (MixUp, CutMix) share: the ``alpha`` check, tensor checks,
and the loss against the partners' targets for ``interpolate_loss=True``.

Examples:
    >>> import torch
    >>> check_alpha(0.2, "MixUp", 0.2)  # fine: returns None
    >>> require_tensors("MixUp", inputs=torch.zeros(2), targets=[0, 1])
    Traceback (most recent call last):
    TypeError: MixUp mixes one tensor of targets, got list. Point input_key/target_key at a tensor in the batch.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

import torch

from composer_bridge.core.batch import BatchKey, set_batch_item

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = ["LossOrTargetMixing", "check_alpha", "loss_against", "require_floating_inputs", "require_tensors"]


class LossOrTargetMixing:
    """The one setting of MixUp and CutMix that decides two capabilities, so that the two cannot disagree.

    The setting is the capability ``interpolates_loss`` (a second loss, against the partners' targets);
    ``replaces_targets`` (probability targets at ``BEFORE_LOSS``) is its opposite, and
    ``interpolate_loss``, Composer's name for the argument, reads and writes the same attribute.
    Changing either name after construction changes both capabilities.

    Examples:
        >>> from composer_bridge.algorithms import MixUp
        >>> mixup = MixUp(interpolate_loss=True)
        >>> mixup.interpolates_loss, mixup.replaces_targets
        (True, False)
        >>> mixup.interpolate_loss = False
        >>> mixup.interpolates_loss, mixup.replaces_targets, mixup.interpolate_loss
        (False, True, False)
    """

    interpolates_loss: bool  # the capability (core.algorithm.CAPABILITIES), set by the algorithm's __init__

    @property
    def interpolate_loss(self) -> bool:
        """Composer's name of the setting (the constructor argument): the capability ``interpolates_loss``."""
        return self.interpolates_loss

    @interpolate_loss.setter
    def interpolate_loss(self, value: bool) -> None:
        self.interpolates_loss = value

    @property
    def replaces_targets(self) -> bool:  # the capability (core.algorithm.CAPABILITIES)
        return not self.interpolates_loss


def check_alpha(alpha: float, name: str, default: float) -> None:
    """``alpha`` must be a finite number >= 0 (0 disables the mixing)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha < math.inf:
        raise ValueError(
            f"{name}(alpha={alpha!r}): alpha must be a finite number >= 0; it is the Beta(alpha, alpha) "
            f"concentration (0 disables mixing, larger values mix more evenly). The default is {default}."
        )


def loss_against(state: State, target_key: BatchKey, target: torch.Tensor, name: str) -> torch.Tensor:
    """The model's loss on ``state.outputs`` with the batch's targets replaced by ``target``.

    Uses ``state.loss_source`` when the adapter set one (a plain module's own loss), else the
    model's ``loss(outputs, batch)``.
    """
    if state.loss_source is not None:
        return state.loss_source.loss(state.outputs, target)
    loss_fn = getattr(state.model, "loss", None)
    if not callable(loss_fn):
        raise TypeError(
            f"{name}(interpolate_loss=True) needs the model's loss(outputs, batch), but "
            f"{type(state.model).__name__} has none. Use a ComposerModule/ComposerClassifier, or "
            "interpolate_loss=False."
        )
    # A shallow copy: the batch the step returns keeps its own targets.
    batch = set_batch_item(copy.copy(state.batch), target_key, target)
    return loss_fn(state.outputs, batch)


def require_tensors(name: str, **items: Any) -> None:
    """Raise ``TypeError`` naming ``name`` and the item when any of ``items`` is not a tensor."""
    for what, value in items.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{name} mixes one tensor of {what}, got {type(value).__name__}. Point input_key/target_key "
                "at a tensor in the batch."
            )


def require_floating_inputs(name: str, input: torch.Tensor, input_key: BatchKey) -> None:
    """Raise ``TypeError`` when the inputs to mix are not floating point (token ids, class labels)."""
    if not input.is_floating_point():
        raise TypeError(
            f"{name} mixes the inputs at input_key={input_key!r}, but they are {input.dtype} values (token ids or "
            "labels?): a weighted mix of them is not an input the model can read. Use it on image or feature "
            "tensors, or point input_key at the floating-point inputs."
        )
