"""The first look (``screen``): a step's configurations are compared by their shortest run on the first search
seed, the best share by their next run length, and so on (successive halving over the run lengths); only those
left go on to full curves. On simulated curves of known speed-up (
tests/helpers/search_sim.py, run through the real GreedySearch and FitScheduler): what it saves, and what it must not lose."""

from __future__ import annotations

import dataclasses
import random
import statistics

from helpers.search_sim import LENGTHS, SimExecutor

from composer_bridge.search.candidates import Candidate
from composer_bridge.search.fit_scheduler import FitScheduler
from composer_bridge.search.greedy import GreedySearch
from composer_bridge.search.settings import SearchSettings
from composer_bridge.search.state import SearchState


def _search(truth: dict[str, float], seed: int, screen: float | None, raises: tuple[str, ...] = ()) -> GreedySearch:
    labels = list(truth)
    settings = SearchSettings(make_module="full", make_data=None, monitor="q", higher=True,
                              candidates=tuple(Candidate("LabelSmoothing", name=n) for n in labels),
                              search_pool=tuple(labels), run_lengths=LENGTHS, search_seeds=(0, 1),
                              confirm_seeds=(1000, 1001, 1002), clock="steps", finalist_seeds=(2,), screen=screen)
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
    assert dataclasses.replace(search.settings, screen=None).screen is None
