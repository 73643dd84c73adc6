"""Where the search's fits run, without Ray: the in-process executor, a fit in its own child process
(multi-process Trainers, faults), the state file's atomic writes, and bad input before training."""

from __future__ import annotations

import functools
import json
import math
import os
import sys

import pytest
from helpers import search_support as task
from helpers.search_faults import KillingFactory

from composer_bridge.search import SearchInputError, search_recipe
from composer_bridge.search.executor import FitTask, InProcessExecutor, execute, needs_own_launcher
from composer_bridge.search.fit_process import run_in_child
from composer_bridge.search.state import SearchState
from composer_bridge.search.trial import FitRecord

make_module = functools.partial(task.make_module, lr=1.0)
CPU = {"accelerator": "cpu", "devices": 1}
DDP = {"accelerator": "cpu", "devices": 2, "strategy": "ddp"}


def _task(factory=make_module, steps: int = 4, trainer_kwargs=None) -> FitTask:
    return FitTask(factory, task.make_data, [], steps, 0, "val/acc", "steps", dict(trainer_kwargs or CPU))


def test_a_fit_in_a_child_process_equals_the_same_fit_here() -> None:
    here = execute(_task())
    child = run_in_child(_task())
    assert child.error is None
    assert (child.quality, child.seconds) == (here.quality, here.seconds) == (here.quality, 4.0)
    assert child.processes == here.processes == 1


def test_a_killed_child_is_retried_once_then_recorded_as_failed(tmp_path) -> None:
    marker = tmp_path / "killed"
    once = run_in_child(_task(KillingFactory(4, str(marker), make_module)))
    assert marker.exists() and once.error is None
    assert once.quality == execute(_task()).quality  # the retry is the same fit
    always = run_in_child(_task(KillingFactory(4, None, make_module)))
    assert math.isnan(always.quality)
    assert "failed 2 times" in always.error and always.error.count("killed by signal 9") == 2


def test_which_trainer_settings_get_their_own_launcher() -> None:
    assert needs_own_launcher(DDP) and needs_own_launcher({"devices": 2, "accelerator": "cpu"})
    assert needs_own_launcher({"devices": "2", "accelerator": "cpu"}) and needs_own_launcher({"num_nodes": 2})
    assert not needs_own_launcher(CPU) and not needs_own_launcher({"accelerator": "cpu"})
    assert not needs_own_launcher({**DDP, "strategy": "ddp_spawn"})


@pytest.mark.timeout(600)
def test_a_search_whose_fits_use_ddp_on_two_processes_finishes(tmp_path) -> None:
    # The default search, one search seed, one candidate, two run lengths, no confirmation: each of its four fits
    # (your run, the race seed's baseline, the candidate, the shorter baseline) is a two-process gloo DDP run in a
    # child.
    kwargs = task.search_kwargs(candidates=["LabelSmoothing"], run_lengths=[2, 4], search_seeds=[0],
                                confirm_seeds=[], trainer_kwargs=DDP)
    del kwargs["max_fits"]
    result = search_recipe(make_module, task.make_data, state_dir=tmp_path, **kwargs)
    assert len(result.fits) >= 3 and all(f.error is None and f.processes == 2 for f in result.fits)
    # each fit's clock counted the global steps it trained (both ranks), to the validation it stopped at
    assert all(f.points and f.seconds == f.points[-1][1] == f.points[-1][0] for f in result.fits)
    first = result.fits[0]  # your run, trained to its end (global steps of both ranks: the steps clock)
    assert first.seconds == first.steps
    # The search's DDP fit is the same fit as the DDP run of that task on its own, outside the search.
    alone = run_in_child(_task(steps=first.steps, trainer_kwargs=DDP))
    assert alone.quality == first.quality and alone.processes == 2
    assert not list(tmp_path.glob("*.tmp"))  # no temporary state file left behind


def test_a_factory_a_child_process_cannot_import_is_refused_before_training(tmp_path) -> None:
    counted = []

    def local_factory(total_steps: int):
        counted.append(total_steps)
        return make_module(total_steps)

    kwargs = task.search_kwargs(trainer_kwargs=DDP, run_lengths=[2, 4])
    with pytest.raises(SearchInputError, match="define it at module level|Define it at module level"):
        search_recipe(local_factory, task.make_data, state_dir=tmp_path, **kwargs, method="greedy")
    with pytest.raises(SearchInputError, match="lambda"):
        search_recipe(lambda n: make_module(n), task.make_data, state_dir=tmp_path, **kwargs, method="greedy")
    assert not (tmp_path / "search.json").exists()


def test_the_ray_executor_without_ray_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as where it is not installed
    with pytest.raises(SearchInputError, match=r"composer-bridge\[ray\]"):
        search_recipe(make_module, task.make_data, executor="ray", **task.search_kwargs(), method="greedy")


def test_an_unknown_executor_is_refused() -> None:
    with pytest.raises(SearchInputError, match="executor='threads'"):
        search_recipe(make_module, task.make_data, executor="threads", **task.search_kwargs(), method="greedy")


def test_the_state_file_is_replaced_atomically_and_never_left_half_written(tmp_path, monkeypatch) -> None:
    path = tmp_path / "search.json"
    state = SearchState(path, {"monitor": "val/acc"})
    state.fits.append(FitRecord([], 0, 2, 0.5, 2.0, 0.1, 0.1, "search"))
    state.save()
    before = path.read_bytes()
    state.fits.append(FitRecord(["MixUp"], 0, 2, math.nan, 0.0, 0.0, 0.0, "search", error="killed"))

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt("interrupted while writing")

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        state.save()
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["search.json"]
    monkeypatch.undo()
    state.save()
    again = SearchState(path, {"monitor": "val/acc"})
    assert [f.error for f in again.fits] == [None, "killed"] and math.isnan(again.fits[1].quality)
    assert json.loads(path.read_text())["fits"][0]["quality"] == 0.5


def test_the_in_process_executor_runs_fits_in_the_order_submitted() -> None:
    executor = InProcessExecutor()
    tickets = [executor.submit(_task(steps=n)) for n in (2, 4)]
    done = [executor.next_done() for _ in tickets]
    assert [t for t, _ in done] == tickets and [o.seconds for _, o in done] == [2.0, 4.0]
    assert executor.pending() == 0 and not executor.concurrent
