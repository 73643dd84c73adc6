"""One run, validated as it trains, and when it may stop: the prescription search's unit of measurement.

A run of ``steps`` optimizer steps (its schedule that long, as the user will train it) is validated every
``eval_every`` steps; its *time to the target* is AlgoPerf's: the training time at the first validation whose
quality reaches the target (validation time left out). Training stops as soon as the answer cannot change:

* **reached**: a validation reached the target (the rest of the run cannot change its time to it);
* **too slow**: it has trained ``stop_after`` seconds without reaching the target (it cannot beat the run it
  races against, whose time is known);
* **pruned at a rung**: at the first validation at or after a rung's time it is below that rung's bar (the
  quality the runs measured so far had there, successive halving's promotion rule at equal training time).

:meth:`CurveRule.verdict` is the rule as a pure function of the points so far (the simulator in the tests and the
Lightning callback :class:`CurveRecorder` both apply it), so a fit stopped early is exactly the prefix of the same
run trained to the end.

Examples:
    >>> rule = CurveRule(eval_every=10, target=0.8, higher=True, stop_after=5.0, gates=((2.0, 0.5),))
    >>> rule.verdict([(10, 1.0, 0.3)]), rule.verdict([(10, 1.0, 0.3), (20, 2.1, 0.4)])
    (None, 'pruned at the rung at 2: 0.4 below 0.5')
    >>> rule.verdict([(10, 1.0, 0.3), (20, 2.1, 0.6), (30, 3.0, 0.85)])
    'reached'
    >>> first_reach([(10, 1.0, 0.3), (20, 2.1, 0.6), (30, 3.0, 0.85)], 0.8, True)
    (30, 3.0)
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from composer_bridge.lightning.package import CALLBACK_BASES

__all__ = ["CurvePoint", "CurveRecorder", "CurveRule", "first_reach"]

#: One validation of a run: ``(optimizer step, training seconds on the search's clock, quality)``.
CurvePoint = tuple[int, float, float]


def first_reach(points: Sequence[CurvePoint], target: float, higher: bool) -> tuple[int, float] | None:
    """``(step, seconds)`` of the first validation whose quality reaches ``target`` (``None``: none did)."""
    for step, seconds, quality in points:
        if not math.isnan(quality) and (quality >= target if higher else quality <= target):
            return int(step), float(seconds)
    return None


@dataclass(frozen=True)
class CurveRule:
    """How one run is validated and when it stops (see the module's docstring).

    Attributes:
        eval_every: optimizer steps between validations (and one at the end).
        target: the quality to reach (``None``: no target yet, the run trains to its end: the baseline's run).
        higher: ``True`` when a higher quality is better.
        stop_after: stop a run that has trained this long (the clock's unit) without reaching the target.
        gates: ``(seconds, bar)`` pairs: at the first validation at or after ``seconds``, a quality worse than
            ``bar`` stops the run.
    """

    eval_every: int
    target: float | None = None
    higher: bool = True
    stop_after: float | None = None
    gates: tuple[tuple[float, float], ...] = ()

    def _better(self, a: float, b: float) -> bool:
        return a >= b if self.higher else a <= b

    def verdict(self, points: Sequence[CurvePoint]) -> str | None:
        """Why a run with these validations so far stops now (``None``: it goes on)."""
        if not points:
            return None
        _, seconds, quality = points[-1]
        if self.target is not None and first_reach(points[-1:], self.target, self.higher) is not None:
            return "reached"
        if math.isnan(quality):
            return "diverged"
        previous = points[-2][1] if len(points) > 1 else -math.inf
        for at, bar in self.gates:
            if previous < at <= seconds and not self._better(quality, bar):
                return f"pruned at the rung at {at:.3g}: {quality:.4g} {'below' if self.higher else 'above'} {bar:.4g}"
        if self.target is not None and self.stop_after is not None and seconds >= self.stop_after:
            return f"too slow: not reached in {seconds:.3g}"
        return None

    def key(self) -> str:
        """The rule as text: part of a fit's identity in the state file (another rule trains another run prefix)."""
        gates = ",".join(f"{a:.6g}:{b:.6g}" for a, b in self.gates)
        return (f"every {self.eval_every}|target {self.target!r}|{'max' if self.higher else 'min'}|"
                f"after {self.stop_after!r}|gates {gates}")


class CurveRecorder(*CALLBACK_BASES):  # type: ignore[misc]
    """Records a validation point every ``eval_every`` steps (training time only) and stops by the rule.

    A callback of both Lightning packages; the Trainer validates every ``eval_every`` steps
    (``val_check_interval``), this callback reads ``monitor`` after each validation.
    """

    def __init__(self, rule: CurveRule, monitor: str, clock: str) -> None:
        self.rule, self.monitor, self.clock = rule, monitor, clock
        self.points: list[CurvePoint] = []
        self.stopped: str | None = None
        self.cpu_s = self.wall_s = 0.0
        self.steps = 0
        self._since: tuple[float, float] | None = None

    def _sync(self, trainer: Any) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def _resume(self) -> None:
        self._since = (time.process_time(), time.perf_counter())

    def _pause(self, trainer: Any) -> None:
        if self._since is not None:
            self._sync(trainer)
            self.cpu_s += time.process_time() - self._since[0]
            self.wall_s += time.perf_counter() - self._since[1]
            self._since = None

    def seconds(self, clock: str | None = None, steps: int | None = None) -> float:
        """Training time so far on ``clock`` (default: the search's); ``steps`` for the steps clock."""
        clock = clock or self.clock
        return {"cpu": self.cpu_s, "wall": self.wall_s, "steps": float(self.steps if steps is None else steps)}[clock]

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._sync(trainer)
        self._resume()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._pause(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        step = trainer.global_step
        if value is None:
            raise KeyError(f"monitor={self.monitor!r} was not logged by validation; it logged "
                           f"{sorted(trainer.callback_metrics)}.")
        if not self.points or self.points[-1][0] != step:
            self.points.append((step, round(self.seconds(steps=step), 6), float(value)))
            self.stopped = self.rule.verdict(self.points)
            if self.stopped is not None:
                trainer.should_stop = True
        if trainer.state.fn == "fit" and self.stopped is None:
            self._resume()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._pause(trainer)
