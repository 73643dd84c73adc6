"""What a run's loss algorithms do to a plain module's targets, and the checks a seen loss call must pass.

The plain-loss step (:mod:`~composer_bridge.lightning.plain_loss.step_events`) holds one
:class:`TargetRules` for the algorithms of its run: which of them interpolate the loss, which call
``loss()``, whether every one acts position by position; whether a call's targets are the batch's
flattened; which positions an ``ignore_index`` leaves out; and the refusal when new probability
targets meet a call that cannot take them.

Examples:
    >>> from composer_bridge.algorithms import LabelSmoothing, MixUp
    >>> rules = TargetRules([LabelSmoothing(0.1)], "MyModule")
    >>> rules.per_position_only, [type(a).__name__ for a in rules.loss_users]
    (True, [])
    >>> TargetRules([MixUp()], "MyModule").per_position_only
    False
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from composer_bridge.core.algorithm import declares
from composer_bridge.lightning.errors import BridgeConfigurationError
from composer_bridge.lightning.plain_loss.seen_call import flattened_view, not_log_probabilities
from composer_bridge.lightning.plain_loss.setup_refusals import names_of, refusal

__all__ = ["TargetRules"]


class TargetRules:
    """The rules ``needy`` (a run's loss algorithms) set for the targets of ``module_name``'s loss calls."""

    def __init__(self, needy: Sequence[Any], module_name: str) -> None:
        self.needy = list(needy)
        self.module_name = module_name
        self.interpolating = [a for a in needy if declares(a, "interpolates_loss")]
        # the algorithms that call loss(): not those that only replace the targets
        self.loss_users = [a for a in needy if declares(a, "interpolates_loss")
                           or not (declares(a, "replaces_targets") or declares(a, "acts_per_position"))]
        # LabelSmoothing acts on each target position by itself, so it can act on targets the step derives
        # (Hugging Face's shifted labels); algorithms that act per sample need the batch's own targets
        self.per_position_only = all(
            (declares(a, "replaces_targets") or declares(a, "acts_per_position")) and not declares(a, "mixes_examples")
            for a in needy
        )
        self._log_probabilities_checked = False

    @staticmethod
    def relabelled(kind: str, input: Any, target: Any, batch_target: torch.Tensor) -> bool:
        """The call's target is the batch's ``(B, T)`` class indices flattened, and its input one row of logits per position."""
        return (
            kind in ("cross_entropy", "nll_loss") and not batch_target.dtype.is_floating_point
            and flattened_view(target, batch_target)
            and isinstance(input, torch.Tensor) and input.ndim == 2 and input.shape[0] == target.numel()
        )

    def ignored_positions(self, kind: str, options: Mapping[str, Any], target: torch.Tensor) -> torch.Tensor | None:
        """Where the index targets equal the call's ``ignore_index``, when algorithms replace them by probabilities.

        torch ignores those positions only for index targets; with probability targets the bridge
        leaves them out itself (:func:`~composer_bridge.lightning.plain_loss.seen_call.probability_loss`). Mixing
        algorithms are refused with an ``ignore_index`` of their own, so here only position-wise replacements act.
        """
        replacing = [a for a in self.needy if declares(a, "replaces_targets")]
        if kind not in ("cross_entropy", "nll_loss") or target.dtype.is_floating_point or not replacing:
            return None
        if any(declares(a, "mixes_examples") for a in replacing):
            return None
        return target == options.get("ignore_index", -100)

    def check_targets(self, kind: str, options: Mapping[str, Any], original: torch.Tensor, targets: Any,
                      input: Any) -> None:
        """Refuse new probability targets for a call that cannot take them (its options, or inputs that are not
        log-probabilities for ``nll_loss``, checked once)."""
        if targets is original:
            return
        to_probabilities = (
            isinstance(targets, torch.Tensor) and targets.dtype.is_floating_point and not original.dtype.is_floating_point
        )
        if not to_probabilities:
            return
        replacing = [a for a in self.needy if declares(a, "replaces_targets")] or self.needy
        where = f"{self.module_name}'s loss ({kind})"
        reason = refusal(kind, options, replacing, where)
        if reason is None and kind == "nll_loss" and not self._log_probabilities_checked:
            reason = not_log_probabilities(input, names_of(replacing), where)
            self._log_probabilities_checked = True
        if reason is not None:
            raise BridgeConfigurationError(reason)
