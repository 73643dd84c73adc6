"""CPU instructions per training step of callback_overhead.py's configurations, counted under callgrind.

On a machine shared with other jobs, the timed benchmark (``benchmarks/callback_overhead.py``) often cannot
tell two versions of the bridge apart: a plain step's CPU time moves by 10-15 % from one process to the next.
Instructions do not move with the load. This script runs one fit per configuration under ``valgrind
--tool=callgrind`` with collection switched on for steps 100-200 only (``callgrind_control -i on|off``; the
imports, the Trainer's setup and the first steps are left out), and prints each configuration's instructions
per step, the empty bridge against plain Lightning, and the extra of 16 distinct algorithms against the extra of
16 Lightning callbacks. Python's hash seed is fixed (``PYTHONHASHSEED=0``): with a random one, runs of one
version differ by up to 0.2 % of a step.

Instructions are not time: a step of the bridge spends more time per instruction than Lightning's callback
dispatch does (``docs/benchmarks.md``, callback overhead), so a ratio met in instructions may not be in time.

Needs ``valgrind`` (Debian: ``apt install valgrind``). About a minute per configuration, two at a time.

Usage::

    .venv/bin/python benchmarks/callback_instructions.py
    PYTHONPATH=/path/to/other/checkout .venv/bin/python benchmarks/callback_instructions.py   # another version
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CONFIGS = ("plain", "empty", "16 algorithms", "16 callbacks")
FIRST, LAST, STEPS = 100, 200, 250  # the default window; --window moves it (a window late in a long run)


def fit_steps(last: int) -> int:
    """The steps a fit whose window ends at ``last`` trains: 50 past it, as the default window's."""
    return last + STEPS - LAST


def collect(on: bool) -> None:
    """Switch callgrind's collection on or off for this process (which runs under callgrind)."""
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def fit(config: str, switch: Callable[[bool], None] = collect, first: int = FIRST, last: int = LAST) -> None:
    """One fit of ``config`` (run inside callgrind): ``switch(True)`` as step ``first`` starts, ``switch(False)`` as
    step ``last`` starts, so steps ``first``..``last``-1 are counted (the fit trains ``last`` + 50 steps)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    sys.path.insert(0, str(Path(__file__).parent))
    import callback_overhead as co

    from composer_bridge import AlgorithmEngineCallback

    class Window(co.L.Callback):
        def on_train_batch_start(self, trainer: object, *args: object) -> None:
            step = trainer.global_step  # type: ignore[attr-defined]
            if step in (first, last):
                switch(step == first)

    guests = {
        "plain": [],
        "empty": [AlgorithmEngineCallback([])],
        "16 algorithms": [AlgorithmEngineCallback([cls() for cls in co.DISTINCT_ALGORITHMS])],
        "16 callbacks": [cls() for cls in co.DISTINCT_CALLBACKS],
    }[config]
    steps = fit_steps(last)
    trainer = co.L.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
                           enable_progress_bar=False, enable_model_summary=False, callbacks=[Window(), *guests])
    trainer.fit(co.Tiny(), co.loader(steps))


def count(config: str, workdir: Path, first: int = FIRST, last: int = LAST) -> int:
    """Instructions per counted step of one ``config`` fit under callgrind."""
    out = workdir / f"callgrind.{config.replace(' ', '_')}"
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                          sys.executable, __file__, "--fit", config, "--window", str(first), str(last)], env=env, capture_output=True, text=True)
    found = re.search(r"Collected\s*:\s*(\d+)", run.stderr)
    if run.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run of {config!r} failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    return int(found.group(1)) // (last - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", choices=CONFIGS, help=argparse.SUPPRESS)  # one fit, inside callgrind
    parser.add_argument("--jobs", type=int, default=2, help="callgrind runs side by side (default 2)")
    parser.add_argument("--window", type=int, nargs=2, default=(FIRST, LAST), metavar=("FIRST", "LAST"),
                        help=f"count steps FIRST..LAST-1 (default {FIRST} {LAST}; e.g. 3000 3100: late in a long run)")
    args = parser.parse_args()
    first, last = args.window
    if not 0 < first < last:
        parser.error(f"--window {first} {last}: expected 0 < FIRST < LAST (steps counted: FIRST..LAST-1)")
    if args.fit:
        fit(args.fit, first=first, last=last)
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("callback_instructions.py needs valgrind and callgrind_control on PATH (Debian: apt install valgrind).")
    import composer_bridge

    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        counts = dict(zip(CONFIGS, pool.map(lambda c: count(c, Path(tmp), first, last), CONFIGS), strict=True))
    plain = counts["plain"]
    print(f"composer_bridge {composer_bridge.__version__} from {Path(composer_bridge.__file__).parent}; "
          f"Python {sys.version.split()[0]}; steps {first}-{last} of a {fit_steps(last)}-step fit, PYTHONHASHSEED=0\n")
    print("| configuration | instructions per step | extra over plain |")
    print("|---|---:|---:|")
    for config in CONFIGS:
        print(f"| {config} | {counts[config]:,} | {counts[config] - plain:+,} |")
    algorithms, callbacks = counts["16 algorithms"] - plain, counts["16 callbacks"] - plain
    print(f"\nempty bridge / plain Lightning: {counts['empty'] / plain:.4f}x (goal: at most 1.02x)")
    print(f"extra of 16 algorithms / extra of 16 Lightning callbacks: {algorithms / callbacks:.3f}x (goal: at most 0.6x)")


if __name__ == "__main__":
    main()
