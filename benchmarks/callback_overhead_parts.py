"""Where the bridge's per-step cost goes: a fixed part for listening at all, and a part per algorithm.

The model, steps and timing of ``benchmarks/callback_overhead.py`` (a tiny ``Linear(32, 2)``, CPU, each
step's training-thread CPU time, summarised by the lower decile of a run's steps), with the bridge
holding 0, 1, 4 and 16 distinct no-op algorithms (each matching every per-step event), the 16 without
cost measurement, and 16 no-op Lightning callbacks. Every round runs each configuration once, in a new
seeded random order; the median over rounds of each configuration's extra over plain Lightning is
reported. The step from the empty bridge to one algorithm is the cost of *listening* (the per-step
hooks shown to Lightning, the module's hooks, nine events a step through the engine and the trace
store); the slope from one to sixteen is the cost of each further algorithm.

Usage::

    .venv/bin/python benchmarks/callback_overhead_parts.py                # 1,500 steps x 5 rounds
    .venv/bin/python benchmarks/callback_overhead_parts.py --steps 50 --rounds 1   # a smoke run
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import callback_overhead as co  # noqa: E402
import torch  # noqa: E402

from composer_bridge import AlgorithmEngineCallback  # noqa: E402


def _bridge(n: int, **kwargs: Any) -> Callable[[], list[Any]]:
    return lambda: [AlgorithmEngineCallback([cls() for cls in co.DISTINCT_ALGORITHMS[:n]], **kwargs)]


CONFIGS: dict[str, Callable[[], list[Any]]] = {
    "plain Lightning": lambda: [],
    "empty bridge": _bridge(0),
    "bridge, 1 algorithm": _bridge(1),
    "bridge, 4 algorithms": _bridge(4),
    "bridge, 16 algorithms": _bridge(16),
    "bridge, 16 algorithms, measure_cost=False": _bridge(16, measure_cost=False),
    "16 Lightning callbacks": lambda: [cls() for cls in co.DISTINCT_CALLBACKS],
}


def measure(steps: int, rounds: int, seed: int = 0) -> dict[str, float]:
    """Each configuration's median extra CPU seconds per step over plain Lightning (lower deciles, paired by round)."""
    rng = random.Random(seed)
    extras: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for _ in range(rounds):
        order = list(CONFIGS)
        rng.shuffle(order)
        deciles = {name: co.time_fit(CONFIGS[name](), steps).decile for name in order}
        for name in CONFIGS:
            extras[name].append(deciles[name] - deciles["plain Lightning"])
    return {name: statistics.median(values) for name, values in extras.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    extra = measure(args.steps, args.rounds)
    for name, value in extra.items():
        print(f"{name:45s} {value * 1e6:+8.1f} us per step")
    listening = extra["bridge, 1 algorithm"] - extra["empty bridge"]
    per_algorithm = (extra["bridge, 16 algorithms"] - extra["bridge, 1 algorithm"]) / 15
    per_callback = extra["16 Lightning callbacks"] / 16
    print(f"listening: {listening * 1e6:.1f} us per step; each further algorithm: {per_algorithm * 1e6:.1f} us "
          f"(each Lightning callback: {per_callback * 1e6:.1f} us); 16 algorithms / 16 callbacks: "
          f"{extra['bridge, 16 algorithms'] / extra['16 Lightning callbacks']:.2f}")


if __name__ == "__main__":
    main()
