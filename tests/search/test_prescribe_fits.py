"""The prescription search with real Lightning fits: the answer is a run a user starts as it is handed over."""

from __future__ import annotations

import lightning as L
import pytest
from helpers.search_support import CANDIDATES, CLIP, make_data, make_module

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.search import Proxy, SearchInputError, search_recipe

KWARGS = dict(monitor="val/acc", candidates=[*CANDIDATES, CLIP], run_lengths=[8, 12, 16], search_seeds=[0, 1],
              confirm_seeds=[1000], clock="steps", eval_every=2, progress=False, starting_recipes={},
              trainer_kwargs={"accelerator": "cpu", "devices": 1}, max_baseline_runs=6)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    state = tmp_path_factory.mktemp("prescribe")
    return search_recipe(make_module, make_data, state_dir=state, **KWARGS), state


def test_the_prescription_trains_as_handed_over(searched) -> None:
    result, _ = searched
    p = result.prescription
    assert p is not None and p.steps in KWARGS["run_lengths"] and p.baseline_steps == 16
    callback = p.callback(seed=3)
    assert isinstance(callback, AlgorithmEngineCallback)
    trainer = L.Trainer(max_steps=p.steps, callbacks=[callback], accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    train, _ = make_data(3)
    trainer.fit(make_module(p.steps), train)
    assert trainer.global_step == p.steps
    code = result.python_code()
    assert f"max_steps={p.steps}" in code and f"total_steps = {p.steps}" in code
    assert f"max_steps: {p.steps}" in result.yaml_fragment()
    assert result.summary().startswith("Prescription: train")


def test_the_cost_is_every_run_of_the_search_in_runs_of_the_baseline(searched) -> None:
    result, _ = searched
    search_runs = [f for f in result.fits if f.phase == "search"]
    baseline = next(f for f in search_runs if not f.config and f.steps == 16)
    assert result.cost.search_train == pytest.approx(sum(f.seconds for f in search_runs))
    assert result.cost.baseline_run == baseline.seconds == 16  # the steps clock: the baseline run's 16 steps
    assert all(f.points for f in result.fits)  # every run was validated as it trained


def test_a_finished_search_re_reports_from_its_state_without_training(searched) -> None:
    result, state = searched
    again = search_recipe(make_module, make_data, state_dir=state, **KWARGS)
    assert again.cost.fits_trained_now == 0
    assert again.prescription == result.prescription and again.steps == result.steps


@pytest.mark.parametrize(("overrides", "match"), [
    ({"method": "fastest"}, "method='fastest'"),
    ({"target": "high"}, "target='high'"),
    ({"eval_every": 0}, "eval_every=0"),
    ({"baseline_run": [(2, 0.1, 0.5), (4, 0.2, 0.6)]}, "must rise and end at the longest run length 16"),
    ({"proxy": Proxy(run_lengths=[2, 4]), "method": "prescribe"}, "method=.greedy."),
])
def test_bad_input_is_refused_before_any_training(overrides, match) -> None:
    with pytest.raises(SearchInputError, match=match):
        search_recipe(make_module, make_data, **{**KWARGS, **overrides})
