"""composer_bridge.training.step_clock: the StepClock counts optimizer steps from Lightning's micro-batches.

No Trainer here: each test drives the clock the way the Lightning adapter does (``start_fit`` at the
fit's start with Lightning's restored ``global_step``, ``start_epoch``, then ``end_micro_batch`` after
every micro-batch with the ``global_step`` Lightning reports) and reads the :class:`State` it counts into.
The wall-clock is a fake ``time.perf_counter`` that the test moves by hand.
"""

from __future__ import annotations

import pytest
import torch

from composer_bridge.core.state import State
from composer_bridge.training import step_clock
from composer_bridge.training.step_clock import StepClock


def new_state() -> State:
    return State(torch.nn.Linear(2, 2))


class FakeClock:
    """``time.perf_counter`` whose value the test sets; counts how often it is read."""

    def __init__(self, now: float = 100.0) -> None:
        self.now, self.reads = now, 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


@pytest.fixture
def wall_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(step_clock.time, "perf_counter", fake)
    return fake


def test_a_step_of_accumulated_micro_batches_counts_once_with_all_their_samples() -> None:
    state = new_state()
    clock = StepClock(state)
    clock.start_fit(global_step=0)
    clock.start_epoch(0)
    # accumulate_grad_batches=3: Lightning's global_step moves after the third micro-batch only
    assert [clock.end_micro_batch(state, samples=4, global_step=0) for _ in range(2)] == [0, 0]
    assert (clock.micro, state.microbatch_index) == (2, 2)
    assert state.timestamp.batch.value == 0
    assert clock.end_micro_batch(state, samples=3, global_step=1) == 1
    assert (state.timestamp.batch.value, state.timestamp.sample.value, state.timestamp.batch_in_epoch.value) == (1, 11, 1)
    assert (clock.micro, state.microbatch_index) == (0, 0)  # the next micro-batch starts a new step
    assert clock.end_micro_batch(state, samples=4, global_step=1) == 0
    assert clock.end_micro_batch(state, samples=4, global_step=2) == 1
    assert (state.timestamp.batch.value, state.timestamp.sample.value) == (2, 19)


def test_several_optimizers_stepping_in_one_training_step_keep_the_batch_count_equal_to_global_step() -> None:
    state = new_state()
    clock = StepClock(state)
    clock.start_fit(global_step=0)
    clock.start_epoch(0)
    assert clock.end_micro_batch(state, samples=8, global_step=2) == 2  # a GAN: D then G stepped
    assert clock.end_micro_batch(state, samples=8, global_step=4) == 2
    assert (state.timestamp.batch.value, state.timestamp.batch_in_epoch.value) == (4, 4)
    assert state.timestamp.sample.value == 16  # samples count once per training_step, not per optimizer


def test_the_samples_the_data_hook_saw_replace_the_batch_size_once() -> None:
    state = new_state()
    clock = StepClock(state)
    clock.start_fit(global_step=0)
    clock.start_epoch(0)
    clock.loaded_samples = 16  # as loaded, before AFTER_DATALOADER (which may change the batch)
    clock.end_micro_batch(state, samples=5, global_step=1)
    assert state.timestamp.sample.value == 16 and clock.loaded_samples is None
    clock.end_micro_batch(state, samples=5, global_step=2)  # not seen by the hook: the given size
    assert state.timestamp.sample.value == 21


def test_a_resumed_fit_counts_from_the_restored_global_step() -> None:
    state = new_state()
    state.timestamp = state.timestamp.copy(batch=6, batch_in_epoch=2, epoch=2)  # as restored from a checkpoint
    clock = StepClock(state)
    clock.start_fit(global_step=6)
    clock.start_epoch(2)
    assert not clock.step_open(global_step=6)
    assert clock.end_micro_batch(state, samples=4, global_step=6) == 0  # accumulating
    assert clock.step_open(global_step=7)  # a callback listed before the bridge sees the step done, uncounted
    assert clock.end_micro_batch(state, samples=4, global_step=7) == 1
    assert not clock.step_open(global_step=7)
    assert (state.timestamp.batch.value, state.timestamp.batch_in_epoch.value) == (7, 3)


def test_an_epoch_starts_once_per_fit_and_drops_the_step_in_flight() -> None:
    state = new_state()
    clock = StepClock(state)
    clock.start_fit(global_step=0)
    assert clock.start_epoch(0) is True
    clock.end_micro_batch(state, samples=4, global_step=0)  # a micro-batch of a step the epoch's end cut off
    assert clock.micro == 1
    assert clock.start_epoch(0) is False  # the same epoch again (a resumed fit's closing of it): no second start
    assert clock.micro == 1
    assert clock.start_epoch(1) is True
    assert (clock.micro, state.microbatch_index) == (0, 0)
    clock.end_micro_batch(state, samples=2, global_step=1)
    assert state.timestamp.sample.value == 2  # the dropped micro-batch's 4 samples are not counted
    clock.start_fit(global_step=1)  # a new fit (fit called again) may start epoch 1 again
    assert clock.start_epoch(1) is True


def test_a_checkpoint_from_an_epochs_last_batch_leaves_that_epoch_open() -> None:
    state = new_state()
    for _ in range(3):
        state.count_batch(samples=4, seconds=0.0)
    # the checkpoint was written in the epoch's last on_train_batch_end: epoch 0, 3 batches into it
    assert StepClock.epoch_left_open(state, loop_epoch=1) is True
    assert StepClock.epoch_left_open(state, loop_epoch=0) is False  # mid-epoch: Lightning resumes in epoch 0
    state.timestamp = state.timestamp.to_next_epoch()
    assert StepClock.epoch_left_open(state, loop_epoch=1) is False  # the epoch's end was counted


def test_a_step_lasts_from_the_end_of_the_previous_one_less_the_evaluation_inside_it(wall_clock: FakeClock) -> None:
    state = new_state()
    clock = StepClock(state)
    clock.start_fit(global_step=0)
    clock.start_epoch(0)  # at t=100
    wall_clock.now = 103.0
    clock.end_micro_batch(state, samples=4, global_step=1)
    assert state.timestamp.batch_wct.total_seconds() == pytest.approx(3.0)
    wall_clock.now = 105.0
    clock.start_eval()
    wall_clock.now = 108.0
    clock.end_eval()  # 3 s of validation inside the next step's window
    wall_clock.now = 110.0
    clock.end_micro_batch(state, samples=4, global_step=2)
    assert state.timestamp.batch_wct.total_seconds() == pytest.approx(4.0)
    assert state.timestamp.total_wct.total_seconds() == pytest.approx(7.0)


def test_an_idle_clock_never_reads_the_wall_clock_and_counts_no_seconds(wall_clock: FakeClock) -> None:
    state = new_state()
    clock = StepClock(state)
    clock.timing = False
    clock.start_fit(global_step=0)
    clock.start_epoch(0)
    for step in (1, 2):
        wall_clock.now += 5
        clock.start_eval()
        clock.end_eval()
        clock.end_micro_batch(state, samples=4, global_step=step)
    assert wall_clock.reads == 0
    assert state.timestamp.batch.value == 2 and state.timestamp.total_wct.total_seconds() == 0.0


def test_a_clock_without_a_state_still_counts_micro_batches() -> None:
    clock = StepClock()
    clock.start_fit(global_step=0)
    state = new_state()
    clock.end_micro_batch(state, samples=1, global_step=0)
    assert clock.micro == 1 and state.microbatch_index == 0  # only the state it was given is kept in step
