"""The hand-over of the user's optimizers and LR schedulers to the algorithms that take them over.

Muon, ScheduleFree and WarmupStableDecay act on what the user's ``configure_optimizers`` built,
without the user changing it. At ``on_fit_start`` (after Lightning built the optimizers, before it
restores their states from a checkpoint) :func:`hand_over` puts the user's optimizers and
schedulers in the :class:`~composer_bridge.State`, fires ``FIT_START``, and gives Lightning
whatever the algorithms left there: their optimizers (so Lightning steps and checkpoints what
really trains) and the schedulers they kept. Algorithms that keep other weights for evaluation
than for training (a schedule-free optimizer's average) also decide what every checkpoint holds
(:func:`write_checkpoints_with`).

Examples:
    >>> import torch
    >>> from composer_bridge import State
    >>> state = State(torch.nn.Linear(2, 1))
    >>> changed([torch.optim.SGD(state.model.parameters(), lr=0.1)], [])
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from composer_bridge.core.algorithm import Algorithm, declares
from composer_bridge.core.state import State
from composer_bridge.lightning import _compat

if TYPE_CHECKING:
    import lightning as L

__all__ = ["changed", "hand_over", "write_checkpoints_with"]


def changed(now: Sequence[Any], given: Sequence[Any]) -> bool:
    """Whether ``now`` holds other objects than ``given`` (identity, in order)."""
    return len(now) != len(given) or any(a is not b for a, b in zip(now, given, strict=True))


def hand_over(trainer: L.Trainer, state: State, fire_fit_start: Callable[[], None]) -> None:
    """Fire ``FIT_START`` with the user's optimizers and schedulers in ``state``; train with what the algorithms leave.

    An algorithm may replace an optimizer (Muon, ScheduleFree's ``replace=True``, SAM's wrapper) or
    drop schedulers (WarmupStableDecay, ScheduleFree); Lightning then steps, clips and checkpoints
    the replacements, and steps only the schedulers left.
    """
    state.optimizers = list(trainer.optimizers)
    state.schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
    optimizers, schedulers = list(state.optimizers), list(state.schedulers)
    fire_fit_start()
    if changed(state.optimizers, optimizers):
        _compat.set_strategy_optimizers(trainer, state.optimizers)
    if changed(state.schedulers, schedulers):
        _compat.set_strategy_schedulers(trainer, state.schedulers)
    write_checkpoints_with(trainer, state.algorithms)


def write_checkpoints_with(trainer: L.Trainer, algorithms: Sequence[Algorithm]) -> None:
    """Every checkpoint ``trainer`` writes holds the weights the algorithms' ``checkpoint_weights()`` choose.

    The ``checkpoint_weights()`` of an algorithm that declares ``chooses_checkpoint_weights`` (a
    context manager: ScheduleFree's puts the optimizer in eval mode, so the averaged weights are
    saved, and back after) is entered around each save, whoever calls it (``ModelCheckpoint``, the
    user, a preemption handler).
    """
    choosers = [a.checkpoint_weights for a in algorithms if declares(a, "chooses_checkpoint_weights")]
    if choosers:
        _compat.wrap_checkpoint_saves(trainer, lambda: _entered(choosers))


@contextmanager
def _entered(choosers: Sequence[Callable[[], AbstractContextManager[Any]]]) -> Iterator[None]:
    with ExitStack() as stack:
        for choose in choosers:
            stack.enter_context(choose())
        yield
