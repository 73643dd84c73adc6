"""The language methods side by side on the CPU, near the baseline's plateau, on seeds no decision has seen.

The character-level GPT of ``examples/language.py`` (2 layers, d_model 64, context 128, batch 4,
AdamW with warm-up and cosine decay scaled to each run's length) on Python's standard-library
source, trained exactly as the recipe search's fits are (``examples/search.py``'s
``language_module`` and ``language_data``, :func:`composer_bridge.search.executor.execute`: a fresh
Trainer per fit, validated once at the end, training timed in process CPU seconds), at the run
lengths of the language search near the plateau (``docs/benchmarks.md``: 2,000, 4,000 and 8,000
steps; the baseline's bits per character level off at 8,000) and on its confirmation seeds 1000,
1001 and 1002, which no search decision used. Every configuration runs at every length on every
seed; for each seed the **strict speed-up** is the baseline's CPU time to its own best quality Q
divided by the configuration's time to Q (:func:`composer_bridge.search.scoring.strict_speedup`,
through ``benchmarks/pareto.py``'s ``summarise``, as the demo and the search compute it).

The configurations are algorithm lists by class name, resolved in :mod:`composer_bridge.algorithms`
when the script runs (``NAME=Class+Class{"argument": value}``, as ``gpu_time_to_quality.py``'s
``--language-configs``: arguments as JSON, ``"{max_seq_length}"`` for the context length, a
language recipe's name for its algorithms). By default: the baseline, the search's pick
(GatedLinearUnits + SeqLengthWarmup) and the published ``gpt-fast`` as the references, and each
newer method alone: Muon, WarmupStableDecay, ZLoss and QKNorm (a default this version of the
library lacks is left out with a note; a configuration named with ``--configs`` must resolve).
Before the measured fits, each configuration trains 2 steps here, so one that cannot train fails
in seconds and is left out, named in the JSON, instead of stopping the run an hour in.

    python benchmarks/language_methods.py                          # about an hour on 2 cores (Ray, 2 workers)
    python benchmarks/language_methods.py --executor local         # one fit at a time in this process
    python benchmarks/language_methods.py --configs 'muon+glu=Muon+GatedLinearUnits'   # more configurations
    python benchmarks/language_methods.py --dry-run --out /tmp/lm  # the whole pipeline at toy lengths (seconds)

Writes ``<out>.json`` (machine, versions, commit, date, settings, every fit as it finishes, the
strict speed-ups and the table; the baseline's qualities beside those the search's state file
recorded for the same fits) and ``<out>.png`` (bits per character against training CPU time,
mean ± sd over seeds). Run it again with the same ``--out`` and it trains only the fits the JSON
lacks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
sys.path.insert(0, str(BENCHMARKS.parent / "examples"))

import gpu_campaign  # noqa: E402  (machine(): versions, commit, date)
import gpu_time_to_quality as ttq  # noqa: E402  (parse_language_config: one grammar for algorithm lists)
import pareto  # noqa: E402  (Run, summarise, plot: the demo's speed-ups and curves)
import search as search_example  # noqa: E402  (examples/search.py: the search's language module and data)

#: The language search near the plateau (docs/benchmarks.md; benchmarks/search_language_plateau_cpu.json).
PLATEAU_LENGTHS = (2000, 4000, 8000)
UNSEEN_SEEDS = (1000, 1001, 1002)
STATE_FILE = BENCHMARKS / "search_language_plateau_cpu.json"
MONITOR = "val/bits_per_char"
TRAINER_KWARGS = {"accelerator": "cpu", "devices": 1}

#: The default configurations (besides the baseline): the references, then each newer method alone.
DEFAULT_CONFIGS = (
    'glu+slw=GatedLinearUnits+SeqLengthWarmup{"duration": 0.3, "min_seq_length": 8, '
    '"max_seq_length": "{max_seq_length}", "step_size": 8}',
    "gpt-fast=gpt-fast",
    "muon=Muon",
    "wsd=WarmupStableDecay",
    'zloss=ZLoss{"target_key": "labels", "class_dim": -1}',
    "qknorm=QKNorm",
)
TASK = {"name": "language", "unit": "steps", "quality": "validation bits per character", "higher_is_better": False}


def configurations(texts: list[str], defaults: bool) -> tuple[dict[str, list[Any]], dict[str, str]]:
    """``({name: candidates}, {name: why left out})``: the baseline first, then ``texts`` parsed.

    With ``defaults`` (the texts are :data:`DEFAULT_CONFIGS`), one this library version cannot build
    is left out with the reason; a configuration the user named must resolve (``ValueError``).

    Example:
        >>> configs, left_out = configurations(["glu=GatedLinearUnits"], defaults=False)
        >>> list(configs), [c.algorithm for c in configs["glu"]], left_out
        (['baseline', 'glu'], ['GatedLinearUnits'], {})
    """
    configs: dict[str, list[Any]] = {"baseline": []}
    left_out: dict[str, str] = {}
    for text in texts:
        try:
            config = ttq.parse_language_config(text, search_example.LM_BLOCK)
        except ValueError as error:  # SearchInputError too
            if not defaults:
                raise
            left_out[text.partition("=")[0]] = str(error)
            continue
        if config.name in configs:
            raise ValueError(f"configuration name {config.name!r} appears twice; give each its own NAME=.")
        configs[config.name] = list(config.candidates)
    return configs, left_out


def fit_task(candidates: list[Any], steps: int, seed: int) -> Any:
    """The search's fit of ``candidates`` (a :class:`composer_bridge.search.executor.FitTask`)."""
    from composer_bridge.search.executor import FitTask

    return FitTask(search_example.language_module, search_example.language_data, list(candidates), steps, seed,
                   MONITOR, "cpu", dict(TRAINER_KWARGS))


def check_trains(configs: dict[str, list[Any]], steps: int = 2) -> dict[str, str]:
    """Train every configuration ``steps`` steps here; ``{name: error}`` for those that raise."""
    from composer_bridge.search.executor import execute

    failed = {}
    for name, candidates in configs.items():
        try:
            outcome = execute(fit_task(candidates, steps, 0))
        except Exception as error:  # noqa: BLE001 - reported and recorded; the other configurations go on
            failed[name] = f"{type(error).__name__}: {error}"
            continue
        if outcome.error:  # a fit with candidates that raised comes back as a failed fit, with the error
            failed[name] = outcome.error
    return failed


def order(configs: list[str], seeds: list[int], lengths: list[int]) -> list[tuple[str, int, int]]:
    """``(config, seed, steps)`` in submission order: longest rounds first (so two workers finish
    together), each round's configurations shuffled (so a busy moment of the machine hits all alike)."""
    rng = random.Random(0)
    out = []
    for steps in sorted(lengths, reverse=True):
        for seed in seeds:
            round_ = list(configs)
            rng.shuffle(round_)
            out += [(c, seed, steps) for c in round_]
    return out


def state_file_baseline(seeds: list[int], lengths: list[int], path: Path = STATE_FILE) -> dict[str, float]:
    """The baseline's qualities the search's state file recorded for these seeds and lengths: ``{"seed/steps": q}``."""
    if not path.exists():
        return {}
    fits = json.loads(path.read_text()).get("fits", [])
    return {f"{f['seed']}/{f['steps']}": f["quality"] for f in fits
            if f["config"] == [] and f["seed"] in seeds and f["steps"] in lengths and f.get("error") is None}


def estimate_minutes(todo: list[tuple[str, int, int]], workers: int, path: Path = STATE_FILE) -> float | None:
    """Minutes the fits ``todo`` take on ``workers`` cores, at the search's baseline CPU seconds per step.

    From the state file's baseline fits (their mean CPU seconds per step); ``None`` without them.
    Methods that cost more per step than the baseline take longer.
    """
    if not path.exists():
        return None
    fits = [f for f in json.loads(path.read_text()).get("fits", []) if f["config"] == [] and f.get("error") is None]
    if not fits:
        return None
    per_step = sum(f["cpu_s"] for f in fits) / sum(f["steps"] for f in fits)
    return sum(steps for _, _, steps in todo) * per_step / max(1, workers) / 60


def report(settings: dict[str, Any], runs: list[pareto.Run], out: Path) -> dict[str, Any]:
    """The strict speed-ups, the table and the PNG of ``runs``, as the demo computes them."""
    task = {**TASK, "budgets": settings["lengths"], "configs": settings["configs"]}
    summary = pareto.summarise(task, runs)
    png = out.parent / f"{out.name}.png"
    pareto.plot(task, runs, png, summary.speedups)
    return {"speedups": summary.speedups, "table": summary.table, "png": png.name}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=None, metavar="NAME=ALGORITHMS",
                   help="configurations besides the baseline (default: the references and each newer method alone)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default 1000 1001 1002 (unseen by the search)")
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="run lengths in steps (default 2000 4000 8000)")
    p.add_argument("--executor", choices=("ray", "local"), default="ray",
                   help="ray: --workers fits side by side, one core each (default); local: one at a time here")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default="benchmarks/language_methods_cpu", help="writes OUT.json and OUT.png")
    p.add_argument("--dry-run", action="store_true",
                   help="lengths 2/4/8, seed 1000, in this process: the pipeline in seconds; its numbers mean nothing")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # steadier CPU timings on shared cores, as the search's fits
    ttq.quiet()
    seeds = args.seeds or ([UNSEEN_SEEDS[0]] if args.dry_run else list(UNSEEN_SEEDS))
    lengths = sorted(set(args.lengths or ([2, 4, 8] if args.dry_run else PLATEAU_LENGTHS)))
    configs, left_out = configurations(args.configs or list(DEFAULT_CONFIGS), defaults=args.configs is None)
    for name, why in left_out.items():
        print(f"left out {name!r}: {why}")
    failed = check_trains(configs)
    for name, why in failed.items():
        print(f"left out {name!r}: it failed to train 2 steps: {why}")
        configs.pop(name)
        left_out[name] = why
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.parent / f"{out.name}.json"
    settings = {"seeds": seeds, "lengths": lengths, "configs": list(configs), "monitor": MONITOR, "clock": "cpu",
                "clock_means": pareto.CLOCKS["cpu"], "trainer_kwargs": TRAINER_KWARGS,
                "algorithms": {n: [dataclasses.asdict(c) for c in cs] for n, cs in configs.items()},
                "model": "examples/search.py language_module: GPT(d_model 64, 2 layers, 4 heads, context 128), batch 4",
                "executor": "local" if args.dry_run else args.executor, "workers": args.workers}
    runs: list[pareto.Run] = []
    if path.exists():  # resume: keep the fits of these settings already measured
        earlier = json.loads(path.read_text())
        if {k: earlier["settings"].get(k) for k in ("seeds", "lengths", "monitor")} == \
                {k: settings[k] for k in ("seeds", "lengths", "monitor")}:
            runs = [pareto.Run(**r) for r in earlier["runs"] if r["config"] in configs]
    done = {(r.config, r.seed, r.budget) for r in runs}
    todo = [job for job in order(list(configs), seeds, lengths) if job not in done]
    machine = {**gpu_campaign.machine(), "cpus": os.cpu_count()}
    print(f"language methods on {machine['cpus']} CPUs, torch {machine['torch']}, commit {machine['commit']}: "
          f"{list(configs)} at {lengths} steps on seeds {seeds}: {len(todo)} fits to run ({len(done)} already in {path})",
          flush=True)
    minutes = estimate_minutes(todo, 1 if args.dry_run or args.executor == "local" else args.workers)
    if minutes is not None and todo:
        print(f"estimate: about {minutes:.0f} min of training (the search's baseline CPU seconds per step; "
              "a method that costs more per step takes longer, a loaded machine too)", flush=True)

    def save() -> dict[str, Any]:
        data = {"machine": machine, "settings": settings, "left_out": left_out, "dry_run": args.dry_run,
                "runs": [dataclasses.asdict(r) for r in runs]}
        path.write_text(json.dumps(data, indent=1))
        return data

    from composer_bridge.search import InProcessExecutor, RayExecutor

    executor: Any = InProcessExecutor() if args.dry_run or args.executor == "local" else \
        RayExecutor(workers=args.workers, cpus_per_fit=1)
    started = time.perf_counter()
    if todo:
        executor.start(fit_task(configs[todo[0][0]], todo[0][2], todo[0][1]))
        try:
            tickets = {executor.submit(fit_task(configs[c], steps, seed)): (c, seed, steps) for c, seed, steps in todo}
            while executor.pending():
                ticket, outcome = executor.next_done()
                config, seed, steps = tickets[ticket]
                if outcome.error:
                    print(f"  {config} seed {seed} {steps} steps FAILED: {outcome.error}", flush=True)
                    continue
                runs.append(pareto.Run("language", config, steps, seed, outcome.quality, outcome.cpu_s, outcome.wall_s,
                                       os.getloadavg()[0], clock="cpu"))
                save()
                print(f"  [{len(runs)}/{len(todo) + len(done)}] {config:<10} seed {seed} {steps:>5} steps: "
                      f"{outcome.quality:.3f} bits/char in {outcome.cpu_s:.1f} CPU s "
                      f"({(time.perf_counter() - started) / 60:.1f} min)", flush=True)
        finally:
            executor.close()
    data = save()
    data["results"] = report(settings, runs, out)
    recorded = state_file_baseline(seeds, lengths)
    data["baseline_vs_state_file"] = {key: {"here": next((r.quality for r in runs if r.config == "baseline" and
                                                          f"{r.seed}/{r.budget}" == key), None), "state_file": q}
                                      for key, q in recorded.items()}
    path.write_text(json.dumps(data, indent=1))
    print("\n" + data["results"]["table"])
    for key, pair in data["baseline_vs_state_file"].items():
        print(f"baseline seed/steps {key}: {pair['here']} bits/char here, {pair['state_file']:.4f} in {STATE_FILE.name}")
    print(f"written {path} and {out.parent / data['results']['png']}")
    return data


if __name__ == "__main__":
    main()
