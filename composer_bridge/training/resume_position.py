"""Where a resumed fit should start, checked against where Lightning starts it.

A checkpoint holds the bridge's timestamp: the epoch and the optimizer step within it at which the
run was saved. A fit resumed from it should train its first batch there. Lightning decides where
it actually starts, from its own loop counters, and some checkpoints make it start elsewhere:

- *earlier* (Lightning-AI/pytorch-lightning#19403): after a run resumed from a checkpoint written at
  an epoch's last batch, the checkpoints that run writes make Lightning restart their epoch from its
  first batch, with ``global_step`` kept. The batches already trained in that epoch are trained again,
  and the run ends that many steps later than the uninterrupted one.
- *later*: not seen in our tests, and warned about the same way. (A checkpoint written after the next
  batch was drawn, by ``OnExceptionCheckpoint`` or SLURM's requeue signal handled in
  ``on_train_batch_start``, also loses that batch, but in the loader's position only: Lightning's
  counters and the bridge's agree, so this check cannot see it.)

The bridge follows Lightning's counters either way (its state must match the loop that runs). This
module only measures the gap, once per resumed fit, and warns with its size. It knows nothing of
Lightning: the adapter gives it the restored timestamp and the loop's position.

Examples:
    >>> import warnings
    >>> position = ResumePosition()
    >>> position.expect(epoch=1, step_in_epoch=3, steps_per_epoch=3)  # saved at epoch 1's last step
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     position.check(loop_epoch=1, loop_step_in_epoch=0)  # Lightning restarts epoch 1
    3
    >>> "19403" in str(caught[0].message)
    True
    >>> position.check(loop_epoch=1, loop_step_in_epoch=0) is None  # once per resumed fit
    True
    >>> position.expect(epoch=2, step_in_epoch=1, steps_per_epoch=3)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     position.check(loop_epoch=2, loop_step_in_epoch=2)  # Lightning starts a step later
    -1
    >>> "1 optimizer step(s) of the uninterrupted run are skipped" in str(caught[0].message)
    True
    >>> position.expect(epoch=2, step_in_epoch=1, steps_per_epoch=3)
    >>> position.check(loop_epoch=2, loop_step_in_epoch=1)  # where it was saved: no warning
    0
"""

from __future__ import annotations

import warnings

__all__ = ["ResumePosition", "ResumeDriftWarning"]

ISSUE = "https://github.com/Lightning-AI/pytorch-lightning/issues/19403"


class ResumeDriftWarning(UserWarning):
    """A resumed fit starts at another optimizer step than the one its checkpoint was saved at."""


class ResumePosition:
    """The position a resumed fit should start at (:meth:`expect`), compared once with Lightning's (:meth:`check`)."""

    def __init__(self) -> None:
        self._expected: tuple[int, int, int | None] | None = None

    def expect(self, epoch: int, step_in_epoch: int, steps_per_epoch: int | None) -> None:
        """Arm the check: the restored timestamp says the fit continues at ``step_in_epoch`` of ``epoch``."""
        self._expected = (int(epoch), int(step_in_epoch), steps_per_epoch)

    def disarm(self) -> None:
        """No check for this fit (it did not resume from a checkpoint)."""
        self._expected = None

    def check(self, loop_epoch: int, loop_step_in_epoch: int) -> int | None:
        """Compare with the loop's first position; warn if they differ. Returns the steps Lightning trains
        again (positive) or skips (negative), ``None`` when nothing was armed. Checks once per :meth:`expect`.
        """
        if self._expected is None:
            return None
        epoch, step, steps_per_epoch = self._expected
        self._expected = None
        if (epoch, step) == (loop_epoch, loop_step_in_epoch):
            return 0
        if epoch != loop_epoch and steps_per_epoch is None:
            gap = None
        else:
            gap = (epoch - loop_epoch) * (steps_per_epoch or 0) + step - loop_step_in_epoch
        saved, starts = f"epoch {epoch}, step {step} of the epoch", f"epoch {loop_epoch}, step {loop_step_in_epoch}"
        if gap is None or gap > 0:
            size = "some" if gap is None else str(gap)
            warnings.warn(
                f"Lightning resumes this checkpoint at {starts}, but it was saved at {saved}: {size} optimizer "
                f"step(s) already trained are trained again, so this run ends {size} step(s) later than an "
                "uninterrupted one, with other weights. This is Lightning's own behaviour, with or without "
                f"composer_bridge ({ISSUE}): it happens to checkpoints written by a run that was itself resumed "
                "from a checkpoint saved at an epoch's last batch. The bridge follows Lightning's counters. "
                "Checkpoints written at epoch ends (ModelCheckpoint(every_n_epochs=1)) resumed exactly however "
                "often a run was resumed in our tests; see the Preemption section of docs/checkpoints.md.",
                ResumeDriftWarning,
                stacklevel=2,
            )
        else:
            warnings.warn(
                f"Lightning resumes this checkpoint at {starts}, but it was saved at {saved}: {-gap} optimizer "
                "step(s) of the uninterrupted run are skipped. The bridge follows Lightning's counters. See the "
                "Preemption section of docs/checkpoints.md.",
                ResumeDriftWarning,
                stacklevel=2,
            )
        return gap
