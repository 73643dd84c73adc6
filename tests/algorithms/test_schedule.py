"""The shared schedule-point parsing: every scheduled algorithm accepts and refuses the same forms."""

from __future__ import annotations

import doctest
from typing import Any

import pytest

import composer_bridge.algorithms._schedule as schedule_module
from composer_bridge.algorithms import (
    ProgressiveResizing,
    SelectiveBackprop,
    SeqLengthWarmup,
    StochasticDepth,
)
from composer_bridge.algorithms._schedule import schedule_point
from composer_bridge.core.time import Time, TimeUnit

SCHEDULED = [
    (ProgressiveResizing, "delay_fraction"),
    (SelectiveBackprop, "start"),
    (StochasticDepth, "drop_warmup"),
    (SeqLengthWarmup, "duration"),
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
