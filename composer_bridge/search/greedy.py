"""The greedy recipe search: which candidates make *this* model reach its baseline's quality sooner.

Method (docs/search.md has the reasoning):

1. **Baseline curves.** On every search seed, the baseline (no algorithm) is trained once per run
   length; its quality-vs-time points are the curve every candidate is measured against. ``Q`` is
   the baseline's best quality on that seed.
2. **Score.** A configuration's score on a seed is its strict speed-up
   (:func:`composer_bridge.search.scoring.strict_speedup`): the baseline's time to ``Q`` over the
   configuration's time to ``Q``; never reaching ``Q`` is a failure, 0x in the mean over seeds.
3. **Greedy forward selection with removal, from the best start.** The first step races the
   starting recipes (published or the user's, whole): seed by seed, in their order, only the leader
   (the best mean so far) going on to the next seed. Then the single candidates race against the
   best of them (step 4); the best starting recipe becomes the current recipe if it beats the
   baseline and no single candidate scores higher, so the search never settles below it. Each step tries adding
   every remaining candidate (of an algorithm not yet in the recipe) to the current recipe and keeps
   the best addition if its mean score beats the current recipe's by more than ``min_gain``; then
   it drops any earlier algorithm whose removal scores at least as well. It ends when no addition
   helps or the budget is spent.
4. **Stopping hopeless trials early.** Within a step, the additions race over the search seeds by
   successive halving: after each seed only the better half of those still ahead of the current
   recipe go on. Along a curve, run lengths go from short to long and stop once the curve reaches
   ``Q`` (longer runs cannot change its score), once its training time passes the baseline's
   time to ``Q`` without reaching it (it cannot beat the baseline on that seed: a failure), or once
   it can no longer end ahead of the recipe it races (a run of ``t`` seconds short of ``Q`` caps the
   speed-up below ``t_base / t``: :class:`~composer_bridge.search.scoring.CurveGoal`). Such a
   curve would have been dropped after that seed anyway, so the decisions are those of full curves.
5. **Confirmation.** The chosen recipe (and any ``also_confirm`` recipes) and the baseline are
   trained on the confirmation seeds, which the search never saw; only those numbers are the result.

Where and when fits train (the cache, the budget, fits side by side) is the
:class:`~composer_bridge.search.fit_scheduler.FitScheduler`'s job; this module only asks it for
fits in the order the method reads them, and announces the curves it is about to read
(``_prefetch``) so that a concurrent executor can train them side by side.

Examples:
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
from collections.abc import Callable, Mapping, Sequence

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

    Examples:
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
        self._read: dict[tuple[Config, int], list] = {}  # each curve's fits read so far, by run length
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

    def goal(self, seed: int, phase: str, beat: float = 1.0) -> CurveGoal:
        """What a curve on ``seed`` races: the baseline's ``Q`` and time to it, and the speed-up it must beat
        (the early stops in the search only)."""
        return CurveGoal.of(self.baseline(seed, phase).points, self.settings.higher, search=phase == "search",
                            beat=beat)

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
        points = [(r.seconds, r.quality) for r in read if not r.error]
        settled = goal.settled(points) if points else None
        for steps in self.settings.run_lengths[len(read):]:
            if settled is not None:
                break
            record = self.fits.fit(config, seed, steps, phase)
            read.append(record)
            if record.error:  # a fit that failed twice is no point of the curve; the next length may still be
                continue
            points.append((record.seconds, record.quality))
            settled = goal.settled(points)
        status = settled or "never reached Q"
        if points and time_to_reach(points, goal.q, self.settings.higher) is not None:
            status = "reached Q"  # a confirmation curve goes on past Q, within the baseline's training time
        base = self.baseline(seed, phase).points
        speed = strict_speedup(base, points, self.settings.higher)[0] if status == "reached Q" else None
        below = beat if status.startswith("stopped: cannot beat") else None
        self.curves[key] = CurveResult(config, seed, phase, points, status, speed, stopped_below=below)
        return self.curves[key]

    def scores(self, config: Config, seeds: Sequence[int]) -> Scores:
        return {seed: self.curve(config, seed, "search").speedup for seed in seeds}

    def _prefetch(self, wanted: Sequence[tuple[Config, int]], phase: str,
                  beat: Callable[[Config, int], float] | None = None) -> None:
        """Tell the scheduler which curves come next, in this order (it may train them side by side);
        ``beat(config, seed)``: what each must beat, as far as known now (never above what :meth:`curve` will ask)."""
        settled = [w for w in wanted if w in self.curves and self.curves[w].stopped_below is None]
        self.fits.prefetch([w for w in wanted if w not in settled], phase,
                           lambda config, seed: self.goal(seed, phase, beat(config, seed) if beat else 1.0))

    # --- step 3: greedy forward selection with removal ---------------------------------------------

    def run(self) -> tuple[Config, Scores]:
        """Steps 1-4: the recipe chosen on the search seeds and its scores there."""
        seeds = self.settings.search_seeds
        self._prefetch([((), seed) for seed in seeds], "search")
        for seed in seeds:
            self.baseline(seed, "search")
        best_start = self._race_starting_recipes()
        while True:
            present = self.settings.algorithms_in(self.incumbent)  # a unique algorithm is not added twice
            pool = [self.settings.config((*self.incumbent, c)) for c in self.settings.search_pool if c not in
                    self.incumbent and not (self.settings.candidate(c).algorithm in present
                                            and self.settings.candidate(c).algorithm_class().unique)]
            if not pool and best_start is None:
                self.steps.append("every candidate is in the recipe")
                break
            bar = mean_score(self.incumbent_scores, seeds)
            start = best_start if best_start is not None and mean_score(best_start[2], seeds) > bar else None
            best_start = None  # the first step only
            # the first step's singles race against the best starting recipe, when it beats the baseline
            best, results = self._race(pool, *((start[2], start[0]) if start else
                                               (self.incumbent_scores, config_name(self.incumbent))))
            best_mean = mean_score(results[best], seeds) if best is not None else 0.0
            if start is not None:
                name, config, scores = start
                if mean_score(scores, seeds) >= best_mean:
                    self._accept(config, scores)
                    self.steps.append(f"start from {name}: {config_name(config)} at {mean_score(scores, seeds):.2f}x")
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

    def _race_starting_recipes(self) -> tuple[str, Config, Scores] | None:
        """The best starting recipe, ``(name, config, scores on every search seed)`` (``None``: none).

        Seed by seed, every recipe still racing is scored in the order given; a curve stops once it
        can no longer beat the leader (the best mean over the seeds so far among those scored before
        it), and only the leader goes on to the next seed.
        """
        seeds = self.settings.search_seeds
        configs = {name: self.settings.config(labels) for name, labels in self.settings.starting_recipes.items()}
        alive, results = list(configs), {name: {} for name in configs}
        for i, seed in enumerate(seeds):
            earlier = {name: sum(results[name][s] or 0.0 for s in seeds[:i]) for name in alive}
            self._prefetch([(configs[name], seed) for name in alive], "search",
                           lambda config, s, names=tuple(alive), seed=seed, earlier=earlier:
                           self._leader_known(config, seed, [(configs[n], earlier[n]) for n in names]))
            leader, lead = None, 0.0
            for name in alive:
                beat = lead - earlier[name] if leader is not None else 1.0
                results[name][seed] = self.curve(configs[name], seed, "search", beat).speedup
                total = earlier[name] + (results[name][seed] or 0.0)
                if leader is None or total > lead:
                    leader, lead = name, total
            dropped = [n for n in alive if n != leader]
            if dropped:
                self.steps.append(f"starting recipes after seed {seed}: {leader} leads at "
                                  f"{lead / (i + 1):.2f}x; {', '.join(dropped)} stopped")
            alive = [leader] if leader is not None else []
        if not alive:
            return None
        name = alive[0]
        self.steps.append(f"starting recipe {name}: {mean_score(results[name], seeds):.2f}x")
        return name, configs[name], results[name]

    def _leader_known(self, config: Config, seed: int, order: list[tuple[Config, float]]) -> float:
        """For the fits trained ahead: what ``config`` must beat on ``seed`` among the starting recipes
        before it in ``order`` (``(config, its sum over earlier seeds)``), counting only the curves
        already known to have reached ``Q``: never more than the search itself will ask."""
        earlier = dict(order)
        lead = 0.0
        for other, other_earlier in order:
            if other == config:
                break
            known = self._known_speedup(other, seed)
            if known is not None:
                lead = max(lead, other_earlier + known)
        return max(1.0, lead - earlier[config])

    def _known_speedup(self, config: Config, seed: int) -> float | None:
        """``config``'s speed-up on ``seed`` from the fits trained so far, if they already reach ``Q``."""
        points = []
        for steps in self.settings.run_lengths:
            record = self.fits.cache.get((config, seed, steps))
            if record is None:
                return None
            if not record.error:
                points.append((record.seconds, record.quality))
                if time_to_reach(points, self.goal(seed, "search").q, self.settings.higher) is not None:
                    return strict_speedup(self.baseline(seed, "search").points, points, self.settings.higher)[0]
        return None

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

    def _race(self, pool: list[Config], bar_scores: Scores, bar_name: str) -> tuple[Config | None, dict[Config, Scores]]:
        """Race ``pool`` seed by seed against ``bar_scores`` (the current recipe's, or in the first step the
        best starting recipe's); after each seed but the last, only the better half of those ahead of it
        go on, and a curve stops once it cannot end ahead. Returns the best one left (``None``: none
        stayed ahead) and every score."""
        seeds = self.settings.search_seeds
        survivors, results = list(pool), {cfg: {} for cfg in pool}
        for i, seed in enumerate(seeds):
            seen = seeds[: i + 1]
            bar_sum = sum(bar_scores[s] or 0.0 for s in seen)
            beat = {cfg: bar_sum - sum(results[cfg][s] or 0.0 for s in seeds[:i]) for cfg in survivors}
            self._prefetch([(cfg, seed) for cfg in survivors], "search", lambda config, _seed, beat=beat: beat[config])
            for cfg in survivors:
                results[cfg][seed] = self.curve(cfg, seed, "search", beat[cfg]).speedup
            bar = mean_score(bar_scores, seen)
            ahead = sorted((c for c in survivors if mean_score(results[c], seen) > bar),
                           key=lambda c: -mean_score(results[c], seen))
            if i < len(seeds) - 1:
                ahead = ahead[: max(1, math.ceil(len(ahead) / 2))]
            dropped = [c for c in survivors if c not in ahead]
            if dropped and i < len(seeds) - 1:
                self.steps.append(f"after seed {seed}: {', '.join(config_name(c) for c in dropped)} stopped "
                                  f"(behind {bar_name}'s {bar:.2f}x or in the lower half)")
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
