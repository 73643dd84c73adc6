"""Warmup-stable-decay (WSD) learning-rate schedule: warm up, hold the peak, decay over the last part of the run.

Examples:
    >>> [round(wsd_multiplier(step, total=10, warmup_steps=2, decay_steps=4), 3) for step in range(10)]
    [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.293, 0.134]
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from composer_bridge.algorithms._schedule import schedule_point, steps_of
from composer_bridge.core.algorithm import Algorithm, check_owners
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.state import State
from composer_bridge.core.time import Time, TimeUnit

__all__ = ["SHAPES", "WarmupStableDecay", "wsd_multiplier"]

#: The decay shapes: ``linear`` (1 - p) and ``1-sqrt`` (1 - sqrt(p)), p the fraction of the decay done.
SHAPES = ("linear", "1-sqrt")


def wsd_multiplier(
    step: int, total: int, warmup_steps: int, decay_steps: int, shape: str = "1-sqrt", final_lr_ratio: float = 0.0
) -> float:
    """The factor of the peak learning rate for optimizer step ``step`` (0-based) of a ``total``-step run.

    Warmup: ``(step + 1) / warmup_steps`` for the first ``warmup_steps`` steps (the first step already
    learns). Stable: ``1``. Decay, over the last ``decay_steps`` steps, with ``p = (step - start) /
    decay_steps`` (``start = total - decay_steps``, so ``p`` runs from 0 to ``1 - 1/decay_steps``):
    ``final + (1 - final) * (1 - p)`` (linear) or ``... * (1 - sqrt(p))`` (1-sqrt); it would reach
    ``final_lr_ratio`` at step ``total``, the one after the last. Past the run: ``final_lr_ratio``.

    Examples:
        >>> wsd_multiplier(0, total=100, warmup_steps=10, decay_steps=20)
        0.1
        >>> wsd_multiplier(90, total=100, warmup_steps=10, decay_steps=20, shape="linear", final_lr_ratio=0.1)
        0.55
    """
    if shape not in SHAPES:
        raise ValueError(f"wsd_multiplier(shape={shape!r}): must be one of {', '.join(map(repr, SHAPES))}.")
    if warmup_steps + decay_steps > total:
        raise ValueError(
            f"wsd_multiplier: warmup ({warmup_steps} steps) and decay ({decay_steps} steps) do not fit in a run of "
            f"{total} steps; shorten them or lengthen the run."
        )
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    start = total - decay_steps
    if step < start:
        return 1.0
    if step >= total:
        return float(final_lr_ratio)
    progress = (step - start) / decay_steps
    left = 1.0 - progress if shape == "linear" else 1.0 - math.sqrt(progress)
    return final_lr_ratio + (1.0 - final_lr_ratio) * left


class WarmupStableDecay(Algorithm):
    """Replace the user's learning-rate schedule by warmup-stable-decay; the peak is the LR they built the optimizer with.

    Before every optimizer step (``BATCH_START``) each parameter group's learning rate is set to
    its peak (the ``lr`` the user's ``configure_optimizers`` built it with, kept as ``initial_lr``)
    times :func:`wsd_multiplier` of the step. The run's length comes from the Trainer:
    ``max_steps``, or ``max_epochs`` × optimizer steps per epoch (batches over
    ``accumulate_grad_batches``, after ``limit_train_batches``). The schedulers the user's
    ``configure_optimizers`` returned are dropped, with a ``UserWarning`` that names them (their
    schedule would fight this one). The learning rate is a function of the step only, so a resumed run
    continues exactly.

    Args:
        warmup: length of the warmup: a fraction of the run (``0.02``), or ``"200ba"``/``"1ep"``. Default ``0.02``.
        decay: length of the decay at the end of the run, same forms. Default ``0.2`` (Hägele et al. 2024:
            a 20 % cooldown with the 1-sqrt shape matches a cosine schedule).
        shape: ``"1-sqrt"`` (default) or ``"linear"``.
        final_lr_ratio: the fraction of the peak the decay heads for (reached one step after the run). Default ``0.0``.

    Examples:
        >>> WarmupStableDecay(warmup=0.05, decay=0.1, shape="linear")
        WarmupStableDecay(warmup=0.05, decay=0.1, shape='linear', final_lr_ratio=0.0)
    """

    unique = True
    owns_schedule = True
    needs_run_length = True

    def __init__(
        self, warmup: float | str = 0.02, decay: float | str = 0.2, shape: str = "1-sqrt", final_lr_ratio: float = 0.0
    ) -> None:
        self._warmup = schedule_point(warmup, "warmup", "WarmupStableDecay")
        self._decay = schedule_point(decay, "decay", "WarmupStableDecay")
        if shape not in SHAPES:
            raise ValueError(f"WarmupStableDecay(shape={shape!r}): must be one of {', '.join(map(repr, SHAPES))}.")
        if isinstance(final_lr_ratio, bool) or not isinstance(final_lr_ratio, (int, float)) or not 0 <= final_lr_ratio <= 1:
            raise ValueError(f"WarmupStableDecay(final_lr_ratio={final_lr_ratio!r}): must be a number in [0, 1], e.g. 0.0.")
        if self._warmup.unit == self._decay.unit == TimeUnit.DURATION and self._warmup.value + self._decay.value > 1:
            raise ValueError(
                f"WarmupStableDecay(warmup={warmup!r}, decay={decay!r}): warmup and decay together exceed the run."
            )
        self.warmup = warmup
        self.decay = decay
        self.shape = shape
        self.final_lr_ratio = final_lr_ratio
        self._steps: tuple[int, int, int] | None = None  # (total, warmup, decay), found at the first step

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.INIT, Event.FIT_START, Event.BATCH_START)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.INIT:
            check_owners(state.algorithms)
        elif event == Event.FIT_START:
            self._take_over(state)
        else:
            self._set_lr(state, logger)

    def _take_over(self, state: State) -> None:
        self._steps = None  # a new fit may have another length
        if state.max_duration is None:
            raise ValueError(
                "WarmupStableDecay needs the run's length to place its decay: give the Trainer max_steps or max_epochs."
            )
        for optimizer in state.optimizers:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])  # the peak (kept in the optimizer's checkpoint)
        if state.schedulers:
            names = ", ".join(type(s).__name__ for s in state.schedulers)
            warnings.warn(
                f"WarmupStableDecay replaces the learning-rate schedule: the scheduler(s) configure_optimizers "
                f"returned ({names}) are not stepped in this run. Remove them, or remove WarmupStableDecay to keep them.",
                stacklevel=2,
            )
            state.schedulers = []

    def steps(self, state: State) -> tuple[int, int, int]:
        """``(total, warmup, decay)`` in optimizer steps for this run (needs the run's length)."""
        if self._steps is None:
            total = steps_of(state.max_duration, state) if state.max_duration is not None else None
            if total is None:
                raise ValueError(
                    f"WarmupStableDecay cannot count the optimizer steps of a run of {state.max_duration} (the training "
                    "dataloader has no length): give the Trainer max_steps."
                )
            whole = Time(int(total), TimeUnit.BATCH)
            warmup = self._in_steps(self._warmup, whole, state)
            decay = self._in_steps(self._decay, whole, state)
            if warmup + decay > int(total):
                raise ValueError(
                    f"WarmupStableDecay(warmup={self.warmup!r}, decay={self.decay!r}): {warmup} + {decay} steps do not "
                    f"fit in this run of {int(total)} steps; shorten them or lengthen the run."
                )
            self._steps = (int(total), warmup, decay)
        return self._steps

    @staticmethod
    def _in_steps(point: Time, whole: Time, state: State) -> int:
        if point.unit == TimeUnit.DURATION:
            return round(float(point.value) * whole.value)
        steps = steps_of(point, state)
        assert steps is not None  # ba always; ep once the dataloader's length is known (it is, or total failed)
        return round(steps)

    def _set_lr(self, state: State, logger: Logger) -> None:
        total, warmup, decay = self.steps(state)
        factor = wsd_multiplier(int(state.timestamp.batch.value), total, warmup, decay, self.shape, self.final_lr_ratio)
        for optimizer in state.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = group.setdefault("initial_lr", group["lr"]) * factor

    def state_dict(self) -> dict[str, Any]:
        return {}
