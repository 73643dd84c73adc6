"""MixUp: train on convex combinations of pairs of examples and of their targets (Zhang et al., 2018).

Functional form :func:`mixup_batch`; the :class:`MixUp` algorithm mixes the inputs at
``BEFORE_FORWARD`` and then either mixes the targets at ``BEFORE_LOSS`` (probability targets) or,
with ``interpolate_loss=True``, computes the loss a second time against the partners' targets
and interpolates the two losses at ``BEFORE_BACKWARD``.

Examples:
    >>> import torch
    >>> x = torch.tensor([[0.0], [10.0]])
    >>> y = torch.tensor([0, 1])
    >>> mixed, y_partner, mixing = mixup_batch(x, y, mixing=0.25, indices=torch.tensor([1, 0]))
    >>> mixed.flatten().tolist(), y_partner.tolist(), mixing
    ([2.5, 7.5], [1, 0], 0.25)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from composer_bridge.algorithms._draws import random_permutation, sample_beta
from composer_bridge.algorithms._mixing import (
    LossOrTargetMixing,
    check_alpha,
    loss_against,
    require_floating_inputs,
    require_tensors,
)
from composer_bridge.algorithms._targets import targets_as_probabilities
from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.batch import BatchKey
from composer_bridge.core.event import Event

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["MixUp", "mixup_batch"]


def _check_mixing(mixing: float) -> None:
    if isinstance(mixing, bool) or not isinstance(mixing, (int, float)) or not 0 <= mixing <= 1:
        raise ValueError(f"mixing={mixing!r} must be a number in [0, 1] (the weight of the partner example).")


def mixup_batch(
    input: torch.Tensor,
    target: torch.Tensor,
    mixing: float | None = None,
    alpha: float = 0.2,
    indices: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Mix each example with a partner from the same batch: ``(1 - mixing) * x + mixing * x[indices]``.

    One ``mixing`` coefficient serves the whole batch; it is drawn as ``min(z, 1 - z)`` with
    ``z ~ Beta(alpha, alpha)`` unless given, so each example keeps the larger share.

    Args:
        input: ``(N, ...)`` inputs.
        target: ``(N, ...)`` targets; returned permuted, not mixed (mix them against the outputs,
            e.g. ``(1 - mixing) * one_hot(target) + mixing * one_hot(target_perm)``).
        mixing: the partner's weight, in ``[0, 1]``; drawn if ``None``.
        alpha: Beta concentration for drawing ``mixing`` (ignored when ``mixing`` is given). Default ``0.2``.
        indices: the partner of each example (a permutation of ``range(N)``); drawn if ``None``.
        generator: the source of the draws (a CPU generator keeps ``mixing`` off the device);
            ``None`` uses torch's global generator.

    Returns:
        ``(mixed_input, permuted_target, mixing)``.

    Examples:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> mixed, y_perm, mixing = mixup_batch(torch.randn(8, 3, 4, 4), torch.arange(8), generator=g)
        >>> mixed.shape, 0 <= mixing <= 0.5, sorted(y_perm.tolist()) == list(range(8))
        (torch.Size([8, 3, 4, 4]), True, True)
    """
    if mixing is None:
        check_alpha(alpha, "mixup_batch", 0.2)
        z = sample_beta(alpha, generator)
        mixing = min(z, 1.0 - z)
    _check_mixing(mixing)
    if indices is None:
        indices = random_permutation(input.shape[0], input.device, generator)
    mixed = input * (1.0 - mixing) + input[indices] * mixing
    return mixed, target[indices], mixing


class MixUp(LossOrTargetMixing, Algorithm):
    """Train on convex combinations of example pairs and of their targets.

    At ``BEFORE_FORWARD`` the inputs become ``(1 - m) * x + m * x[perm]`` with one ``m`` per
    micro-batch (``min(z, 1 - z)``, ``z ~ Beta(alpha, alpha)``) and a random pairing ``perm``,
    both drawn from the run's generator. Then, by default, the targets become the same mixture of
    one-hot targets at ``BEFORE_LOSS`` (the loss must accept probability targets, as
    :class:`~composer_bridge.ComposerClassifier`'s does); with ``interpolate_loss=True`` the
    targets are left alone and at ``BEFORE_BACKWARD`` the loss becomes
    ``(1 - m) * loss + m * loss_against_partner_targets`` (exact for losses linear in the targets,
    such as cross-entropy).

    Args:
        alpha: Beta concentration, ``>= 0``: near 0 barely mixes, 1 mixes uniformly. Default ``0.2``.
        interpolate_loss: interpolate the losses instead of the targets. Default ``False``.
        input_key: where the inputs are in the batch (index, dict key or ``(getter, setter)``).
        target_key: where the targets are in the batch.

    Examples:
        >>> MixUp(alpha=0.2)
        MixUp(alpha=0.2, interpolate_loss=False, input_key=0, target_key=1)
    """

    needs = frozenset({"floating input"})
    unique = True
    augments_data = True
    mixes_examples = True
    needs_loss_events = True

    def __init__(
        self,
        alpha: float = 0.2,
        interpolate_loss: bool = False,
        input_key: BatchKey = 0,
        target_key: BatchKey = 1,
    ) -> None:
        check_alpha(alpha, "MixUp", 0.2)
        if not isinstance(interpolate_loss, bool):
            raise TypeError(f"MixUp(interpolate_loss={interpolate_loss!r}): must be True or False.")
        self.alpha = alpha
        self.interpolates_loss = interpolate_loss
        self.input_key = input_key
        self.target_key = target_key
        self.mixing = 0.0
        self.indices: torch.Tensor | None = None
        self.permuted_target: torch.Tensor | None = None

    def match(self, event: Event, state: State) -> bool:
        second = Event.BEFORE_BACKWARD if self.interpolates_loss else Event.BEFORE_LOSS
        return event == Event.BEFORE_FORWARD or event == second

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        target = state.batch_get_item(self.target_key)
        if event == Event.BEFORE_FORWARD:
            input = state.batch_get_item(self.input_key)
            require_tensors("MixUp", inputs=input, targets=target)
            require_floating_inputs("MixUp", input, self.input_key)
            z = sample_beta(self.alpha, state.generator(type(self).__name__, "cpu"))
            self.mixing = min(z, 1.0 - z)
            self.indices = random_permutation(
                input.shape[0], input.device, state.generator(type(self).__name__, input.device)
            )
            mixed, self.permuted_target, _ = mixup_batch(input, target, self.mixing, indices=self.indices)
            state.batch_set_item(self.input_key, mixed)
            return
        assert self.permuted_target is not None, "MixUp: BEFORE_FORWARD did not run for this micro-batch"
        if event == Event.BEFORE_LOSS:
            outputs = state.outputs
            require_tensors("MixUp", outputs=outputs, targets=target)
            own = targets_as_probabilities(outputs, target)
            partner = targets_as_probabilities(outputs, self.permuted_target)
            state.batch_set_item(self.target_key, own * (1.0 - self.mixing) + partner * self.mixing)
        else:  # BEFORE_BACKWARD, interpolate_loss=True
            partner_loss = loss_against(state, self.target_key, self.permuted_target, "MixUp")
            state.loss = state.loss * (1.0 - self.mixing) + partner_loss * self.mixing
        self.permuted_target = None
