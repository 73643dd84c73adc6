"""What the search hands over: a run you can start, its length, the target it reaches and the speed-up to expect.

A :class:`Prescription` is the algorithms with their arguments **and** the run length to train them for (the
module factory's ``total_steps`` and the Trainer's ``max_steps``): the speed-up the search measured is the time
to the target inside a run of exactly that length, so the user trains what was measured. When the gain is the
shorter schedule itself, the prescription is the baseline (no algorithm) at fewer steps, and says so.

Examples:
    >>> from composer_bridge.search.candidates import Candidate
    >>> p = Prescription(algorithms=(Candidate("LabelSmoothing", {"smoothing": 0.1}),), steps=150, baseline_steps=200,
    ...                  target=0.9, monitor="val/acc", mode="max", speedup=1.4, low=1.1, high=1.7)
    >>> p.text()
    'train 150 steps (max_steps=150, the schedule 150 steps long) with LabelSmoothing: val/acc 0.9 expected 1.40x sooner than the baseline at 200 steps (90 % interval 1.10x to 1.70x)'
    >>> print(p.python_code().splitlines()[-1])
    trainer = lightning.Trainer(max_steps=150, callbacks=[callback])  # and your module built for total_steps=150
    >>> len(p.callback().algorithms)
    1
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from composer_bridge.search.candidates import Candidate

__all__ = ["Prescription", "run_code", "run_yaml"]


def _kwargs_text(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def run_code(algorithms: Sequence[Candidate], steps: int, note: str) -> str:
    """Python code for a run of ``steps`` optimizer steps with ``algorithms`` (arguments scaled to it)."""
    classes = sorted({c.algorithm for c in algorithms})
    lines = ["import lightning", "from composer_bridge import AlgorithmEngineCallback"]
    if classes:
        lines.append(f"from composer_bridge.algorithms import {', '.join(classes)}")
    lines += ["", f"# {note}", f"total_steps = {steps}  # build your module's schedule for this many steps",
              "algorithms = ["]
    lines += [f"    {c.algorithm}({_kwargs_text(c.scaled_kwargs(steps))})," for c in algorithms]
    lines += ["]", "callback = AlgorithmEngineCallback(algorithms)",
              f"trainer = lightning.Trainer(max_steps={steps}, callbacks=[callback])  "
              f"# and your module built for total_steps={steps}"]
    return "\n".join(lines)


def run_yaml(algorithms: Sequence[Candidate], steps: int, note: str) -> str:
    """A LightningCLI fragment (``trainer.max_steps`` and ``trainer.callbacks``) for that run."""
    lines = [f"# {note}", f"# Build your model's schedule for {steps} steps (total_steps: {steps}).",
             "trainer:", f"  max_steps: {steps}", "  callbacks:",
             "    - class_path: composer_bridge.AlgorithmEngineCallback", "      init_args:"]
    if not algorithms:
        lines.append("        algorithms: []")
    else:
        lines.append("        algorithms:")
        for c in algorithms:
            lines.append(f"          - class_path: composer_bridge.algorithms.{c.algorithm}")
            kwargs = c.scaled_kwargs(steps)
            if kwargs:
                lines.append(f"            init_args: {json.dumps(kwargs)}")
    return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class Prescription:
    """A run to start: ``algorithms`` trained for ``steps`` optimizer steps, and what to expect of it.

    Attributes:
        algorithms: the candidates, arguments as published (those counted in steps are scaled to ``steps``).
        steps: the run length to train: the module factory's ``total_steps`` and the Trainer's ``max_steps``.
        baseline_steps: the length of the baseline run it was measured against (the user's run).
        target: the quality it reaches (``monitor``, in ``mode``'s direction).
        speedup: the expected speed-up in time to ``target`` over the baseline run, on unseen seeds.
        low, high: that speed-up's interval (``confidence``); ``None`` when nothing was measured twice.
        confidence: the interval's coverage.
        measured: what the expectation rests on, in words (which seeds, which runs).
    """

    algorithms: tuple[Candidate, ...]
    steps: int
    baseline_steps: int
    target: float
    monitor: str
    mode: str
    speedup: float = 1.0
    low: float | None = None
    high: float | None = None
    confidence: float = 0.9
    measured: str = ""

    @property
    def is_baseline(self) -> bool:
        """No algorithm: the baseline, at ``steps`` (the gain, if any, is the shorter schedule itself)."""
        return not self.algorithms

    @property
    def names(self) -> str:
        return " + ".join(c.label for c in self.algorithms) or "no algorithm (the baseline)"

    def built(self) -> list[Any]:
        """Fresh algorithm instances for a run of ``steps`` steps."""
        return [c.build(self.steps) for c in self.algorithms]

    def callback(self, **kwargs: Any) -> Any:
        """The :class:`~composer_bridge.AlgorithmEngineCallback` for this run (``kwargs``: its other arguments).

        Train it with ``Trainer(max_steps=prescription.steps, callbacks=[callback])`` and a module whose
        schedule is ``prescription.steps`` long."""
        from composer_bridge import AlgorithmEngineCallback

        return AlgorithmEngineCallback(self.built(), **kwargs)

    def interval_text(self) -> str:
        if self.low is None or self.high is None:
            return "no interval: measured on one seed only"
        return f"{100 * self.confidence:g} % interval {self.low:.2f}x to {self.high:.2f}x"

    def text(self) -> str:
        """One sentence: what to train, and what to expect."""
        what = "the baseline, no algorithm" if self.is_baseline else self.names
        shorter = (" (the gain is the shorter schedule itself)" if self.is_baseline and self.steps < self.baseline_steps
                   else "")
        return (f"train {self.steps} steps (max_steps={self.steps}, the schedule {self.steps} steps long) with {what}"
                f"{shorter}: {self.monitor} {self.target:.4g} expected {self.speedup:.2f}x sooner than the baseline at "
                f"{self.baseline_steps} steps ({self.interval_text()})")

    def python_code(self) -> str:
        """The run as Python code: the callback, ``max_steps`` and the schedule's length."""
        return run_code(self.algorithms, self.steps, f"Found by composer_bridge.search: {self.text()}.")

    def yaml_fragment(self) -> str:
        """The run as a LightningCLI fragment: ``trainer.max_steps`` and ``trainer.callbacks``."""
        return run_yaml(self.algorithms, self.steps, f"Found by composer_bridge.search: {self.text()}.")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record (the algorithms as ``[class name, kwargs, label]``)."""
        return {"algorithms": [[c.algorithm, dict(c.kwargs), c.label] for c in self.algorithms], "steps": self.steps,
                "baseline_steps": self.baseline_steps, "target": self.target, "monitor": self.monitor,
                "mode": self.mode, "speedup": self.speedup, "low": self.low, "high": self.high,
                "confidence": self.confidence, "measured": self.measured}
