"""The greedy recipe search: which candidates make *this* model reach its baseline's quality sooner.

Method (docs/search.md has the reasoning):

1. **Baseline curves.** On every search seed, the baseline (no algorithm) is trained once per run
   length; its quality-vs-time points fix the target every candidate aims at: ``Q``, the median of its
   best qualities over the search seeds, and ``T``, its median time to ``Q`` (:func:`fixed_target`).
2. **Score.** A configuration's score on a seed is its strict speed-up: ``T`` over the
   configuration's time to ``Q``; never reaching ``Q`` is a failure, 0x in the mean over seeds.
3. **Greedy forward selection with removal, from the best start.** The first step races the
   starting recipes (published or the user's, whole): seed by seed, in their order, only the leader
   (the best mean so far) going on to the next seed. Then the single candidates race against the
   best of them (step 4); the best starting recipe becomes the current recipe if it is taken (below)
   and no single candidate scores higher. Each step tries adding every remaining candidate (of an
   algorithm not yet in the recipe) to the current recipe and takes the best addition if its mean
   beats the current recipe's by more than ``min_gain`` and the search is sure enough: at
   ``confidence`` on the search seeds, then again on the finalist seeds, which played no part in
   choosing it (:mod:`composer_bridge.search.estimate`); then it drops any earlier algorithm whose
   removal scores at least as well. It ends when no addition is taken or the budget is spent.
4. **Stopping hopeless trials early.** With ``screen``, a step first looks at every configuration's
   shortest run on the first search seed against the baseline's quality after the same training
   time, and only the best share (at least two) go on; at each longer run length but the longest, the
   best share of those (at least one) go on again, and those left race in full (``_screened``): a
   guess, the only stop here that may change a decision. With ``first_look``, the first look reads runs
   of its own, shorter than the shortest run length; with ``shortlist``, the steps after the first try
   only the candidates the first step's first look kept (both off by default: docs/search.md says why). Within a step, the additions race over the search seeds by
   successive halving: after each seed only the better half of those still ahead of the current
   recipe go on. Along a curve, run lengths go from short to long and stop once the curve reaches
   ``Q`` (longer runs cannot change its score), once its training time passes ``T`` without reaching
   it (it cannot beat the baseline on that seed: a failure), or once it can no longer end ahead of
   the recipe it races (a run of ``t`` seconds short of ``Q`` caps the speed-up below ``T / t``:
   :class:`~composer_bridge.search.scoring.CurveGoal`). Such a curve would have been dropped after
   that seed anyway, so the decisions are those of full curves. A curve whose fit raised (the
   candidates' failure on this model) stops at once, and its candidate is left out from then on.
5. **Confirmation.** The chosen recipe (and any ``also_confirm`` recipes, or the best configuration
   tried when none was taken) and the baseline are trained on the confirmation seeds, which the
   search never saw, aiming at the same ``Q``; only those numbers are the result, beside the
   estimate (:meth:`GreedySearch.estimate`) they check.

Where and when fits train (the cache, the budget, fits side by side) is the
:class:`~composer_bridge.search.fit_scheduler.FitScheduler`'s job; this module only asks it for
fits in the order the method reads them, and announces the curves it is about to read
(``_prefetch``) so that a concurrent executor can train them side by side.

Examples:
    A step's scores are mean speed-ups over the search seeds, a seed that never reached the target counting 0x
    (the greedy search on a real task: :func:`~composer_bridge.search.search_recipe` with ``method="greedy"``):

    >>> mean_score({0: 2.0, 1: 1.0, 2: None}, [0, 1, 2])
    1.0
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from composer_bridge.search.curves import CurveBook, Scores
from composer_bridge.search.estimate import Estimate, estimate, held_out, needed, probability_better
from composer_bridge.search.fit_scheduler import FitScheduler
from composer_bridge.search.results import Config, CurveResult, config_name
from composer_bridge.search.settings import SearchSettings

__all__ = ["GreedySearch", "mean_score"]

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

    def __init__(self, settings: SearchSettings, fits: FitScheduler, book: CurveBook | None = None) -> None:
        self.settings, self.fits = settings, fits
        self.book = book if book is not None else CurveBook(settings, fits)
        self.steps: list[str] = []
        self.incumbent: Config = ()
        self.incumbent_scores: Scores = {s: 1.0 for s in settings.search_seeds}
        self.left_out: dict[str, str] = {}  # candidates that raised on this model, and why
        self._finalists: dict[Config, Scores] = {}  # the last race's configurations still ahead after its last seed
        self.shortlist: tuple[str, ...] | None = None  # the candidates the later steps try (``shortlist``)

    @property
    def curves(self) -> dict[tuple[Config, int], CurveResult]:
        """Every curve read so far (the :class:`~composer_bridge.search.curves.CurveBook`'s)."""
        return self.book.curves

    # --- step 3: greedy forward selection with removal ---------------------------------------------

    def run(self) -> tuple[Config, Scores]:
        """Steps 1-4: the recipe chosen on the search seeds and its scores there."""
        seeds = self.settings.search_seeds
        self.book.prefetch([((), seed) for seed in seeds], "search")
        for seed in seeds:
            self.book.baseline(seed, "search")
        best_start = self._race_starting_recipes()
        while True:
            present = self.settings.algorithms_in(self.incumbent)  # a unique algorithm is not added twice
            pool = [self.settings.config((*self.incumbent, c)) for c in self.settings.search_pool if c not in
                    self.incumbent and c not in self.left_out and (self.shortlist is None or c in self.shortlist)
                    and not (self.settings.candidate(c).algorithm in present
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
            self._leave_out_failures(pool)
            if self.shortlist is not None and not any(line.startswith("the later steps") for line in self.steps):
                self.steps.append(f"the later steps try only the candidates this first look kept: "
                                  f"{', '.join(self.shortlist) or 'none'}")
            best_mean = mean_score(results[best], seeds) if best is not None else 0.0
            if start is not None:
                name, config, scores = start
                ok, how = self._screen(config, scores, len(self.settings.starting_recipes))
                if mean_score(scores, seeds) >= best_mean and ok:
                    ok, final, scores = self._finalist(config, scores)
                    how = f"{how}; {final}" if final else how
                if mean_score(scores, seeds) >= best_mean and ok:
                    self._accept(config, scores)
                    self.steps.append(f"start from {name}: {config_name(config)} at {mean_score(scores, seeds):.2f}x "
                                      f"({how})")
                    continue
                if mean_score(scores, seeds) >= best_mean:
                    self.steps.append(f"starting recipe {name} ({mean_score(scores, seeds):.2f}x) not taken: {how}")
            ok, how = self._screen(best, results[best], len(pool)) if best else (False, "")
            if ok and best_mean > bar * (1 + self.settings.min_gain):
                ok, final, results[best] = self._finalist(best, results[best])
                how = f"{how}; {final}" if final else how
            if best is None or best_mean <= bar * (1 + self.settings.min_gain) or not ok:
                tail = f"; best addition {config_name(best)} at {best_mean:.2f}x, {how}" if best else ""
                self.steps.append(f"no addition beats {config_name(self.incumbent)} ({bar:.2f}x) by more than "
                                  f"{100 * self.settings.min_gain:g} % at {100 * self.settings.confidence:g} % "
                                  f"confidence{tail}: stop")
                break
            newest = next(c for c in best if c not in self.incumbent)
            self._accept(best, results[best])
            self.steps.append(f"add {newest}: {config_name(best)} at {best_mean:.2f}x over {bar:.2f}x ({how})")
            self._remove_unhelpful(newest)
        return self.incumbent, self.incumbent_scores

    # --- the noise: how sure each decision is, and the estimate for unseen seeds -------------------

    def _leave_out_failures(self, configs: Sequence[Config]) -> None:
        """Candidates whose curve raised (the candidates' failure on this model) are tried no more, with why."""
        for config in configs:
            for seed in self.settings.search_seeds:
                curve = self.curves.get((config, seed))
                if curve is None or not curve.status.startswith("failed: "):
                    continue
                newest = [c for c in config if c not in self.incumbent and c not in self.left_out]
                for label in newest:
                    self.left_out[label] = curve.status.removeprefix("failed: ")
                    self.steps.append(f"{label} left out of the search: {config_name(config)} on seed {seed} "
                                      f"{curve.status}")

    def _bound(self, curve: CurveResult) -> float | None:
        """A search curve's speed-up, or for a curve stopped early the most it could have scored
        (``T`` over its last run's time); ``None`` for a curve that raised (it measures nothing)."""
        if curve.speedup is not None:
            return curve.speedup
        if curve.status.startswith("failed: "):
            return None
        if curve.status.startswith("stopped") and curve.points:
            return min(1e3, self.book.target("search")[1] / max(curve.points[-1][0], 1e-12))
        return 0.0

    def field(self) -> tuple[list[list[float]], list[list[float]]]:
        """Every configuration's scores on the search seeds (stopped curves at their bound), and the
        baseline's own per-seed ratios (``T`` over its time to ``Q``: pure seed-to-seed noise)."""
        by_config: dict[Config, list[float]] = {}
        noise: list[list[float]] = []
        for (config, _seed), curve in self.curves.items():
            if curve.phase != "search":
                continue
            if not config:
                if curve.points:
                    speed = self.book.speedup(curve.points, "search")
                    if speed is not None:
                        noise.append([speed])
                continue
            value = self._bound(curve)
            if value is not None:
                by_config.setdefault(config, []).append(value)
        baseline = [v for group in noise for v in group]
        return list(by_config.values()), ([baseline] if len(baseline) > 1 else [])

    def sure(self, scores: Scores, against: Scores, config: Config | None = None) -> float:
        """How sure the search is that the configuration scored ``scores`` truly beats the one scored
        ``against`` (the baseline, at exactly 1x, or the current recipe): the seed-to-seed noise is pooled
        from the two and from the baseline's own spread, all measured to the end on every search seed, so
        the curves stopped early never change a decision."""
        seeds = [s for s in scores if s in against]
        _, noise = self.field()
        others = [[v or 0.0 for v in r.values()] for c, r in self._finalists.items() if c != config]
        return probability_better([scores[s] or 0.0 for s in seeds], [against[s] or 0.0 for s in seeds],
                                  [*noise, *others])

    def _sure_enough(self, config: Config, scores: Scores, against: Scores, contestants: int) -> tuple[bool, str]:
        """Whether ``config``, the best of ``contestants``, is sure enough to be taken, and how sure, in words."""
        if self.settings.confidence == 0:
            return True, "no confidence asked"
        sure, need = self.sure(scores, against, config), needed(self.settings.confidence, contestants)
        among = f" as the best of {contestants}" if contestants > 1 else ""
        return sure >= need, f"{100 * sure:.1f} % sure it is better; {100 * need:.1f} % needed{among}"

    def _screen(self, config: Config, scores: Scores, contestants: int) -> tuple[bool, str]:
        """The first look at a step's best configuration, on the search seeds it was chosen on.

        With finalist seeds, it only has to look better than the current recipe at the chosen confidence: the
        finalist seeds, which played no part in choosing it, then decide (:meth:`_finalist`). Without them, the
        best of ``contestants`` must be sure enough for all of them at once (Bonferroni)."""
        return self._sure_enough(config, scores, self.incumbent_scores,
                                 1 if self.settings.finalist_seeds else contestants)

    def _finalist(self, config: Config, scores: Scores) -> tuple[bool, str, Scores]:
        """Before a step takes its best configuration: score it (and the current recipe) on the finalist seeds,
        which played no part in choosing it, and take it only if it beats the current recipe there at the chosen
        confidence (the seed-to-seed noise as measured on the search seeds). A lead that was luck rarely holds."""
        extra = [s for s in self.settings.finalist_seeds if s not in scores]
        if not extra:
            return True, "", scores
        wanted = [(config, s) for s in extra] + [(self.incumbent, s) for s in extra if self.incumbent]
        self.book.prefetch(wanted, "search")
        fresh = {s: self.book.curve(config, s, "search").speedup for s in extra}
        against = {s: self.book.curve(self.incumbent, s, "search").speedup if self.incumbent else 1.0 for s in extra}
        _, noise = self.field()
        seeds = [s for s in scores if s in self.incumbent_scores]
        measured = [[scores[s] or 0.0 for s in seeds], *noise,
                    *([[self.incumbent_scores[s] or 0.0 for s in seeds]] if self.incumbent else []),
                    *([v or 0.0 for v in r.values()] for c, r in self._finalists.items() if c != config)]
        sure = (1.0 if self.settings.confidence == 0 else
                probability_better([fresh[s] or 0.0 for s in extra], [against[s] or 0.0 for s in extra], measured,
                                   fresh_only=True))
        mean = statistics.fmean(v or 0.0 for v in fresh.values())
        how = (f"on the finalist seed{'s' if len(extra) > 1 else ''} {extra}: {mean:.2f}x, {100 * sure:.1f} % sure "
               f"it is better; {100 * self.settings.confidence:g} % needed")
        return sure >= self.settings.confidence, how, {**scores, **fresh}

    def estimate(self, config: Config, scores: Scores) -> Estimate | None:
        """The pick's speed-up on unseen seeds, corrected for having been chosen (``None`` for the baseline).

        With finalist seeds (the default), the pick's scores there are the estimate: they played no part in
        choosing it (:func:`~composer_bridge.search.estimate.held_out`; a pick whose last change came from a
        removal is scored there now). Without them, the search seeds' mean is shrunk towards the field of every
        configuration tried (:func:`~composer_bridge.search.estimate.estimate`)."""
        if not config:
            return None
        seeds, new = self.settings.search_seeds, len(self.settings.confirm_seeds)
        raw = statistics.fmean(scores[s] or 0.0 for s in seeds if s in scores)
        field, noise = self.field()
        extra = self.settings.finalist_seeds
        if extra:
            fresh = {s: scores[s] if s in scores else self.book.curve(config, s, "search").speedup for s in extra}
            own = [scores.get(s, fresh.get(s)) or 0.0 for s in (*seeds, *extra)]
            others = [[v or 0.0 for v in r.values()] for c, r in self._finalists.items() if c != config]
            return held_out([v or 0.0 for v in fresh.values()], raw, [own, *noise, *others], new,
                            reference_seeds=len(seeds), seeds=len(seeds) + len(extra))
        pick = [scores[s] or 0.0 for s in seeds if s in scores]
        return estimate(pick, field or [pick], new_seeds=new, noise=noise)

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
            self.book.prefetch([(configs[name], seed) for name in alive], "search",
                           lambda config, s, names=tuple(alive), seed=seed, earlier=earlier:
                           self._leader_known(config, seed, [(configs[n], earlier[n]) for n in names]))
            leader, lead = None, 0.0
            for name in alive:
                beat = lead - earlier[name] if leader is not None else 1.0
                results[name][seed] = self.book.curve(configs[name], seed, "search", beat).speedup
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
            known = self.book.known_speedup(other, seed)
            if known is not None:
                lead = max(lead, other_earlier + known)
        return max(1.0, lead - earlier[config])

    def _accept(self, config: Config, scores: Scores) -> None:
        self.incumbent, self.incumbent_scores = config, scores

    def _remove_unhelpful(self, newest: str) -> None:
        """Drop earlier algorithms that stopped helping (the one just added stays)."""
        seeds = self.settings.search_seeds
        while len(self.incumbent) > 1:
            bar = mean_score(self.incumbent_scores, seeds)
            trials = [(tuple(x for x in self.incumbent if x != a), a) for a in self.incumbent if a != newest]
            self.book.prefetch([(cfg, seed) for cfg, _ in trials for seed in seeds], "search")
            scored = [(mean_score(self.book.scores(cfg, seeds), seeds), cfg, a) for cfg, a in trials]
            keep = [t for t in scored if t[0] >= bar]
            if not keep:
                break
            score, cfg, removed = max(keep, key=lambda t: t[0])
            self.steps.append(f"remove {removed}: {config_name(cfg)} at {score:.2f}x >= {bar:.2f}x")
            self._accept(cfg, self.book.scores(cfg, seeds))

    # --- step 4: successive halving over the search seeds ------------------------------------------

    def _race(self, pool: list[Config], bar_scores: Scores, bar_name: str) -> tuple[Config | None, dict[Config, Scores]]:
        """Race ``pool`` seed by seed against ``bar_scores`` (the current recipe's, or in the first step the
        best starting recipe's); after each seed but the last, only the better half of those ahead of it
        go on, and a curve stops once it cannot end ahead. Returns the best one left (``None``: none
        stayed ahead) and every score."""
        seeds = self.settings.search_seeds
        survivors, results = self._screened(pool), {cfg: {} for cfg in pool}
        for i, seed in enumerate(seeds):
            seen = seeds[: i + 1]
            bar_sum = sum(bar_scores[s] or 0.0 for s in seen)
            beat = {cfg: bar_sum - sum(results[cfg][s] or 0.0 for s in seeds[:i]) for cfg in survivors}
            self.book.prefetch([(cfg, seed) for cfg in survivors], "search", lambda config, _seed, beat=beat: beat[config])
            for cfg in survivors:
                results[cfg][seed] = self.book.curve(cfg, seed, "search", beat[cfg]).speedup
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
        # the configurations still ahead after the last seed: measured in full on every seed (a curve stopped early
        # is never ahead), so their spread informs the noise the same way whatever was stopped
        self._finalists = {c: results[c] for c in survivors}
        return (survivors[0] if survivors else None), results

    def _screened(self, pool: list[Config]) -> list[Config]:
        """The configurations of ``pool`` that go on to full curves, by successive halving over the run lengths on
        the first search seed: with ``screen``, the best share of them (at least two) by their first look's run
        (``first_look`` steps, or the shortest run length), then at each longer run length but the longest the best
        share of those (at least one), each run compared with the baseline's quality after the same training time.
        A configuration that raised is left in, to be left out by its curve; one whose runs already reach ``Q``
        needs no longer run and goes on. The first step's first look makes the shortlist (``shortlist``)."""
        share, seed = self.settings.screen, self.settings.search_seeds[0]
        if share is None:
            return list(pool)
        alive, raised, looks = list(pool), [], []
        for number, (steps, index) in enumerate(self.settings.looks()):
            keep = max(2 if number == 0 else 1, math.ceil(len(alive) * share))
            done = [cfg for cfg in alive if number > 0 and self.book.reached(cfg, seed, "search")]
            racing = [cfg for cfg in alive if cfg not in done]
            if keep >= len(racing):
                if number == 0:
                    self._note_shortlist(racing)
                continue
            if index is None:  # the first look's own run, and the baseline's beside it (the reference)
                self.fits.prefetch_runs([((), seed, steps), *((cfg, seed, steps) for cfg in racing)], "search")
                self.book.look_run((), seed, steps)
                runs = {cfg: self.book.look_run(cfg, seed, steps) for cfg in racing}
            else:
                self.fits.prefetch_runs([(cfg, seed, steps) for cfg in racing], "search")
                runs = {cfg: self.book.run_at(cfg, seed, "search", index) for cfg in racing}
            raised += [cfg for cfg, run in runs.items() if run.raised]
            value = {cfg: -math.inf if run.error else self.book.at_equal_time(run, seed, "search")
                     for cfg, run in runs.items() if cfg not in raised}
            ranked = sorted(value, key=lambda cfg: -value[cfg])
            kept, dropped = ranked[:keep], ranked[keep:]
            if number == 0:
                self._note_shortlist(kept)
            looks.append(f"{'first look' if not looks else 'then'} at {steps} steps on seed {seed}: "
                         f"{', '.join(config_name(c) for c in kept)} go on; "
                         f"{', '.join(config_name(c) for c in dropped)} stopped (the best {keep} of {len(value)})")
            alive = [cfg for cfg in alive if cfg in kept or cfg in done]
        if looks:
            self.steps.append("; ".join(looks) + " (quality at equal training time against the baseline)")
        return [cfg for cfg in pool if cfg in alive or cfg in raised]

    def _note_shortlist(self, kept: Sequence[Config]) -> None:
        """With ``shortlist``: the first step's first look names the candidates the later steps try."""
        if not self.settings.shortlist or self.shortlist is not None:
            return
        self.shortlist = tuple(dict.fromkeys(label for cfg in kept for label in cfg if label not in self.incumbent))
