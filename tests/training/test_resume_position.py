"""composer_bridge.training.resume_position: a resumed fit that starts elsewhere than it was saved is named, once.

The adapter arms :class:`ResumePosition` with the restored timestamp's position and compares it with
the loop's first batch; these tests drive it directly, with the positions Lightning gives in the cases
its docstring lists.
"""

from __future__ import annotations

import warnings

import pytest

from composer_bridge.training.resume_position import ResumeDriftWarning, ResumePosition


def test_lightnings_restart_of_the_epoch_is_measured_in_steps_and_named_with_its_issue() -> None:
    position = ResumePosition()
    position.expect(epoch=1, step_in_epoch=3, steps_per_epoch=3)  # saved after epoch 1's last step
    with pytest.warns(ResumeDriftWarning, match=r"3 optimizer step\(s\) already trained are trained again.*19403"):
        assert position.check(loop_epoch=1, loop_step_in_epoch=0) == 3


def test_a_gap_across_epochs_counts_the_steps_of_the_epochs_between() -> None:
    position = ResumePosition()
    position.expect(epoch=3, step_in_epoch=1, steps_per_epoch=4)
    with pytest.warns(ResumeDriftWarning, match="epoch 2, step 2"):
        assert position.check(loop_epoch=2, loop_step_in_epoch=2) == 3  # 2 steps left of epoch 2, 1 of epoch 3
    position.expect(epoch=3, step_in_epoch=1, steps_per_epoch=None)  # epoch length unknown: no number
    with pytest.warns(ResumeDriftWarning, match="some optimizer step"):
        assert position.check(loop_epoch=2, loop_step_in_epoch=2) is None


def test_a_later_start_warns_with_the_steps_skipped() -> None:
    position = ResumePosition()
    position.expect(epoch=0, step_in_epoch=2, steps_per_epoch=5)
    with pytest.warns(ResumeDriftWarning, match=r"2 optimizer step\(s\) of the uninterrupted run are skipped"):
        assert position.check(loop_epoch=0, loop_step_in_epoch=4) == -2


def test_the_check_runs_once_per_resumed_fit_and_not_at_all_for_a_fresh_one() -> None:
    position = ResumePosition()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert position.check(loop_epoch=0, loop_step_in_epoch=0) is None  # a fresh fit: nothing armed
        position.expect(epoch=2, step_in_epoch=1, steps_per_epoch=3)
        assert position.check(loop_epoch=2, loop_step_in_epoch=1) == 0  # exactly where it was saved
        position.expect(epoch=1, step_in_epoch=3, steps_per_epoch=3)
        position.disarm()
        assert position.check(loop_epoch=1, loop_step_in_epoch=0) is None
    position.expect(epoch=1, step_in_epoch=3, steps_per_epoch=3)
    with pytest.warns(ResumeDriftWarning):
        position.check(loop_epoch=1, loop_step_in_epoch=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert position.check(loop_epoch=1, loop_step_in_epoch=0) is None  # the second batch is not checked
