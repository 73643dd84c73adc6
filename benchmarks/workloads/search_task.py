"""The recipe search on one workload, as the benchmark runs it: on the target seeds only, one fit at a time.

The search decides on the first two target seeds, checks a step's best on a third (its finalist seed) and
confirms on three more (never on a held-out seed); the proxy search does the same at a fraction of every run
length and confirms at full size on one seed,
with its default candidates and the published recipes that apply as its starting recipes, timed in
CPU seconds; its state lives in ``<out>/search_<workload>/`` so it resumes. Its pick then trains on
the held-out seeds like every other configuration (:mod:`workloads.plan`).

Examples:
    >>> from workloads.plan import SearchSpec
    >>> SearchSpec("vit", 1e-3, (10, 20), (10, 11), (12,)).key
    'vit|search|0.001|[10, 20]|[10, 11]'
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import time
from pathlib import Path
from typing import Any

from workloads.configs import as_spec
from workloads.plan import SearchSpec

__all__ = ["run_search", "state_folder"]


def state_folder(spec: SearchSpec, folder: Path) -> Path:
    """Where the search of ``spec`` keeps its state under ``folder``: ``search_<workload>[_proxy][_screen][_<method>][_<revision>]``."""
    # the folders of the quarter-length proxy were named before other shares were measured: they keep that name
    proxy = "" if not spec.proxy_fraction else "_proxy" + ("" if spec.proxy_fraction == 0.25 else f"{spec.proxy_fraction:g}")
    name = f"search_{spec.workload}{proxy}" + ("_screen" if spec.screen else "") + (f"_{spec.method}" if spec.method else "")
    return Path(folder) / (name + (f"_{spec.revision}" if spec.revision else ""))


def run_search(spec: SearchSpec, folder: Path) -> dict[str, Any]:
    """Run the search of ``spec``; return its record (the pick as ``(class name, kwargs)`` pairs, its cost)."""
    import workloads
    from composer_bridge.search import Proxy, search_recipe

    workload = workloads.load(spec.workload)
    started = time.perf_counter()
    record: dict[str, Any] = {
        "key": spec.key, "kind": "search", "workload": spec.workload, "lr": spec.lr,
        "run_lengths": list(spec.run_lengths), "search_seeds": list(spec.search_seeds),
        "confirm_seeds": list(spec.confirm_seeds), "finalist_seeds": list(spec.finalist_seeds),
        "budget_seconds": spec.budget_seconds, "budget_runs": spec.budget_runs, "screen": spec.screen, "error": None}
    proxy = Proxy.shorter(spec.run_lengths, spec.proxy_fraction) if spec.proxy_fraction else None
    before = dataclasses.replace(spec, revision="") if spec.revision else dataclasses.replace(spec, method="")
    previous, state = state_folder(before, folder), state_folder(spec, folder)
    if state != previous and not state.exists() and previous.exists():
        # the previous revision's fits, trained by the same code, are read instead of trained again
        shutil.copytree(previous, state)
    extra: dict[str, Any] = {"method": "greedy"}  # the revisions before "prescribe" are the greedy search's
    if spec.method == "prescribe":
        extra = {"method": "prescribe", "target": spec.target}
    try:
        result = search_recipe(
            functools.partial(workload.make_module, lr=spec.lr), workload.make_data, monitor=workload.monitor,
            mode=workload.mode, run_lengths=list(spec.run_lengths), search_seeds=list(spec.search_seeds),
            confirm_seeds=list(spec.confirm_seeds), trainer_kwargs={"accelerator": "cpu", "devices": 1},
            state_dir=state, progress=False, proxy=proxy,
            finalist_seeds=list(spec.finalist_seeds) if spec.finalist_seeds else None, screen=spec.screen,
            **extra, **spec.search_kwargs)
    except Exception as error:  # noqa: BLE001 - the benchmark goes on without this search; its reason is kept
        return {**record, "recipe": None, "error": f"{type(error).__name__}: {error}"[:2000],
                "wall_s": round(time.perf_counter() - started, 2)}
    confirmed = result.confirmed
    return {
        **record,
        "recipe": [list(pair) for pair in as_spec(result.recipe)],
        "labels": [c.label for c in result.recipe],
        "search_score": result.search_score,
        "confirmed_mean": None if confirmed is None else confirmed.mean,
        "confirmed_per_seed": None if confirmed is None else list(confirmed.per_seed),
        "estimate": None if result.estimate is None else result.estimate.as_dict(),
        "runner_up": [c.label for c in result.runner_up],
        "runner_up_confirmed": None if result.runner_up_confirmed is None else result.runner_up_confirmed.mean,
        "proxy": None if proxy is None else {"fraction": spec.proxy_fraction, "run_lengths": list(proxy.run_lengths)},
        "cost": {k: v for k, v in result.cost.items() if isinstance(v, (int, float, str, type(None)))},
        "decisions": list(result.steps), "wall_s": round(time.perf_counter() - started, 2),
        # the run length the pick trains for on the held-out seeds: the prescription's (as handed over)
        "steps": None if result.prescription is None else result.prescription.steps,
        "prescription": None if result.prescription is None else result.prescription.as_dict(),
    }
