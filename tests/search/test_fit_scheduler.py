"""The fit scheduler's own rules: a curve's slots while fits are in flight, and the budget in baseline runs."""

from __future__ import annotations

import pytest

from composer_bridge.search.candidates import Candidate
from composer_bridge.search.executor import InProcessExecutor
from composer_bridge.search.fit_scheduler import _FLYING, FitScheduler, _Pending
from composer_bridge.search.results import BudgetExhausted
from composer_bridge.search.settings import SearchSettings
from composer_bridge.search.state import SearchState
from composer_bridge.search.trial import FitRecord


def _record(config, seed, steps, seconds) -> FitRecord:
    return FitRecord(list(config), seed, steps, 0.5, seconds, seconds, seconds, "search")


def test_a_curves_prefix_stops_at_the_first_fit_not_back_yet() -> None:
    curve = _Pending(("A",), 0, [_record(("A",), 0, 1, 1.0), _FLYING, _record(("A",), 0, 4, 4.0)])
    assert curve.prefix() == 1 and curve.known() == 3
    assert [r.steps for r in curve.finished()] == [1, 4] and curve.seconds() == 5.0


def test_a_budget_in_baseline_runs_is_known_once_every_search_seeds_baseline_is_in() -> None:
    settings = SearchSettings(make_module=None, make_data=None, monitor="q", higher=True,
                              candidates=(Candidate("LabelSmoothing", name="A"),), search_pool=("A",),
                              run_lengths=(1, 2), search_seeds=(0, 1), confirm_seeds=(10,), clock="cpu",
                              max_baseline_runs=2.5)
    fits = FitScheduler(settings, SearchState(None, {}), InProcessExecutor())
    fits.cache = {((), seed, steps): _record((), seed, steps, float(steps)) for seed in (0, 1) for steps in (1, 2)}
    fits.cache.update({(("A",), 0, 1): _record(("A",), 0, 1, 1.0), (("A",), 0, 2): _record(("A",), 0, 2, 2.0)})
    assert fits.baseline_run() is None and fits.max_seconds() is None  # nothing known yet: no limit
    for seed in (0, 1):
        for steps in (1, 2):
            fits.fit((), seed, steps, "search")
    assert fits.baseline_run() == 3.0 and fits.max_seconds() == 7.5  # 2.5 runs of 3 s
    fits.fit(("A",), 0, 1, "search")  # 6 + 1 = 7 s spent; a 2-step fit is expected to take 2 s more: over 7.5
    with pytest.raises(BudgetExhausted, match="2.5 baseline runs = 7.5 s"):
        fits.fit(("A",), 0, 2, "search")
