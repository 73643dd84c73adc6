"""Confirm one more published recipe on a finished vision search's confirmation seeds, against its baseline.

A search's settings (and so its state file) fix the recipes it confirms; this trains another one,
``composer_bridge.recipes`` by name, with the module, data, run lengths and confirmation seeds of
``examples/search.py``'s vision search, and scores it against the baseline curves recorded in the
state file, exactly as the search scores its own confirmations (one torch thread, process CPU
time, a curve stops at the first run length that reaches the baseline's best).

    python benchmarks/confirm_recipe.py benchmarks/search_vision_cpu.json short --out benchmarks/search_vision_cpu_short.json

Example:
    >>> from composer_bridge.search.scoring import strict_speedup
    >>> strict_speedup([(1.0, 0.4), (2.0, 0.5)], [(1.0, 0.5)], True)[0]
    2.0
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from search import vision_data, vision_module  # noqa: E402  (examples/search.py)

from composer_bridge.search import from_recipe  # noqa: E402
from composer_bridge.search.scoring import best_quality, strict_speedup, summarise_speedups, time_to_reach  # noqa: E402
from composer_bridge.search.trial import FitRecord, run_fit  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("state", type=Path, help="a finished vision search's search.json")
    parser.add_argument("recipe", help="a recipe of composer_bridge.recipes (e.g. short)")
    parser.add_argument("--out", type=Path, required=True, help="where the fits and speed-ups go (JSON)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    state = json.loads(args.state.read_text())
    settings = state["settings"]
    if settings["monitor"] != "val/acc" or settings["clock"] != "cpu":
        raise SystemExit(f"{args.state}: expected the vision search (val/acc, CPU clock); got {settings['monitor']}, "
                         f"{settings['clock']}.")
    lengths, seeds = settings["run_lengths"], settings["confirm_seeds"]
    recipe = from_recipe(args.recipe)
    fits: list[FitRecord] = []
    per_seed: dict[int, float | None] = {}
    for seed in seeds:
        base = sorted((f["seconds"], f["quality"]) for f in state["fits"]
                      if f["phase"] == "confirm" and f["seed"] == seed and not f["config"])
        if len(base) != len(lengths):
            raise SystemExit(f"{args.state}: the baseline has {len(base)} of {len(lengths)} confirmation fits on "
                             f"seed {seed}; finish the search first.")
        q = best_quality(base, True)
        points: list[tuple[float, float]] = []
        for steps in lengths:
            quality, timer, _ = run_fit(vision_module, vision_data, [c.build(steps) for c in recipe], steps, seed,
                                        "val/acc", "cpu", {"accelerator": "cpu", "devices": 1})
            fits.append(FitRecord([c.label for c in recipe], seed, steps, quality, timer.cpu_s, timer.cpu_s,
                                  timer.wall_s, "confirm"))
            points.append((timer.cpu_s, quality))
            print(f"{args.recipe} seed {seed} @{steps}: quality {quality:.3f}, {timer.cpu_s:.2f} CPU s", flush=True)
            if time_to_reach(points, q, True) is not None:
                break
        per_seed[seed] = strict_speedup(base, points, True)[0]
    speed = summarise_speedups(per_seed)
    out = {"state": str(args.state), "recipe": args.recipe, "labels": [c.label for c in recipe],
           "speedup": {"per_seed": list(speed.per_seed), "seeds": list(speed.seeds), "mean": speed.mean,
                       "sd": speed.sd, "text": speed.text()},
           "fits": [asdict(f) for f in fits]}
    args.out.write_text(json.dumps(out, indent=1))
    print(f"published {args.recipe}: {speed.text()}")
    return out


if __name__ == "__main__":
    main()
