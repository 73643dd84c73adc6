"""composer_bridge.search: real Lightning fits on a tiny task, a few optimizer steps each.

The clock is ``"steps"`` (deterministic) wherever a test compares whole tables: with CPU time the
fits are the same but the search's decisions may differ with the machine's load.
"""

from __future__ import annotations

import functools
import json
import statistics
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from helpers import search_support as task

from composer_bridge.search import (
    BudgetWarning,
    Candidate,
    CandidateWarning,
    SearchInputError,
    StaleStateError,
    search_recipe,
)
from composer_bridge.search.scoring import time_to_reach

# lr=3.0 makes the tiny task unstable enough that gradient clipping (task.CLIP) wins on the search seeds.
make_module = functools.partial(task.make_module, lr=3.0)
CANDIDATES = ["LabelSmoothing", "MixUp", task.CLIP]
KWARGS = task.search_kwargs(candidates=CANDIDATES, confirm_seeds=[10, 11])


def _rows(result) -> list[tuple]:
    """The table without the times measured in seconds (the steps clock is in it, and deterministic)."""
    return [(f.phase, tuple(f.config), f.seed, f.steps, f.quality, f.seconds) for f in result.fits]


@pytest.fixture(scope="module")
def searched(tmp_path_factory) -> tuple:
    state = tmp_path_factory.mktemp("search")
    counting = task.Counting(factory=make_module)
    result = search_recipe(counting, task.make_data, state_dir=state, **KWARGS, method="greedy")
    return result, state, counting


def test_the_search_finds_a_recipe_on_search_seeds_and_reports_only_confirmation_seeds(searched) -> None:
    result, _, _ = searched
    assert [c.label for c in result.recipe] == ["Clip"]
    assert result.search_score > 1.0
    confirm = [f for f in result.fits if f.phase == "confirm"]
    search = [f for f in result.fits if f.phase == "search"]
    assert {f.seed for f in confirm} == {10, 11} and {f.seed for f in search} == {0, 1, 2}
    # seed 2 is the finalist seed: only the step's best (against the baseline, exact at 1x) is scored there
    assert {tuple(f.config) for f in search if f.seed == 2} == {("Clip",)}
    assert result.settings["finalist_seeds"] == [2] and result.estimate is not None
    # The reported number, recomputed independently from the table's rows: one target, fixed by the baseline on the
    # search seeds (the worse of its two best accuracies); the baseline's mean time to it over the two confirmation
    # seeds, over the recipe's own time to it on each confirmation seed.
    q = min(max(f.quality for f in search if f.seed == seed and not f.config) for seed in (0, 1))
    base = {seed: sorted((f.seconds, f.quality) for f in confirm if f.seed == seed and not f.config) for seed in (10, 11)}
    times = [time_to_reach(points, q, True) for points in base.values()]
    if None in times:  # the baseline misses the target on one of the two unseen seeds: at best it got there at the end
        t_base = statistics.mean(max(t for t, _ in points) for points in base.values())
    else:
        t_base = statistics.mean(times)
    per_seed = []
    for seed in (10, 11):
        mine = sorted((f.seconds, f.quality) for f in confirm if f.seed == seed and f.config == ["Clip"])
        reached = time_to_reach(mine, q, True)
        per_seed.append(None if reached is None else round(t_base / reached, 6))
    assert list(result.confirmed.per_seed) == per_seed
    assert result.confirmed.seeds == (10, 11)
    assert result.beats_baseline == (statistics.mean(s or 0.0 for s in per_seed) > 1.0)
    assert "GradientClipping" in result.python_code() and "composer_bridge.algorithms.GradientClipping" in result.yaml_fragment()


def test_the_best_quality_within_the_baselines_training_time_is_read_off_the_confirmation_fits(searched) -> None:
    result, _, _ = searched
    confirm = [f for f in result.fits if f.phase == "confirm"]
    by_hand = {}
    for name, config in (("baseline", []), ("recipe", ["Clip"])):
        per_seed = []
        for seed in (10, 11):
            budget = max(f.seconds for f in confirm if f.seed == seed and not f.config)  # the baseline's longest run
            per_seed.append(max(f.quality for f in confirm if f.seed == seed and f.config == config
                                and f.seconds <= budget))
        by_hand[name] = per_seed
    within = result.quality_within_baseline_time
    assert set(within) == {"baseline", "recipe"}
    for name, per_seed in by_hand.items():
        assert list(within[name].per_seed) == per_seed and within[name].seeds == (10, 11)
        assert within[name].mean == pytest.approx(statistics.mean(per_seed))
    # The recipe's curves run past Q up to the baseline's training time: every run length is there.
    assert sorted(f.steps for f in confirm if f.config == ["Clip"] and f.seed == 10) == task.RUN_LENGTHS
    assert f"recipe {within['recipe'].text()}" in result.summary()


def test_every_fit_is_a_real_deterministic_lightning_fit(searched, tmp_path) -> None:
    result, _, _ = searched
    again = search_recipe(make_module, task.make_data, state_dir=tmp_path, **KWARGS, method="greedy")
    assert _rows(again) == _rows(result)
    assert again.steps == result.steps
    # One fit on its own, out of the search's order and after other random draws, repeats exactly:
    # the same quality as in the table, and the same trained weights twice.
    from composer_bridge.search.trial import run_fit

    first = result.fits[0]
    assert first.config == [] and first.phase == "search"
    fits = []
    for draws in (10, 1000):
        torch.rand(draws)
        fits.append(run_fit(make_module, task.make_data, [], first.steps, first.seed, "val/acc", "steps",
                            {"accelerator": "cpu", "devices": 1}))
    assert fits[0][0] == fits[1][0] == first.quality and fits[0][1].steps == first.steps
    weights = [list(fit[2].state_dict().values()) for fit in fits]
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))


def test_an_interrupted_search_resumes_where_it_stopped_and_ends_with_the_same_table(searched, tmp_path) -> None:
    result, _, _ = searched
    # 2 modules for the probe, then one per fit: the 12th fit's module raises.
    with pytest.raises(KeyboardInterrupt):
        search_recipe(task.Counting(interrupt_at=2 + 12, factory=make_module), task.make_data, state_dir=tmp_path,
                      **KWARGS, method="greedy")
    saved = json.loads((tmp_path / "search.json").read_text())
    assert len(saved["fits"]) == 11
    resumed_counter = task.Counting(factory=make_module)
    resumed = search_recipe(resumed_counter, task.make_data, state_dir=tmp_path, **KWARGS, method="greedy")
    assert _rows(resumed) == _rows(result)
    assert resumed_counter.calls == 2 + len(result.fits) - 11  # only the missing fits trained
    assert resumed.cost["fits_trained_now"] == len(result.fits) - 11


def test_a_finished_search_re_reports_from_disk_without_training(searched) -> None:
    result, state, _ = searched
    counting = task.Counting(factory=make_module)
    saved = (state / "search.json").read_bytes()
    again = search_recipe(counting, task.make_data, state_dir=state, **KWARGS, method="greedy")
    assert counting.calls == 2  # the probe's two modules; no fit
    assert again.cost["fits_trained_now"] == 0
    assert _rows(again) == _rows(result) and again.confirmed == result.confirmed
    # Looking at a finished search is not part of its cost: the file, and the overhead it records, stay.
    assert (state / "search.json").read_bytes() == saved
    assert (again.cost["overhead_s"], again.cost["overhead_cpu_s"]) == (result.cost["overhead_s"],
                                                                         result.cost["overhead_cpu_s"])


def test_a_re_report_with_a_smaller_budget_reports_only_the_fits_within_it(searched, tmp_path) -> None:
    # The state holds the whole search; replayed with 9 fits (the two baseline curves and one candidate
    # curve), the result's table, cost and Lightning time are those 9 fits', not the state's.
    result, state, _ = searched
    (tmp_path / "search.json").write_text((state / "search.json").read_text())
    counting = task.Counting(factory=make_module)
    with pytest.warns(BudgetWarning):
        small = search_recipe(counting, task.make_data, state_dir=tmp_path, **{**KWARGS, "max_fits": 9}, method="greedy")
    assert counting.calls == 2 and small.stopped_by_budget and not small.recipe
    assert len(result.fits) > 9
    assert _rows(small) == _rows(result)[:9] and small.cost["search_fits"] == 9
    assert small.cost["lightning_outside_training_s"] == pytest.approx(
        sum(f.fit_wall_s - f.wall_s for f in result.fits[:9]))
    assert small.table().count("\n| search |") == 9


def test_a_state_from_other_settings_is_refused(searched) -> None:
    _, state, _ = searched
    with pytest.raises(StaleStateError, match="run_lengths"):
        search_recipe(make_module, task.make_data, state_dir=state, **{**KWARGS, "run_lengths": [2, 4]}, method="greedy")


@pytest.mark.parametrize("budget", [{"max_fits": 12}, {"max_train_seconds": 60}])
def test_the_budget_is_respected(tmp_path, budget) -> None:
    kwargs = {**KWARGS, "max_fits": None, "screen": None, **budget}  # every configuration raced in full
    with pytest.warns(BudgetWarning, match="the first step alone needs about"):
        result = search_recipe(make_module, task.make_data, state_dir=tmp_path, **kwargs, method="greedy")
    search = [f for f in result.fits if f.phase == "search"]
    if "max_fits" in budget:
        assert len(search) <= 12
    else:
        assert sum(f.seconds for f in search) <= 60  # steps clock: each fit's cost is known in advance
    assert result.stopped_by_budget
    assert result.cost["search_fits"] == len(search)


def test_the_search_overhead_is_measured(searched) -> None:
    result, _, _ = searched
    cost = result.cost
    assert 0 < cost["overhead_s"]
    # the cost is read off the fits themselves: every search fit's training time, and one baseline run = the
    # baseline's fits on one search seed (mean over the seeds)
    search_fits = [f for f in result.fits if f.phase == "search"]
    assert cost["search_train"] == pytest.approx(sum(f.seconds for f in search_fits))
    seeds = result.settings["search_seeds"]
    per_seed = [sum(f.seconds for f in search_fits if not f.config and f.seed == s) for s in seeds]
    assert cost["baseline_run"] == pytest.approx(sum(per_seed) / len(seeds))


# --- bad input, before any training ----------------------------------------------------------------


def _refused(match: str, factory=None, **overrides) -> task.Counting:
    counting = task.Counting(factory=factory or make_module)
    with pytest.raises(SearchInputError, match=match):
        search_recipe(counting, task.make_data, **{**KWARGS, **overrides}, method="greedy")
    return counting


def test_a_metric_the_module_never_logs_is_refused_before_training() -> None:
    counting = _refused(r"monitor='val/accuracy' is not logged .* it logs \['val/acc', 'val/loss'\]", monitor="val/accuracy")
    assert counting.calls == 2  # the probe's modules only


def test_a_budget_smaller_than_one_baseline_run_is_refused() -> None:
    assert _refused(r"max_fits=5 is smaller than one baseline run", max_fits=5).calls == 0
    # A time budget: known after the first (shortest) baseline fit, before any other.
    counting = _refused(r"max_train_seconds=10 is smaller than one baseline run", max_fits=None, max_train_seconds=10)
    assert counting.calls == 3


@pytest.mark.parametrize("screen", [0, 1.5, "third", True])
def test_a_screen_share_outside_zero_to_one_is_refused_before_training(screen) -> None:
    assert _refused(rf"screen={screen!r}: expected a share in \(0, 1\]", screen=screen).calls == 0


@pytest.mark.parametrize("first_look", [0, 1.5, "half", True])
def test_a_first_look_share_outside_zero_to_one_is_refused_before_training(first_look) -> None:
    assert _refused(rf"first_look={first_look!r}: expected a share of the shortest run length in \(0, 1\]",
                    first_look=first_look).calls == 0


@pytest.mark.parametrize("shortlist", [1, "yes", None])
def test_a_shortlist_that_is_not_true_or_false_is_refused_before_training(shortlist) -> None:
    assert _refused(rf"shortlist={shortlist!r}: expected True .* or False", shortlist=shortlist).calls == 0


def test_a_state_saved_with_another_screen_resumes_and_reads_its_fits(searched, tmp_path) -> None:
    # screen steers which fits the search reads, never what a fit trains: the state is not
    # refused, the fits it holds are read rather than trained again, and it is saved with the new settings
    result, state, _ = searched
    (tmp_path / "search.json").write_text((state / "search.json").read_text())
    counting = task.Counting(factory=make_module)
    again = search_recipe(counting, task.make_data, state_dir=tmp_path, **{**KWARGS, "screen": None}, method="greedy")
    held = len(json.loads((state / "search.json").read_text())["fits"])
    assert again.cost["fits_trained_now"] < len(again.fits) and len(again.fits) > 0
    assert counting.calls == 2 + again.cost["fits_trained_now"]  # the probe's two modules, and each fit trained now
    saved = json.loads((tmp_path / "search.json").read_text())
    assert "screen" not in saved["settings"] and len(saved["fits"]) >= held


def test_a_factory_returning_the_same_module_twice_is_refused() -> None:
    module = make_module(8)
    _refused("returned the same ComposerClassifier object twice", factory=lambda steps: module)
    network = task.tiny_network()
    from composer_bridge import ComposerClassifier

    _refused("share .* parameter tensors", factory=lambda steps: ComposerClassifier(network, num_classes=3))


def test_candidates_that_cannot_apply_are_refused_or_left_out() -> None:
    # BlurPool needs convolutions with more channels than the tiny network has.
    _refused(r"\['BlurPool'\] cannot apply .* BlurPool would replace nothing", candidates=["BlurPool", "MixUp"])
    _refused("no such algorithm. Did you mean 'MixUp'", candidates=["Mixup"])
    _refused("could not build it", candidates=[Candidate("GradientClipping")])
    _refused(r"labels \['MixUp'\] appear more than once", candidates=["MixUp", Candidate("MixUp", {"alpha": 0.4})])


def test_default_candidates_that_cannot_apply_are_left_out_with_a_warning(tmp_path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(SearchInputError, match="max_fits=1 is smaller"):
            search_recipe(make_module, task.make_data, **{**KWARGS, "candidates": None, "max_fits": 1}, method="greedy")
    assert not [w for w in caught if issubclass(w.category, CandidateWarning)]  # the budget is checked first
    from composer_bridge.search import checks
    from composer_bridge.search.candidates import DEFAULT_CANDIDATES

    found = checks.probe(make_module, task.make_data, "val/acc", 2, 0, {})
    with pytest.warns(CandidateWarning, match="BlurPool .*would replace nothing"):
        usable = checks.filter_candidates(list(DEFAULT_CANDIDATES), found, 2, explicit=False)
    assert "BlurPool" not in [c.label for c in usable] and "MixUp" in [c.label for c in usable]


def test_confirmation_seeds_shared_with_search_seeds_and_owned_trainer_arguments_are_refused() -> None:
    _refused(r"confirm_seeds=\[1, 10\] shares \[1\] with search_seeds", confirm_seeds=[1, 10])
    _refused(r"trainer_kwargs sets \['max_steps'\]", trainer_kwargs={"max_steps": 5})
    _refused("mode='maximise'", mode="maximise")
    _refused("the label 'LabelSmoothing' means", also_confirm={"mine": [Candidate("LabelSmoothing", {"smoothing": 0.3})]},
             candidates=["LabelSmoothing"])
    _refused("run_lengths=", run_lengths=[4])


def test_the_command_runs_a_search_from_a_config(tmp_path) -> None:
    from composer_bridge.search.__main__ import main

    config = tmp_path / "search.yaml"
    config.write_text(f"""
module:
  class_path: helpers.search_support.TinyModule
  init_args: {{lr: 1.0}}
data:
  class_path: helpers.search_support.TinyData
search:
  monitor: val/acc
  candidates: [LabelSmoothing, {{algorithm: MixUp, kwargs: {{alpha: 0.2}}}}]
  run_lengths: [2, 4]
  max_fits: 8
  search_seeds: [0]
  confirm_seeds: [10]
  clock: steps
trainer:
  accelerator: cpu
out: {tmp_path / 'out'}
wandb: false
""")
    result = main(["--config", str(config)])
    assert (tmp_path / "out" / "search.json").exists() and (tmp_path / "out" / "pareto.png").stat().st_size > 0
    assert "composer_bridge.AlgorithmEngineCallback" in (tmp_path / "out" / "recipe.yaml").read_text()
    assert len([f for f in result.fits if f.phase == "search"]) <= 8
    assert torch.equal(torch.tensor([f.quality for f in result.fits]),
                       torch.tensor([f["quality"] for f in json.loads((tmp_path / "out" / "search.json").read_text())["fits"]]))
    assert [asdict(f) for f in result.fits] == json.loads((tmp_path / "out" / "search.json").read_text())["fits"]


def test_outputs_are_written(searched, tmp_path) -> None:
    result, _, _ = searched
    paths = result.write(tmp_path, wandb=False)
    assert Path(paths["pareto.png"]).read_bytes()[:4] == b"\x89PNG"
    fits = Path(paths["fits.md"]).read_text().splitlines()
    assert len(fits) == 2 + len(result.fits)
    namespace: dict = {}
    exec(Path(paths["recipe.py"]).read_text(), namespace)  # the code runs and builds the recipe
    assert [type(a).__name__ for a in namespace["algorithms"]] == ["GradientClipping"]


def test_the_docstring_examples_run() -> None:
    import doctest
    import importlib

    for name in ("scoring", "candidates", "checks", "report", "state", "trial", "__main__"):
        module = importlib.import_module(f"composer_bridge.search.{name}")
        assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0, name
    import composer_bridge.data

    assert doctest.testmod(composer_bridge.data).failed == 0


def test_the_example_runs_a_quick_search_and_logs_the_table_to_wandb_offline(tmp_path, capsys) -> None:
    from helpers.support import load_script

    example = load_script("examples/search.py", "search_example_under_test")
    result = example.main(["--quick", "--no-progress", "--out", str(tmp_path), "--confirm-seeds", "1000", "1001"])
    assert "published mild" in capsys.readouterr().out and (tmp_path / "pareto.png").exists()
    assert json.loads((tmp_path / "search.json").read_text())["settings"]["run_lengths"] == [2, 4]
    assert set(result.also_confirmed) == {"published mild"}
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0  # a real W&B offline run, written by wandb itself
