"""Where the bridge's per-step time goes, timed from the inside of a real ``lightning.Trainer``.

``benchmarks/callback_overhead.py`` measures whole steps, whose noise on a shared machine is larger
than some of the costs it compares. This script times pieces of the bridge directly, with a clock
around each call, in the same set-up (a ``Linear(32, 2)`` module, batch 8, CPU, one torch thread):

- **trace path**: the engine logger's ``log_traces`` (everything the traces cost after ``apply``:
  the trace store, the text-trace check, the Lightning-logger metrics), with the 16 distinct no-op
  algorithms of ``callback_overhead.py``;
- **idle hook**: an empty bridge's one per-step hook, ``on_train_batch_end`` (the step clock and the
  check whether anything listens), as Lightning calls it.

Each is reported in µs per step, one line per run. The clocks themselves add about 0.1 µs a call.
To compare with another version of the package, put its checkout first on the path::

    .venv/bin/python benchmarks/bridge_inside.py                    # this checkout, 3 runs of 2000 steps
    PYTHONPATH=/path/to/other/checkout .venv/bin/python benchmarks/bridge_inside.py
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import callback_overhead as overhead  # noqa: E402  (the same module, algorithms and timing loop)

from composer_bridge import AlgorithmEngineCallback  # noqa: E402
from composer_bridge.core.logger import Logger  # noqa: E402


def trace_path_us(steps: int) -> float:
    """µs per step inside ``Logger.log_traces`` with 16 distinct no-op algorithms."""
    spent = [0.0]
    original = Logger.log_traces

    def timed(self: Logger, traces: Any) -> None:
        start = time.perf_counter()
        original(self, traces)
        spent[0] += time.perf_counter() - start

    Logger.log_traces = timed  # type: ignore[method-assign]
    try:
        overhead.time_fit([AlgorithmEngineCallback([cls() for cls in overhead.DISTINCT_ALGORITHMS])], steps)
    finally:
        Logger.log_traces = original  # type: ignore[method-assign]
    return spent[0] / steps * 1e6


def idle_hook_us(steps: int) -> float:
    """µs per step inside an empty bridge's ``on_train_batch_end``."""
    spent = [0.0]

    class Timed(AlgorithmEngineCallback):
        def on_train_batch_end(self, *args: Any) -> None:
            start = time.perf_counter()
            super().on_train_batch_end(*args)
            spent[0] += time.perf_counter() - start

    overhead.time_fit([Timed([])], steps)
    return spent[0] / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    import composer_bridge

    print(f"composer_bridge from {os.path.dirname(composer_bridge.__file__)}; {args.steps} steps per run; "
          f"load average {os.getloadavg()[0]:.1f}")
    overhead.time_fit([AlgorithmEngineCallback([cls() for cls in overhead.DISTINCT_ALGORITHMS])], 50)  # warm-up
    for run in range(args.runs):
        print(f"run {run + 1}: trace path {trace_path_us(args.steps):.1f} µs/step (16 algorithms); "
              f"idle hook {idle_hook_us(args.steps):.1f} µs/step (empty bridge)")


if __name__ == "__main__":
    main()
