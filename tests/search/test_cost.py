"""SearchResult.cost: typed attributes, derived numbers, and the mapping it used to be."""

from __future__ import annotations

import json
import math

import pytest

from composer_bridge.search.cost import SearchCost


def test_the_cost_in_baseline_runs_and_in_full_size_runs() -> None:
    cost = SearchCost(clock="cpu", clock_means="CPU time", search_fits=30, confirm_fits=9, search_train=120.0,
                      confirm_train=60.0, baseline_run=10.0, search_unread_fits=2, search_unread_train=5.0,
                      full_baseline_run=40.0)
    assert cost.search_in_baseline_runs == 12.0 and cost.search_trained_in_baseline_runs == 12.5
    assert cost.search_in_full_runs == 3.0
    assert SearchCost(clock="cpu", clock_means="", search_fits=0, confirm_fits=0, search_train=0.0, confirm_train=0.0,
                      baseline_run=10.0).search_in_full_runs is None  # no full-size baseline trained


def test_it_still_reads_as_the_mapping_it_was() -> None:
    cost = SearchCost(clock="steps", clock_means="steps", search_fits=4, confirm_fits=2, search_train=8.0,
                      confirm_train=4.0, baseline_run=0.0)
    assert cost["search_fits"] == 4 and cost.get("max_fits") is None and "search_in_baseline_runs" in cost
    assert math.isnan(cost["search_in_baseline_runs"])  # no baseline run measured
    with pytest.raises(KeyError):
        cost["nothing"]
    assert json.loads(json.dumps(cost.as_dict(), default=str))["search_fits"] == 4
    assert len(cost) == len(list(cost)) == len(cost.as_dict())
