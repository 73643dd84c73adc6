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

    .venv/bin/python benchmarks/engine_dispatch.py            # --quick for a smoke run
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
import tempfile
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


def one_run(dispatch: Callable[[object], object], events: list, reps: int) -> float:
    """Microseconds per ``dispatch(event)`` call over ``reps`` passes over ``events``, garbage collector off."""
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for _ in range(reps):
            for event in events:
                dispatch(event)
        return (time.perf_counter_ns() - start) / 1000 / (reps * len(events))
    finally:
        gc.enable()


# --- composer_bridge -----------------------------------------------------------------------------
class NoOp(Algorithm):
    def match(self, event, state):
        return True

    def apply(self, event, state, logger):
        return None


def noop_algorithms(n: int) -> list[Algorithm]:
    # Distinct classes, as in a real run (trace keys are per class).
    return [type(f"NoOp{i}", (NoOp,), {})() for i in range(n)]


def bridge_algorithms(n: int) -> tuple[Callable, list]:
    engine = Engine(State(torch.nn.Linear(1, 1), algorithms=noop_algorithms(n)))
    return engine.run_event, [Event[name] for name in STEP_EVENTS]


def bridge_handlers(n: int) -> tuple[Callable, list]:
    engine = Engine(State(torch.nn.Linear(1, 1)))
    events = [Event[name] for name in STEP_EVENTS]
    for event in events:
        for _ in range(n):
            engine.add_event_handler(event, lambda state, event: None)
    return engine.run_event, events


# --- PyTorch Ignite ------------------------------------------------------------------------------
def ignite_handlers(n: int) -> tuple[Callable, list]:
    from ignite.engine import Engine as IgniteEngine
    from ignite.engine.events import EventEnum

    StepEvents = EventEnum("StepEvents", {name: name.lower() for name in STEP_EVENTS})
    engine = IgniteEngine(lambda engine, batch: None)
    engine.register_events(*StepEvents)
    for event in StepEvents:
        for _ in range(n):
            engine.add_event_handler(event, lambda engine: None)
    # _fire_event is what Ignite's own loop calls for every event (fire_event adds one call on top).
    return engine._fire_event, list(StepEvents)


# --- MosaicML Composer (in its own environment) --------------------------------------------------
# A worker in Composer's environment: reads "N REPS" lines, answers with the µs per event of one run.
COMPOSER_WORKER = r"""
import gc, json, sys, time
import torch
from composer.core import Algorithm, Engine, Event, State
from composer.loggers import Logger
from composer.models import ComposerClassifier

torch.set_num_threads(1)
names = json.loads(sys.argv[1])

class NoOp(Algorithm):
    def match(self, event, state):
        return True
    def apply(self, event, state, logger):
        return None

data = torch.utils.data.TensorDataset(torch.zeros(8, 2), torch.zeros(8, dtype=torch.long))
engines = {}

def engine_with(n):
    if n not in engines:
        algorithms = [type(f"NoOp{i}", (NoOp,), {})() for i in range(n)]
        state = State(model=ComposerClassifier(torch.nn.Linear(2, 2), num_classes=2), rank_zero_seed=0,
                      run_name="bench", device="cpu", algorithms=algorithms, max_duration="1ep",
                      dataloader=torch.utils.data.DataLoader(data, batch_size=2), dataloader_label="train")
        engines[n] = Engine(state, Logger(state))
        for event in events:
            engines[n].run_event(event)
    return engines[n]

events = [Event[name] for name in names]
print(json.dumps({"version": __import__("composer").__version__}), flush=True)
for line in sys.stdin:
    n, reps = map(int, line.split())
    run_event = engine_with(n).run_event
    gc.disable()
    start = time.perf_counter_ns()
    for _ in range(reps):
        for event in events:
            run_event(event)
    spent = (time.perf_counter_ns() - start) / 1000 / (reps * len(events))
    gc.enable()
    print(json.dumps(spent), flush=True)
"""


class ComposerWorker:
    """Composer's Engine, measured in its own interpreter so that Composer is never imported here."""

    def __init__(self) -> None:
        # Its error output goes to a file (a pipe nobody reads could fill and stall it), shown if it dies.
        self.errors = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [COMPOSER_PYTHON, "-c", COMPOSER_WORKER, json.dumps(STEP_EVENTS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        self.version = json.loads(self._read())["version"]

    def _read(self) -> str:
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            code = self.process.wait()
            self.errors.seek(0)
            tail = "".join(self.errors.readlines()[-15:]).rstrip()
            raise RuntimeError(f"the Composer worker ({COMPOSER_PYTHON}) exited with {code}; its last error "
                               f"output:\n{tail or '(none)'}")
        return line

    def one_run(self, n: int, reps: int) -> float:
        self.process.stdin.write(f"{n} {reps}\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        return float(json.loads(self._read()))

    def close(self) -> None:
        self.process.stdin.close()  # type: ignore[union-attr]
        self.process.wait()
        self.errors.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[0, 1, 4, 16], help="algorithms / handlers")
    parser.add_argument("--reps", type=int, default=2000, help="steps per run (Composer: a tenth of it)")
    parser.add_argument("--runs", type=int, default=9, help="runs per measurement (the median is reported)")
    parser.add_argument("--no-composer", action="store_true", help="leave Composer out")
    parser.add_argument("--quick", action="store_true", help="smoke run: N = 0 and 16, 200 steps x 3 runs")
    args = parser.parse_args()
    if args.quick:
        args.counts, args.reps, args.runs = [0, 16], 200, 3
    torch.set_num_threads(1)

    import ignite

    composer = None
    if not args.no_composer and os.path.exists(COMPOSER_PYTHON):
        try:
            composer = ComposerWorker()
        except (OSError, RuntimeError, ValueError) as error:
            print(f"(Composer not measured: {error})", file=sys.stderr)
    systems: dict[str, dict[int, tuple[Callable, list]]] = {
        "ours": {n: bridge_algorithms(n) for n in args.counts},
        "handlers": {n: bridge_handlers(n) for n in args.counts},
        "ignite": {n: ignite_handlers(n) for n in args.counts},
    }
    samples: dict[str, dict[int, list[float]]] = {name: {n: [] for n in args.counts} for name in [*systems, "composer"]}
    for by_count in systems.values():  # warm up: fill the order caches and handler lists
        for dispatch, events in by_count.values():
            one_run(dispatch, events, 10)
    # Interleave the systems run by run, so that a busy moment of the machine hits all of them alike.
    for _ in range(args.runs):
        for n in args.counts:
            for name, by_count in systems.items():
                samples[name][n].append(one_run(*by_count[n], args.reps))
            if composer is not None:
                samples["composer"][n].append(composer.one_run(n, max(args.reps // 10, 20)))
    if composer is not None:
        composer.close()
    median = {name: {n: statistics.median(v) for n, v in by_count.items() if v} for name, by_count in samples.items()}

    print(f"Python {platform.python_version()}, torch {torch.__version__}, pytorch-ignite {ignite.__version__}"
          + (f", Composer {composer.version}" if composer else ", Composer not measured"))
    print(f"{len(STEP_EVENTS)} events per optimizer step; µs per event, median of {args.runs} interleaved runs "
          f"of {args.reps} steps ({max(args.reps // 10, 20)} for Composer).\n")
    header = ["N", "composer_bridge `run_event`, N algorithms", "composer_bridge, N handlers",
              "Ignite `_fire_event`, N handlers", "Ignite ÷ ours"]
    if composer:
        header += ["Composer `run_event`, N algorithms", "Composer ÷ ours", "ms per step: ours / Composer"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    per_step = len(STEP_EVENTS) / 1000
    for n in args.counts:
        ours, ignite_us = median["ours"][n], median["ignite"][n]
        row = [str(n), f"{ours:.2f}", f"{median['handlers'][n]:.2f}", f"{ignite_us:.2f}", f"{ignite_us / ours:.2f}x"]
        if composer:
            theirs = median["composer"][n]
            row += [f"{theirs:.1f}", f"{theirs / ours:.0f}x", f"{ours * per_step:.3f} / {theirs * per_step:.2f}"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
