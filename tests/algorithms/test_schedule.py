"""The shared schedule-point parsing: every scheduled algorithm accepts and refuses the same forms."""

from __future__ import annotations

import doctest
from typing import Any

import pytest
import torch

import composer_bridge.algorithms._schedule as schedule_module
from composer_bridge.algorithms import (
    BatchSizeWarmup,
    ProgressiveResizing,
    SelectiveBackprop,
    SeqLengthWarmup,
    StochasticDepth,
)
from composer_bridge.algorithms._schedule import fraction_of_run, in_unit, schedule_point, steps_of
from composer_bridge.core.state import State
from composer_bridge.core.time import Time, TimeUnit

SCHEDULED = [
    (ProgressiveResizing, "delay_fraction"),
    (SelectiveBackprop, "start"),
    (StochasticDepth, "drop_warmup"),
    (SeqLengthWarmup, "duration"),
    (BatchSizeWarmup, "duration"),
]


@pytest.mark.parametrize("value, expected", [
    (0.25, Time(0.25, TimeUnit.DURATION)), ("0.25dur", Time(0.25, TimeUnit.DURATION)),
    ("3ep", Time(3, TimeUnit.EPOCH)), ("200ba", Time(200, TimeUnit.BATCH)), (Time(4, "ba"), Time(4, "ba")),
])
def test_fractions_and_time_strings_in_dur_ep_ba_are_schedule_points(value: Any, expected: Time) -> None:
    assert schedule_point(value, "start", "Owner") == expected


@pytest.mark.parametrize("cls, name", SCHEDULED)
@pytest.mark.parametrize("value, message", [
    ("90sec", r"not 'sec'"), ("100sp", r"not 'sp'"), ("soon", r"time string such as '0.5dur'"), ([1], "e.g. 0.5"),
])
def test_every_scheduled_algorithm_refuses_other_units_and_garbage_naming_itself(
    cls: type, name: str, value: Any, message: str,
) -> None:
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\({name}={value!r}\): .*{message}".replace("[", r"\[")):
        cls(**{name: value})


def test_fractions_beyond_the_run_are_refused_except_for_a_warmup_that_may_outlast_it() -> None:
    with pytest.raises(ValueError, match=r"Owner\(end=1.5\): a fraction of the run must be in \[0, 1\]"):
        schedule_point(1.5, "end", "Owner")
    assert schedule_point(1.5, "drop_warmup", "Owner", at_most_one_run=False) == Time(1.5, TimeUnit.DURATION)
    StochasticDepth(drop_warmup="1.5dur")
    with pytest.raises(ValueError, match=r"SeqLengthWarmup\(duration=2.0\).*\[0, 1\]"):
        SeqLengthWarmup(duration=2.0)


def test_docstring_examples_run() -> None:
    assert doctest.testmod(schedule_module).failed == 0


def _state(max_duration: str | None, dataloader_len: int | None) -> State:
    return State(torch.nn.Linear(1, 1), max_duration=max_duration, dataloader_len=dataloader_len)


@pytest.mark.parametrize("time, max_duration, per_epoch, steps", [
    ("30ba", None, None, 30.0),  # batches need nothing
    ("3ep", None, 25, 75.0),  # epochs need the steps per epoch ...
    ("3ep", "10ep", None, None),  # ... and only them
    ("0.5dur", "200ba", None, 100.0),
    ("0.25dur", "4ep", 10, 10.0),
    ("0.25dur", "4ep", None, None),
    ("0.5dur", None, 10, None),  # no run length
    ("0.5dur", "1000sp", 10, None),  # samples do not convert
])
def test_steps_of_converts_batches_epochs_and_fractions_of_the_run(
    time: str, max_duration: str | None, per_epoch: int | None, steps: float | None,
) -> None:
    assert steps_of(Time.from_input(time), _state(max_duration, per_epoch)) == steps


def test_in_unit_counts_in_epochs_too() -> None:
    state = _state("100ba", 20)
    assert in_unit(Time(30, "ba"), TimeUnit.EPOCH, state) == 1.5
    assert in_unit(Time(0.5, "dur"), TimeUnit.EPOCH, state) == 2.5
    assert in_unit(Time(0.5, "dur"), TimeUnit.EPOCH, _state("6ep", None)) == 3.0  # ep in ep: no steps needed


def test_every_scheduled_algorithm_counts_the_run_in_the_same_steps() -> None:
    from composer_bridge.algorithms import EMA, GyroDropout

    state = _state("3ep", 40)  # 120 optimizer steps
    assert steps_of(Time(1.0, "dur"), state) == 120
    assert SeqLengthWarmup(duration=0.25)._warmup_steps(state) == 30
    assert SeqLengthWarmup(duration="2ep")._warmup_steps(state) == 80
    assert BatchSizeWarmup(duration=0.25)._warmup_steps(state) == 30
    assert GyroDropout()._total_steps(state) == 120
    assert fraction_of_run(Time(30, "ba"), state, "Owner") == 0.25
    assert EMA(half_life="0.25dur").smoothing_for(state) == 2.0 ** (-1 / 30)
    no_steps = _state("3ep", None)
    assert GyroDropout()._total_steps(no_steps) is None
    with pytest.raises(ValueError, match=r"SeqLengthWarmup\(duration in epochs\) needs the number of steps per epoch"):
        SeqLengthWarmup(duration="2ep")._warmup_steps(no_steps)
    with pytest.raises(ValueError, match="SeqLengthWarmup needs the number of steps per epoch to schedule in fractions"):
        SeqLengthWarmup(duration=0.25)._warmup_steps(no_steps)
    with pytest.raises(ValueError, match=r"Owner cannot convert 30ba into a fraction of a run of 3ep"):
        fraction_of_run(Time(30, "ba"), no_steps, "Owner")
