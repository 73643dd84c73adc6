"""The greedy recipe search: which candidates make *this* model reach its baseline's quality sooner.

Method (docs/search.md has the reasoning):

1. **Baseline curves.** On every search seed, the baseline (no algorithm) is trained once per run
   length; its quality-vs-time points are the curve every candidate is measured against. ``Q`` is
   the baseline's best quality on that seed.
2. **Score.** A configuration's score on a seed is its strict speed-up
   (:func:`composer_bridge.search.scoring.strict_speedup`): the baseline's time to ``Q`` over the
   configuration's time to ``Q``; never reaching ``Q`` is a failure, 0x in the mean over seeds.
3. **Greedy forward selection with removal, from the best start.** The first step races every
   starting recipe (published or the user's, whole, on every search seed) beside the single
   candidates; the best starting recipe becomes the current recipe if it beats the baseline and no
   single candidate scores higher, so the search never settles below it. Each step tries adding
   every remaining candidate (of an algorithm not yet in the recipe) to the current recipe and keeps
   the best addition if its mean score beats the current recipe's by more than ``min_gain``; then
   it drops any earlier algorithm whose removal scores at least as well. It ends when no addition
   helps or the budget is spent.
4. **Stopping hopeless trials early.** Within a step, the additions race over the search seeds by
   successive halving: after each seed only the better half of those still ahead of the current
   recipe go on. Along a curve, run lengths go from short to long and stop once the curve reaches
   ``Q`` (longer runs cannot change its score), or once its training time passes the baseline's
   time to ``Q`` without reaching it (it cannot beat the baseline on that seed: a failure).
5. **Confirmation.** The chosen recipe (and any ``also_confirm`` recipes) and the baseline are
   trained on the confirmation seeds, which the search never saw; only those numbers are the result.

Where and when fits train (the cache, the budget, fits side by side) is the
:class:`~composer_bridge.search.fit_scheduler.FitScheduler`'s job; this module only asks it for
fits in the order the method reads them, and announces the curves it is about to read
(``_prefetch``) so that a concurrent executor can train them side by side.

Example:
    >>> from composer_bridge.search.candidates import Candidate
    >>> from composer_bridge.search.executor import InProcessExecutor
    >>> from composer_bridge.search.fit_scheduler import FitScheduler
    >>> from composer_bridge.search.settings import SearchSettings
    >>> from composer_bridge.search.state import SearchState
    >>> settings = SearchSettings(make_module=None, make_data=None, monitor="q", higher=True,
    ...                           candidates=(Candidate("MixUp"),), search_pool=("MixUp",), run_lengths=(1, 2),
    ...                           search_seeds=(0,), confirm_seeds=(10,), clock="steps", max_fits=4)
    >>> search = GreedySearch(settings, FitScheduler(settings, SearchState(None, {}), InProcessExecutor()))
    >>> search.incumbent
    ()
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from composer_bridge.search.fit_scheduler import FitScheduler
from composer_bridge.search.results import Config, CurveResult, config_name
from composer_bridge.search.scoring import (
    CurveGoal,
    QualityWithin,
    SpeedUp,
    best_quality_within,
    strict_speedup,
    summarise_speedups,
    time_to_reach,
)
from composer_bridge.search.settings import SearchSettings

__all__ = ["GreedySearch", "mean_score"]

Scores = dict[int, float | None]  # a configuration's strict speed-up per seed (None: never reached Q)


def mean_score(scores: Mapping[int, float | None], seeds: Sequence[int]) -> float:
    """The mean speed-up over ``seeds``, failures as 0x.

    Example:
        >>> mean_score({0: 1.5, 1: None}, [0, 1])
        0.75
    """
    return statistics.mean((scores[s] or 0.0) for s in seeds)


class GreedySearch:
    """Steps 1-5 of the method above, on fits from ``fits``.

    ``incumbent`` and ``incumbent_scores`` hold the recipe accepted so far (kept when the budget
    stops the search); ``steps`` says in words what each step tried and decided.
    """

    def __init__(self, settings: SearchSettings, fits: FitScheduler) -> None:
        self.settings, self.fits = settings, fits
        self.curves: dict[tuple[Config, int], CurveResult] = {}
        self.steps: list[str] = []
        self.incumbent: Config = ()
        self.incumbent_scores: Scores = {s: 1.0 for s in settings.search_seeds}

    # --- steps 1 and 2: curves and their scores ----------------------------------------------------

    def baseline(self, seed: int, phase: str) -> CurveResult:
        """The baseline's curve on ``seed``: every run length (step 1)."""
        key = ((), seed)
        if key not in self.curves:
            self._prefetch([key], phase)
            points = []
            for steps in self.settings.run_lengths:
                record = self.fits.fit((), seed, steps, phase)
                if not record.error:
                    points.append((record.seconds, record.quality))
            if not points:
                reasons = "; ".join(f.error or "" for f in self.fits.state.fits if not f.config and f.seed == seed)
                raise RuntimeError(f"every baseline fit on seed {seed} failed, so nothing can be compared on it: "
                                   f"{reasons}")
            self.curves[key] = CurveResult((), seed, phase, points, "baseline", 1.0)
        return self.curves[key]

    def goal(self, seed: int, phase: str) -> CurveGoal:
        """What a curve on ``seed`` races: the baseline's ``Q`` and time to it (the early stop in the search only)."""
        return CurveGoal.of(self.baseline(seed, phase).points, self.settings.higher, search=phase == "search")

    def curve(self, config: Config, seed: int, phase: str) -> CurveResult:
        """``config``'s curve on ``seed``, run lengths short to long until it is settled (steps 2 and 4;
        :meth:`~composer_bridge.search.scoring.CurveGoal.settled` says when)."""
        if not config:
            return self.baseline(seed, phase)
        key = (config, seed)
        if key not in self.curves:
            goal = self.goal(seed, phase)
            points: list[tuple[float, float]] = []
            status = "never reached Q"
            for steps in self.settings.run_lengths:
                record = self.fits.fit(config, seed, steps, phase)
                if record.error:  # a fit that failed twice is no point of the curve; the next length may still be
                    continue
                points.append((record.seconds, record.quality))
                settled = goal.settled(points)
                if settled is not None:
                    status = settled
                    break
            if points and time_to_reach(points, goal.q, self.settings.higher) is not None:
                status = "reached Q"  # a confirmation curve goes on past Q, within the baseline's training time
            base = self.baseline(seed, phase).points
            speed = strict_speedup(base, points, self.settings.higher)[0] if status == "reached Q" else None
            self.curves[key] = CurveResult(config, seed, phase, points, status, speed)
        return self.curves[key]

    def scores(self, config: Config, seeds: Sequence[int]) -> Scores:
        return {seed: self.curve(config, seed, "search").speedup for seed in seeds}

    def _prefetch(self, wanted: Sequence[tuple[Config, int]], phase: str) -> None:
        """Tell the scheduler which curves come next, in this order (it may train them side by side)."""
        self.fits.prefetch([w for w in wanted if w not in self.curves], phase, lambda seed: self.goal(seed, phase))

    # --- step 3: greedy forward selection with removal ---------------------------------------------

    def run(self) -> tuple[Config, Scores]:
        """Steps 1-4: the recipe chosen on the search seeds and its scores there."""
        seeds = self.settings.search_seeds
        self._prefetch([((), seed) for seed in seeds], "search")
        for seed in seeds:
            self.baseline(seed, "search")
        starts = self._race_starting_recipes()
        while True:
            present = self.settings.algorithms_in(self.incumbent)  # a unique algorithm is not added twice
            pool = [self.settings.config((*self.incumbent, c)) for c in self.settings.search_pool if c not in
                    self.incumbent and not (self.settings.candidate(c).algorithm in present
                                            and self.settings.candidate(c).algorithm_class().unique)]
            if not pool and not starts:
                self.steps.append("every candidate is in the recipe")
                break
            best, results = self._race(pool)
            bar = mean_score(self.incumbent_scores, seeds)
            best_mean = mean_score(results[best], seeds) if best is not None else 0.0
            if starts:
                name, start, scores = max(starts, key=lambda t: mean_score(t[2], seeds))
                starts = []  # the first step only
                if mean_score(scores, seeds) > bar and mean_score(scores, seeds) >= best_mean:
                    self._accept(start, scores)
                    self.steps.append(f"start from {name}: {config_name(start)} at {mean_score(scores, seeds):.2f}x")
                    continue
            if best is None or best_mean <= bar * (1 + self.settings.min_gain):
                tail = f"; best addition {config_name(best)} at {best_mean:.2f}x" if best else ""
                self.steps.append(f"no addition beats {config_name(self.incumbent)} ({bar:.2f}x) by more than "
                                  f"{100 * self.settings.min_gain:g} %{tail}: stop")
                break
            newest = next(c for c in best if c not in self.incumbent)
            self._accept(best, results[best])
            self.steps.append(f"add {newest}: {config_name(best)} at {best_mean:.2f}x")
            self._remove_unhelpful(newest)
        return self.incumbent, self.incumbent_scores

    def _race_starting_recipes(self) -> list[tuple[str, Config, Scores]]:
        """Score every starting recipe, whole, on every search seed (no halving: the best one is never lost)."""
        seeds = self.settings.search_seeds
        configs = {name: self.settings.config(labels) for name, labels in self.settings.starting_recipes.items()}
        self._prefetch([(config, seed) for seed in seeds for config in configs.values()], "search")
        raced = [(name, config, self.scores(config, seeds)) for name, config in configs.items()]
        for name, _, scores in raced:
            self.steps.append(f"starting recipe {name}: {mean_score(scores, seeds):.2f}x")
        return raced

    def _accept(self, config: Config, scores: Scores) -> None:
        self.incumbent, self.incumbent_scores = config, scores

    def _remove_unhelpful(self, newest: str) -> None:
        """Drop earlier algorithms that stopped helping (the one just added stays)."""
        seeds = self.settings.search_seeds
        while len(self.incumbent) > 1:
            bar = mean_score(self.incumbent_scores, seeds)
            trials = [(tuple(x for x in self.incumbent if x != a), a) for a in self.incumbent if a != newest]
            self._prefetch([(cfg, seed) for cfg, _ in trials for seed in seeds], "search")
            scored = [(mean_score(self.scores(cfg, seeds), seeds), cfg, a) for cfg, a in trials]
            keep = [t for t in scored if t[0] >= bar]
            if not keep:
                break
            score, cfg, removed = max(keep, key=lambda t: t[0])
            self.steps.append(f"remove {removed}: {config_name(cfg)} at {score:.2f}x >= {bar:.2f}x")
            self._accept(cfg, self.scores(cfg, seeds))

    # --- step 4: successive halving over the search seeds ------------------------------------------

    def _race(self, pool: list[Config]) -> tuple[Config | None, dict[Config, Scores]]:
        """Race ``pool`` seed by seed; after each seed but the last, only the better half of those ahead
        of the current recipe go on. Returns the best one left (``None``: none stayed ahead) and every score."""
        seeds = self.settings.search_seeds
        survivors, results = list(pool), {cfg: {} for cfg in pool}
        for i, seed in enumerate(seeds):
            self._prefetch([(cfg, seed) for cfg in survivors], "search")
            for cfg in survivors:
                results[cfg][seed] = self.curve(cfg, seed, "search").speedup
            seen = seeds[: i + 1]
            bar = mean_score(self.incumbent_scores, seen)
            ahead = sorted((c for c in survivors if mean_score(results[c], seen) > bar),
                           key=lambda c: -mean_score(results[c], seen))
            if i < len(seeds) - 1:
                ahead = ahead[: max(1, math.ceil(len(ahead) / 2))]
            dropped = [c for c in survivors if c not in ahead]
            if dropped and i < len(seeds) - 1:
                self.steps.append(f"after seed {seed}: {', '.join(config_name(c) for c in dropped)} stopped "
                                  f"(behind {config_name(self.incumbent)}'s {bar:.2f}x or in the lower half)")
            survivors = ahead
            if not survivors:
                break
        return (survivors[0] if survivors else None), results

    # --- step 5: confirmation ----------------------------------------------------------------------

    def prefetch_confirmation(self, configs: Sequence[Config], baselines: bool) -> None:
        """The confirmation's fits side by side: the baselines first (they set ``Q``), then every recipe.

        ``baselines``: whether the confirmation trains its baselines even with no recipe to confirm.
        """
        if not any(configs) and not baselines:
            return  # nothing to confirm: the baselines on the confirmation seeds are not trained either
        seeds = self.settings.confirm_seeds
        self._prefetch([((), seed) for seed in seeds], "confirm")
        self._prefetch([(c, seed) for c in configs if c for seed in seeds], "confirm")

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
