"""Time to accuracy: the vision example's baseline against each recipe, over several seeds, in one run.

For every seed, the baseline (no algorithm) and each recipe of ``examples/vision.py`` train the
same ResNetCNN on scikit-learn's digits with the same data order and initial weights, validating
after every epoch. For each recipe run we record

- its final validation accuracy, and the difference to the same seed's baseline;
- the training time at which it first validated at the baseline's final accuracy or better;
- the **speed-up**: the baseline's training time divided by that time (Composer's convention:
  the baseline trains for its fixed budget), and the **strict speed-up**: the time the baseline
  itself first validated at that accuracy, divided by the recipe's time.

Training time leaves validation out. Both wall time and the process's CPU time are measured:
on a machine shared with other jobs, CPU time of a single-threaded run is the steadier measure of
the work done, so ``--threads 1`` (the default) with CPU time is what the table leads with.
Runs are interleaved seed by seed so a busy moment of the machine hits all recipes alike.

    python benchmarks/time_to_accuracy.py                       # 3 seeds, 12 epochs, all recipes
    python benchmarks/time_to_accuracy.py --seeds 5 --recipes mild --threads 2

Prints a Markdown table (and writes it to ``--markdown`` if given).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import vision  # noqa: E402  (examples/vision.py)


def _mean_sd(values: list[float], fmt: str, suffix: str = "") -> str:
    """``mean ± standard deviation`` (the deviation unsigned), or ``—`` for no values."""
    if not values:
        return "—"
    if len(values) == 1:
        return format(values[0], fmt) + suffix
    spread = format(statistics.stdev(values), fmt.replace("+", ""))
    return f"{format(statistics.mean(values), fmt)} ± {spread}{suffix}"


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            cpu = names[0]
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, "
            f"{torch.get_num_threads()} intra-op thread(s), Python {platform.python_version()}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-epochs", type=int, default=12)
    parser.add_argument("--max-steps", type=int, default=-1, help="for smoke tests")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--recipes", default="mild,medium,hot", help="comma-separated, from mild, medium, hot")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: leave PyTorch's default)")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--markdown", default=None, help="also write the table to this file")
    parser.add_argument("--json", default=None, help="write every run's numbers to this file")
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    names = [r.strip() for r in args.recipes.split(",") if r.strip()]
    for name in names:
        if name not in vision.RECIPES[1:]:
            parser.error(f"--recipes: unknown recipe {name!r}; choose from {vision.RECIPES[1:]}")

    common = dict(max_epochs=args.max_epochs, max_steps=args.max_steps, batch_size=args.batch_size,
                  accelerator=args.accelerator, precision=args.precision)
    vision.train("none", max_steps=2, limit_val_batches=0, accelerator=args.accelerator)  # warm-up
    started = time.perf_counter()
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    baselines: list[dict[str, Any]] = []
    for seed in range(args.seeds):
        base = vision.train("none", seed=seed, **common)
        baselines.append({"seed": seed, "final_acc": base.final_acc, "train_s": base.train_seconds,
                          "train_cpu_s": base.train_cpu_seconds, "points": [list(p) for p in base.points]})
        print(f"seed {seed} baseline: acc {base.final_acc:.4f}, {base.train_seconds:.1f} s "
              f"({base.train_cpu_seconds:.1f} CPU s)", flush=True)
        for name in names:
            run = vision.train(name, seed=seed, **common)
            target = base.final_acc
            row = {"seed": seed, "final_acc": run.final_acc, "delta_acc": run.final_acc - target,
                   "train_s": run.train_seconds, "train_cpu_s": run.train_cpu_seconds,
                   "points": [list(p) for p in run.points]}
            for unit, cpu in (("wall", False), ("cpu", True)):
                reach = run.time_to_reach(target, cpu=cpu)
                own = base.time_to_reach(target, cpu=cpu)
                budget = base.train_cpu_seconds if cpu else base.train_seconds
                row[f"reach_{unit}_s"] = reach
                row[f"speedup_{unit}"] = budget / reach if reach else None
                row[f"strict_speedup_{unit}"] = own / reach if reach and own else None
            rows[name].append(row)
            print(f"  {name:<7} acc {run.final_acc:.4f} ({row['delta_acc']:+.4f}), {run.train_seconds:.1f} s "
                  f"({run.train_cpu_seconds:.1f} CPU s), speed-up {row['speedup_cpu'] or 0:.2f}x CPU / "
                  f"{row['speedup_wall'] or 0:.2f}x wall", flush=True)
    elapsed = time.perf_counter() - started

    base_acc = [b["final_acc"] for b in baselines]
    lines = [
        f"{args.seeds} seeds, {args.max_epochs} epochs, batch {args.batch_size}; machine: {_machine()}; "
        f"benchmark wall time {elapsed / 60:.1f} min.",
        "",
        "| recipe | final accuracy | Δ accuracy vs baseline | reached baseline accuracy | speed-up (CPU time) "
        "| speed-up (wall time) | strict speed-up (CPU) | training CPU s |",
        "|---|---|---|---|---|---|---|---|",
        f"| baseline | {_mean_sd(base_acc, '.4f')} | — | — | 1.00x | 1.00x | 1.00x | "
        f"{_mean_sd([b['train_cpu_s'] for b in baselines], '.1f')} |",
    ]
    for name in names:
        runs = rows[name]
        reached = [r for r in runs if r["speedup_cpu"]]
        lines.append(
            f"| {name} | {_mean_sd([r['final_acc'] for r in runs], '.4f')} "
            f"| {_mean_sd([r['delta_acc'] for r in runs], '+.4f')} | {len(reached)}/{len(runs)} seeds "
            f"| {_mean_sd([r['speedup_cpu'] for r in reached], '.2f', 'x')} "
            f"| {_mean_sd([r['speedup_wall'] for r in runs if r['speedup_wall']], '.2f', 'x')} "
            f"| {_mean_sd([r['strict_speedup_cpu'] for r in reached if r['strict_speedup_cpu']], '.2f', 'x')} "
            f"| {_mean_sd([r['train_cpu_s'] for r in runs], '.1f')} |"
        )
    table = "\n".join(lines)
    print("\n" + table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"baselines": baselines, "recipes": rows, "machine": _machine()}, f, indent=1)
    return {"baselines": baselines, "recipes": rows, "table": table}


if __name__ == "__main__":
    main()
