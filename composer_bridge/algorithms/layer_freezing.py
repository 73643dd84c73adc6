"""Layer freezing: stop training the earliest layers progressively, from ``freeze_start`` to the end.

Examples:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> freeze_layers(model, optimizer, current_duration=1.0, freeze_start=0.0, freeze_level=1.0)
    (2, 1.0)
    >>> [p.requires_grad for p in model.parameters()]
    [False, False, False, False, True, True]
    >>> len(optimizer.param_groups[0]["params"])
    2
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.state import State

__all__ = ["LayerFreezing", "freeze_layers"]

log = logging.getLogger(__name__)


def _check_fraction(value: object, name: str, where: str, upper_open: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}({name}={value!r}): must be a number between 0 and 1.")
    if not (0.0 <= value < 1.0 if upper_open else 0.0 <= value <= 1.0):
        bound = "[0, 1)" if upper_open else "[0, 1]"
        raise ValueError(f"{where}({name}={value!r}): must lie in {bound} (a fraction of the run or of the layers).")


def freeze_schedule(current_duration: float, freeze_start: float, freeze_level: float) -> float:
    """The fraction of layers frozen at ``current_duration``: 0 until ``freeze_start``, then linear to ``freeze_level`` at 1.

    Examples:
        >>> freeze_schedule(0.75, freeze_start=0.5, freeze_level=1.0)
        0.5
    """
    if current_duration <= freeze_start:
        return 0.0
    return freeze_level * (current_duration - freeze_start) / (1.0 - freeze_start)


def layers_of(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The model's layers in registration order: modules without children that hold parameters.

    Examples:
        >>> net = torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.ReLU(), torch.nn.Linear(1, 1))
        >>> [name for name, _ in layers_of(net)]
        ['0', '2']
    """
    found: list[tuple[str, torch.nn.Module]] = []

    def visit(prefix: str, module: torch.nn.Module) -> None:
        children = list(module.named_children())
        if not children:
            if any(True for _ in module.parameters()):
                found.append((prefix, module))
            return
        for name, child in children:
            visit(f"{prefix}.{name}" if prefix else name, child)

    visit("", model)
    return found


def _as_list(optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None) -> list[torch.optim.Optimizer]:
    if optimizers is None:
        return []
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    return list(optimizers)


def remove_from_optimizers(
    params: Sequence[torch.Tensor], optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None
) -> None:
    """Take ``params`` out of every group of ``optimizers`` (keeping the others' order) and drop their state.

    Without this, momentum and weight decay would keep moving frozen weights; dropping their
    state keeps ``optimizer.state_dict()`` consistent (it only describes grouped parameters).
    """
    ids = {id(p) for p in params}
    for optimizer in _as_list(optimizers):
        for group in optimizer.param_groups:
            group["params"] = [p for p in group["params"] if id(p) not in ids]
        for p in params:
            optimizer.state.pop(p, None)


def freeze_layers(
    model: torch.nn.Module,
    optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None,
    current_duration: float,
    freeze_start: float = 0.5,
    freeze_level: float = 1.0,
) -> tuple[int, float]:
    """Freeze the first layers of ``model`` as the schedule says at ``current_duration``; return (layers, fraction).

    The fraction frozen is 0 until ``freeze_start`` and grows linearly to ``freeze_level`` at the
    end of training; it applies to all layers but the last (see :func:`layers_of`), which always
    trains. Frozen parameters get ``requires_grad=False`` and leave the optimizers.

    Args:
        model: the model being trained.
        optimizers: its optimizer(s); frozen parameters are removed from them.
        current_duration: the fraction of training done, in ``[0, 1]``.
        freeze_start: the fraction of training before freezing starts. Default ``0.5``.
        freeze_level: the fraction of layers frozen at the end of training. Default ``1.0``.
    """
    _check_fraction(freeze_start, "freeze_start", "freeze_layers", upper_open=True)
    _check_fraction(freeze_level, "freeze_level", "freeze_layers", upper_open=False)
    _check_fraction(current_duration, "current_duration", "freeze_layers", upper_open=False)
    layers = layers_of(model)[:-1]
    fraction = freeze_schedule(float(current_duration), float(freeze_start), float(freeze_level))
    depth = int(fraction * len(layers))
    newly = [p for _, layer in layers[:depth] for p in layer.parameters() if p.requires_grad]
    remove_from_optimizers(newly, optimizers)
    for p in newly:
        p.requires_grad_(False)
    if newly:
        log.info("LayerFreezing froze %d of %d layers (%.0f%%).", depth, len(layers) + 1, 100 * fraction)
    return depth, fraction


class LayerFreezing(Algorithm):
    """Progressively freeze the earliest layers (FreezeOut, Brock et al. 2017; Freeze Training, Raghu et al. 2017).

    At every ``EPOCH_END`` the first ``freeze_level * (t - freeze_start) / (1 - freeze_start)`` of
    the layers (``t`` the fraction of training done) stop training: ``requires_grad=False`` and out
    of the optimizer, which saves their backward and update work. Sets ``find_unused_parameters``
    so DDP tolerates parameters without gradients.

    Resumption is exact (Composer's LayerFreezing is not: mosaicml/composer#1002): the names of
    frozen parameters are in :meth:`state_dict`; after a checkpoint's weights load they are frozen
    again, and at ``FIT_START`` they leave the new optimizers before Lightning restores the
    optimizer state, so the parameter groups match the saved ones entry for entry.

    Args:
        freeze_start: fraction of training before freezing starts, in ``[0, 1)``. Default ``0.5``.
        freeze_level: fraction of layers frozen at the end, in ``[0, 1]``. Default ``1.0``.

    Examples:
        >>> LayerFreezing(freeze_start=0.5, freeze_level=1.0)
        LayerFreezing(freeze_start=0.5, freeze_level=1.0)
    """

    unique = True
    needs_run_length = True  # freezes by the fraction of the run done
    freezes_layers = True
    find_unused_parameters = True

    def __init__(self, freeze_start: float = 0.5, freeze_level: float = 1.0) -> None:
        _check_fraction(freeze_start, "freeze_start", "LayerFreezing", upper_open=True)
        _check_fraction(freeze_level, "freeze_level", "LayerFreezing", upper_open=False)
        self.freeze_start = freeze_start
        self.freeze_level = freeze_level
        self.frozen: list[str] = []  # parameter names, in model order
        self.freeze_depth = 0
        self.freeze_percentage = 0.0

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.EPOCH_END, Event.AFTER_LOAD, Event.FIT_START)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.AFTER_LOAD:
            self._refreeze(state.model)
            return
        if event == Event.FIT_START:
            frozen = set(self.frozen)
            params = [p for name, p in state.model.named_parameters() if name in frozen]
            remove_from_optimizers(params, state.optimizers)
            return
        elapsed = state.get_elapsed_duration()
        if elapsed is None:
            raise ValueError(
                "LayerFreezing schedules by the fraction of training done, but the run has no max_duration; set the "
                "Trainer's max_epochs or max_steps."
            )
        trainable = {name for name, p in state.model.named_parameters() if p.requires_grad}
        depth, fraction = freeze_layers(
            state.model, state.optimizers, float(elapsed.value), self.freeze_start, self.freeze_level
        )
        self.freeze_depth, self.freeze_percentage = depth, fraction
        # Only what this algorithm froze: parameters frozen by the user were never in its optimizer removals.
        self.frozen += [name for name, p in state.model.named_parameters() if name in trainable and not p.requires_grad]
        logger.log_metrics({"LayerFreezing/layers_frozen": depth, "LayerFreezing/percentage_frozen": fraction})

    def _refreeze(self, model: torch.nn.Module) -> None:
        frozen = set(self.frozen)
        missing = frozen - {name for name, _ in model.named_parameters()}
        if missing:
            raise ValueError(
                f"LayerFreezing's checkpoint state names parameters this model lacks: {sorted(missing)[:5]}; was it "
                "written for another model?"
            )
        for name, p in model.named_parameters():
            if name in frozen:
                p.requires_grad_(False)

    def state_dict(self) -> dict[str, Any]:
        return {"frozen": list(self.frozen), "freeze_depth": self.freeze_depth, "freeze_percentage": self.freeze_percentage}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"frozen", "freeze_depth", "freeze_percentage"}:
            raise ValueError(f"LayerFreezing state has keys {sorted(state)}; expected ['freeze_depth', 'freeze_percentage', 'frozen'].")
        self.frozen = [str(n) for n in state["frozen"]]
        self.freeze_depth = int(state["freeze_depth"])
        self.freeze_percentage = float(state["freeze_percentage"])
