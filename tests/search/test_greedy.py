"""The greedy loop's decisions on scripted scores: forward selection, removal, successive halving, budget.

The fits are replaced by a table of strict speed-ups per (configuration, seed), so each rule of the
strategy is checked on its own; tests/search/test_search.py runs the same loop on real Lightning fits.
"""

from __future__ import annotations

import pytest

from composer_bridge.search.candidates import Candidate
from composer_bridge.search.search import BudgetExhausted, CurveResult, _Search
from composer_bridge.search.state import SearchState


class Scripted(_Search):
    """A search whose curves come from ``scores[frozenset(config)]`` (one speed-up for every seed, or per seed)."""

    def __init__(self, scores: dict, seeds=(0, 1), labels=("A", "B", "C"), max_curves: int | None = None) -> None:
        super().__init__(None, None, "q", True, [Candidate("MixUp", name=n) for n in labels], [1, 2], list(seeds),
                         [10], "steps", {}, None, None, 0.02, SearchState(None, {}), None)
        self.table, self.evaluated, self.max_curves = scores, [], max_curves

    def baseline(self, seed, phase):
        return self.curve((), seed, phase)

    def curve(self, config, seed, phase):
        key = (config, seed)
        if key not in self.curves:
            if self.max_curves is not None and len(self.evaluated) >= self.max_curves:
                raise BudgetExhausted(f"{self.max_curves} curves")
            self.evaluated.append(key)
            value = self.table.get(frozenset(config), 0.5) if config else 1.0
            value = value[seed] if isinstance(value, dict) else value
            self.curves[key] = CurveResult(config, seed, phase, [], "scripted", value)
        return self.curves[key]


def test_forward_selection_adds_the_best_candidate_while_it_helps_by_more_than_min_gain() -> None:
    search = Scripted({frozenset("A"): 1.5, frozenset("B"): 1.3, frozenset("AB"): 1.52, frozenset("AC"): 1.8})
    recipe, scores = search.greedy()
    assert recipe == ("A", "C") and scores == {0: 1.8, 1: 1.8}
    # A+B (1.52x) was not enough over A (1.5x, needs > 1.53x); A+B+C is below A+C: the loop stops there.
    assert search.steps[-1].startswith("no addition beats A + C")


def test_an_algorithm_that_stops_helping_is_removed() -> None:
    # A is chosen first, then B, then C; next to B and C, A no longer helps: B + C without it scores higher.
    search = Scripted({frozenset("A"): 1.5, frozenset("B"): 1.2, frozenset("C"): 1.1, frozenset("AB"): 1.7,
                       frozenset("AC"): 1.6, frozenset("ABC"): 1.9, frozenset("BC"): 1.95})
    recipe, scores = search.greedy()
    assert recipe == ("B", "C") and scores == {0: 1.95, 1: 1.95}
    assert "remove A: B + C at 1.95x >= 1.90x" in search.steps
    assert search.steps[-1].startswith("no addition beats B + C")


def test_successive_halving_sends_only_the_better_half_of_those_ahead_to_the_next_seed() -> None:
    scores = {frozenset("A"): {0: 1.4, 1: 1.0, 2: 1.0}, frozenset("B"): {0: 1.3, 1: 1.3, 2: 1.3},
              frozenset("C"): {0: 1.2, 1: 2.0, 2: 2.0}, frozenset("D"): {0: 0.9, 1: 3.0, 2: 3.0}}
    search = Scripted(scores, seeds=(0, 1, 2), labels=("A", "B", "C", "D"))
    search.greedy()
    on_seed = {seed: {c for c, s in search.evaluated if s == seed and len(c) == 1} for seed in (0, 1, 2)}
    assert on_seed[0] == {("A",), ("B",), ("C",), ("D",)}
    assert on_seed[1] == {("A",), ("B",)}  # C ahead but in the lower half of the three ahead; D behind the baseline
    assert on_seed[2] == {("B",)}  # after seed 1 (means A 1.2, B 1.3): the better one


def test_a_budget_stop_keeps_the_recipe_accepted_so_far() -> None:
    search = Scripted({frozenset("A"): 1.5, frozenset("AB"): 1.9}, max_curves=2 + 4 + 2)
    with pytest.raises(BudgetExhausted):
        search.greedy()
    # 2 baseline curves, step one (A, B, C on seed 0, A on seed 1), step two's A+B and A+C on seed 0: then
    # the budget ends, before A+B (ahead) is scored on seed 1, so the recipe stays A.
    assert search.incumbent == ("A",) and search.evaluated[-1] == (("A", "C"), 0)
