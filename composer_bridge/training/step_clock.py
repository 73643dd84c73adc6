"""The step clock: which micro-batch of an optimizer step the loop is in, and when a step ends.

Lightning calls ``on_train_batch_start``/``on_train_batch_end`` once per *micro-batch*; Composer's
``timestamp.batch`` counts *optimizer steps*. The clock bridges the two: a step ends with the first
micro-batch after which Lightning's ``global_step`` moved, and counts as many batches as it moved.
That single rule covers gradient accumulation (k micro-batches, one step), manual optimization
with several optimizers (one ``training_step``, several steps: ``timestamp.batch`` stays equal to
``global_step``), manual accumulation (no step yet: the micro-batch continues the step) and SAM
(two closure evaluations, one step).

Examples:
    >>> import torch
    >>> from composer_bridge.core.state import State
    >>> state = State(torch.nn.Linear(1, 1))
    >>> clock = StepClock(state)
    >>> clock.start_fit(global_step=0)
    >>> clock.end_micro_batch(state, samples=4, global_step=0)  # accumulating: no step yet
    0
    >>> state.microbatch_index  # the clock keeps it equal to clock.micro
    1
    >>> clock.end_micro_batch(state, samples=4, global_step=2)  # two optimizers stepped
    2
    >>> state.timestamp.batch.value, state.timestamp.sample.value
    (2, 8)
"""

from __future__ import annotations

import time

from composer_bridge.core.state import State

__all__ = ["StepClock"]


class StepClock:
    """Micro-batch, sample and wall-clock bookkeeping for one training loop.

    The wall-clock (``time.perf_counter``) is read only while :attr:`timing` is on: the bridge
    turns it on while anything listens (an algorithm, an engine callback or a handler may read
    ``state.timestamp``'s ``*_wct``), so an idle bridge never reads the clock and leaves those
    fields at zero. While timing, it reads the clock once per optimizer step, at each epoch's
    start, and twice around each evaluation inside an epoch.

    Args:
        state: the run's state; its ``microbatch_index`` is kept equal to :attr:`micro` (written
            here only).
    """

    def __init__(self, state: State | None = None) -> None:
        self._state = state
        self._micro = 0
        self._samples = 0
        #: the samples the data hook saw for the micro-batch in flight (``None``: not seen)
        self.loaded_samples: int | None = None
        self._global_step = 0
        #: whether to read the wall-clock; a step that starts while it is off counts no seconds
        self.timing = True
        self._batch_started_at: float | None = None
        self._eval_started_at: float | None = None
        #: the Lightning epoch whose EPOCH_START fired last (``None``: none in this fit yet)
        self.started_epoch: int | None = None

    @property
    def micro(self) -> int:
        """Micro-batches finished in the current optimizer step (``state.microbatch_index``)."""
        return self._micro

    @micro.setter
    def micro(self, value: int) -> None:
        self._micro = value
        if self._state is not None:
            self._state.microbatch_index = value

    def start_fit(self, global_step: int) -> None:
        """The loop (re)starts at Lightning's ``global_step`` (restored when resuming)."""
        self._global_step = int(global_step)
        self.started_epoch = None
        self.reset_step()

    def start_epoch(self, epoch: int) -> bool:
        """Lightning's ``epoch`` starts: drop the step in flight and restart the wall-clock.

        Returns ``False`` when the epoch has started already in this fit (see :meth:`epoch_left_open`):
        its EPOCH_START must not fire twice.
        """
        if self.started_epoch == epoch:
            return False
        self.started_epoch = epoch
        self.reset_step()
        self._batch_started_at = time.perf_counter() if self.timing else None
        return True

    @staticmethod
    def epoch_left_open(state: State, loop_epoch: int) -> bool:
        """Whether a resumed loop starts in the epoch after the one the restored timestamp is still in.

        A checkpoint written at the last batch of an epoch (``ModelCheckpoint(every_n_train_steps=N)``
        there, ``train_time_interval``, ``trainer.save_checkpoint`` from ``on_train_batch_end``) holds
        the timestamp *before* that epoch's end advanced it. Resuming from it, Lightning goes straight
        to the next epoch and calls neither ``on_train_epoch_end`` for the checkpoint's epoch nor
        ``on_train_epoch_start`` for the next. The uninterrupted run fired EPOCH_END (its timestamp
        moved to the next epoch, which every random draw is keyed on) and then EPOCH_START: the
        resumed run must fire them too, before its first batch.

        Examples:
            >>> import torch
            >>> state = State(torch.nn.Linear(1, 1))
            >>> state.count_batch(samples=4, seconds=0.0)  # epoch 0 ran a batch; its end did not fire
            >>> StepClock.epoch_left_open(state, loop_epoch=1), StepClock.epoch_left_open(state, loop_epoch=0)
            (True, False)
        """
        timestamp = state.timestamp
        return int(loop_epoch) == int(timestamp.epoch.value) + 1 and int(timestamp.batch_in_epoch.value) > 0

    def reset_step(self) -> None:
        self.micro = 0
        self._samples = 0

    def step_open(self, global_step: int) -> bool:
        """Whether Lightning finished an optimizer step that :meth:`end_micro_batch` has not counted yet.

        True only inside ``on_train_batch_end`` of a callback that Lightning calls before the bridge.
        """
        return int(global_step) > self._global_step

    def end_micro_batch(self, state: State, samples: int, global_step: int) -> int:
        """Count a finished micro-batch; return how many optimizer steps it completed (0: step continues).

        When it completed any, the step's samples and wall-clock go to ``state`` (``count_batch``)
        and the next micro-batch starts a new step.
        """
        loaded = self.loaded_samples
        if loaded is not None:
            samples = loaded
            self.loaded_samples = None
        self._samples += samples
        steps = int(global_step) - self._global_step
        if steps <= 0:
            self.micro += 1
            return 0
        self._global_step = int(global_step)
        # As in Composer, a batch's wall-clock runs from the end of the previous one (data loading
        # in, evaluation out: see start_eval/end_eval).
        seconds = 0.0
        if self.timing:
            now = time.perf_counter()
            if self._batch_started_at is not None:
                seconds = now - self._batch_started_at
            self._batch_started_at = now
        else:
            self._batch_started_at = None
        state.count_batch(self._samples, seconds, batches=steps)
        self.reset_step()
        return steps

    def start_eval(self) -> None:
        self._eval_started_at = time.perf_counter() if self.timing and self._batch_started_at is not None else None

    def end_eval(self) -> None:
        """Evaluation inside a step's wall-clock window is not batch time."""
        if self._eval_started_at is not None and self._batch_started_at is not None:
            self._batch_started_at += time.perf_counter() - self._eval_started_at
        self._eval_started_at = None
