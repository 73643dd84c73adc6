"""The curves a recipe search reads: each configuration on each seed, its fits short to long, and its score.

A :class:`CurveBook` asks the :class:`~composer_bridge.search.fit_scheduler.FitScheduler` for one fit at a
time, in the order a curve reads them, and stops a curve once its score is settled
(:class:`~composer_bridge.search.scoring.CurveGoal`); the baseline's curves fix each phase's target
(:func:`fixed_target`), and every other curve is scored against it. The greedy search
(:mod:`composer_bridge.search.greedy`) decides from these scores; it never reads a fit itself.

Examples:
    >>> from composer_bridge.search.candidates import Candidate
    >>> from composer_bridge.search.executor import InProcessExecutor
    >>> from composer_bridge.search.fit_scheduler import FitScheduler
    >>> from composer_bridge.search.settings import SearchSettings
    >>> from composer_bridge.search.state import SearchState
    >>> settings = SearchSettings(make_module=None, make_data=None, monitor="q", higher=True,
    ...                           candidates=(Candidate("MixUp"),), search_pool=("MixUp",), run_lengths=(1, 2),
    ...                           search_seeds=(0,), confirm_seeds=(10,), clock="steps", max_fits=4)
    >>> book = CurveBook(settings, FitScheduler(settings, SearchState(None, {}), InProcessExecutor()))
    >>> book.curves
    {}
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from composer_bridge.search.fit_scheduler import FitScheduler
from composer_bridge.search.results import Config, CurveResult
from composer_bridge.search.scoring import (
    CurveGoal,
    QualityWithin,
    SpeedUp,
    best_quality,
    best_quality_within,
    quality_at,
    summarise_speedups,
    time_to_reach,
)
from composer_bridge.search.settings import SearchSettings
from composer_bridge.search.trial import FitRecord

__all__ = ["CurveBook", "Scores", "fixed_target", "median_time"]

Scores = dict[int, float | None]  # a configuration's strict speed-up per seed (None: never reached Q)


def fixed_target(curves: Sequence[Sequence[tuple[float, float]]], higher: bool) -> tuple[float, float]:
    """``(Q, T)`` from the baseline's curves on the seeds of a phase.

    ``Q`` is the median of the baseline's best qualities (the worse of the two middle ones for an even
    number of seeds, so that more than half of the seeds reach it: with two seeds, the worse one); ``T`` is
    the median over the seeds of the baseline's time to ``Q``, a seed that never reaches it counting as
    infinitely slow. A lucky or unlucky seed moves neither.

    Examples:
        >>> q, t = fixed_target([[(1, 0.5), (2, 0.8)], [(1, 0.6), (2, 0.7)]], higher=True)  # the worse of two bests
        >>> q, round(t, 3)  # the mean of 1.667 (interpolated on the first curve) and 2
        (0.7, 1.833)
        >>> fixed_target([[(1, 0.5), (2, 0.8)], [(1, 0.6), (2, 0.7)], [(1, 0.2), (2, 0.3)]], higher=True)
        (0.7, 2.0)
    """
    bests = sorted((best_quality(points, higher) for points in curves), reverse=higher)
    q = bests[len(bests) // 2]
    return q, median_time([time_to_reach(points, q, higher) for points in curves])


def median_time(times: Sequence[float | None]) -> float:
    """The median of times, ``None`` (never reached) counting as infinitely slow; infinity for no time at all.

    The workloads benchmark scores a configuration on a workload with it too.

    Examples:
        >>> median_time([3.0, None, 1.0]), median_time([2.0, 4.0]), median_time([2.0, None]), median_time([])
        (3.0, 3.0, inf, inf)
    """
    ordered = sorted(math.inf if t is None else t for t in times)
    if not ordered:
        return math.inf
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _measured(records: Sequence[FitRecord]) -> list[tuple[float, float]]:
    """The ``(seconds, quality)`` points of the runs read for one curve that measured something."""
    return [(r.seconds, r.quality) for r in records if not r.error]


class CurveBook:
    """Every curve of one search, by ``(configuration, seed)``, read from ``fits`` and scored against the target."""

    def __init__(self, settings: SearchSettings, fits: FitScheduler) -> None:
        self.settings, self.fits = settings, fits
        self.curves: dict[tuple[Config, int], CurveResult] = {}
        self._read: dict[tuple[Config, int], list] = {}  # each curve's fits read so far, by run length
        self._targets: dict[str, tuple[float, float]] = {}
        self._look_points: dict[int, dict[int, tuple[float, float]]] = {}  # the baseline's first-look runs, by seed

    def baseline(self, seed: int, phase: str) -> CurveResult:
        """The baseline's curve on ``seed``: every run length (step 1)."""
        key = ((), seed)
        if key not in self.curves:
            self.prefetch([key], phase)
            points = []
            for steps in self.settings.lengths(phase):
                record = self.fits.fit((), seed, steps, phase)
                if not record.error:
                    points.append((record.seconds, record.quality))
            if not points:
                reasons = "; ".join(f.error or "" for f in self.fits.state.fits if not f.config and f.seed == seed)
                raise RuntimeError(f"every baseline fit on seed {seed} failed, so nothing can be compared on it: "
                                   f"{reasons}")
            self.curves[key] = CurveResult((), seed, phase, points, "baseline", 1.0)
        return self.curves[key]

    def target(self, phase: str) -> tuple[float, float]:
        """``(Q, T)`` of a phase, fixed once its baselines are in: every configuration on every seed of the phase
        aims at this ``Q``; its speed-up on a seed is ``T`` over its own time to ``Q``.

        ``Q`` is set once, by the baseline on the search seeds (:func:`fixed_target`), and the confirmation aims at
        the same ``Q`` (with a proxy, whose runs differ from the full-size ones, the confirmation sets its own from
        its baselines); ``T`` is the median over the phase's seeds of the baseline's time to ``Q``."""
        if phase not in self._targets:
            higher = self.settings.higher
            curves = [self.baseline(seed, phase).points for seed in self.settings.seeds(phase)]
            if phase == "search" or self.settings.proxy is not None:
                self._targets[phase] = fixed_target(curves, higher)
            else:
                q = self.target("search")[0]
                t_base = median_time([time_to_reach(points, q, higher) for points in curves])
                if math.isinf(t_base):  # the baseline misses the search's target on most unseen seeds: at best it
                    t_base = statistics.median(max(t for t, _ in points) for points in curves)  # got there at the end
                self._targets[phase] = (q, t_base)
        return self._targets[phase]

    def goal(self, seed: int, phase: str, beat: float = 1.0) -> CurveGoal:
        """What a curve on ``seed`` races: the phase's fixed ``Q`` and the baseline's mean time to it, and the
        speed-up it must beat (the early stops in the search only)."""
        q, t_base = self.target(phase)
        # only the confirmation reads the baseline's training time on the curve's own seed (a finalist seed has none)
        t_total = max(t for t, _ in self.baseline(seed, phase).points) if phase == "confirm" else t_base
        return CurveGoal(q, t_base, t_total, self.settings.higher, search=phase == "search", beat=beat)

    def speedup(self, points: list[tuple[float, float]], phase: str) -> float | None:
        """The strict speed-up of a curve with these points: ``T`` over its time to the phase's ``Q``."""
        q, t_base = self.target(phase)
        reached = time_to_reach(points, q, self.settings.higher) if points else None
        return round(t_base / reached, 6) if reached else None

    def curve(self, config: Config, seed: int, phase: str, beat: float = 1.0) -> CurveResult:
        """``config``'s curve on ``seed``, run lengths short to long until it is settled against ``beat``
        (steps 2 and 4; :meth:`~composer_bridge.search.scoring.CurveGoal.settled` says when).

        A curve stopped because it could not beat a faster recipe goes on from where it stopped when
        it is asked for again against a lower one (its fits are read once)."""
        if not config:
            return self.baseline(seed, phase)
        key = (config, seed)
        cached = self.curves.get(key)
        if cached is not None and (cached.stopped_below is None or beat >= cached.stopped_below):
            return cached
        goal = self.goal(seed, phase, beat)
        read = self._read.setdefault(key, [])
        points = _measured(read)
        settled = goal.settled(points) if points else None
        raised = bool(read) and read[-1].raised
        for steps in self.settings.lengths(phase)[len(read):]:
            if settled is not None or raised:
                break
            record = self.fits.fit(config, seed, steps, phase)
            read.append(record)
            if record.raised:  # the candidates raised: every length would
                break
            if record.error:  # a fit that failed twice is no point of the curve; the next length may still be
                continue
            points.append((record.seconds, record.quality))
            settled = goal.settled(points)
        status = settled or "never reached Q"
        if points and time_to_reach(points, goal.q, self.settings.higher) is not None:
            status = "reached Q"  # a confirmation curve goes on past Q, within the baseline's training time
        elif read and read[-1].raised:
            status = f"failed: {read[-1].error}"
        speed = self.speedup(points, phase) if status == "reached Q" else None
        below = beat if status.startswith("stopped: cannot beat") else None
        self.curves[key] = CurveResult(config, seed, phase, points, status, speed, stopped_below=below)
        return self.curves[key]

    def run_at(self, config: Config, seed: int, phase: str, index: int = 0) -> FitRecord:
        """``config``'s run at the ``index``-th run length on ``seed``, the shorter ones read first (a step's
        screening reads them); its curve goes on from there. A run that raised ends the curve: it is returned for
        every longer length."""
        read = self._read.setdefault((config, seed), [])
        lengths = self.settings.lengths(phase)
        while len(read) <= index and not (read and read[-1].raised):
            read.append(self.fits.fit(config, seed, lengths[len(read)], phase))
        return read[min(index, len(read) - 1)]

    def look_run(self, config: Config, seed: int, steps: int) -> FitRecord:
        """``config``'s run of ``steps`` steps on ``seed`` for the search's first look, shorter than any run length:
        no point of its curve (the baseline's is the reference :meth:`at_equal_time` reads at that time)."""
        record = self.fits.fit(config, seed, steps, "search")
        if not config and not record.error:
            self._look_points.setdefault(seed, {})[steps] = (record.seconds, record.quality)
        return record

    def reached(self, config: Config, seed: int, phase: str) -> bool:
        """Whether the runs of ``config`` on ``seed`` read so far already reach the phase's ``Q`` (its curve needs
        no longer run)."""
        points = _measured(self._read.get((config, seed), []))
        return bool(points) and time_to_reach(points, self.target(phase)[0], self.settings.higher) is not None

    def at_equal_time(self, record: FitRecord, seed: int, phase: str) -> float:
        """How much better a run's quality is than the baseline's on ``seed`` after the same training time (the
        baseline's curve read between its runs, flat before the first and after the last; higher is better)."""
        points = sorted([*self.baseline(seed, phase).points, *self._look_points.get(seed, {}).values()])
        reference = quality_at(points, record.seconds)
        return (record.quality - reference) * (1.0 if self.settings.higher else -1.0)

    def scores(self, config: Config, seeds: Sequence[int]) -> Scores:
        return {seed: self.curve(config, seed, "search").speedup for seed in seeds}

    def prefetch(self, wanted: Sequence[tuple[Config, int]], phase: str,
                  beat: Callable[[Config, int], float] | None = None) -> None:
        """Tell the scheduler which curves come next, in this order (it may train them side by side);
        ``beat(config, seed)``: what each must beat, as far as known now (never above what :meth:`curve` will ask)."""
        settled = [w for w in wanted if w in self.curves and self.curves[w].stopped_below is None]
        self.fits.prefetch([w for w in wanted if w not in settled], phase,
                           lambda config, seed: self.goal(seed, phase, beat(config, seed) if beat else 1.0))

    def known_speedup(self, config: Config, seed: int) -> float | None:
        """``config``'s speed-up on ``seed`` from the fits trained so far, if they already reach ``Q``."""
        points = []
        for steps in self.settings.lengths("search"):
            record = self.fits.cache.get((config, seed, steps))
            if record is None:
                return None
            if not record.error:
                points.append((record.seconds, record.quality))
                speed = self.speedup(points, "search")
                if speed is not None:
                    return speed
        return None

    def runner_up(self) -> Config | None:
        """The configuration with the best mean over every search seed (``None``: none was scored on all)."""
        seeds = self.settings.search_seeds
        scored = {}
        for (config, _seed), _curve in self.curves.items():
            if config and all((config, s) in self.curves and self.curves[(config, s)].phase == "search" for s in seeds):
                scored[config] = statistics.fmean(self.curves[(config, s)].speedup or 0.0 for s in seeds)
        return max(scored, key=lambda c: (scored[c], -len(c))) if scored else None

    def prefetch_confirmation(self, configs: Sequence[Config], baselines: bool) -> None:
        """The confirmation's fits side by side: the baselines first (they set ``Q``), then every recipe.

        ``baselines``: whether the confirmation trains its baselines even with no recipe to confirm.
        """
        if not any(configs) and not baselines:
            return  # nothing to confirm: the baselines on the confirmation seeds are not trained either
        seeds = self.settings.confirm_seeds
        self.prefetch([((), seed) for seed in seeds], "confirm")
        self.prefetch([(c, seed) for c in configs if c for seed in seeds], "confirm")

    def confirm(self, config: Config) -> SpeedUp:
        """``config``'s strict speed-up on the confirmation seeds, every curve to the longest run length."""
        return summarise_speedups({seed: self.curve(config, seed, "confirm").speedup
                                   for seed in self.settings.confirm_seeds})

    def quality_within_baseline_time(self, config: Config) -> QualityWithin:
        """The best quality ``config`` reached within the baseline's training time, on each confirmation seed.

        The second answer beside the strict speed-up, for a user whose goal is quality, not time: on
        each seed, the best of ``config``'s runs that took no longer than the baseline's longest run.
        """
        seeds = self.settings.confirm_seeds
        within = []
        for seed in seeds:
            t_total = max(t for t, _ in self.baseline(seed, "confirm").points)
            within.append(best_quality_within(self.curve(config, seed, "confirm").points, t_total,
                                              self.settings.higher))
        return QualityWithin(tuple(within), tuple(seeds))
