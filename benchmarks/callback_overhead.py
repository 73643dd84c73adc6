"""Per-step overhead of AlgorithmEngineCallback in a real lightning.Trainer, side by side in one run.

A tiny ``Linear(32, 2)`` model (a plain ``LightningModule``, batch 8) runs ``--steps`` CPU steps
under each configuration below; every round runs all of them once, in a new (seeded) random order,
and ``--repeats`` rounds are run:

- plain Lightning (no callback);
- + one bare ``lightning.Callback()`` (Lightning's own floor for adding any callback);
- + ``AlgorithmEngineCallback([])`` (an empty bridge);
- + the bridge with 16 no-op algorithms of 16 *distinct* classes, each matching the per-step
  events (so each has its own trace keys and cost entries, as 16 real algorithms would);
- + 16 no-op Lightning callbacks of 16 distinct classes (6 per-step hooks each): the alternative of
  writing each algorithm as its own Lightning callback;
- + the bridge with 16 instances of *one* no-op class (what this benchmark measured before: their
  traces and cost entries collapse into one key per event, so it understates the bridge's cost).

Every step is timed in the training thread's CPU time (``time.thread_time_ns``): the overheads
measured here are CPU work, and on a machine shared with other jobs wall time also counts the
moments another process held the core. Each run is summarised twice:

- **decile**: the lower decile of its steps' CPU times, the cost of an undisturbed step. On a
  shared VM identical plain runs measured 0.85-1.5 ms per step in the mean while their lower
  deciles stayed within a few percent: other tenants' work (cache and memory-bandwidth contention
  reach thread CPU time too) only ever *adds* time, and the bridge's work is the same in every
  step, so the lower decile estimates it with the least interference (the reasoning behind
  ``timeit``'s advice to read the minimum). It leaves out costs that come only in some steps
  (a garbage collection, the trace timeline's halving at step 1,024): the mean keeps them.
- **mean**: the mean over all steps (interference included).

Overheads are paired: within a round, a configuration's value minus plain Lightning's; the median
over rounds is reported with the lowest and highest round. Wall time is recorded too.

Separate runs differ by more than the bridge costs on a shared machine (a step's time drifts over
hundreds of steps), so the two targets are read from fits where the compared set-ups take turns
every 10 steps in one process (``in_run_ab``, ``in_run_groups``): the empty bridge at most 1.02x a
plain step, and the extra of 16 distinct algorithms at most 0.6x the extra of 16 Lightning
callbacks. The across-run figures are printed for reference, with engine dispatch against PyTorch
Ignite's measured in the same run (``benchmarks/engine_dispatch.py``; needs ``pytorch-ignite``, the
``bench`` extra).

``--profiler simple`` (or ``advanced``, ``pytorch``) gives every Trainer that profiler, so every
configuration pays it and the bridge's markers show what it adds on top.

``--package pytorch_lightning`` runs everything on ``import pytorch_lightning as pl`` (``pl.Trainer``,
``pl.LightningModule``, ``pl.Callback``) instead of ``lightning``.

Usage::

    .venv/bin/python benchmarks/callback_overhead.py                 # 2000 steps x 11 rounds
    .venv/bin/python benchmarks/callback_overhead.py --quick         # a smoke run, ~1 min
    .venv/bin/python benchmarks/callback_overhead.py --ab-only --package pytorch_lightning
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import logging
import os
import platform
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from composer_bridge import Algorithm, AlgorithmEngineCallback, Event, State

PACKAGES = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}


def _package_option() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--package", choices=sorted(PACKAGES), default="lightning",
                        help="the Lightning package to run on (lightning.pytorch or pytorch_lightning)")
    return parser


# Read before the classes below are built on the package's LightningModule and Callback.
PACKAGE = _package_option().parse_known_args()[0].package
L: Any = importlib.import_module(PACKAGES[PACKAGE])

# The events of one optimizer step (what a per-step algorithm such as EMA, LayerFreezing or MixUp
# matches); a plain LightningModule gets nine of them (not the forward/loss ones).
STEP_EVENTS = frozenset({
    Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_TRAIN_BATCH,
    Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD,
    Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH, Event.BATCH_END, Event.BATCH_CHECKPOINT,
})
N = 16
#: the Trainers' ``profiler=`` (``None``: Lightning's default, PassThroughProfiler); set by ``--profiler``
PROFILER: str | None = None


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(32, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StepNoOp(Algorithm):
    """Runs at every per-step event and does nothing: the engine's cost with no work in ``apply``."""

    def match(self, event: Event, state: State) -> bool:
        return event in STEP_EVENTS

    def apply(self, event: Event, state: State, logger: Any) -> None:
        return None


class NoOpCallback(L.Callback):
    def on_train_batch_start(self, *args: Any) -> None: ...
    def on_train_batch_end(self, *args: Any) -> None: ...
    def on_before_backward(self, *args: Any) -> None: ...
    def on_after_backward(self, *args: Any) -> None: ...
    def on_before_optimizer_step(self, *args: Any) -> None: ...
    def on_before_zero_grad(self, *args: Any) -> None: ...


# 16 distinct classes each (built once: a class per configuration run would only add noise).
DISTINCT_ALGORITHMS = [type(f"StepNoOp{i:02d}", (StepNoOp,), {}) for i in range(N)]
DISTINCT_CALLBACKS = [type(f"NoOpCallback{i:02d}", (NoOpCallback,), {}) for i in range(N)]


def loader(steps: int) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * 8, 32, generator=g)
    y = torch.randint(0, 2, (steps * 8,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def lower_decile(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[0]


@dataclass
class Run:
    """One configuration's run: the training thread's CPU seconds of every step, and the mean wall seconds."""

    cpu: list[float]
    wall: float

    @property
    def mean(self) -> float:
        """CPU seconds per step, averaged over every step (what the run cost, interference included)."""
        return statistics.fmean(self.cpu)

    @property
    def decile(self) -> float:
        """The lower decile of the steps' CPU seconds: an undisturbed step's cost (see the module docstring)."""
        return lower_decile(self.cpu)


def time_fit(callbacks: list[L.Callback], steps: int) -> Run:
    """Time every step of a ``fit`` (setup excluded): step i runs from batch i's start to batch i+1's."""
    cpu: list[int] = []
    wall: list[float] = []

    class Clock(L.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            cpu.append(time.thread_time_ns())
            if not wall:
                wall.append(time.perf_counter())

        def on_train_end(self, *args: Any) -> None:
            wall.append(time.perf_counter())

    trainer = L.Trainer(
        accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[Clock(), *callbacks], profiler=PROFILER,
    )
    trainer.fit(Tiny(), loader(steps))
    return Run([(b - a) * 1e-9 for a, b in itertools.pairwise(cpu)], (wall[1] - wall[0]) / (steps - 1))


class Toggling(Tiny):
    """``Tiny`` that puts one group of guest callbacks at a time into ``trainer.callbacks`` for ``block`` steps.

    The groups take turns, then a block runs with none of them: with one group, the guests take
    part in alternate blocks. The switch happens in the module's ``on_train_batch_start``, which
    Lightning calls after its callbacks' hook of the same name, so step i (from this hook to the
    next) runs wholly with one group or with none. Every step's CPU time is recorded with the group
    that took part (its index in ``groups``; -1 for none).

    An active bridge also fires events from hooks it sets on the module instance (batch transfer,
    ``training_step``, ``backward``), which leaving ``trainer.callbacks`` does not stop: while its
    group is out, those instance attributes are put aside too (the class's own hooks run, as in
    plain Lightning), and put back with the group.
    """

    def __init__(self, groups: list[list[L.Callback]], block: int) -> None:
        super().__init__()
        self.groups, self.block = groups, block
        self.marks: list[int] = []
        self.slots: list[int] = []
        self._bridge_group = next((i for i, group in enumerate(groups)
                                   if any(isinstance(g, AlgorithmEngineCallback) for g in group)), None)
        self._aside: dict[str, Any] | None = None  # the bridge's instance hooks while its group is out

    def _module_hooks(self, present: bool) -> None:
        if present and self._aside is not None:
            vars(self).update(self._aside)
            self._aside = None
        elif not present and self._aside is None:
            cls = type(self)
            names = [k for k, v in vars(self).items() if callable(v) and callable(getattr(cls, k, None))]
            self._aside = {name: vars(self).pop(name) for name in names}

    @property
    def present(self) -> list[bool]:
        """For every step, whether a group of guests took part."""
        return [slot >= 0 for slot in self.slots]

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.marks.append(time.thread_time_ns())
        slot = (len(self.slots) // self.block) % (len(self.groups) + 1)
        slot = -1 if slot == len(self.groups) else slot
        callbacks = self.trainer.callbacks
        if self._bridge_group is not None:
            self._module_hooks(slot == self._bridge_group)
        for index, group in enumerate(self.groups):
            if index == slot and group[0] not in callbacks:
                callbacks.extend(group)
            elif index != slot and group[0] in callbacks:
                for guest in group:
                    callbacks.remove(guest)
        self.slots.append(slot)


def in_run_groups(groups: list[list[L.Callback]], steps: int, block: int = 10,
                  warmup: int = 200, settle: int = 0) -> list[list[float]]:
    """One ``fit`` with each group of ``groups`` taking part in turn for ``block`` steps, then a block with none.

    Returns the kept steps' CPU seconds per group, and last those of the steps with no guests.
    Plain Lightning and Lightning with each group run in the same process, model and data, a few
    milliseconds apart: what differs between the sets of steps is only each group's per-step work.
    Every group is in the ``Trainer`` from the start, so its set-up hooks have run; the first
    ``warmup`` steps are left out, and the first ``settle`` steps of every block (a bridge that comes
    back after a block away sees its step's plans change, which a bridge that stays never does).
    """
    module = Toggling(groups, block)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[guest for group in groups for guest in group],
    )
    trainer.fit(module, loader(steps))
    times = [(b - a) * 1e-9 for a, b in itertools.pairwise(module.marks)]
    kept = [(t, s) for i, (t, s) in enumerate(zip(times, module.slots, strict=False))
            if i >= warmup and i % block >= settle]
    return [[t for t, s in kept if s == slot] for slot in [*range(len(groups)), -1]]


@dataclass
class AB:
    """One in-run A/B fit: the steps' CPU seconds with and without the guests."""

    with_guests: list[float]
    without: list[float]

    def ratio(self, summary: Callable[[list[float]], float]) -> float:
        return summary(self.with_guests) / summary(self.without)


def in_run_ab(guests: list[L.Callback], steps: int, block: int = 10, warmup: int = 200) -> AB:
    """One ``fit`` with ``guests`` taking part in alternate blocks of ``block`` steps (see ``in_run_groups``)."""
    with_guests, without = in_run_groups([guests], steps, block, warmup)
    return AB(with_guests, without)





class EveryFourthStep(StepNoOp):
    """Runs at ``BATCH_END`` of every 4th step only, as an algorithm with an update interval does."""

    def match(self, event: Event, state: State) -> bool:
        return event is Event.BATCH_END and state.timestamp.batch.value % 4 == 0


#: the groups that take turns in one fit (``in_run_groups``): the 16 algorithms against the 16 callbacks
#: with no process, model or machine state between them (a Trainer takes one bridge, so one bridge group)
GROUPS: dict[str, Callable[[], list[L.Callback]]] = {
    f"bridge, {N} distinct no-op algorithms": lambda: [AlgorithmEngineCallback([c() for c in DISTINCT_ALGORITHMS])],
    f"{N} no-op Lightning callbacks": lambda: [c() for c in DISTINCT_CALLBACKS],
}
AB_GUESTS: dict[str, Callable[[], list[L.Callback]]] = {
    "AlgorithmEngineCallback([])": lambda: [AlgorithmEngineCallback([])],
    "1 bare Lightning callback (no hooks)": lambda: [L.Callback()],
    f"bridge, {N} algorithms + 1 every 4th step": lambda: [
        AlgorithmEngineCallback([*(c() for c in DISTINCT_ALGORITHMS), EveryFourthStep()])],
}
GROUP_BLOCK, GROUP_SETTLE = 10, 2


PLAIN = "plain Lightning"
EMPTY = "+ AlgorithmEngineCallback([])"
ALGOS = f"+ bridge, {N} distinct no-op algorithms"
CALLBACKS = f"+ {N} no-op Lightning callbacks"
CONFIGS: dict[str, Callable[[], list[L.Callback]]] = {
    PLAIN: lambda: [],
    "+ 1 bare Lightning callback (no hooks)": lambda: [L.Callback()],
    EMPTY: lambda: [AlgorithmEngineCallback([])],
    ALGOS: lambda: [AlgorithmEngineCallback([cls() for cls in DISTINCT_ALGORITHMS])],
    CALLBACKS: lambda: [cls() for cls in DISTINCT_CALLBACKS],
    f"+ bridge, {N} instances of one no-op class (old benchmark)": lambda: [
        AlgorithmEngineCallback([StepNoOp() for _ in range(N)])],
}


def check_distinct_keys(steps: int) -> tuple[int, int]:
    """Run the 16-class bridge once; return its (trace keys, cost entries), which must be 16 per event."""
    bridge = AlgorithmEngineCallback([cls() for cls in DISTINCT_ALGORITHMS])
    time_fit([bridge], steps)
    traces, cost = len(bridge.traces.stats), len(bridge.cost)
    per_event = {key.split("/")[1] for key in bridge.traces.stats}
    if traces != N * len(per_event) or cost != traces:
        raise AssertionError(f"expected {N} trace keys and cost entries per event, got {traces} keys and "
                             f"{cost} cost entries over {len(per_event)} events")
    return traces, len(per_event)


def dispatch_vs_ignite(reps: int, runs: int) -> tuple[float, float, list[float]] | None:
    """Engine.run_event with 16 distinct no-op algorithms vs Ignite's dispatch to 16 handlers, interleaved.

    Returns (median µs per event ours, Ignite's, per-run Ignite ÷ ours), or None without Ignite.
    """
    if importlib.util.find_spec("ignite") is None:
        return None
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import engine_dispatch

    ours, theirs = engine_dispatch.bridge_algorithms(N), engine_dispatch.ignite_handlers(N)
    engine_dispatch.one_run(*ours, 10)
    engine_dispatch.one_run(*theirs, 10)
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(runs):
        samples[0].append(engine_dispatch.one_run(*ours, reps))
        samples[1].append(engine_dispatch.one_run(*theirs, reps))
    ratios = [t / o for o, t in zip(*samples, strict=True)]
    return statistics.median(samples[0]), statistics.median(samples[1]), ratios


def spread(values: list[float], fmt: str) -> str:
    return f"{min(values):{fmt}}..{max(values):{fmt}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     parents=[_package_option()])
    parser.add_argument("--steps", type=int, default=2000, help="training steps per configuration run")
    parser.add_argument("--repeats", type=int, default=11, help="interleaved rounds")
    parser.add_argument("--ab-steps", type=int, default=10000, help="steps of each in-run A/B fit")
    parser.add_argument("--ab-repeats", type=int, default=3, help="in-run A/B fits per guest")
    parser.add_argument("--ab-only", action="store_true", help="only the in-run A/B of the empty bridge (with "
                        "PYTHONPATH=<other checkout>: compare versions)")
    parser.add_argument("--groups-only", action="store_true", help="only the in-run fits of 16 algorithms against "
                        "16 callbacks, and the interval algorithm's A/B (with PYTHONPATH=<other checkout>: compare versions)")
    parser.add_argument("--profiler", choices=("simple", "advanced", "pytorch"),
                        help="every Trainer's profiler (default: none, Lightning's PassThroughProfiler)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 300 steps x 3 rounds, one 2000-step A/B")
    args = parser.parse_args()
    global PROFILER
    PROFILER = args.profiler
    if args.quick:
        args.steps, args.repeats, args.ab_steps, args.ab_repeats = 300, 3, 2000, 1
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)

    if args.ab_only:
        import composer_bridge

        print(f"composer_bridge from {os.path.dirname(composer_bridge.__file__)} on {L.__name__} {L.__version__}; "
              "in-run A/B of the empty bridge, "
              f"{args.ab_steps} steps per fit (with ÷ without: mean, median, lower decile)")
        for _ in range(args.ab_repeats):
            fit = in_run_ab([AlgorithmEngineCallback([])], args.ab_steps)
            print(f"{fit.ratio(statistics.fmean):.4f}x  {fit.ratio(statistics.median):.4f}x  "
                  f"{fit.ratio(lower_decile):.4f}x")
        return
    if args.groups_only:
        import composer_bridge

        print(f"composer_bridge from {os.path.dirname(composer_bridge.__file__)} on {L.__name__} {L.__version__}; "
              f"in-run groups, {args.ab_steps} steps per fit: extra µs per step (mean) of {' and '.join(GROUPS)}, "
              "their ratio; then the interval algorithm's in-run A/B")
        for _ in range(args.ab_repeats):
            *guests, none = in_run_groups([make() for make in GROUPS.values()], args.ab_steps, GROUP_BLOCK,
                                          settle=GROUP_SETTLE)
            extra = [(statistics.fmean(g) - statistics.fmean(none)) * 1e6 for g in guests]
            print(f"+{extra[0]:.1f}  +{extra[1]:.1f}  {extra[0] / extra[1]:.3f}x")
        interval = list(AB_GUESTS)[-1]
        for _ in range(args.ab_repeats):
            fit = in_run_ab(AB_GUESTS[interval](), args.ab_steps)
            print(f"{interval}: +{(statistics.fmean(fit.with_guests) - statistics.fmean(fit.without)) * 1e6:.1f}")
        return
    keys, events = check_distinct_keys(50)  # also the warm-up
    runs: dict[str, list[Run]] = {name: [] for name in CONFIGS}
    order = random.Random(0)  # each round runs the configurations in a new order: no fixed position bias
    started = time.perf_counter()
    for _ in range(args.repeats):
        names = list(CONFIGS)
        order.shuffle(names)
        for name in names:
            runs[name].append(time_fit(CONFIGS[name](), args.steps))
    abs_: dict[str, list[AB]] = {name: [] for name in AB_GUESTS}
    for _ in range(args.ab_repeats):
        for name, guests in AB_GUESTS.items():
            abs_[name].append(in_run_ab(guests(), args.ab_steps))
    groups: list[list[list[float]]] = []
    for _ in range(args.ab_repeats):
        groups.append(in_run_groups([make() for make in GROUPS.values()], args.ab_steps, GROUP_BLOCK,
                                    settle=GROUP_SETTLE))
    dispatch = dispatch_vs_ignite(reps=200 if args.quick else 2000, runs=3 if args.quick else 9)
    elapsed = time.perf_counter() - started

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.steps} steps x {args.repeats} interleaved rounds ({elapsed:.0f} s); "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average {load:.1f}; "
          f"Python {platform.python_version()}, torch {torch.__version__}, {L.__name__} {L.__version__}")
    print(f"The {N}-class bridge recorded {keys} trace keys and as many cost entries ({N} per event, "
          f"{events} events per step).\n")
    print("Step time: the training thread's CPU µs per step; decile: each run's lower decile of its steps "
          "(an undisturbed step), mean: each run's mean over all steps. Overhead: the median over rounds of "
          "(configuration - plain Lightning) in the same round; range: the lowest and highest round; "
          "wall: the mean-based overhead in wall time.\n")
    print("| configuration | decile µs/step | overhead (decile) | range | % of plain (decile) "
          "| mean µs/step | overhead (mean) | range | % of plain (mean) | wall overhead |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    plain = runs[PLAIN]
    extra: dict[str, dict[str, list[float]]] = {"decile": {}, "mean": {}}
    for name, values in runs.items():
        cells = []
        for kind, extras in extra.items():
            mine = [getattr(run, kind) for run in values]
            base = [getattr(run, kind) for run in plain]
            extras[name] = [(m - p) * 1e6 for m, p in zip(mine, base, strict=True)]
            overhead = statistics.median(extras[name])
            rng = "" if name == PLAIN else spread(extras[name], "+.0f")
            cells.append(f"{statistics.median(mine) * 1e6:.0f} | {overhead:+.0f} | {rng} "
                         f"| {overhead / (statistics.median(base) * 1e6) * 100:+.1f} %")
        wall = statistics.median((m.wall - p.wall) * 1e6 for m, p in zip(values, plain, strict=True))
        print(f"| {name} | {' | '.join(cells)} | {wall:+.0f} |")

    print(f"\nIn-run A/B: one fit of {args.ab_steps} steps per line, the guest taking part in alternate blocks of 10 "
          "steps (the first 200 steps left out); with ÷ without, in CPU time:\n")
    print("| guest | fit | mean | median | lower decile | extra µs/step (mean) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, fits in abs_.items():
        for i, fit in enumerate(fits, 1):
            extra_us = (statistics.fmean(fit.with_guests) - statistics.fmean(fit.without)) * 1e6
            print(f"| {name} | {i} | {fit.ratio(statistics.fmean):.4f}x | {fit.ratio(statistics.median):.4f}x "
                  f"| {fit.ratio(lower_decile):.4f}x | {extra_us:+.1f} |")

    names = list(GROUPS)
    print(f"\nIn-run groups: one fit of {args.ab_steps} steps per line; each group takes part for {GROUP_BLOCK} steps "
          f"in turn, then {GROUP_BLOCK} steps run with none (the first {GROUP_SETTLE} steps of every block and the "
          "first 200 of the fit left out); extra CPU µs per step over the steps with none:\n")
    print("| fit | steps with none, µs (mean) | " + " | ".join(f"{n} (mean / median)" for n in names)
          + f" | {names[0]} ÷ {names[1]} (mean / median) |")
    print("|---:|---:|" + "---:|" * (len(names) + 1))
    group_ratio: list[float] = []
    for i, fit in enumerate(groups, 1):
        *guests, none = fit
        means = [(statistics.fmean(g) - statistics.fmean(none)) * 1e6 for g in guests]
        medians = [(statistics.median(g) - statistics.median(none)) * 1e6 for g in guests]
        group_ratio.append(means[0] / means[1])
        print(f"| {i} | {statistics.fmean(none) * 1e6:.0f} | "
              + " | ".join(f"+{m:.0f} / +{d:.0f}" for m, d in zip(means, medians, strict=True))
              + f" | {means[0] / means[1]:.2f}x / {medians[0] / medians[1]:.2f}x |")

    empty_ab = [fit.ratio(statistics.fmean) for fit in abs_["AlgorithmEngineCallback([])"]]
    rows = [("empty bridge ÷ plain step (in-run A/B, mean; median of fits)", "≤ 1.02x",
             f"{statistics.median(empty_ab):.3f}x", spread(empty_ab, ".3f"), statistics.median(empty_ab) <= 1.02),
            (f"extra of {N} algorithms ÷ extra of {N} Lightning callbacks (in-run groups, mean; median of fits)",
             "≤ 0.6x", f"{statistics.median(group_ratio):.2f}x", spread(group_ratio, ".2f"),
             statistics.median(group_ratio) <= 0.6)]
    for kind, extras in extra.items():
        ratio = [getattr(e, kind) / getattr(p, kind) for e, p in zip(runs[EMPTY], plain, strict=True)]
        algos, callbacks = statistics.median(extras[ALGOS]), statistics.median(extras[CALLBACKS])
        paired = [a / c for a, c in zip(extras[ALGOS], extras[CALLBACKS], strict=True) if c > 0]
        rows += [
            (f"empty bridge ÷ plain step (across runs, {kind}; for reference)", "≤ 1.02x", f"{statistics.median(ratio):.3f}x",
             spread(ratio, ".3f"), statistics.median(ratio) <= 1.02),
            (f"extra of {N} algorithms ÷ extra of {N} Lightning callbacks (across runs, {kind}; for reference)",
             "≤ 0.6x", f"{algos / callbacks:.2f}x", spread(paired, ".2f") if paired else "", algos / callbacks <= 0.6),
        ]
    if dispatch is not None:
        ours, theirs, ratios = dispatch
        rows.append((f"Ignite dispatch ÷ engine dispatch, {N} handlers/algorithms ({ours:.2f} vs {theirs:.2f} µs/event)",
                     "> 1x", f"{theirs / ours:.2f}x", spread(ratios, ".2f"), theirs > ours))
    print("\n| target | wanted | measured (median) | range over rounds | met |")
    print("|---|---|---:|---:|---|")
    for name, wanted, measured, rng, met in rows:
        print(f"| {name} | {wanted} | {measured} | {rng} | {'yes' if met else 'NO'} |")
    if dispatch is None:
        print("\n(engine dispatch vs Ignite not measured: install the bench extra, pytorch-ignite)")


if __name__ == "__main__":
    main()
