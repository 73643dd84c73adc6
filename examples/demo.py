"""The main demo: does a Composer recipe reach the baseline's quality sooner? Three seeds, several run lengths.

    python examples/demo.py                  # 67 s on 2 CPU cores at load average 2, W&B offline
    python examples/demo.py --seeds 5        # more seeds (longer)
    python examples/demo.py --wandb-online   # log to your W&B account (after `wandb login`)

A speed-up claim from one run is a seed lottery, and one measured against a baseline budget
longer than the task needs is no speed-up at all. So the demo does what
``benchmarks/pareto.py`` does, smaller: it trains the baseline and a recipe at several run
lengths (each run's whole schedule scaled to its length), for several seeds, and compares final
quality against training time. For each seed the **strict speed-up** is the baseline's training
time to its own best quality Q divided by the recipe's time to Q (interpolated between run
lengths); a seed where the recipe never gets to Q is a failure.

1. **Language** (where the recipe wins): a character-level GPT on Python's standard-library
   source; quality = validation bits per character. Recipe: ``recipes.language("gpt-fast")``
   (ALiBi, SeqLengthWarmup, GatedLinearUnits, gradient clipping) training on sequences a quarter
   as long (ALiBi's ``train_sequence_length_scaling=0.25``), evaluated at full length.
2. **Vision** (where it does not, on this CPU): the digits ResNet with the ``mild`` recipe
   scaled to each run's length (``recipes.vision("mild", total_steps=...)``). Its plan and cost
   report are printed.

The work runs in two processes side by side, one torch thread each. Training time is each
process's own CPU time with validation left out (on shared cores it varies far less than wall
time). The demo writes ``outputs/demo_language.png`` and
``outputs/demo_accuracy.png`` (quality against training time, mean ± sd over seeds) and logs a
baseline run and a recipe run to W&B in offline mode under ``outputs/wandb`` (``wandb sync``
uploads them later). ``docs/benchmarks.md`` has the full benchmark behind these numbers.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmarks/pareto.py: the runs, speed-ups and plots

import pareto  # noqa: E402

LANGUAGE_BUDGETS = (25, 50, 100)  # optimizer steps (the first three of benchmarks/pareto.py)
VISION_BUDGETS = (23, 46)  # optimizer steps (1 and 2 epochs of digits)
LANGUAGE_RECIPE = "gpt-fast, short ALiBi"


def language_recipe(total_steps: int) -> list[Any]:
    """The language recipe of this demo, for a run of ``total_steps`` steps."""
    return pareto.language_recipe("gpt-fast", alibi={"train_sequence_length_scaling": 0.25})(total_steps)


def run_grid(task: dict[str, Any], configs: dict[str, Any], budgets: list[int], seeds: list[int],
             train: Any, echo: bool = True) -> tuple[list[pareto.Run], dict[str, Any]]:
    """Every configuration at every budget for every seed, the configurations interleaved."""
    runs, bridges = [], {}
    for seed in seeds:
        for budget in budgets:
            for config, build in configs.items():
                fit = train(config, build(budget), budget, seed)
                runs.append(pareto.Run(task["name"], config, budget, seed, fit.quality, fit.cpu_s, fit.wall_s,
                                       os.getloadavg()[0]))
                if fit.bridge is not None:
                    bridges[config] = fit.bridge
                if echo:
                    print(f"  {config:<22} {budget:>4} steps, seed {seed}: {task['quality']} {fit.quality:.4f} "
                          f"after {fit.cpu_s:.1f} s of training", flush=True)
    return runs, bridges


def second_process(recipe: str, vision_budgets: list[int], language_budgets: list[int], seeds: list[int],
                   language_seeds: list[int], threads: int) -> tuple[list[pareto.Run], list[pareto.Run], str, str]:
    """The second process's share: the whole vision grid, then the language grid for ``language_seeds``.

    Returns the vision runs, the language runs, and the vision recipe's plan and cost report.
    """
    import torch

    _quiet()
    if threads > 0:
        torch.set_num_threads(threads)
    pareto.vision_train("warm-up", [], 2, 0)
    task = {"name": "vision", "quality": "accuracy"}
    runs, bridges = run_grid(task, {"baseline": lambda steps: [], recipe: pareto.vision_recipe(recipe)},
                             vision_budgets, seeds, pareto.vision_train, echo=False)
    bridge = bridges.get(recipe)
    language_runs: list[pareto.Run] = []
    if language_seeds:
        pareto.language_train("warm-up", [], 2, 0)
        language_runs, _ = run_grid({"name": "language"}, {"baseline": lambda steps: [], LANGUAGE_RECIPE: language_recipe},
                                    language_budgets, language_seeds, pareto.language_train, echo=False)
    return runs, language_runs, (str(bridge.plan()) if bridge else ""), (str(bridge.cost_report()) if bridge else "")


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


def vision_lines(runs: list[pareto.Run], recipe: str) -> None:
    """The per-seed comparison at the longest run length, in the words of a time-to-accuracy report."""
    longest = max(r.budget for r in runs)
    for seed in sorted({r.seed for r in runs}):
        mine = {r.config: r for r in runs if r.seed == seed and r.budget == longest}
        base, rec = mine["baseline"], mine[recipe]
        curve = [(r.cpu_s, r.quality) for r in sorted((r for r in runs if r.seed == seed and r.config == recipe),
                                                      key=lambda r: r.budget)]
        reach = pareto.time_to_reach(curve, base.quality, higher_is_better=True)
        if reach is not None:
            print(f"  seed {seed}: Speed-up to the baseline's accuracy ({base.quality:.4f} after {base.cpu_s:.1f} s): "
                  f"{base.cpu_s / reach:.2f}x")
        else:
            print(f"  seed {seed}: the recipe did not reach the baseline's final accuracy ({base.quality:.4f}) in "
                  f"{longest} steps (it ended at {rec.quality:.4f})")


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
    print(f"[1/2] language: char-level GPT on the stdlib source, baseline vs {LANGUAGE_RECIPE!r}, "
          f"{language_budgets} steps x {len(seeds)} seeds")
    print(f"[2/2] vision: digits ResNet, baseline vs recipe {args.recipe} (scaled to each run's length), "
          f"{vision_budgets} steps x {len(seeds)} seeds, in a second process (one core each)", flush=True)
    print("(the second process also trains the last language seed; its lines are not echoed)\n", flush=True)
    # Two single-threaded processes share the work (the language grid costs about three times the
    # vision grid, so the second process also takes the last language seed). Timings are each
    # process's own CPU time, so the processes do not disturb each other's measurements; on 2 cores
    # this halves the wait.
    here, there = seeds[:-1] if len(seeds) > 1 else seeds, seeds[-1:] if len(seeds) > 1 else []
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        job = pool.submit(second_process, args.recipe, vision_budgets, language_budgets, seeds, there, args.threads)
        pareto.language_train("warm-up", [], 2, 0)  # the first steps of a process pay for lazy initialisation
        lang_runs, _ = run_grid(language, {"baseline": lambda steps: [], LANGUAGE_RECIPE: language_recipe},
                                language_budgets, here, pareto.language_train)
        vis_runs, more_lang_runs, plan, cost_report = job.result()
    lang_runs += more_lang_runs

    print("\n" + "=" * 78)
    print("Language: validation bits per character (lower is better); Q = the baseline's best, per seed")
    print(pareto.summarise(language, lang_runs).table.split("\n\n")[0])
    summaries = {"language": verdict(language, lang_runs, LANGUAGE_RECIPE)}
    print(f"\nVision: validation accuracy; baseline vs recipe {args.recipe}")
    print(pareto.summarise(vision, vis_runs).table.split("\n\n")[0])
    vision_lines(vis_runs, args.recipe)
    summaries["vision"] = verdict(vision, vis_runs, args.recipe)

    if plan:
        print(f"\nThe callback's plan for recipe {args.recipe} (order of the algorithms at each event):")
        print(plan)
        print("\nCost report (wall time inside each algorithm's apply, last vision run):")
        print(cost_report)

    pngs = [out / "demo_language.png", out / "demo_accuracy.png"]
    pareto.plot(language, lang_runs, pngs[0], {LANGUAGE_RECIPE: summaries["language"]})
    pareto.plot(vision, vis_runs, pngs[1], {args.recipe: summaries["vision"]})
    print(f"\nQuality against training time: {pngs[0]}, {pngs[1]}")
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
