"""The module-facing step API: what a LightningModule calls into the bridge while one is attached.

Lightning gives callbacks no hook inside ``training_step``, around the batch transfer or before
a checkpoint's weights load, and Composer's events live there. Two kinds of caller reach the
bridge from inside the module instead:

- :class:`~composer_bridge.ComposerModule`'s steps call :meth:`ModuleSteps.train_step`,
  :meth:`~ModuleSteps.eval_forward` and :meth:`~ModuleSteps.predict_forward`;
- the hooks the bridge installs on a module (:mod:`~composer_bridge.lightning.module_hooks`) call
  :meth:`~ModuleSteps.after_batch_transfer`, :meth:`~ModuleSteps.before_checkpoint_load` and
  :meth:`~ModuleSteps.fire_event`, and read :attr:`~ModuleSteps.listening` and :attr:`~ModuleSteps.state`.

Every event fired here comes from :data:`~composer_bridge.lightning.hook_map.HOOK_EVENTS`. The
run (:class:`~composer_bridge.lightning.run.BridgeRun`) holds one :class:`ModuleSteps` and
connects it to its state and engine; the module holds it weakly
(:func:`~composer_bridge.lightning.module.attach_run`), so a run that is dropped leaves the
module training as a plain LightningModule.

Examples:
    >>> import torch
    >>> from composer_bridge.core import Engine, State
    >>> model = torch.nn.Linear(2, 1)
    >>> state = State(model)
    >>> steps = ModuleSteps()
    >>> steps.connect(state, Engine(state).fire)  # a state, and an engine to fire into
    >>> class Module(torch.nn.Module):
    ...     def forward(self, batch):
    ...         return model(batch[0])
    ...     def loss(self, outputs, batch):
    ...         return ((outputs - batch[1]) ** 2).mean()
    >>> batch, outputs, loss = steps.train_step(Module(), (torch.ones(4, 2), torch.zeros(4, 1)))
    >>> outputs.shape, loss.ndim
    (torch.Size([4, 1]), 0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from composer_bridge.core.event import Event
from composer_bridge.core.state import State
from composer_bridge.lightning.hook_map import HOOK_EVENTS
from composer_bridge.lightning.module import _batch_size
from composer_bridge.training.step_clock import StepClock

__all__ = ["ModuleSteps"]

_TRAIN_STEP_EVENTS = HOOK_EVENTS["training_step"]


class ModuleSteps:
    """The calls a module makes into the bridge during a step; each fires the events of one table row.

    It holds what those calls read: the run's :attr:`state` and :attr:`clock`, whether anything
    :attr:`listening`, and the engine's ``fire`` (:meth:`connect`). What the checkpoint hook does
    before the weights load is the run's: it is given as ``before_load``.

    Args:
        before_load: called by :meth:`before_checkpoint_load` with the checkpoint (``None``: nothing to do).
    """

    def __init__(self, before_load: Callable[[dict[str, Any]], None] | None = None) -> None:
        #: the run's state (``None`` before setup)
        self.state: State | None = None
        #: micro-batches and steps of the training loop
        self.clock = StepClock()
        #: whether anything listens (while not, the per-step events are not fired)
        self.listening = False
        self._fire_event: Callable[[Event], Any] = _not_set_up
        self._before_load = before_load
        #: the engine's ``run_marker_only_event`` while it has a profiler (``None``: no profiler, nothing to mark)
        self.marker_only: Callable[[Event], None] | None = None

    def connect(self, state: State, fire: Callable[[Event], Any] | None = None) -> None:
        """Serve ``state``; fire events through ``fire`` (an engine's ``fire``; ``None`` keeps the current one)."""
        if self.state is not state:
            self.state = state
            self.clock = StepClock(state)
        if fire is not None:
            self._fire_event = fire

    def live_state(self) -> State:
        """The state, which every hook and step after ``setup`` has (Lightning calls setup first)."""
        state = self.state
        if state is None:
            raise RuntimeError("AlgorithmEngineCallback: a Lightning hook ran before the callback's setup.")
        return state

    def fire_event(self, event: Event) -> None:
        """Run ``event`` through the engine, discarding its traces."""
        self._fire_event(event)

    def fire_hook(self, hook: str) -> None:
        """Fire the events :data:`~composer_bridge.lightning.hook_map.HOOK_EVENTS` lists for ``hook``, in order."""
        fire = self._fire_event
        for event in HOOK_EVENTS[hook]:
            fire(event)

    def mark_hook(self, hook: str) -> None:
        """Record the marker-only events of ``hook``'s ``[marker]`` row (callers check :attr:`marker_only` first)."""
        mark = self.marker_only
        if mark is not None:
            for event in HOOK_EVENTS[hook]:
                mark(event)

    def train_step(self, module: Any, batch: Any) -> tuple[Any, Any, torch.Tensor]:
        """Forward and loss of one training micro-batch with their events; returns ``(batch, outputs, loss)``.

        ``module`` has Composer's ``forward(batch)`` and ``loss(outputs, batch)``; algorithms may
        replace the batch, the outputs and the loss between them.
        """
        state = self.live_state()
        fire = self._fire_event
        before_forward, after_forward, before_loss, after_loss, before_backward = _TRAIN_STEP_EVENTS
        state.batch = batch
        fire(before_forward)
        state.outputs = module(state.batch)
        fire(after_forward)
        fire(before_loss)
        state.loss = module.loss(state.outputs, state.batch)
        fire(after_loss)
        fire(before_backward)
        return state.batch, state.outputs, state.loss

    def eval_forward(self, module: Any, batch: Any) -> Any:
        """The evaluation forward pass (``module.eval_forward``), between its events."""
        return self._forward_between(module, batch, "validation_step")

    def predict_forward(self, module: Any, batch: Any) -> Any:
        """The prediction forward pass (``module.eval_forward``), between its events."""
        return self._forward_between(module, batch, "predict_step")

    def _forward_between(self, module: Any, batch: Any, hook: str) -> Any:
        state = self.live_state()
        before, after = HOOK_EVENTS[hook]
        state.batch = batch
        self._fire_event(before)
        state.outputs = module.eval_forward(state.batch)
        self._fire_event(after)
        return state.outputs

    def after_batch_transfer(self, batch: Any) -> Any:
        """The module's ``on_after_batch_transfer`` in training: AFTER_DATALOADER may replace the batch."""
        state = self.live_state()
        state.batch = batch
        self.clock.loaded_samples = _batch_size(batch) or 0  # as loaded, before AFTER_DATALOADER (Composer's count)
        if self.listening:
            self.fire_hook("on_after_batch_transfer")
        return state.batch

    def before_checkpoint_load(self, checkpoint: dict[str, Any]) -> None:
        """The module's ``on_load_checkpoint``, before the weights load: BEFORE_LOAD, then check the checkpoint fits."""
        if self._before_load is not None:
            self._before_load(checkpoint)


def _not_set_up(event: Event) -> Any:
    raise RuntimeError("AlgorithmEngineCallback.run_event was called before Trainer setup.")
