"""The main demo: the same small ResNet on scikit-learn's digits, trained twice with the same seed.

    python examples/demo.py                  # baseline vs. the "mild" recipe, W&B offline
    python examples/demo.py --recipe medium  # or "hot"
    python examples/demo.py --wandb-online   # log to your W&B account (after `wandb login`)

Run 1 is a plain Lightning run; run 2 adds one callback, ``AlgorithmEngineCallback``, with a
Composer recipe (``examples/vision.py`` says how it is adapted to 8x8 digits). Both validate
after every epoch. The demo prints each run's accuracy and time, the speed-up to the baseline's
accuracy (the baseline's training time divided by the time at which the recipe run first
validated at the baseline's final accuracy or better), the callback's plan (which algorithm
runs at which event, in which order) and its cost report (time spent inside each algorithm).
It writes ``outputs/demo_accuracy.png`` (the two accuracy curves against training time) and
logs both runs to W&B in offline mode under ``outputs/wandb`` (``wandb sync`` uploads them later).

Training time leaves out validation; the first few steps of a throw-away run warm up PyTorch
before anything is timed. The runs choose ``accelerator="auto"``: a GPU or TPU is used when
present. On CPU it uses one PyTorch thread (``--threads``); on 2 CPU cores the demo takes
about 30 seconds (a minute while other programs load the cores).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vision  # noqa: E402  (examples/vision.py: the training code shared with the benchmark)


def make_logger(name: str, args: argparse.Namespace) -> Any:
    """A WandbLogger (offline unless ``--wandb-online``), or no logger with ``--no-wandb``."""
    if args.no_wandb:
        return False
    from lightning.pytorch.loggers import WandbLogger

    save_dir = Path(args.out) / "wandb"
    save_dir.mkdir(parents=True, exist_ok=True)
    return WandbLogger(project="composer-bridge-demo", name=name, group=f"seed{args.seed}",
                       save_dir=str(args.out), offline=not args.wandb_online)


def finish_wandb(logger: Any) -> None:
    if logger:
        import wandb

        wandb.finish()


def plot(baseline: vision.RunResult, recipe: vision.RunResult, reach: float | None, path: Path) -> None:
    """Validation accuracy against training seconds for both runs: the whole range, and the last 5%."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120)
    for ax, low in zip(axes, (0.0, 0.95), strict=True):
        for run, colour, label in ((baseline, "#7f7f7f", "baseline"), (recipe, "#d62728", f"recipe: {recipe.recipe}")):
            xs = [0.0] + [p.seconds for p in run.points]
            ys = [0.1] + [p.acc for p in run.points]
            ax.plot(xs, ys, marker="o", markersize=3, color=colour, label=label)
        ax.axhline(baseline.final_acc, color="#7f7f7f", linestyle=":", linewidth=1,
                   label=f"baseline final accuracy ({baseline.final_acc:.4f})")
        if reach is not None:
            ax.axvline(reach, color="#d62728", linestyle="--", linewidth=1,
                       label=f"recipe reaches it: {baseline.train_seconds / reach:.2f}x sooner")
        ax.set_xlabel("training time (s, validation excluded)")
        ax.set_ylim(low, 1.0 + (1.0 - low) * 0.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation accuracy")
    axes[0].set_title("ResNetCNN on scikit-learn digits")
    axes[1].set_title("the last 5%")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", choices=vision.RECIPES[1:], default="mild")
    parser.add_argument("--max-epochs", type=int, default=12)
    parser.add_argument("--max-steps", type=int, default=-1, help="stop each run after this many steps (tests)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--threads", type=int, default=1,
                        help="PyTorch CPU threads (default 1; 0 keeps PyTorch's default of one per core)")
    parser.add_argument("--out", default="outputs", help="folder for the PNG and the W&B files")
    parser.add_argument("--wandb-online", action="store_true", help="log to W&B online (needs `wandb login`)")
    parser.add_argument("--no-wandb", action="store_true", help="do not log to W&B at all")
    parser.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)

    os.environ.setdefault("WANDB_SILENT", "true")
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*smaller than the logging interval.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    if args.threads > 0:
        # This model is too small to gain much from more threads on CPU, and one thread keeps the
        # timings steady when other programs share the cores (several threads then slow down a lot).
        import torch

        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    # Warm-up (not timed): the first steps of any process pay for PyTorch's lazy initialisation.
    vision.train("none", max_steps=2, accelerator=args.accelerator, limit_val_batches=0)

    common = dict(seed=args.seed, max_epochs=args.max_epochs, max_steps=args.max_steps,
                  batch_size=args.batch_size, accelerator=args.accelerator,
                  enable_progress_bar=not args.no_progress_bar)
    print(f"\n[1/2] baseline: ResNetCNN, {args.max_epochs} epochs, batch {args.batch_size}, seed {args.seed}")
    logger = make_logger("baseline", args)
    baseline = vision.train("none", logger=logger, **common)
    finish_wandb(logger)

    algorithms = vision.recipe_algorithms(args.recipe)
    print(f"\n[2/2] recipe {args.recipe!r}: " + ", ".join(type(a).__name__ for a in algorithms))
    logger = make_logger(f"recipe-{args.recipe}", args)
    recipe = vision.train(args.recipe, algorithms=algorithms, logger=logger, **common)
    finish_wandb(logger)

    target = baseline.final_acc
    reach = recipe.time_to_reach(target)
    own = baseline.time_to_reach(target)
    speedup = baseline.train_seconds / reach if reach else None
    print("\n" + "=" * 78)
    print(f"{'run':<16}{'final val acc':>14}{'training s':>12}{'wall s':>9}")
    for run, name in ((baseline, "baseline"), (recipe, f"recipe {args.recipe}")):
        print(f"{name:<16}{run.final_acc:>14.4f}{run.train_seconds:>12.1f}{run.wall_seconds:>9.1f}")
    print("-" * 78)
    if reach is not None:
        print(f"Speed-up to the baseline's accuracy ({target:.4f}): {speedup:.2f}x  "
              f"(recipe reached it after {reach:.1f} s of training; the baseline trained {baseline.train_seconds:.1f} s)")
        reach_cpu = recipe.time_to_reach(target, cpu=True)
        if reach_cpu:
            print(f"  By CPU time (steadier on a shared machine): {baseline.train_cpu_seconds / reach_cpu:.2f}x")
        if own is not None and own < baseline.train_seconds:
            print(f"  The baseline itself first validated at that accuracy after {own:.1f} s "
                  f"({own / reach:.2f}x the recipe's time).")
    else:
        print(f"The recipe did not reach the baseline's final accuracy ({target:.4f}) in {args.max_epochs} epochs "
              f"(it ended at {recipe.final_acc:.4f}).")
    accuracy_change = recipe.final_acc - baseline.final_acc
    print(f"Final accuracy, recipe minus baseline: {accuracy_change:+.4f}")

    callback = recipe.callback
    if callback is not None:
        print("\nThe callback's plan (order of the algorithms at each event):")
        print(callback.plan())
        print("\nCost report (wall time inside each algorithm's apply):")
        print(callback.cost_report())

    png = out / "demo_accuracy.png"
    plot(baseline, recipe, reach, png)
    print(f"\nAccuracy curves: {png}")
    if not args.no_wandb:
        where = "online (see the run links above)" if args.wandb_online else \
            f"offline in {out / 'wandb'} (upload with: wandb sync {out / 'wandb'}/offline-run-*)"
        print(f"W&B runs: {where}")
    print(f"Total demo time: {time.perf_counter() - started:.0f} s")
    return {"baseline": baseline, "recipe": recipe, "speedup": speedup, "png": png}


if __name__ == "__main__":
    main()
