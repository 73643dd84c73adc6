"""The run's part in Lightning's training loop: the timestamp kept in step with it, and its events fired.

:class:`~composer_bridge.lightning.run.BridgeRun` holds one :class:`TrainingLoop`; the callback's
training hooks reach it through the run. It moves the state's timestamp as Lightning moves
(micro-batches into optimizer steps through the :class:`~composer_bridge.training.step_clock.StepClock`,
epochs, the end of training), fires the events
:data:`~composer_bridge.lightning.hook_map.HOOK_EVENTS` lists for each hook, checks that a
resumed fit starts where it was saved, and passes an algorithm's stop request on to the Trainer.
Refreshing who listens is the run's: it hands the loop its ``refresh`` to call after each step,
and the method that opens an epoch says so.

Examples:
    >>> import torch
    >>> from composer_bridge.core import Engine, Logger, State
    >>> from composer_bridge.lightning.steps import ModuleSteps
    >>> state = State(torch.nn.Linear(1, 1))
    >>> steps = ModuleSteps()
    >>> steps.connect(state, Engine(state).fire)
    >>> loop = TrainingLoop(steps, Logger())
    >>> loop.step_open()  # no fit yet: Lightning's global_step reads 0
    False
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from composer_bridge.core.logger import Logger
from composer_bridge.lightning import _compat
from composer_bridge.lightning.module import _batch_size
from composer_bridge.lightning.steps import ModuleSteps
from composer_bridge.training.resume_position import ResumePosition

if TYPE_CHECKING:  # hints name lightning.pytorch's classes; pytorch_lightning's work the same (package.py)
    import lightning as L

__all__ = ["TrainingLoop"]


class TrainingLoop:
    """The training hooks of one run: timestamp, step clock, training events, resume position, stop requests.

    Args:
        steps: the run's step API, whose state, clock and listening it reads and whose events it fires.
        logger: the engine's logger, whose step it keeps at the state's batch count.
        refresh: called after each optimizer step (the run's ``refresh_listening``: an algorithm or
            engine callback added during a step is heard from the next one on).
    """

    def __init__(self, steps: ModuleSteps, logger: Logger, refresh: Callable[[], None] | None = None) -> None:
        self.steps = steps
        self.logger = logger
        self._refresh = refresh if refresh is not None else _nothing
        #: checked at a resumed fit's first batch
        self.resume_position = ResumePosition()
        self._global_step: Callable[[], int] = _zero  # reads Lightning's global_step (set at on_train_start)

    def start(self, trainer: L.Trainer, pl_module: L.LightningModule, restored: bool) -> bool:
        """``on_train_start`` (``restored``: a checkpoint's entry was restored); returns whether to reopen an epoch.

        True when the fit resumed from an epoch's last batch: that epoch must end and the next
        start, through the callback's own hooks (a subclass of the callback may extend them).
        """
        state, clock = self.steps.live_state(), self.steps.clock
        state.dataloader = trainer.train_dataloader
        batches = trainer.num_training_batches
        if isinstance(batches, int) or (isinstance(batches, float) and batches != float("inf")):
            state.dataloader_len = -(-int(batches) // max(1, trainer.accumulate_grad_batches))
        self._global_step = _compat.step_counter(trainer, bool(pl_module.automatic_optimization))
        clock.start_fit(self._global_step())
        if state.timestamp.batch.value == 0 and state.timestamp.epoch.value == 0:
            self.steps.fire_hook("on_train_start")
        reopen = clock.epoch_left_open(state, trainer.current_epoch)
        # a resumed fit should start where the restored timestamp is; Lightning may start elsewhere (#19403).
        # Under manual optimization a batch may be several steps: no batch-to-step position to compare.
        if restored and self._global_step() > 0 and pl_module.automatic_optimization:
            epoch, batch = state.timestamp.epoch.value, state.timestamp.batch_in_epoch.value
            if reopen:  # the reopened epoch ends before the first batch: the next one starts at its batch 0
                epoch, batch = epoch + 1, 0
            self.resume_position.expect(epoch, batch, state.dataloader_len)
        else:
            self.resume_position.disarm()
        return reopen

    def epoch_start(self, trainer: L.Trainer) -> bool:
        """``on_train_epoch_start``: whether an epoch opens (its event is then the run's to fire, after refreshing)."""
        return self.steps.clock.start_epoch(trainer.current_epoch)

    def batch_start(self, trainer: L.Trainer, batch_idx: int) -> None:
        """``on_train_batch_start`` (hidden while nothing listens): the first micro-batch of a step opens it.

        The clock counts micro-batches also while this hook was hidden, so a bridge that began
        listening mid-step waits for the next step.
        """
        steps = self.steps
        state = steps.state
        if steps.clock.micro == 0 and steps.listening and state is not None:
            self.resume_position.check(trainer.current_epoch, batch_idx // max(1, trainer.accumulate_grad_batches))
            self.logger.step = state.batch_count
            steps.fire_hook("on_train_batch_start")

    def after_backward(self, trainer: L.Trainer) -> None:
        if self.steps.listening and _compat.is_training(trainer):
            self.steps.fire_hook("on_after_backward")

    def before_optimizer_step(self, optimizer: Any) -> None:
        state = self.steps.state
        if state is None or not self.steps.listening:
            return
        state.stepping_optimizer = optimizer
        try:
            self.steps.fire_hook("on_before_optimizer_step")
        finally:
            state.stepping_optimizer = None

    def batch_end(self, trainer: L.Trainer, batch: Any) -> bool:
        """``on_train_batch_end``: count the micro-batch; returns whether it ended an optimizer step.

        The one hook an idle bridge receives at every step: it reads attributes and calls the
        clock, nothing more (a test counts its calls).
        """
        steps = self.steps
        state, clock = steps.state, steps.clock
        if state is None:
            state = steps.live_state()  # raises: a hook before setup
        self.resume_position.disarm()  # only a fit's first batch is compared (a bridge idle then has no check)
        if steps.marker_only is not None and steps.listening:  # a profiler: the next batch's wait begins
            steps.mark_hook("on_train_batch_end[marker]")
        # The data hook counted the micro-batch's samples as loaded; without it (an idle bridge), counted here.
        samples = (_batch_size(batch) or 0) if clock.loaded_samples is None else 0
        if not clock.end_micro_batch(state, samples, self._global_step()):
            return False
        if steps.listening:
            self.logger.step = state.batch_count
            steps.fire_hook("on_train_batch_end")
            if state.stop_requested:
                trainer.should_stop = True
        self._refresh()
        return True

    def epoch_end(self, trainer: L.Trainer) -> None:
        state = self.steps.live_state()
        state.timestamp = state.timestamp.to_next_epoch()
        self.steps.clock.reset_step()
        if self.steps.marker_only is not None:
            self.steps.mark_hook("on_train_epoch_end[marker]")
        self.steps.fire_hook("on_train_epoch_end")
        self._honour_stop(trainer)

    def end(self) -> None:
        """``on_train_end``: the timestamp's iteration ends, then TRAINING's end fires."""
        state = self.steps.live_state()
        state.timestamp = state.timestamp.to_next_iteration()
        self.steps.fire_hook("on_train_end")

    def step_open(self) -> bool:
        """Whether Lightning finished an optimizer step the clock has not counted yet (see ``StepClock.step_open``)."""
        return self.steps.clock.step_open(self._global_step())

    def _honour_stop(self, trainer: L.Trainer) -> None:
        state = self.steps.state
        if state is not None and state.stop_requested:
            trainer.should_stop = True


def _zero() -> int:
    return 0


def _nothing() -> None:
    return None
