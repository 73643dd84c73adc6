"""The search on Ray: a local Ray with 2 CPUs started by these tests, tiny fits side by side.

With ``clock="steps"`` the parallel search must take the sequential search's path exactly: the same
fits (any order), the same steps and the same recipe and confirmation.
"""

from __future__ import annotations

import functools
import json

import pytest
from helpers import search_support as task
from helpers.search_faults import KillingFactory, RaisingFactory

from composer_bridge.search import RayExecutor, SearchInputError, search_recipe

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.timeout(900)

make_module = functools.partial(task.make_module, lr=3.0)
KWARGS = task.search_kwargs(candidates=["LabelSmoothing", "MixUp", task.CLIP], confirm_seeds=[10, 11])


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _rows(result) -> list[tuple]:
    return sorted((f.phase, tuple(f.config), f.seed, f.steps, f.quality, f.seconds) for f in result.fits)


@pytest.fixture(scope="module")
def sequential(tmp_path_factory):
    state = tmp_path_factory.mktemp("sequential")
    result = search_recipe(make_module, task.make_data, state_dir=state, **KWARGS, method="greedy")
    result.trained = len(json.loads((state / "search.json").read_text())["fits"])
    return result


def _parallel(state_dir, factory=make_module, **overrides):
    return search_recipe(factory, task.make_data, state_dir=state_dir,
                         executor=RayExecutor(cpus_per_fit=1), **{**KWARGS, **overrides}, method="greedy")


def test_the_search_on_ray_takes_the_sequential_path_and_picks_the_same_recipe(local_ray, sequential, tmp_path) -> None:
    parallel = _parallel(tmp_path)
    assert [c.label for c in parallel.recipe] == [c.label for c in sequential.recipe] == ["Clip"]
    assert parallel.steps == sequential.steps
    assert _rows(parallel) == _rows(sequential)
    assert parallel.confirmed == sequential.confirmed and parallel.search_score == sequential.search_score
    # Side by side, yet no fit more than one at a time: a curve's next run length waited for its shorter ones.
    assert parallel.cost["fits_trained_now"] == sequential.trained


class WatchedRay(RayExecutor):
    """A RayExecutor that notes each candidate fit submitted while a shorter fit of the same curve was training,
    and the order of every fit submitted."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.training: dict[int, tuple] = {}
        self.ahead: list[tuple] = []
        self.order: list[tuple] = []

    def submit(self, task) -> int:
        ticket = super().submit(task)
        curve = (tuple(c.label for c in task.candidates), task.seed)
        self.order.append((*curve, task.steps))
        if curve[0] and any(c == curve and steps < task.steps for c, steps in self.training.values()):
            self.ahead.append((*curve, task.steps))
        self.training[ticket] = (curve, task.steps)
        return ticket

    def next_done(self):
        ticket, outcome = super().next_done()
        del self.training[ticket]
        return ticket, outcome


def test_a_speculating_search_decides_as_the_sequential_one_and_reports_what_it_trained_ahead(
        local_ray, sequential, tmp_path) -> None:
    # Idle workers train the next run length before the shorter run says whether it is needed: the same
    # fits read, the same decisions; any fit no decision read is in the cost, apart.
    watched = WatchedRay(cpus_per_fit=1, speculate=True)
    parallel = search_recipe(make_module, task.make_data, state_dir=tmp_path, executor=watched, **KWARGS, method="greedy")
    assert parallel.steps == sequential.steps and _rows(parallel) == _rows(sequential)
    assert parallel.confirmed == sequential.confirmed
    # idle workers trained something early: a curve's next run length, or the confirmation's baselines
    last_search_fit = max(i for i, (_, seed, _) in enumerate(watched.order) if seed in KWARGS["search_seeds"])
    assert watched.ahead or any(seed in KWARGS["confirm_seeds"] for _, seed, _ in watched.order[:last_search_fit])
    trained = len(json.loads((tmp_path / "search.json").read_text())["fits"])
    assert trained == parallel.cost["fits_trained_now"] >= sequential.trained
    assert parallel.cost["search_unread_fits"] == trained - len(parallel.fits)
    # without speculate, a curve's next run length never starts before its shorter one is back
    plain = WatchedRay(cpus_per_fit=1)
    search_recipe(make_module, task.make_data, state_dir=tmp_path / "plain", executor=plain, **KWARGS, method="greedy")
    assert plain.ahead == []


def test_with_recipes_to_confirm_idle_workers_train_the_confirmations_baselines_during_the_search(
        local_ray, tmp_path) -> None:
    # The baselines on the confirmation seeds are certain to be read when a recipe is to be confirmed: a
    # speculating search starts them while the search's own fits leave a worker free, and decides as the
    # sequential search does.
    kwargs = {**KWARGS, "also_confirm": {"ls": ["LabelSmoothing"]}}
    alone = search_recipe(make_module, task.make_data, state_dir=tmp_path / "alone", **kwargs, method="greedy")
    watched = WatchedRay(cpus_per_fit=1, speculate=True)
    parallel = search_recipe(make_module, task.make_data, state_dir=tmp_path / "ray", executor=watched, **kwargs, method="greedy")
    assert parallel.steps == alone.steps and _rows(parallel) == _rows(alone)
    assert parallel.confirmed == alone.confirmed and parallel.also_confirmed == alone.also_confirmed
    search_seeds, confirm_seeds = KWARGS["search_seeds"], KWARGS["confirm_seeds"]
    last_search_fit = max(i for i, (config, seed, _) in enumerate(watched.order) if seed in search_seeds)
    early = [(seed, steps) for config, seed, steps in watched.order[:last_search_fit] if seed in confirm_seeds]
    assert early and all(config == () for config, seed, _ in watched.order[:last_search_fit] if seed in confirm_seeds)
    assert len(watched.order) == len(set(watched.order))  # no fit trained twice
    assert parallel.cost["search_unread_fits"] == len(watched.order) - len(parallel.fits)


def test_a_killed_worker_is_retried_and_the_search_ends_as_without_the_kill(local_ray, sequential, tmp_path) -> None:
    marker = tmp_path / "killed"
    result = _parallel(tmp_path / "state", KillingFactory(8, str(marker), make_module))
    assert marker.exists()  # a worker was killed mid-search
    assert all(f.error is None for f in result.fits)
    assert _rows(result) == _rows(sequential) and result.steps == sequential.steps


def test_a_fit_whose_worker_dies_twice_is_recorded_as_failed_and_the_search_goes_on(local_ray, tmp_path) -> None:
    # Every 8-step fit kills its worker: those fits fail, twice each; the curves go on without them.
    result = _parallel(tmp_path, KillingFactory(8, None, make_module), candidates=["LabelSmoothing", "MixUp"],
                       confirm_seeds=[10])
    failed = [f for f in result.fits if f.error]
    assert failed and all(f.steps == 8 for f in failed)
    assert all("died 2 times" in f.error for f in failed)
    assert all(f.error is None for f in result.fits if f.steps != 8)
    assert result.confirmed is None or result.confirmed.seeds == (10,)
    assert result.table().count("failed (the Ray worker died 2 times") == len(failed)
    saved = json.loads((tmp_path / "search.json").read_text())
    assert {tuple(f["config"]) for f in saved["fits"] if f["error"]} == {tuple(f.config) for f in failed}


def test_an_interrupted_parallel_search_resumes_without_retraining_finished_fits(local_ray, sequential,
                                                                                 tmp_path) -> None:
    done = _parallel(tmp_path)
    state = json.loads((tmp_path / "search.json").read_text())
    kept = 9  # as if the driver had been killed after nine fits had finished
    state["fits"] = state["fits"][:kept]
    (tmp_path / "search.json").write_text(json.dumps(state))
    resumed = _parallel(tmp_path)
    assert _rows(resumed) == _rows(done) == _rows(sequential)
    assert resumed.cost["fits_trained_now"] == len(json.loads((tmp_path / "search.json").read_text())["fits"]) - kept


def test_a_search_whose_fits_use_ddp_on_two_processes_finishes_on_ray(local_ray, tmp_path) -> None:
    ddp = {"accelerator": "cpu", "devices": 2, "strategy": "ddp"}
    kwargs = {**KWARGS, "candidates": ["LabelSmoothing"], "run_lengths": [2, 4], "max_fits": 4,
              "search_seeds": [0], "confirm_seeds": [10], "trainer_kwargs": ddp}
    executor = RayExecutor()
    assert executor.resources(ddp) == (2.0, 0.0)  # one core per DDP process
    result = search_recipe(make_module, task.make_data, state_dir=tmp_path, executor=executor, **kwargs, method="greedy")
    assert result.fits and all(f.error is None and f.seconds == f.steps and f.processes == 2 for f in result.fits)


def test_an_error_of_the_users_code_that_cannot_be_pickled_stops_the_search_with_its_message(local_ray,
                                                                                          tmp_path) -> None:
    # not "the worker died": the user's error, as its text, and the search stops as it would without Ray
    with pytest.raises(RuntimeError, match="(?s)could not be sent back from its Ray worker.*UnpicklableError: make_module: "
                                           "a bug in the user's code"):
        _parallel(tmp_path, RaisingFactory())


def test_bad_ray_input_is_refused_before_training(local_ray, tmp_path) -> None:
    with pytest.raises(SearchInputError, match="Define it at module level"):
        _parallel(tmp_path, lambda n: make_module(n))
    with pytest.raises(SearchInputError, match="3 cores and 0 GPUs.*largest machine of the Ray cluster has 2 cores"):
        search_recipe(make_module, task.make_data, state_dir=tmp_path, executor=RayExecutor(cpus_per_fit=3), **KWARGS, method="greedy")
    with pytest.raises(SearchInputError, match="speculate='yes': expected True or False"):
        RayExecutor(speculate="yes")
    assert not (tmp_path / "search.json").exists()


def test_an_unreachable_cluster_address_is_refused() -> None:
    with pytest.raises(SearchInputError, match="address='127.0.0.1:9'.*no Ray cluster answers"):
        search_recipe(make_module, task.make_data, executor=RayExecutor(address="127.0.0.1:9"), **KWARGS, method="greedy")


def test_the_command_runs_its_fits_on_ray(local_ray, tmp_path) -> None:
    from composer_bridge.search.__main__ import executor_from, main

    config = tmp_path / "search.yaml"
    config.write_text("""
module: {class_path: helpers.search_support.TinyModule, init_args: {lr: 1.0}}
data: {class_path: helpers.search_support.TinyData}
search: {monitor: val/acc, candidates: [LabelSmoothing, MixUp], run_lengths: [2, 4], max_fits: 8,
          search_seeds: [0], confirm_seeds: [10], clock: steps, progress: false}
trainer: {accelerator: cpu}
executor: {name: ray, cpus_per_fit: 1}
wandb: false
""")
    on_ray = main(["--config", str(config), "--out", str(tmp_path / "ray")])
    here = main(["--config", str(config), "--out", str(tmp_path / "here"), "--executor", "local"])
    assert _rows(on_ray) == _rows(here) and on_ray.steps == here.steps
    with pytest.raises(SearchInputError, match="executor: 'threads'"):
        executor_from("threads")
