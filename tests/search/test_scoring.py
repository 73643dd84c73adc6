"""The curve arithmetic every speed-up rests on (composer_bridge.search.scoring), on hand-worked curves."""

from __future__ import annotations

import pytest

from composer_bridge.search.scoring import (
    CurveGoal,
    best_quality_within,
    strict_speedup,
    summarise_speedups,
    time_to_reach,
)


def test_the_time_to_a_quality_is_interpolated_between_runs_and_never_extrapolated() -> None:
    curve = [(1.0, 0.5), (3.0, 0.9)]
    assert time_to_reach(curve, 0.7, True) == pytest.approx(2.0)
    assert time_to_reach(curve, 0.4, True) == 1.0  # reached at the first run: no earlier time is invented
    assert time_to_reach(curve, 0.95, True) is None  # beyond the last run: never reached
    assert time_to_reach([(1.0, 2.0), (2.0, 1.0)], 1.5, False) == pytest.approx(1.5)  # a loss, lower is better


def test_a_dip_does_not_hide_an_earlier_crossing() -> None:
    assert time_to_reach([(1.0, 0.6), (2.0, 0.8), (3.0, 0.7)], 0.75, True) == pytest.approx(1.75)


def test_the_strict_speed_up_is_the_baselines_time_to_its_best_over_the_recipes() -> None:
    speed, q, t_base, t_recipe = strict_speedup([(1, 0.8), (2, 0.9), (4, 0.95)], [(0.5, 0.85), (1, 0.93), (2, 0.97)],
                                                True)
    assert (q, t_base) == (0.95, 4)
    assert t_recipe == pytest.approx(1 + (0.95 - 0.93) / (0.97 - 0.93))
    assert speed == pytest.approx(4 / t_recipe, abs=1e-6)


def test_a_seed_that_never_reaches_the_target_counts_zero_in_the_mean() -> None:
    s = summarise_speedups({0: 2.0, 1: None, 2: 1.0})
    assert s.mean == pytest.approx(1.0) and s.reached == 2 and "fail" in s.text()


def test_only_runs_within_the_time_count_for_the_second_answer() -> None:
    assert best_quality_within([(1.0, 0.6), (2.0, 0.8), (4.5, 0.9)], 4.0, True) == 0.8
    assert best_quality_within([(5.0, 0.9)], 4.0, True) is None


def test_a_curve_goal_stops_a_curve_once_its_score_is_settled() -> None:
    goal = CurveGoal(q=0.7, t_base=2.0, t_total=2.0, higher=True, search=True, beat=2.5)
    assert goal.settled([(0.5, 0.6)]) is None  # could still reach 0.7 before 2.0 / 2.5 = 0.8 s
    assert goal.settled([(0.5, 0.6), (0.8, 0.65)]) == "stopped: cannot beat 2.50x"
    assert CurveGoal(0.7, 2.0, 2.0, True, True).settled([(2.1, 0.6)]) == "stopped: past the baseline's time to Q"
