"""composer_bridge.search.curves: the phase's fixed target (Q, T) and the median time a configuration is scored by.

CurveBook itself is exercised through the search in tests/search/test_estimate.py and test_greedy.py.
"""

from __future__ import annotations

import math

import pytest

from composer_bridge.search.curves import fixed_target, median_time


def test_the_target_is_fixed_once_for_every_seed_of_a_phase() -> None:
    # The baseline's bests are 0.8 and 0.7: Q = 0.7 on both seeds; T = the mean of the baseline's times to it.
    curves = [[(10, 0.5), (20, 0.8)], [(10, 0.6), (20, 0.7)]]
    assert fixed_target(curves, higher=True) == (0.7, pytest.approx((10 + 10 * 0.2 / 0.3 + 20) / 2))
    # A lucky seed does not move it: with a third seed far better, Q is the median best, not the lucky one.
    q, _ = fixed_target([*curves, [(10, 0.95), (20, 0.99)]], higher=True)
    assert q == 0.8
    # For a loss, lower is better: the worse of two bests is the higher one.
    assert fixed_target([[(10, 2.0), (20, 1.0)], [(10, 2.0), (20, 1.5)]], higher=False)[0] == 1.5


def test_a_seed_that_never_reaches_the_target_counts_as_infinitely_slow() -> None:
    # The third seed's best (0.6) is below Q = 0.7: its time is infinite, so T is the slower of the other two.
    q, t = fixed_target([[(10, 0.7), (20, 0.8)], [(10, 0.5), (20, 0.7)], [(10, 0.5), (20, 0.6)]], higher=True)
    assert q == 0.7 and t == 20
    assert median_time([3.0, None, 1.0]) == 3.0
    assert median_time([2.0, None]) == math.inf and median_time([]) == math.inf
