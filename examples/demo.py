"""The main demo: does a Composer recipe reach the baseline's quality sooner? Three seeds, several run lengths.

    python examples/demo.py                  # about 1.5 minutes on 2 idle CPU cores, W&B offline
    python examples/demo.py --seeds 5        # more seeds (longer)
    python examples/demo.py --wandb-online   # log to your W&B account (after `wandb login`)

A speed-up claim from one run is a seed lottery, and one measured against a baseline budget
longer than the task needs is no speed-up at all. So the demo does what
``benchmarks/pareto.py`` does, smaller: it trains the baseline and a recipe at several run
lengths (each run's whole schedule scaled to its length), for several seeds, and compares final
quality against training time. For each seed the **strict speed-up** is the baseline's training
time to its own best quality Q divided by the recipe's time to Q (interpolated between run
lengths); a seed where the recipe never gets to Q is a failure.

1. **Language**: a character-level GPT on Python's standard-library source, 25/50/100 steps;
   quality = validation bits per character. Recipe: ``recipes.language("gpt-fast")`` (ALiBi,
   SeqLengthWarmup, GatedLinearUnits, gradient clipping) training on sequences a quarter as long
   (ALiBi's ``train_sequence_length_scaling=0.25``), evaluated at full length.
2. **Vision**: cluttered digits (``composer_bridge.data.cluttered_digits_loaders`` at 16x16: moved,
   rotated, cluttered and noisy digits, 1,000 training images) with a small ResNet, at 150, 300 and
   600 steps of 32 images: the baseline is far from its plateau at 150 and on it at 600. Recipe:
   ``recipes.vision("mild", total_steps=...)``. Its plan and cost report are printed. (On the 8x8
   digits, which a baseline learns to 0.99 in 92 steps, the same recipe never reached the baseline:
   a task too easy to gain anything from these methods; see ``docs/benchmarks.md``.)

Each line of progress is one finished curve (one configuration, one seed, every run length); the
verdicts print whatever the seeds give. The curves run in two worker processes side by side, one
torch thread each. Training time is each process's own CPU time with validation left out (on shared
cores it varies far less than wall time). The demo writes ``outputs/demo_language.png`` and
``outputs/demo_accuracy.png`` (quality against training time, mean ± sd over seeds) and logs a
baseline run and a recipe run to W&B in offline mode under ``outputs/wandb`` (``wandb sync``
uploads them later). ``docs/benchmarks.md`` has the full benchmark behind these numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing
import os
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmarks/pareto.py: the runs, speed-ups and plots

import pareto  # noqa: E402

LANGUAGE_BUDGETS = (25, 50, 100)  # optimizer steps (the first three of benchmarks/pareto.py)
VISION = pareto.VISION_SETUPS["cluttered"]  # cluttered digits at 16x16, batch 32
VISION_BUDGETS = VISION.budgets  # optimizer steps: 150 (far from the plateau), 300 (near it), 600 (on it)
LANGUAGE_RECIPE = "gpt-fast, short ALiBi"


def language_recipe(total_steps: int) -> list[Any]:
    """The language recipe of this demo, for a run of ``total_steps`` steps."""
    return pareto.language_recipe("gpt-fast", alibi={"train_sequence_length_scaling": 0.25})(total_steps)


def vision_train(config: str, algorithms: list[Any], steps: int, seed: int) -> pareto.Fit:
    """One cluttered-digits run of ``steps`` steps, its whole schedule scaled to them."""
    return pareto.vision_train(config, algorithms, steps, seed, setup=VISION)


class Curve(NamedTuple):
    """One configuration's runs at every budget for one seed, and the recipe's plan and cost report."""

    task: str
    config: str
    seed: int
    runs: list[pareto.Run]
    plan: str
    cost_report: str


def train_curve(task: str, config: str, seed: int, budgets: list[int], vision_recipe: str) -> Curve:
    """Every budget of one (task, configuration, seed), in a worker process (one torch thread)."""
    if task == "vision":
        build = (lambda steps: []) if config == "baseline" else pareto.vision_recipe(vision_recipe, VISION.image_size)
        train = vision_train
    else:
        build = (lambda steps: []) if config == "baseline" else language_recipe
        train = pareto.language_train
    runs = []
    for budget in budgets:
        fit = train(config, build(budget), budget, seed)
        runs.append(pareto.Run(task, config, budget, seed, fit.quality, fit.cpu_s, fit.wall_s, os.getloadavg()[0]))
    bridge = fit.bridge  # the longest run's
    return Curve(task, config, seed, runs, str(bridge.plan()) if bridge else "", str(bridge.cost_report()) if bridge else "")


def start_worker(threads: int) -> None:
    """Each worker's first steps pay for lazy initialisation: a short run of each task, not timed."""
    import torch

    _quiet()
    if threads > 0:
        torch.set_num_threads(threads)
    vision_train("warm-up", [], 2, 0)
    pareto.language_train("warm-up", [], 2, 0)


def _quiet() -> None:
    os.environ.setdefault("WANDB_SILENT", "true")
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


def verdict(task: dict[str, Any], runs: list[pareto.Run], recipe: str) -> dict[str, Any]:
    """Print the strict speed-up per seed and what it means; return the summary numbers."""
    summary = pareto.summarise(task, runs).speedups[recipe]
    per_seed = summary["per_seed"]
    seeds_text = ", ".join("never reached Q" if s is None else f"{s:.2f}x" for s in per_seed)
    print(f"  strict speed-up per seed: {seeds_text}")
    mean = summary["mean"]
    if summary["reached"] == len(per_seed) and mean is not None and min(per_seed) >= 1.0:
        print(f"  VERDICT: the recipe reaches the baseline's best quality sooner on every seed: "
              f"{mean:.2f}x on average (lowest seed {min(per_seed):.2f}x).")
    elif summary["reached"] == 0:
        print(f"  VERDICT: the recipe did not reach the baseline's best quality on any of the {len(per_seed)} seeds.")
    else:
        print(f"  VERDICT: mixed: the recipe reached the baseline's best quality on {summary['reached']} of "
              f"{len(per_seed)} seeds; mean strict speed-up {mean:.2f}x (failures count as 0x).")
    return summary


def seed_lines(runs: list[pareto.Run], recipe: str, higher_is_better: bool) -> None:
    """Per seed, where the strict speed-up comes from: Q, the baseline's time to it, the recipe's."""
    for seed in sorted({r.seed for r in runs}):
        curves = {config: sorted((r for r in runs if r.seed == seed and r.config == config), key=lambda r: r.budget)
                  for config in ("baseline", recipe)}
        speed, q, t_base, t_recipe = pareto.strict_speedup([(r.cpu_s, r.quality) for r in curves["baseline"]],
                                                           [(r.cpu_s, r.quality) for r in curves[recipe]],
                                                           higher_is_better)
        at = next(r.budget for r in curves["baseline"] if r.quality == q)
        head = f"  seed {seed}: Q = {q:.4f}, the baseline's best (at {at} steps), reached after {t_base:.1f} s of training; "
        if t_recipe is None:
            last = curves[recipe][-1]
            print(head + f"the recipe never reached it (it ended at {last.quality:.4f} after {last.budget} steps)")
        else:
            print(head + f"the recipe reached it after {t_recipe:.1f} s: {speed:.2f}x")


def log_to_wandb(args: argparse.Namespace, runs: list[pareto.Run], summaries: dict[str, Any], pngs: list[Path]) -> None:
    """Two W&B runs, the baseline's and the recipes', each with every (task, budget, seed) point."""
    import wandb

    for name in ("baseline", "recipe"):
        run = wandb.init(project="composer-bridge-demo", name=name, dir=str(args.out), reinit="finish_previous",
                         mode="online" if args.wandb_online else "offline",
                         config={"seeds": args.seeds, "language_recipe": LANGUAGE_RECIPE, "vision_recipe": args.recipe})
        mine = [r for r in runs if (r.config == "baseline") == (name == "baseline")]
        for r in mine:
            run.log({f"{r.task}/quality": r.quality, f"{r.task}/train_cpu_s": r.cpu_s, f"{r.task}/budget_steps": r.budget,
                     "seed": r.seed})
        if name == "recipe":
            for task, summary in summaries.items():
                run.summary[f"{task}/strict_speedup_mean"] = summary["mean"]
                run.summary[f"{task}/seeds_reaching_Q"] = summary["reached"]
            run.log({png.stem: wandb.Image(str(png)) for png in pngs})
        run.finish()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", choices=("mild", "medium", "hot"), default="mild", help="the vision recipe")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=-1, help="cap every run at this many steps (tests)")
    parser.add_argument("--threads", type=int, default=1,
                        help="PyTorch CPU threads (default 1; 0 keeps PyTorch's default of one per core)")
    parser.add_argument("--out", default="outputs", help="folder for the PNGs and the W&B files")
    parser.add_argument("--wandb-online", action="store_true", help="log to W&B online (needs `wandb login`)")
    parser.add_argument("--no-wandb", action="store_true", help="do not log to W&B at all")
    parser.add_argument("--no-progress-bar", action="store_true", help="(kept for compatibility: no bars are shown)")
    args = parser.parse_args(argv)

    _quiet()
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    seeds = list(range(args.seeds))

    def capped(budgets: tuple[int, ...]) -> list[int]:
        return sorted({min(b, args.max_steps) if args.max_steps > 0 else b for b in budgets})

    language = {"name": "language", "quality": "bits/char", "higher_is_better": False, "unit": "steps"}
    vision = {"name": "vision", "quality": "accuracy", "higher_is_better": True, "unit": "steps"}
    language_budgets, vision_budgets = capped(LANGUAGE_BUDGETS), capped(VISION_BUDGETS)
    print(f"language: char-level GPT on the stdlib source, baseline vs {LANGUAGE_RECIPE!r}, "
          f"{language_budgets} steps x {len(seeds)} seeds")
    print(f"vision: cluttered digits ({VISION.image_size}x{VISION.image_size}), ResNet, baseline vs recipe "
          f"{args.recipe} (scaled to each run's length), {vision_budgets} steps x {len(seeds)} seeds")
    # Two single-threaded worker processes share the curves, the costly vision curves first. Timings
    # are each process's own CPU time, so the two do not disturb each other's measurements; on 2 cores
    # this halves the wait.
    jobs = [("vision", config, seed, vision_budgets) for seed in seeds for config in ("baseline", args.recipe)]
    jobs += [("language", config, seed, language_budgets) for seed in seeds for config in ("baseline", LANGUAGE_RECIPE)]
    print(f"{len(jobs)} curves on 2 worker processes (one core each); each line is one finished curve:\n", flush=True)
    curves: list[Curve] = []
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn"),
                             initializer=start_worker, initargs=(args.threads,)) as pool:
        pending = [pool.submit(train_curve, task, config, seed, budgets, args.recipe)
                   for task, config, seed, budgets in jobs]
        for done in as_completed(pending):
            curve = done.result()
            curves.append(curve)
            name = {"language": language, "vision": vision}[curve.task]["quality"]
            points = ", ".join(f"{r.quality:.3f} at {r.budget}" for r in curve.runs)
            print(f"  [{len(curves):>2}/{len(jobs)}] {curve.task:<8} {curve.config:<22} seed {curve.seed}: {name} "
                  f"{points} steps ({sum(r.cpu_s for r in curve.runs):.1f} s of training)", flush=True)
    lang_runs = [r for c in curves if c.task == "language" for r in c.runs]
    vis_runs = [r for c in curves if c.task == "vision" for r in c.runs]
    recipe_curves = [c for c in curves if c.task == "vision" and c.config == args.recipe]
    plan = recipe_curves[-1].plan if recipe_curves else ""
    cost_report = recipe_curves[-1].cost_report if recipe_curves else ""

    print("\n" + "=" * 78)
    print("Language: validation bits per character (lower is better); Q = the baseline's best, per seed")
    print(pareto.summarise(language, lang_runs).table.split("\n\n")[0])
    summaries = {"language": verdict(language, lang_runs, LANGUAGE_RECIPE)}
    print(f"\nVision: validation accuracy; baseline vs recipe {args.recipe}")
    print(pareto.summarise(vision, vis_runs).table.split("\n\n")[0])
    seed_lines(vis_runs, args.recipe, higher_is_better=True)
    summaries["vision"] = verdict(vision, vis_runs, args.recipe)

    if plan:
        print(f"\nThe callback's plan for recipe {args.recipe} (order of the algorithms at each event):")
        print(plan)
        print("\nCost report (wall time inside each algorithm's apply, last vision run):")
        print(cost_report)

    pngs = [out / "demo_language.png", out / "demo_accuracy.png"]
    pareto.plot(language, lang_runs, pngs[0], {LANGUAGE_RECIPE: summaries["language"]})
    pareto.plot(vision, vis_runs, pngs[1], {args.recipe: summaries["vision"]})
    table = out / "demo_runs.json"
    table.write_text(json.dumps({"runs": [dataclasses.asdict(r) for r in lang_runs + vis_runs],
                                 "speedups": summaries}, indent=1))
    print(f"\nQuality against training time: {pngs[0]}, {pngs[1]}; every run: {table}")
    if not args.no_wandb:
        log_to_wandb(args, lang_runs + vis_runs, summaries, pngs)
        where = "online (see the run links above)" if args.wandb_online else \
            f"offline in {out / 'wandb'} (upload with: wandb sync {out / 'wandb'}/offline-run-*)"
        print(f"W&B runs: {where}")
    loads = [r.load for r in lang_runs + vis_runs]
    print(f"Total demo time: {time.perf_counter() - started:.0f} s (load average during the runs: "
          f"{statistics.median(loads):.1f}; above 2 the 2 cores were shared with other programs)")
    return {"language": lang_runs, "vision": vis_runs, "summaries": summaries, "pngs": pngs}


if __name__ == "__main__":
    main()
