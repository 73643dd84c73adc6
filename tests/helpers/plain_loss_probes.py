"""Probes the plain-loss tests share: the targets the loss used, and the losses given to backward.

Example:
    >>> probe = TargetProbe()
    >>> probe.targets
    []
"""

from __future__ import annotations

from typing import Any

import torch

from composer_bridge import Algorithm, Event, State


class TargetProbe(Algorithm):
    """Listed last: at AFTER_LOSS it runs first (after-events run in reverse), so it sees the targets the loss used."""

    def __init__(self) -> None:
        self.targets: list[torch.Tensor] = []

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_LOSS

    def apply(self, event: Event, state: State, logger: Any) -> None:
        self.targets.append(state.batch_get_item(1).detach().clone())


class Recorder:
    """A LightningModule mix-in: the losses given to backward (Lightning's on_before_backward hook)."""

    backward_losses: list[torch.Tensor]

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.backward_losses.append(loss.detach().clone())
