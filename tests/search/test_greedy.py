"""The greedy loop's decisions on scripted scores: forward selection, removal, successive halving, budget.

The fits are replaced by a table of strict speed-ups per (configuration, seed), so each rule of the
strategy is checked on its own; tests/search/test_search.py runs the same loop on real Lightning fits.
"""

from __future__ import annotations

import pytest

from composer_bridge.search import BudgetWarning
from composer_bridge.search.candidates import Candidate
from composer_bridge.search.curves import CurveBook
from composer_bridge.search.executor import InProcessExecutor
from composer_bridge.search.fit_scheduler import FitScheduler
from composer_bridge.search.greedy import GreedySearch
from composer_bridge.search.results import BudgetExhausted, CurveResult
from composer_bridge.search.settings import SearchSettings
from composer_bridge.search.state import SearchState
from composer_bridge.search.trial import FitRecord

#: Each scripted label stands for an algorithm of its own (a unique algorithm is never added twice).
CLASSES = {"A": "LabelSmoothing", "B": "CutOut", "C": "EMA", "D": "SAM", "a": "LabelSmoothing"}


def _settings(labels, lengths, seeds, clock, max_seconds=None, pool=None, starts=None) -> SearchSettings:
    return SearchSettings(make_module=None, make_data=None, monitor="q", higher=True,
                          candidates=tuple(Candidate(CLASSES[n], name=n) for n in labels),
                          search_pool=tuple(pool or labels), run_lengths=tuple(lengths), search_seeds=tuple(seeds),
                          confirm_seeds=(10,), clock=clock, max_train_seconds=max_seconds,
                          starting_recipes=starts or {}, confidence=0.0)  # the rules alone: no noise gate


def _greedy(settings: SearchSettings) -> tuple[SearchSettings, FitScheduler]:
    return settings, FitScheduler(settings, SearchState(None, {}), InProcessExecutor())


class ScriptedBook(CurveBook):
    """Curves from ``scores[frozenset(config)]`` (one speed-up for every seed, or per seed) instead of fits."""

    def __init__(self, settings, fits, scores: dict, max_curves: int | None, cut: bool) -> None:
        super().__init__(settings, fits)
        self.table, self.evaluated, self.max_curves, self.cut = scores, [], max_curves, cut
        self.beats: dict = {}  # (config, seed) -> the speed-up each curve was asked to beat, the last time

    def baseline(self, seed, phase):
        return self.curve((), seed, phase)

    def curve(self, config, seed, phase, beat=1.0):
        """With ``cut``: a curve that cannot beat ``beat`` stops with no score (as soon as it could in a real
        run), and is asked again from where it stopped against a lower ``beat``."""
        key = (config, seed)
        self.beats[key] = beat
        cached = self.curves.get(key)
        if cached is None or (cached.stopped_below is not None and beat < cached.stopped_below):
            if cached is None:
                if self.max_curves is not None and len(self.evaluated) >= self.max_curves:
                    raise BudgetExhausted(f"{self.max_curves} curves")
                self.evaluated.append(key)
            value = self.table.get(frozenset(config), 0.5) if config else 1.0
            value = value[seed] if isinstance(value, dict) else value
            if self.cut and config and beat > 1.0 and (value is None or value < beat):
                self.curves[key] = CurveResult(config, seed, phase, [], f"stopped: cannot beat {beat:.2f}x", None,
                                               stopped_below=beat)
            else:
                self.curves[key] = CurveResult(config, seed, phase, [], "scripted", value)
        return self.curves[key]


class Scripted(GreedySearch):
    """The greedy search on a :class:`ScriptedBook` of speed-ups."""

    def __init__(self, scores: dict, seeds=(0, 1), labels=("A", "B", "C"), max_curves: int | None = None,
                 pool=None, starts=None, cut: bool = False) -> None:
        settings, fits = _greedy(_settings(labels, [1, 2], seeds, "steps", pool=pool, starts=starts))
        super().__init__(settings, fits, book=ScriptedBook(settings, fits, scores, max_curves, cut))
        self.evaluated, self.beats = self.book.evaluated, self.book.beats


def test_forward_selection_adds_the_best_candidate_while_it_helps_by_more_than_min_gain() -> None:
    search = Scripted({frozenset("A"): 1.5, frozenset("B"): 1.3, frozenset("AB"): 1.52, frozenset("AC"): 1.8})
    recipe, scores = search.run()
    assert recipe == ("A", "C") and scores == {0: 1.8, 1: 1.8}
    # A+B (1.52x) was not enough over A (1.5x, needs > 1.53x); A+B+C is below A+C: the loop stops there.
    assert search.steps[-1].startswith("no addition beats A + C")


def test_an_algorithm_that_stops_helping_is_removed() -> None:
    # A is chosen first, then B, then C; next to B and C, A no longer helps: B + C without it scores higher.
    search = Scripted({frozenset("A"): 1.5, frozenset("B"): 1.2, frozenset("C"): 1.1, frozenset("AB"): 1.7,
                       frozenset("AC"): 1.6, frozenset("ABC"): 1.9, frozenset("BC"): 1.95})
    recipe, scores = search.run()
    assert recipe == ("B", "C") and scores == {0: 1.95, 1: 1.95}
    assert "remove A: B + C at 1.95x >= 1.90x" in search.steps
    assert search.steps[-1].startswith("no addition beats B + C")


def test_successive_halving_sends_only_the_better_half_of_those_ahead_to_the_next_seed() -> None:
    scores = {frozenset("A"): {0: 1.4, 1: 1.0, 2: 1.0}, frozenset("B"): {0: 1.3, 1: 1.3, 2: 1.3},
              frozenset("C"): {0: 1.2, 1: 2.0, 2: 2.0}, frozenset("D"): {0: 0.9, 1: 3.0, 2: 3.0}}
    search = Scripted(scores, seeds=(0, 1, 2), labels=("A", "B", "C", "D"))
    search.run()
    on_seed = {seed: {c for c, s in search.evaluated if s == seed and len(c) == 1} for seed in (0, 1, 2)}
    assert on_seed[0] == {("A",), ("B",), ("C",), ("D",)}
    assert on_seed[1] == {("A",), ("B",)}  # C ahead but in the lower half of the three ahead; D behind the baseline
    assert on_seed[2] == {("B",)}  # after seed 1 (means A 1.2, B 1.3): the better one


def test_a_budget_stop_keeps_the_recipe_accepted_so_far() -> None:
    search = Scripted({frozenset("A"): 1.5, frozenset("AB"): 1.9}, max_curves=2 + 4 + 2)
    with pytest.raises(BudgetExhausted):
        search.run()
    # 2 baseline curves, step one (A, B, C on seed 0, A on seed 1), step two's A+B and A+C on seed 0: then
    # the budget ends, before A+B (ahead) is scored on seed 1, so the recipe stays A.
    assert search.incumbent == ("A",) and search.evaluated[-1] == (("A", "C"), 0)


def test_a_lone_starting_recipe_races_whole_on_every_seed_and_the_search_never_settles_below_it() -> None:
    # The start C + D is behind the baseline on seed 0 and far ahead on seed 1 (mean 2.0x); the single A
    # leads on seed 0 (mean 1.25x). Halving would have dropped C + D after seed 0; the leading start goes on.
    scores = {frozenset("A"): {0: 1.5, 1: 1.0}, frozenset("B"): {0: 1.2, 1: 1.0}, frozenset("CD"): {0: 1.0, 1: 3.0},
              frozenset("ACD"): {0: 1.1, 1: 2.8}, frozenset("BCD"): {0: 1.0, 1: 2.9}}
    search = Scripted(scores, labels=("A", "B", "C", "D"), pool=("A", "B"), starts={"cd": ("C", "D")})
    recipe, found = search.run()
    assert {(c, s) for c, s in search.evaluated if c == ("C", "D")} == {(("C", "D"), 0), (("C", "D"), 1)}
    assert recipe == ("C", "D") and found == {0: 1.0, 1: 3.0}
    assert search.steps[0] == "starting recipe cd: 2.00x" and any(s.startswith("start from cd: C + D at 2.00x") for s in search.steps)
    # From the start, single candidates are added (A + C + D, B + C + D: no better), none of C, D twice.
    assert search.steps[-1].startswith("no addition beats C + D (2.00x)")


def test_only_the_leading_starting_recipe_goes_on_and_a_start_that_cannot_lead_stops_early() -> None:
    # seed 0: s1 (C) 2.0x leads; s2 (D) 1.5x cannot beat it and stops (no score); s3 (B + D) 2.4x takes the
    # lead. Seed 1: only s3, the leader, is scored.
    scores = {frozenset("C"): 2.0, frozenset("D"): 1.5, frozenset("BD"): {0: 2.4, 1: 2.2}}
    search = Scripted(scores, labels=("A", "B", "C", "D"), pool=("A",), cut=True,
                      starts={"s1": ("C",), "s2": ("D",), "s3": ("B", "D")})
    recipe, found = search.run()
    assert search.beats[(("D",), 0)] == 2.0 and search.curves[(("D",), 0)].speedup is None
    assert search.beats[(("B", "D"), 0)] == 2.0
    assert {c for c, s in search.evaluated if s == 1 and len(c) > 1 or c in {("C",), ("D",)} and s == 1} \
        == {("B", "D")}
    assert "starting recipes after seed 0: s3 leads at 2.40x; s1, s2 stopped" in search.steps
    assert recipe == ("B", "D") and found == {0: 2.4, 1: 2.2}
    # the single A races against s3 (2.4x on seed 0): it must beat that to go on, and cannot
    assert search.beats[(("A",), 0)] == pytest.approx(2.4)


def test_stopping_curves_that_cannot_beat_the_recipe_they_race_changes_no_decision() -> None:
    # Random tables of per-seed speed-ups (failures among them), with and without the early stop against
    # the raced recipe (as early as it could ever happen): the same recipe, scores and steps every time,
    # and never a curve more.
    import random

    rng = random.Random(7)
    labels = ("A", "B", "C", "D")
    for _ in range(300):
        table = {}
        for n in range(1, 5):
            for combo in __import__("itertools").combinations(labels, n):
                table[frozenset(combo)] = {s: (None if rng.random() < 0.1 else round(rng.uniform(0.5, 4.0), 2))
                                           for s in (0, 1, 2)}
        starts = {"s1": ("A", "B"), "s2": ("C", "D"), "s3": ("B", "C", "D")}
        runs = [Scripted(table, seeds=(0, 1, 2), labels=labels, starts=starts, cut=cut) for cut in (False, True)]
        (full, full_scores), (cut, cut_scores) = (r.run() for r in runs)
        assert full == cut and full_scores == cut_scores
        assert [x for x in runs[0].steps if "cannot" not in x] == [x for x in runs[1].steps if "cannot" not in x]
        assert set(runs[1].evaluated) <= set(runs[0].evaluated)


def test_a_single_candidate_that_beats_every_starting_recipe_is_taken_instead() -> None:
    scores = {frozenset("A"): 2.5, frozenset("CD"): 1.5, frozenset("AB"): 2.0}
    search = Scripted(scores, labels=("A", "B", "C", "D"), pool=("A", "B"), starts={"cd": ("C", "D")})
    recipe, _ = search.run()
    assert recipe == ("A",) and any(s.startswith("add A: A at 2.50x") for s in search.steps)


def test_the_rungs_of_a_settings_ladder_race_in_one_step_and_at_most_one_joins_the_recipe() -> None:
    # "A" and "a" are two settings of one (unique) algorithm: the better rung is kept, and the next step
    # tries B beside it but never the other rung.
    scores = {frozenset("A"): 1.5, frozenset("a"): 1.6, frozenset("B"): 1.2, frozenset("aB"): 1.7}
    search = Scripted(scores, labels=("A", "a", "B"))
    recipe, _ = search.run()
    assert recipe == ("a", "B")
    assert not any({"A", "a"} <= set(config) for config, _ in search.evaluated)


# --- one curve: run lengths short to long, and the two exact early stops ------------------------------


def _curve_search(points: dict, max_seconds: float | None = None) -> CurveBook:
    """The curves of a search over run lengths 1, 2, 4 whose fits come from
    ``points[(config, seed, steps)] = (seconds, quality)``.

    The records go into the scheduler's fit cache, so the real ``FitScheduler.fit``, ``CurveBook.curve``
    and budget code run; a fit missing from the table would need training and fails the test.
    """
    search = CurveBook(*_greedy(_settings(("A", "B"), [1, 2, 4], [0], "cpu", max_seconds)))
    search.fits.cache = {key: FitRecord(list(key[0]), key[1], key[2], q, s, s, s, "search" if key[1] == 0 else "confirm")
                    for key, (s, q) in points.items()}
    return search


BASELINE = {((), 0, 1): (1.0, 0.3), ((), 0, 2): (2.0, 0.5), ((), 0, 4): (4.0, 0.6),
            ((), 10, 1): (1.0, 0.3), ((), 10, 2): (2.0, 0.5), ((), 10, 4): (4.0, 0.6)}


def test_a_curve_stops_at_the_first_run_length_that_reaches_the_baselines_best() -> None:
    # A reaches Q = 0.6 at 2 steps: its 4-step fit cannot change its time to Q and is not trained.
    search = _curve_search({**BASELINE, (("A",), 0, 1): (0.9, 0.4), (("A",), 0, 2): (1.8, 0.7)})
    curve = search.curve(("A",), 0, "search")
    assert curve.status == "reached Q" and [p[0] for p in curve.points] == [0.9, 1.8]
    # Time to 0.6 on A's curve: 0.9 + 0.9 * (0.6 - 0.4) / (0.7 - 0.4) = 1.5 s; the baseline's: 4.0 s.
    assert curve.speedup == pytest.approx(4.0 / 1.5)
    assert [(tuple(f.config), f.steps) for f in search.fits.search_fits] == [((), 1), ((), 2), ((), 4), (("A",), 1),
                                                                         (("A",), 2)]


def test_a_curve_past_the_baselines_time_to_q_stops_as_a_failure() -> None:
    # B's 2-step fit takes 4.5 s, past the baseline's 4.0 s to Q, still below Q: it cannot beat the
    # baseline on this seed, so its 4-step fit is not trained and it scores as a failure.
    search = _curve_search({**BASELINE, (("B",), 0, 1): (2.2, 0.3), (("B",), 0, 2): (4.5, 0.55)})
    curve = search.curve(("B",), 0, "search")
    assert curve.status == "stopped: past the baseline's time to Q" and curve.speedup is None
    assert len(curve.points) == 2


def test_a_curve_that_cannot_beat_the_recipe_it_races_stops_and_goes_on_later_against_a_lower_one() -> None:
    # The baseline reaches Q = 0.6 at 4.0 s. Raced against 3x, A's 1-step run (1.5 s, below Q) caps its
    # speed-up below 4.0 / 1.5 = 2.67x: it stops there, its 2-step fit not trained.
    search = _curve_search({**BASELINE, (("A",), 0, 1): (1.5, 0.4), (("A",), 0, 2): (3.0, 0.65)})
    curve = search.curve(("A",), 0, "search", beat=3.0)
    assert curve.status == "stopped: cannot beat 3.00x" and curve.speedup is None and curve.stopped_below == 3.0
    assert [(tuple(f.config), f.steps) for f in search.fits.search_fits][3:] == [(("A",), 1)]
    assert search.curve(("A",), 0, "search", beat=3.5) is curve  # a higher bar: nothing more to learn
    # Against 2x it goes on from the 2-step fit (the 1-step one is not read twice) and reaches Q.
    again = search.curve(("A",), 0, "search", beat=2.0)
    assert again.status == "reached Q" and again.stopped_below is None
    assert again.speedup == pytest.approx(4.0 / (1.5 + 1.5 * (0.6 - 0.4) / (0.65 - 0.4)))
    assert [(tuple(f.config), f.steps) for f in search.fits.search_fits][3:] == [(("A",), 1), (("A",), 2)]


class TableExecutor:
    """A concurrent executor with two workers that speculate, whose fits come from a table, oldest first."""

    concurrent, speculate = True, True

    def __init__(self, table: dict) -> None:
        self.table, self.queue, self.tickets, self.while_busy = table, [], 0, []

    def slots(self) -> int:
        return 2

    def submit(self, task) -> int:
        self.tickets += 1
        key = (tuple(c.label for c in task.candidates), task.seed, task.steps)
        self.while_busy.append((key, [k for _, k in self.queue]))  # what was still training when it started
        self.queue.append((self.tickets, key))
        return self.tickets

    def next_done(self):
        from composer_bridge.search.executor import FitOutcome

        ticket, key = self.queue.pop(0)
        seconds, quality = self.table[key]
        return ticket, FitOutcome(quality, seconds, seconds, seconds, seconds)


def test_an_idle_worker_trains_a_curves_next_run_length_before_the_shorter_one_is_back() -> None:
    # A alone in the race: its 1-step fit takes one worker, so the other starts A's 2-step fit at once. The
    # 1-step fit reaches Q: the search reads only it and goes on without waiting for the 2-step fit, which is
    # kept when it comes back but read by no decision.
    search = _curve_search(BASELINE)
    executor = TableExecutor({(("A",), 0, 1): (0.9, 0.65), (("A",), 0, 2): (1.8, 0.7)})
    search.fits.executor = executor
    search.prefetch([(("A",), 0)], "search")
    assert executor.while_busy == [((("A",), 0, 1), []), ((("A",), 0, 2), [(("A",), 0, 1)])]
    curve = search.curve(("A",), 0, "search")
    assert curve.status == "reached Q" and len(curve.points) == 1
    assert [(tuple(f.config), f.steps) for f in search.fits.search_fits][3:] == [(("A",), 1)]
    assert [key for _, key in executor.queue] == [(("A",), 0, 2)]  # still training: not waited for


def test_confirmation_curves_are_not_stopped_early_by_the_baselines_time() -> None:
    # The same slow curve on a confirmation seed runs to the longest run length: a reported number is
    # never cut short by the search's shortcut.
    search = _curve_search({**BASELINE, (("B",), 10, 1): (2.2, 0.3), (("B",), 10, 2): (4.5, 0.55),
                            (("B",), 10, 4): (9.0, 0.62)})
    curve = search.curve(("B",), 10, "confirm")
    assert curve.status == "reached Q" and len(curve.points) == 3
    assert curve.speedup == pytest.approx(4.0 / (4.5 + 4.5 * (0.6 - 0.55) / (0.62 - 0.55)), abs=1e-6)


def test_a_time_budget_stops_before_a_fit_it_cannot_cover() -> None:
    # 7 s of baseline, then A at 1 and 2 steps (0.9 s + 2.5 s): 10.4 s spent. A's 4-step fit is expected to
    # cost what the 4-step baseline fit took (4.0 s): 14.4 s > 14, so it is not started.
    search = _curve_search({**BASELINE, (("A",), 0, 1): (0.9, 0.4), (("A",), 0, 2): (2.5, 0.5)}, max_seconds=14)
    with pytest.warns(BudgetWarning, match="the first step alone needs about 21"):
        search.baseline(0, "search")
    with pytest.raises(BudgetExhausted, match="14 s"):
        search.curve(("A",), 0, "search")
    assert [(tuple(f.config), f.steps) for f in search.fits.search_fits][3:] == [(("A",), 1), (("A",), 2)]


def test_a_confirmation_curve_goes_on_past_q_within_the_baselines_training_time() -> None:
    # A reaches Q = 0.6 in its 1-step run; the search would stop there, but on a confirmation seed the
    # longer runs still fit in the baseline's training time (4.0 s), so they are trained: A's best quality
    # within that time is its 4-step run's 0.8, and its speed-up is read off the same first crossing.
    search = _curve_search({**BASELINE, (("A",), 10, 1): (0.5, 0.65), (("A",), 10, 2): (1.0, 0.7),
                            (("A",), 10, 4): (2.0, 0.8)})
    curve = search.curve(("A",), 10, "confirm")
    assert curve.status == "reached Q" and len(curve.points) == 3 and curve.speedup == pytest.approx(4.0 / 0.5)
    within = search.quality_within_baseline_time(("A",))
    assert within.per_seed == (0.8,) and within.mean == 0.8
    assert search.quality_within_baseline_time(()).per_seed == (0.6,)  # the baseline's own best


def test_the_best_quality_within_the_baselines_time_counts_only_runs_that_fit_in_it() -> None:
    # A's 4-step run takes 4.5 s, past the baseline's 4.0 s: its 0.9 does not count; the 2-step run's 0.7 does.
    search = _curve_search({**BASELINE, (("A",), 10, 1): (0.9, 0.4), (("A",), 10, 2): (1.8, 0.7),
                            (("A",), 10, 4): (4.5, 0.9)})
    assert search.quality_within_baseline_time(("A",)).per_seed == (0.7,)
    assert search.curve(("A",), 10, "confirm").speedup == pytest.approx(4.0 / 1.5)
