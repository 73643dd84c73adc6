"""Settings ladders: a few settings of one algorithm raced in one step, at most one of them in a recipe."""

from __future__ import annotations

import functools

from helpers import search_support as task

from composer_bridge.search import Candidate, search_recipe, with_ladders
from composer_bridge.search.candidates import SETTING_LADDERS, ladder

make_module = functools.partial(task.make_module, lr=1.0)


def test_with_ladders_replaces_each_laddered_candidate_by_its_rungs() -> None:
    labels = [c.label for c in with_ladders(["GhostBatchNorm", Candidate("LabelSmoothing", {"smoothing": 0.3})])]
    assert labels == ["GhostBatchNorm", *(c.label for c in ladder("LabelSmoothing"))]
    assert [dict(c.kwargs) for c in ladder("MixUp")] == list(SETTING_LADDERS["MixUp"])
    for candidate in with_ladders():  # every rung of the default candidates builds
        candidate.build(100)


def test_the_rungs_race_on_real_fits_and_never_share_a_recipe() -> None:
    candidates = with_ladders(["LabelSmoothing", "GhostBatchNorm"])
    result = search_recipe(make_module, task.make_data, **task.search_kwargs(
        candidates=candidates, search_seeds=[0], confirm_seeds=[10], max_fits=40, starting_recipes={}, screen=None), method="greedy")
    rungs = {c.label for c in ladder("LabelSmoothing")}
    first_step = {tuple(c.config) for c in result.curves if c.phase == "search" and len(c.config) == 1}
    assert {(r,) for r in rungs} <= first_step  # every rung was raced
    assert all(len(rungs & set(f.config)) <= 1 for f in result.fits)  # never two rungs in one fit
    assert len(rungs & {c.label for c in result.recipe}) <= 1
