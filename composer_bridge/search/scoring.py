"""The strict time-to-quality speed-up: how much sooner a configuration reaches the baseline's best quality.

A *curve* is a list of ``(training seconds, quality)`` points ordered by time, one per run length
(each run trained from scratch with its whole schedule scaled to its length). On one seed, the
baseline's best quality over its run lengths is ``Q``; the strict speed-up of a configuration is
the baseline's own time to ``Q`` divided by the configuration's time to ``Q``, both read off
their curves with linear interpolation between run lengths and no extrapolation. A configuration
that never reaches ``Q`` has no speed-up (``None``): a failure, counted as 0x in a mean.

``benchmarks/pareto.py`` and the recipe search (:mod:`composer_bridge.search`) both use these.

Examples:
    >>> strict_speedup([(1, 0.8), (2, 0.9), (4, 0.95)], [(0.5, 0.85), (1, 0.93), (2, 0.97)], True)
    (2.666667, 0.95, 4.0, 1.5)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CurveGoal", "QualityWithin", "SpeedUp", "best_quality", "best_quality_within", "quality_at", "strict_speedup", "summarise_speedups", "time_to_reach"]

Curve = Sequence[tuple[float, float]]


def time_to_reach(curve: Curve, target: float, higher_is_better: bool) -> float | None:
    """The first time the piecewise-linear curve through ``curve`` (time-ordered) reaches ``target``.

    Starts at the first point (no extrapolation before it or after the last one); ``None`` if the
    curve never gets there.

    Examples:
        >>> round(time_to_reach([(1.0, 0.5), (3.0, 0.9)], 0.7, higher_is_better=True), 6)
        2.0
        >>> time_to_reach([(1.0, 0.5), (3.0, 0.9)], 0.95, higher_is_better=True) is None
        True
    """
    sign = 1.0 if higher_is_better else -1.0
    goal = sign * target
    previous: tuple[float, float] | None = None
    for t, q in curve:
        if sign * q >= goal - 1e-12:
            if previous is None or sign * previous[1] >= goal:
                return t
            t0, q0 = previous[0], sign * previous[1]
            return t0 + (t - t0) * (goal - q0) / (sign * q - q0)
        previous = (t, q)
    return None


def quality_at(curve: Curve, seconds: float) -> float:
    """The quality of the piecewise-linear curve through ``curve`` after ``seconds`` of training.

    The points are read in time order; before the first and after the last the curve is flat (no
    extrapolation), as in :func:`time_to_reach`.

    Examples:
        >>> quality_at([(3.0, 0.9), (1.0, 0.5)], 2.0), quality_at([(1.0, 0.5), (3.0, 0.9)], 0.5)
        (0.7, 0.5)
        >>> quality_at([(1.0, 0.5), (3.0, 0.9)], 9.0)
        0.9
    """
    points = sorted(curve)
    if not points:
        raise ValueError("quality_at: the curve has no points.")
    if seconds <= points[0][0]:
        return points[0][1]
    for (t0, q0), (t1, q1) in zip(points, points[1:], strict=False):
        if seconds <= t1:
            return q0 + (q1 - q0) * (seconds - t0) / (t1 - t0) if t1 > t0 else q1
    return points[-1][1]


def best_quality(curve: Curve, higher_is_better: bool) -> float:
    """The best quality on ``curve`` (``max`` or ``min``).

    Examples:
        >>> best_quality([(1, 0.8), (2, 0.9)], True), best_quality([(1, 3.0), (2, 2.5)], False)
        (0.9, 2.5)
    """
    if not curve:
        raise ValueError("best_quality: the curve has no points.")
    qualities = [q for _, q in curve]
    return max(qualities) if higher_is_better else min(qualities)


def strict_speedup(base: Curve, recipe: Curve,
                   higher_is_better: bool) -> tuple[float | None, float, float, float | None]:
    """``(speed-up or None, Q, baseline's time to Q, recipe's time to Q)`` for one pair of curves.

    Examples:
        >>> strict_speedup([(1, 0.8), (2, 0.9), (4, 0.95)], [(0.5, 0.85), (1, 0.93), (2, 0.97)], True)
        (2.666667, 0.95, 4.0, 1.5)
    """
    best = best_quality(base, higher_is_better)
    t_base = time_to_reach(base, best, higher_is_better)
    assert t_base is not None
    t_recipe = time_to_reach(recipe, best, higher_is_better)
    speed = t_base / t_recipe if t_recipe else None
    return (None if speed is None else round(speed, 6), best, t_base,
            None if t_recipe is None else round(t_recipe, 6))


@dataclass(frozen=True)
class SpeedUp:
    """Strict speed-ups over seeds: per seed (``None`` = never reached Q), mean (failures as 0x) and spread."""

    per_seed: tuple[float | None, ...]
    seeds: tuple[int, ...]

    @property
    def mean(self) -> float:
        return statistics.mean(s or 0.0 for s in self.per_seed) if self.per_seed else 0.0

    @property
    def sd(self) -> float:
        values = [s or 0.0 for s in self.per_seed]
        return statistics.stdev(values) if len(values) > 1 else 0.0

    @property
    def reached(self) -> int:
        return sum(s is not None for s in self.per_seed)

    def text(self) -> str:
        """``"1.23x ± 0.10 (1.10x, 1.30x, 1.29x; 3/3 seeds reach Q)"``."""
        seeds = ", ".join("fail" if s is None else f"{s:.2f}x" for s in self.per_seed)
        return (f"{self.mean:.2f}x ± {self.sd:.2f} ({seeds}; {self.reached}/{len(self.per_seed)} seeds reach Q)")


def summarise_speedups(per_seed: dict[int, float | None]) -> SpeedUp:
    """A :class:`SpeedUp` from ``{seed: speed-up or None}``, seeds in ascending order.

    Examples:
        >>> s = summarise_speedups({1: 1.5, 0: None})
        >>> s.per_seed, s.mean, s.reached
        ((None, 1.5), 0.75, 1)
    """
    seeds = tuple(sorted(per_seed))
    return SpeedUp(tuple(per_seed[s] for s in seeds), seeds)


def best_quality_within(curve: Curve, seconds: float, higher_is_better: bool) -> float | None:
    """The best quality among the points of ``curve`` trained within ``seconds`` (``None``: none was).

    Only measured points count: each is a whole run of its length, and nothing is interpolated.

    Examples:
        >>> best_quality_within([(1.0, 0.6), (2.0, 0.8), (4.5, 0.9)], 4.0, True)
        0.8
        >>> best_quality_within([(5.0, 0.9)], 4.0, True) is None
        True
    """
    within = [(t, q) for t, q in curve if t <= seconds * (1 + 1e-9)]
    return best_quality(within, higher_is_better) if within else None


@dataclass(frozen=True)
class QualityWithin:
    """The best quality a configuration reached within the baseline's training time, per seed.

    On each seed, the baseline's training time is its longest run's; ``None`` on a seed where no run
    of the configuration fitted in it. ``mean`` is ``None`` unless every seed has a value.
    """

    per_seed: tuple[float | None, ...]
    seeds: tuple[int, ...]

    @property
    def mean(self) -> float | None:
        if not self.per_seed or any(q is None for q in self.per_seed):
            return None
        return statistics.mean(q for q in self.per_seed if q is not None)

    def text(self) -> str:
        """``"0.912 (0.905, 0.920)"``: the mean, then each seed (``"none"``: no run fitted in the time)."""
        seeds = ", ".join("none" if q is None else f"{q:.4g}" for q in self.per_seed)
        return f"{'—' if self.mean is None else f'{self.mean:.4g}'} ({seeds})"


@dataclass(frozen=True)
class CurveGoal:
    """What a configuration's curve on one seed is raced against, and when it needs no longer run.

    ``q`` is the target (the phase's, fixed from the baseline's curves), ``t_base`` the baseline's time
    to it and ``t_total`` the baseline's training time on the curve's seed (its longest run). In the
    search (``search=True``) a curve stops once it reaches ``q`` (longer runs cannot change its
    speed-up) or passes ``t_base`` without reaching it (it cannot beat the baseline on that seed).
    ``beat`` above 1 is the speed-up the curve must beat to matter (the recipe it races, on that seed):
    a curve whose run of ``t`` seconds has not reached ``q`` can end no faster than ``t_base / t`` (its
    time to ``q`` lies after ``t``), so it stops once ``t >= t_base / beat``. On the confirmation seeds
    it goes on until it has reached ``q`` *and* passed ``t_total``, so that both answers are measured:
    the strict speed-up and the best quality within the baseline's training time.

    Examples:
        >>> goal = CurveGoal(q=0.7, t_base=2.0, t_total=2.0, higher=True, search=True)
        >>> goal.settled([(1.5, 0.6)]), goal.settled([(0.8, 0.6), (1.6, 0.75)])
        (None, 'reached Q')
        >>> goal.settled([(2.5, 0.6)])
        "stopped: past the baseline's time to Q"
        >>> racing = CurveGoal(q=0.7, t_base=2.0, t_total=2.0, higher=True, search=True, beat=2.5)
        >>> racing.settled([(0.5, 0.6)]), racing.settled([(0.5, 0.6), (0.8, 0.65)])
        (None, 'stopped: cannot beat 2.50x')
        >>> confirm = CurveGoal(q=0.7, t_base=2.0, t_total=2.0, higher=True, search=False)
        >>> confirm.settled([(0.8, 0.6), (1.6, 0.75)]), confirm.settled([(0.8, 0.6), (1.6, 0.75), (3.2, 0.8)])
        (None, 'reached Q')
    """

    q: float
    t_base: float
    t_total: float
    higher: bool
    search: bool
    beat: float = 1.0

    def settled(self, points: Curve) -> str | None:
        """Why a curve with these points needs no longer run (``None``: it goes on to the next run length)."""
        reached = bool(points) and time_to_reach(points, self.q, self.higher) is not None
        if self.search:
            if reached:
                return "reached Q"
            if points and self.beat > 1.0 and points[-1][0] >= self.t_base / self.beat:
                return f"stopped: cannot beat {self.beat:.2f}x"
            if points and points[-1][0] >= self.t_base:
                return "stopped: past the baseline's time to Q"
            return None
        return "reached Q" if reached and points[-1][0] >= self.t_total else None
