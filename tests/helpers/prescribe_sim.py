"""Simulated runs for the prescription search's tests: curves from a model, no training.

Each configuration has a *speed* (progress per step), a *per-step cost* (seconds per step), a *late gain* (a
method that pays only late: below the baseline early, above it near its schedule's end) and a *plateau*; a run of
``steps`` steps follows its schedule (progress slows as the learning rate decays: a shorter schedule gets further
early), and every seed carries a *luck* shared by all configurations (a seed that is hard for one is hard for
all), plus each run's own noise and the validation's. The executor honours a fit's
:class:`~composer_bridge.search.curve_rule.CurveRule`, so a stopped run is the prefix of the full one.

Examples:
    >>> model = Model({"A": Truth(speed=1.5)})
    >>> full = model.points(("A",), seed=0, steps=40, eval_every=10)
    >>> [p[0] for p in full]
    [10, 20, 30, 40]
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from composer_bridge.search.candidates import Candidate
from composer_bridge.search.executor import FitOutcome


@dataclass(frozen=True)
class Truth:
    """What a configuration does to the run (the baseline: every default)."""

    speed: float = 1.0  #: progress per step, relative to the baseline
    cost: float = 1.0  #: seconds per step, relative to the baseline
    late: float = 0.0  #: quality lost early and gained back (and more) in the schedule's last fifth
    lag: float = 0.0  #: quality lost at the start, gone by a third of the run (an average lagging the weights)
    plateau: float = 0.0  #: added to the plateau quality


@dataclass
class Model:
    """The simulated task: each configuration's truth (labels joined by ``"+"``; unknown labels are neutral)."""

    truths: dict[str, Truth]
    luck_sd: float = 0.05  #: the seed's shared luck (log-speed), the same for every configuration
    run_sd: float = 0.03  #: each run's own log-speed noise
    validation_sd: float = 0.003  #: each validation's noise
    base_seconds: float = 0.1  #: the baseline's seconds per step
    horizon: float = 60.0  #: progress units to the plateau

    def truth(self, config: tuple[str, ...]) -> Truth:
        parts = [self.truths.get(label, Truth()) for label in config]
        speed = math.prod(p.speed for p in parts)
        return Truth(speed=speed, cost=math.prod(p.cost for p in parts), late=sum(p.late for p in parts),
                     lag=sum(p.lag for p in parts), plateau=sum(p.plateau for p in parts))

    def points(self, config: tuple[str, ...], seed: int, steps: int, eval_every: int) -> list[tuple[int, float, float]]:
        t = self.truth(config)
        luck = random.Random(f"luck {seed}").gauss(0, self.luck_sd)
        own = random.Random(f"run {config} {seed} {steps}").gauss(0, self.run_sd)
        validation = random.Random(f"val {config} {seed} {steps}")
        rate = t.speed * math.exp(luck + own)
        out = []
        for step in [*range(eval_every, steps, eval_every), steps]:
            fraction = step / steps
            # progress under a decaying schedule: fast early, and the decay itself adds a final push
            progress = rate * steps * (fraction - 0.5 * fraction ** 2 + 0.6 * fraction ** 4)
            quality = (0.9 + t.plateau) * (1 - math.exp(-progress / self.horizon))
            quality += t.late * (-(1 - fraction) + 2.5 * max(0.0, fraction - 0.8))
            quality -= t.lag * math.exp(-fraction / 0.15)
            quality += validation.gauss(0, self.validation_sd)
            out.append((step, round(step * self.base_seconds * t.cost, 6), quality))
        return out


@dataclass
class SimExecutor:
    """Runs fits from the model, in order, stopping each by its rule; records what it trained."""

    model: Model
    concurrent: bool = False
    speculate: bool = False
    trained: list[tuple[tuple[str, ...], int, int, float]] = field(default_factory=list)
    _queue: list = field(default_factory=list)

    def slots(self) -> int:
        return 1

    def start(self, sample) -> None:
        pass

    def submit(self, task) -> int:
        self._queue.append(task)
        return len(self.trained) + len(self._queue)

    def next_done(self) -> tuple[int, FitOutcome]:
        task = self._queue.pop(0)
        config = tuple(c.label for c in task.candidates)
        full = self.model.points(config, task.seed, task.steps, task.curve.eval_every)
        kept, stopped = [], None
        for point in full:
            kept.append(point)
            stopped = task.curve.verdict(kept)
            if stopped is not None:
                break
        if stopped is None and len(kept) < len(full):
            stopped = "?"
        seconds = kept[-1][1]
        self.trained.append((config, task.seed, task.steps, seconds))
        ticket = len(self.trained) + len(self._queue)
        return ticket, FitOutcome(kept[-1][2], seconds, seconds, seconds, seconds, points=[list(p) for p in kept],
                                  stopped=stopped)

    def pending(self) -> int:
        return len(self._queue)

    def close(self) -> None:
        self._queue.clear()


def candidates(labels, averaging=()) -> tuple[Candidate, ...]:
    """Candidates with these labels: GradientClipping under other names, or EMA for those in ``averaging`` (a
    method that declares its gain shows late); the model decides what they do."""
    return tuple(Candidate("EMA", {"half_life": "100ba"}, name=label) if label in averaging else
                 Candidate("GradientClipping", {"clipping_type": "norm", "clipping_threshold": 1.0}, name=label)
                 for label in labels)
