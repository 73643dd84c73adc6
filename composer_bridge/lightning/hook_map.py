"""Which Lightning hook fires which Composer events: the whole mapping, in one table.

:class:`~composer_bridge.AlgorithmEngineCallback` fires exactly the events listed here for each
hook, and reads them from here only: its run (:mod:`~composer_bridge.lightning.run`), the module's
step API (:mod:`~composer_bridge.lightning.steps`) and the hooks installed on the module
(:mod:`~composer_bridge.lightning.module_hooks`) name no event themselves (a test checks both, and
that ``docs/how-it-works.md`` shows the same table). A key with a
qualifier in brackets is a variant of the hook: ``"on_validation_start[standalone]"`` is
``on_validation_start`` under ``trainer.validate``/``trainer.test`` rather than during ``fit``.

Rules the table cannot show, kept by the run:

- the per-step events fire only while something listens (an algorithm, an engine callback or a
  handler); the epoch, fit and eval events always fire;
- ``on_train_batch_start`` fires its events on the *first* micro-batch of an optimizer step and
  ``on_train_batch_end`` on the micro-batch after which Lightning's ``global_step`` moved (see
  :mod:`~composer_bridge.training.step_clock`);
- ``on_before_optimizer_step`` fires ``AFTER_TRAIN_BATCH`` before *every* optimizer step, with
  ``state.stepping_optimizer`` set: once per step in automatic optimization, once per
  ``optimizer.step()`` call in manual optimization, and once per gradient under SAM;
- ``setup`` fires ``INIT`` once per model, ``on_train_start`` fires ``ITERATION_START`` only on a
  fresh run (not when resuming);
- a ``[marker]`` row runs no algorithm: with a profiler only (``Trainer(profiler=...)``), its
  events are marker-only (:meth:`~composer_bridge.Engine.run_marker_only_event`): the end of each
  training micro-batch opens the ``event/dataloader`` span of the next batch's wait, which the
  next ``AFTER_DATALOADER`` closes, or the epoch's end (no batch came), or an evaluation's start.

Examples:
    >>> [event.name for event in HOOK_EVENTS["on_train_epoch_end"]]
    ['EPOCH_END', 'EPOCH_CHECKPOINT']
"""

from __future__ import annotations

from composer_bridge.core.event import Event

__all__ = ["HOOK_EVENTS"]

#: Lightning hook (callback hook, or a module hook the bridge installs) → the events it fires, in order.
HOOK_EVENTS: dict[str, tuple[Event, ...]] = {
    "setup": (Event.INIT,),
    "on_load_checkpoint": (Event.BEFORE_LOAD,),  # the module's hook, before the weights load
    "load_state_dict": (Event.AFTER_LOAD,),  # the callback's state, after the weights
    "on_fit_start": (Event.FIT_START,),
    "on_train_start": (Event.ITERATION_START,),
    "on_train_epoch_start": (Event.EPOCH_START,),
    "on_before_batch_transfer": (Event.BEFORE_DATALOADER,),
    "on_after_batch_transfer": (Event.AFTER_DATALOADER,),
    "on_train_batch_start": (Event.BATCH_START, Event.BEFORE_TRAIN_BATCH),
    "training_step": (
        Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD,
    ),
    "training_step[plain]": (Event.BEFORE_BACKWARD,),  # a module without forward/loss apart
    # ... with an algorithm that needs the loss events: around the loss call seen inside it (plain_loss/step_events.py)
    "training_step[loss]": (
        Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD,
    ),
    "on_after_backward": (Event.AFTER_BACKWARD,),
    "on_before_optimizer_step": (Event.AFTER_TRAIN_BATCH,),
    "on_train_batch_end": (Event.BATCH_END, Event.BATCH_CHECKPOINT),
    "on_train_batch_end[marker]": (Event.BEFORE_DATALOADER,),  # every micro-batch: the next batch's wait
    "on_train_epoch_end[marker]": (Event.AFTER_DATALOADER,),  # no batch came
    "on_train_epoch_end": (Event.EPOCH_END, Event.EPOCH_CHECKPOINT),
    "on_train_end": (Event.ITERATION_END, Event.ITERATION_CHECKPOINT, Event.FIT_END),
    "on_validation_start[marker]": (Event.AFTER_DATALOADER,),  # the wait ends: evaluation runs
    "on_validation_start": (Event.EVAL_BEFORE_ALL, Event.EVAL_START),
    "on_validation_end": (Event.EVAL_END, Event.EVAL_AFTER_ALL),
    "on_validation_start[standalone]": (Event.EVAL_STANDALONE_START, Event.EVAL_START),
    "on_validation_end[standalone]": (Event.EVAL_END, Event.EVAL_STANDALONE_END),
    "on_test_start": (Event.EVAL_STANDALONE_START, Event.EVAL_START),
    "on_test_end": (Event.EVAL_END, Event.EVAL_STANDALONE_END),
    "on_validation_batch_start": (Event.EVAL_BATCH_START,),
    "on_validation_batch_end": (Event.EVAL_BATCH_END,),
    "on_test_batch_start": (Event.EVAL_BATCH_START,),
    "on_test_batch_end": (Event.EVAL_BATCH_END,),
    "validation_step": (Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD),  # around the forward
    "test_step": (Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD),
    "on_predict_start": (Event.PREDICT_START,),
    "on_predict_batch_start": (Event.PREDICT_BATCH_START,),
    "predict_step": (Event.PREDICT_BEFORE_FORWARD, Event.PREDICT_AFTER_FORWARD),
    "on_predict_batch_end": (Event.PREDICT_BATCH_END,),
    "on_predict_end": (Event.PREDICT_END,),
}
