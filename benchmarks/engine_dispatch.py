"""How much does the engine cost per event? composer_bridge vs PyTorch Ignite vs Composer, in one run.

Each system dispatches the events of one optimizer step (``BEFORE_DATALOADER`` … ``BATCH_CHECKPOINT``)
to N always-matching no-op algorithms (composer_bridge and Composer) or N no-op handlers per event
(Ignite, and composer_bridge's own Ignite-style handlers), so what is measured is the dispatch
itself: matching, ordering, tracing and calling. Every number is the median over ``--runs`` runs
of ``--reps`` steps each, in microseconds per event.

Composer is measured only if ``/tmp/anchorenv/bin/python`` (a separate environment with MosaicML
Composer, see ``shared/anchors/``) exists; it runs there in a subprocess, so Composer is never
imported here.

Run::

    .venv/bin/python benchmarks/engine_dispatch.py
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from composer_bridge import Algorithm, Engine, Event, State

STEP_EVENTS = [
    "BEFORE_DATALOADER", "AFTER_DATALOADER", "BATCH_START", "BEFORE_TRAIN_BATCH",
    "BEFORE_FORWARD", "AFTER_FORWARD", "BEFORE_LOSS", "AFTER_LOSS", "BEFORE_BACKWARD",
    "AFTER_BACKWARD", "AFTER_TRAIN_BATCH", "BATCH_END", "BATCH_CHECKPOINT",
]
COMPOSER_PYTHON = "/tmp/anchorenv/bin/python"


def time_per_event(dispatch: Callable[[object], object], events: list, reps: int, runs: int) -> float:
    """Median over ``runs`` of the microseconds per ``dispatch(event)`` call, ``reps`` passes over ``events``."""
    for event in events:  # warm caches (the engine's order cache, Ignite's handler lists)
        dispatch(event)
    samples = []
    gc.disable()
    try:
        for _ in range(runs):
            start = time.perf_counter_ns()
            for _ in range(reps):
                for event in events:
                    dispatch(event)
            samples.append((time.perf_counter_ns() - start) / 1000 / (reps * len(events)))
    finally:
        gc.enable()
    return statistics.median(samples)


# --- composer_bridge -----------------------------------------------------------------------------
class NoOp(Algorithm):
    def match(self, event, state):
        return True

    def apply(self, event, state, logger):
        return None


def noop_algorithms(n: int) -> list[Algorithm]:
    # Distinct classes, as in a real run (trace keys are per class).
    return [type(f"NoOp{i}", (NoOp,), {})() for i in range(n)]


def bridge_algorithms(n: int, reps: int, runs: int) -> float:
    engine = Engine(State(torch.nn.Linear(1, 1), algorithms=noop_algorithms(n)))
    return time_per_event(engine.run_event, [Event[name] for name in STEP_EVENTS], reps, runs)


def bridge_handlers(n: int, reps: int, runs: int) -> float:
    engine = Engine(State(torch.nn.Linear(1, 1)))
    events = [Event[name] for name in STEP_EVENTS]
    for event in events:
        for _ in range(n):
            engine.add_event_handler(event, lambda state, event: None)
    return time_per_event(engine.run_event, events, reps, runs)


# --- PyTorch Ignite ------------------------------------------------------------------------------
def ignite_handlers(n: int, reps: int, runs: int) -> float:
    from ignite.engine import Engine as IgniteEngine
    from ignite.engine.events import EventEnum

    StepEvents = EventEnum("StepEvents", {name: name.lower() for name in STEP_EVENTS})
    engine = IgniteEngine(lambda engine, batch: None)
    engine.register_events(*StepEvents)
    for event in StepEvents:
        for _ in range(n):
            engine.add_event_handler(event, lambda engine: None)
    # _fire_event is what Ignite's own loop calls for every event (fire_event adds one call on top).
    return time_per_event(engine._fire_event, list(StepEvents), reps, runs)


# --- MosaicML Composer (in its own environment) --------------------------------------------------
COMPOSER_SNIPPET = r"""
import gc, json, statistics, sys, time, logging
import torch
from composer.core import Algorithm, Engine, Event, State
from composer.loggers import Logger
from composer.models import ComposerClassifier

counts, reps, runs, names = json.loads(sys.argv[1])
torch.set_num_threads(1)

class NoOp(Algorithm):
    def match(self, event, state):
        return True
    def apply(self, event, state, logger):
        return None

data = torch.utils.data.TensorDataset(torch.zeros(8, 2), torch.zeros(8, dtype=torch.long))
results = {}
for n in counts:
    algorithms = [type(f"NoOp{i}", (NoOp,), {})() for i in range(n)]
    state = State(model=ComposerClassifier(torch.nn.Linear(2, 2), num_classes=2), rank_zero_seed=0,
                  run_name="bench", device="cpu", algorithms=algorithms, max_duration="1ep",
                  dataloader=torch.utils.data.DataLoader(data, batch_size=2), dataloader_label="train")
    engine = Engine(state, Logger(state))
    events = [Event[name] for name in names]
    for event in events:
        engine.run_event(event)
    samples = []
    gc.disable()
    for _ in range(runs):
        start = time.perf_counter_ns()
        for _ in range(reps):
            for event in events:
                engine.run_event(event)
        samples.append((time.perf_counter_ns() - start) / 1000 / (reps * len(events)))
    gc.enable()
    results[n] = statistics.median(samples)
    engine.close()
print(json.dumps({"version": __import__("composer").__version__, "results": results}))
"""


def composer_engine(counts: list[int], reps: int, runs: int) -> tuple[str, dict[int, float]] | None:
    if not os.path.exists(COMPOSER_PYTHON):
        return None
    # Composer is far slower per event: fewer repetitions give the same measuring time.
    arg = json.dumps([counts, max(reps // 10, 20), runs, STEP_EVENTS])
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([COMPOSER_PYTHON, "-c", COMPOSER_SNIPPET, arg], capture_output=True, text=True,
                          env=env, check=False)
    if done.returncode != 0:
        print(f"(Composer measurement failed: {done.stderr.strip().splitlines()[-1:]})", file=sys.stderr)
        return None
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["version"], {int(k): v for k, v in out["results"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[0, 1, 4, 16], help="algorithms / handlers")
    parser.add_argument("--reps", type=int, default=2000, help="steps per run")
    parser.add_argument("--runs", type=int, default=7, help="runs per measurement (the median is reported)")
    parser.add_argument("--no-composer", action="store_true", help="skip the Composer subprocess")
    args = parser.parse_args()
    torch.set_num_threads(1)

    import ignite

    ours, handlers, theirs = {}, {}, {}
    for n in args.counts:
        ours[n] = bridge_algorithms(n, args.reps, args.runs)
        handlers[n] = bridge_handlers(n, args.reps, args.runs)
        theirs[n] = ignite_handlers(n, args.reps, args.runs)
    composer = None if args.no_composer else composer_engine(args.counts, args.reps, args.runs)

    print(f"Python {platform.python_version()}, torch {torch.__version__}, pytorch-ignite {ignite.__version__}"
          + (f", Composer {composer[0]}" if composer else ", Composer not measured"))
    print(f"{len(STEP_EVENTS)} events per optimizer step; µs per event, median of {args.runs} runs "
          f"of {args.reps} steps.\n")
    header = ["N", "composer_bridge `run_event`, N algorithms", "composer_bridge, N handlers",
              "Ignite `_fire_event`, N handlers", "Ignite ÷ ours"]
    if composer:
        header += ["Composer `run_event`, N algorithms", "Composer ÷ ours", "ms per step: ours / Composer"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for n in args.counts:
        row = [str(n), f"{ours[n]:.2f}", f"{handlers[n]:.2f}", f"{theirs[n]:.2f}", f"{theirs[n] / ours[n]:.2f}x"]
        if composer:
            c = composer[1][n]
            per_step = len(STEP_EVENTS) / 1000
            row += [f"{c:.1f}", f"{c / ours[n]:.0f}x", f"{ours[n] * per_step:.3f} / {c * per_step:.2f}"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
