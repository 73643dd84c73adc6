"""One small recipe search four ways: in this process, on Ray with one worker, on Ray with two workers,
and on Ray with two workers that speculate (``RayExecutor(speculate=True)``: an idle worker trains a
curve's next run length before its shorter run is back).

    python benchmarks/search_executors.py --out benchmarks/search_executors_cpu.json

The clock is ``"steps"``, so the four must make the same decisions and read the same fits (the
speculating one may train more: they are counted); what differs is the wall time. Ray is started by this script (``ray.init(num_cpus=workers)``, timed apart)
and each fit holds one core (``cpus_per_fit=1``, one torch thread). Ray's overhead per fit is the wall
time of the one-worker search minus the in-process search's, over the fits trained.

Needs ``pip install 'composer-bridge[ray]'``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from composer_bridge import ComposerClassifier
from composer_bridge.data import cluttered_digits_loaders
from composer_bridge.models import ResNetCNN
from composer_bridge.search import RayExecutor, search_recipe

SETTINGS: dict[str, Any] = dict(
    monitor="val/acc", mode="max", candidates=["LabelSmoothing", "MixUp", "CutOut", "ProgressiveResizing"],
    run_lengths=[10, 20, 40], max_fits=30, search_seeds=[0, 1], confirm_seeds=[1000, 1001], clock="steps",
    trainer_kwargs={"accelerator": "cpu", "devices": 1}, progress=False,
    starting_recipes={},  # the same small search as the recorded runs: no published recipes raced
)


def make_module(total_steps: int) -> ComposerClassifier:
    return ComposerClassifier(
        ResNetCNN(num_classes=10, in_channels=1, widths=(16, 32)), num_classes=10,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        scheduler=lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=total_steps))


def make_data(seed: int) -> Any:
    return cluttered_digits_loaders(batch_size=64, seed=seed, copies=1, train_per_class=40, test_per_class=20)


def run(executor: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as state:
        started = time.perf_counter()
        result = search_recipe(make_module, make_data, state_dir=state, executor=executor, **SETTINGS, method="greedy")
        wall = time.perf_counter() - started
    return {"wall_s": wall, "recipe": [c.label for c in result.recipe], "steps": result.steps,
            "fits": sorted([f.phase, f.config, f.seed, f.steps, f.quality] for f in result.fits),
            "fits_trained": result.cost["fits_trained_now"], "fits_unread": result.cost["search_unread_fits"],
            "fit_wall_sum_s": sum(f.fit_wall_s for f in result.fits)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/search_executors_cpu.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import ray

    runs: dict[str, Any] = {"load_average_before": os.getloadavg()}
    runs["in_process"] = run(None)
    for workers in (1, 2):
        started = time.perf_counter()
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        runs[f"ray_start_{workers}_s"] = time.perf_counter() - started
        runs[f"ray_{workers}"] = run(RayExecutor(cpus_per_fit=1))
        if workers == 2:
            runs["ray_2_speculate"] = run(RayExecutor(cpus_per_fit=1, speculate=True))
        ray.shutdown()
    runs["load_average_after"] = os.getloadavg()
    base, one, two, spec = runs["in_process"], runs["ray_1"], runs["ray_2"], runs["ray_2_speculate"]
    runs["same_decisions"] = (base["steps"] == one["steps"] == two["steps"] == spec["steps"]
                              and base["fits"] == one["fits"] == two["fits"] == spec["fits"])
    runs["wall_ratio_in_process_over_ray_2"] = base["wall_s"] / two["wall_s"]
    runs["wall_ratio_in_process_over_ray_2_speculate"] = base["wall_s"] / spec["wall_s"]
    runs["ray_overhead_per_fit_s"] = (one["wall_s"] - base["wall_s"]) / one["fits_trained"]
    runs["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, ray {ray.__version__}"
    runs["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    check=False).stdout.strip()
    runs["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    Path(args.out).write_text(json.dumps(runs, indent=1))
    for key in ("same_decisions", "wall_ratio_in_process_over_ray_2", "wall_ratio_in_process_over_ray_2_speculate",
                "ray_overhead_per_fit_s"):
        print(key, runs[key])
    for key in ("in_process", "ray_1", "ray_2", "ray_2_speculate"):
        print(key, f"{runs[key]['wall_s']:.1f} s wall, {runs[key]['fits_trained']} fits trained "
                   f"({runs[key]['fits_unread']} unread), recipe {runs[key]['recipe']}")
    print("load average", runs["load_average_before"], "->", runs["load_average_after"])


if __name__ == "__main__":
    main()
