"""Engine-side callbacks: code that observes every event, after the algorithms have run.

Examples:
    >>> from composer_bridge.core.event import Event
    >>> class CountSteps(Callback):
    ...     def __init__(self):
    ...         self.steps = 0
    ...     def batch_end(self, state, logger):
    ...         self.steps += 1
    >>> cb = CountSteps()
    >>> cb.run_event(Event.BATCH_END, state=None, logger=None)
    >>> cb.steps
    1
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from composer_bridge.core.event import Event
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["Callback"]


class Callback:
    """Base class for engine callbacks: one method per event, named by the event's value.

    :meth:`run_event` calls the method named after the event (``batch_end`` for
    ``Event.BATCH_END``), so override the events you need; override ``run_event`` itself to
    see every event. The event methods do nothing by default. ``close`` and ``post_close`` run
    once when the engine shuts down, also after an exception; ``state_dict``/``load_state_dict``
    make the callback resumable.
    """

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        """Dispatch ``event`` to the method of the same name."""
        getattr(self, event.value)(state, logger)

    def close(self, state: State, logger: Logger) -> None:
        """Release resources (flush files, finish runs). Runs at teardown and on exceptions."""

    def post_close(self) -> None:
        """Runs after every callback's ``close``, only if this callback's ``close`` did not raise."""

    def state_dict(self) -> dict[str, Any]:
        """Resumable state (tensors and plain data only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    # --- one method per event, in the order the events fire ---------------------------------------
    def init(self, state: State, logger: Logger) -> None:
        """``Event.INIT``: once, when the engine starts (in the bridge: ``setup``, before optimizers and checkpoint loading)."""

    def before_load(self, state: State, logger: Logger) -> None:
        """``Event.BEFORE_LOAD``: before a checkpoint is loaded."""

    def after_load(self, state: State, logger: Logger) -> None:
        """``Event.AFTER_LOAD``: after a checkpoint's weights and state are restored."""

    def fit_start(self, state: State, logger: Logger) -> None:
        """``Event.FIT_START``: when training starts."""

    def iteration_start(self, state: State, logger: Logger) -> None:
        """``Event.ITERATION_START``: at the start of an iteration (a group of epochs)."""

    def epoch_start(self, state: State, logger: Logger) -> None:
        """``Event.EPOCH_START``: at the start of every training epoch."""

    def before_dataloader(self, state: State, logger: Logger) -> None:
        """``Event.BEFORE_DATALOADER``: before the next batch is fetched."""

    def after_dataloader(self, state: State, logger: Logger) -> None:
        """``Event.AFTER_DATALOADER``: after a batch is fetched and moved to the device."""

    def batch_start(self, state: State, logger: Logger) -> None:
        """``Event.BATCH_START``: at the start of every optimizer step."""

    def before_train_batch(self, state: State, logger: Logger) -> None:
        """``Event.BEFORE_TRAIN_BATCH``: before the forward/backward passes of a step."""

    def before_forward(self, state: State, logger: Logger) -> None:
        """``Event.BEFORE_FORWARD``: before the forward pass of each micro-batch."""

    def after_forward(self, state: State, logger: Logger) -> None:
        """``Event.AFTER_FORWARD``: after the forward pass of each micro-batch."""

    def before_loss(self, state: State, logger: Logger) -> None:
        """``Event.BEFORE_LOSS``: before the loss of each micro-batch is computed."""

    def after_loss(self, state: State, logger: Logger) -> None:
        """``Event.AFTER_LOSS``: after the loss of each micro-batch is computed."""

    def before_backward(self, state: State, logger: Logger) -> None:
        """``Event.BEFORE_BACKWARD``: before the backward pass of each micro-batch."""

    def after_backward(self, state: State, logger: Logger) -> None:
        """``Event.AFTER_BACKWARD``: after the backward pass of each micro-batch."""

    def after_train_batch(self, state: State, logger: Logger) -> None:
        """``Event.AFTER_TRAIN_BATCH``: after all micro-batches of a step, before the optimizer steps."""

    def batch_end(self, state: State, logger: Logger) -> None:
        """``Event.BATCH_END``: at the end of every optimizer step (the step is already counted)."""

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        """``Event.BATCH_CHECKPOINT``: after ``batch_end``, where a checkpoint of the step may be written."""

    def epoch_end(self, state: State, logger: Logger) -> None:
        """``Event.EPOCH_END``: at the end of every training epoch."""

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        """``Event.EPOCH_CHECKPOINT``: after ``epoch_end``, where a checkpoint of the epoch may be written."""

    def iteration_end(self, state: State, logger: Logger) -> None:
        """``Event.ITERATION_END``: at the end of an iteration."""

    def iteration_checkpoint(self, state: State, logger: Logger) -> None:
        """``Event.ITERATION_CHECKPOINT``: after ``iteration_end``, where a checkpoint may be written."""

    def fit_end(self, state: State, logger: Logger) -> None:
        """``Event.FIT_END``: when training ends."""

    def eval_before_all(self, state: State, logger: Logger) -> None:
        """``Event.EVAL_BEFORE_ALL``: before the evaluation of all evaluators."""

    def eval_start(self, state: State, logger: Logger) -> None:
        """``Event.EVAL_START``: at the start of an evaluation."""

    def eval_batch_start(self, state: State, logger: Logger) -> None:
        """``Event.EVAL_BATCH_START``: at the start of every evaluation batch."""

    def eval_before_forward(self, state: State, logger: Logger) -> None:
        """``Event.EVAL_BEFORE_FORWARD``: before the forward pass of an evaluation batch."""

    def eval_after_forward(self, state: State, logger: Logger) -> None:
        """``Event.EVAL_AFTER_FORWARD``: after the forward pass of an evaluation batch."""

    def eval_batch_end(self, state: State, logger: Logger) -> None:
        """``Event.EVAL_BATCH_END``: at the end of every evaluation batch."""

    def eval_end(self, state: State, logger: Logger) -> None:
        """``Event.EVAL_END``: at the end of an evaluation."""

    def eval_after_all(self, state: State, logger: Logger) -> None:
        """``Event.EVAL_AFTER_ALL``: after the evaluation of all evaluators."""

    def eval_standalone_start(self, state: State, logger: Logger) -> None:
        """``Event.EVAL_STANDALONE_START``: at the start of an evaluation run outside training."""

    def eval_standalone_end(self, state: State, logger: Logger) -> None:
        """``Event.EVAL_STANDALONE_END``: at the end of an evaluation run outside training."""

    def predict_start(self, state: State, logger: Logger) -> None:
        """``Event.PREDICT_START``: at the start of prediction."""

    def predict_batch_start(self, state: State, logger: Logger) -> None:
        """``Event.PREDICT_BATCH_START``: at the start of every prediction batch."""

    def predict_before_forward(self, state: State, logger: Logger) -> None:
        """``Event.PREDICT_BEFORE_FORWARD``: before the forward pass of a prediction batch."""

    def predict_after_forward(self, state: State, logger: Logger) -> None:
        """``Event.PREDICT_AFTER_FORWARD``: after the forward pass of a prediction batch."""

    def predict_batch_end(self, state: State, logger: Logger) -> None:
        """``Event.PREDICT_BATCH_END``: at the end of every prediction batch."""

    def predict_end(self, state: State, logger: Logger) -> None:
        """``Event.PREDICT_END``: at the end of prediction."""
