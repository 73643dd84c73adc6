"""The first look (``screen``): a step's configurations are compared by their shortest run on the first search
seed, the best share by their next run length, and so on (successive halving over the run lengths); only those
left go on to full curves. On simulated curves of known speed-up (
tests/helpers/search_sim.py, run through the real GreedySearch and FitScheduler): what it saves, and what it must not lose."""

from __future__ import annotations

import random
import statistics

from helpers.search_sim import LENGTHS, SimExecutor

from composer_bridge.search.candidates import Candidate
from composer_bridge.search.fit_scheduler import FitScheduler
from composer_bridge.search.greedy import GreedySearch
from composer_bridge.search.settings import SearchSettings
from composer_bridge.search.state import SearchState

DISTINCT = ["LabelSmoothing", "MixUp", "CutOut", "EMA", "GradientClipping", "BlurPool", "ChannelsLast", "CutMix"]


def _search(truth: dict[str, float], seed: int, screen: float | None, raises: tuple[str, ...] = (),
            first_look: int | None = None, shortlist: bool = False, distinct: bool = False) -> GreedySearch:
    labels = list(truth)
    # one algorithm for every label, or (``distinct``) one each, so that a recipe may hold several
    algorithms = DISTINCT[: len(labels)] if distinct else ["LabelSmoothing"] * len(labels)
    settings = SearchSettings(make_module="full", make_data=None, monitor="q", higher=True,
                              candidates=tuple(Candidate(a, name=n) for a, n in zip(algorithms, labels, strict=True)),
                              search_pool=tuple(labels), run_lengths=LENGTHS, search_seeds=(0, 1),
                              confirm_seeds=(1000, 1001, 1002), clock="steps", finalist_seeds=(2,), screen=screen,
                              first_look=first_look, shortlist=shortlist)
    executor = SimExecutor(truth, 0.15, random.Random(seed), raises=raises)
    return GreedySearch(settings, FitScheduler(settings, SearchState(None, {}), executor))


def _baseline_runs(search: GreedySearch) -> float:
    return search.fits.spent() / sum(LENGTHS)


def test_a_real_speed_up_is_still_found_at_well_under_the_cost_of_full_races() -> None:
    truth = {**{f"c{i}": 1.0 for i in range(11)}, "fast": 2.0}
    picked, cost, full_cost = 0, [], []
    for table in range(20):
        screened = _search(truth, table, screen=1 / 3)
        picked += screened.run()[0] == ("fast",)
        cost.append(_baseline_runs(screened))
        full = _search(truth, table, screen=None)
        full.run()
        full_cost.append(_baseline_runs(full))
    # full races find it in 19 of these 20 tables; the halving over run lengths trades one of them for a third
    # less cost than the first look at the shortest run alone (18 of 20, at 0.55x the full races' cost)
    assert picked >= 17, picked
    assert statistics.median(cost) < 0.7 * statistics.median(full_cost), (statistics.median(cost),
                                                                          statistics.median(full_cost))


def test_equal_configurations_still_leave_the_baseline_in_place() -> None:
    truth = {f"c{i}": 1.0 for i in range(12)}
    kept = sum(_search(truth, table, screen=1 / 3).run()[0] == () for table in range(20))
    assert kept >= 16, kept


def test_the_first_look_keeps_the_best_share_at_each_run_length_and_says_which_went_on() -> None:
    truth = {"slow": 0.5, "fast": 2.0, "a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}
    search = _search(truth, 0, screen=1 / 3)
    search.run()
    look = next(s for s in search.steps if s.startswith("first look at 10 steps on seed 0"))
    first, then = look.split("; then at 20 steps on seed 0: ")
    assert "fast" in first.split(" go on")[0] and "slow" in first.split(" go on")[1]
    assert then.split(" go on")[0] == "fast"  # the best third of the two kept: one
    other = next(c for c in first.split(": ")[1].split(" go on")[0].split(", ") if c != "fast")
    # only the last one kept has a curve on the first search seed in the first step
    first_step = {c for (config, s), _ in search.curves.items() if s == 0 and len(config) == 1 for c in config}
    assert first_step == {"fast"}
    # a configuration stopped at the first look cost its shortest run, one stopped at the second its two shortest
    costs = {label: [f.steps for f in search.fits.search_fits if f.config == [label] and f.seed == 0]
             for label in ("slow", other)}
    assert costs == {"slow": [LENGTHS[0]], other: list(LENGTHS[:2])}, costs


def test_a_configuration_that_raises_at_the_first_look_is_left_out() -> None:
    truth = {"broken": 1.0, "fast": 2.0, "a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "e": 1.0}
    search = _search(truth, 0, screen=1 / 3, raises=("broken",))
    recipe, _ = search.run()
    assert "broken" in search.left_out and recipe == ("fast",)
    assert [f.steps for f in search.fits.search_fits if f.config == ["broken"]] == [LENGTHS[0]]


def test_without_screen_every_configuration_is_raced() -> None:
    truth = {f"c{i}": 1.0 for i in range(6)}
    search = _search(truth, 0, screen=None)
    search.run()
    assert {config for (config, s) in search.curves if s == 0 and config} == {(c,) for c in truth}
    assert not any(s.startswith("first look") for s in search.steps)


def test_a_first_look_of_its_own_reads_shorter_runs_beside_the_baseline_s_and_leaves_the_unit_alone() -> None:
    truth = {"slow": 0.5, "fast": 2.0, "a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}
    look = LENGTHS[0] // 2
    search = _search(truth, 0, screen=1 / 3, first_look=look)
    assert search.run()[0] == ("fast",)
    line = next(s for s in search.steps if s.startswith(f"first look at {look} steps on seed 0"))
    assert f"then at {LENGTHS[0]} steps on seed 0" in line and "slow" in line.split("; then")[0].split(" go on")[1]
    fits = search.fits.search_fits
    # every configuration and the baseline ran the look on the first search seed, and nowhere else
    assert {tuple(f.config) for f in fits if f.steps == look} == {(), *((c,) for c in truth)}
    assert {f.seed for f in fits if f.steps == look} == {0}
    # one stopped at the first look cost that run only; the look's runs are no point of any curve
    assert [f.steps for f in fits if f.config == ["slow"]] == [look]
    assert all(t > look for curve in search.curves.values() for t, _ in curve.points)
    # a baseline run is still every run length on one seed: the baseline's look run is no part of it
    assert search.fits.baseline_run() == sum(LENGTHS)
    # the look compares with the baseline's own look run at the same time, not its shortest run
    baseline_look = next(f for f in fits if not f.config and f.steps == look)
    fast_look = next(f for f in fits if f.config == ["fast"] and f.steps == look)
    assert search.book.at_equal_time(fast_look, 0, "search") == fast_look.quality - baseline_look.quality


def test_the_shortlist_tries_only_what_the_first_look_kept_and_misses_a_part_that_helps_only_in_pairs() -> None:
    # "pair" slows training alone (0.8x) but beside "fast" (2x) the two make 3x: the true best recipe is both
    truth = {"fast": 2.0, "pair": 0.8, "a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "e": 1.0, "f": 1.0}
    found, cost = {True: 0, False: 0}, {True: [], False: []}
    for table in range(10):
        for shortlist in (True, False):
            search = _search(truth, table, screen=1 / 3, shortlist=shortlist, distinct=True)
            search.fits.executor.synergy = {frozenset({"fast", "pair"}): 3.0 / (2.0 * 0.8)}
            recipe, _ = search.run()
            found[shortlist] += recipe == ("fast", "pair")
            cost[shortlist].append(_baseline_runs(search))
            if shortlist:  # the later steps raced only what the first look kept
                later = {c for (config, _), _ in search.curves.items() if len(config) == 2 for c in config}
                assert search.shortlist is not None and later <= {"fast", *search.shortlist}, (later, search.shortlist)
                assert any(s.startswith("the later steps try only") for s in search.steps)
    assert found[False] >= 5 and found[True] <= 1, found  # measured: 6 of 10 without the shortlist, 0 with it
    assert statistics.median(cost[True]) < statistics.median(cost[False])
