"""What each algorithm costs per training step, next to one forward+backward of the example model.

Every case runs one algorithm through the events of one optimizer step (``AFTER_DATALOADER`` …
``AFTER_TRAIN_BATCH``, each ``match`` checked and ``apply`` called where it matches) on a fixed
batch of 64 RGB 32x32 images with 10 classes, with the model's outputs and loss already in the
state, so what is timed is the algorithm's own work (SelectiveBackprop's includes its extra
no-grad forward pass). Next to it: one forward+backward of ``ResNetCNN(in_channels=3)`` on the
full batch, and on the batch the algorithm leaves (smaller images or fewer examples make the
training step itself cheaper). Times are medians over ``--runs`` runs of about ``--seconds`` each,
the three measurements of a row interleaved run by run (so a busy moment of the machine hits them
alike), on one torch thread by default (steady numbers on a shared machine).

To add an algorithm, append one :class:`Case` to ``CASES``: a label and a factory for the
configured algorithm (``events`` and ``prepare`` cover algorithms that act at other events or
need setting up, e.g. surgery at ``INIT``).

Usage::

    .venv/bin/python benchmarks/algorithm_cost.py            # --seconds, --runs, --threads, --only
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from composer_bridge import Algorithm, ComposerClassifier, Event, Logger, State
from composer_bridge.algorithms import (
    Alibi,
    BlurPool,
    ChannelsLast,
    ColOut,
    CutMix,
    CutOut,
    Factorize,
    GatedLinearUnits,
    GhostBatchNorm,
    GyroDropout,
    LabelSmoothing,
    LowPrecisionGroupNorm,
    LowPrecisionLayerNorm,
    MixUp,
    ProgressiveResizing,
    SelectiveBackprop,
    SqueezeExcite,
    StochasticDepth,
    WeightStandardization,
)
from composer_bridge.models import GPT, ResNetCNN

BATCH, CHANNELS, SIZE, CLASSES = 64, 3, 32, 10
STEP_EVENTS = (
    Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_TRAIN_BATCH, Event.BEFORE_FORWARD,
    Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD,
    Event.AFTER_TRAIN_BATCH,
)


@dataclass
class Case:
    """One row of the table: ``make()`` builds the configured algorithm."""

    label: str
    make: Callable[[], Algorithm]
    events: tuple[Event, ...] = STEP_EVENTS
    prepare: Callable[[Algorithm, State], None] | None = None
    notes: str = field(default="")


CASES: list[Case] = [
    Case("LabelSmoothing(0.1)", lambda: LabelSmoothing(smoothing=0.1)),
    Case("MixUp(0.2)", lambda: MixUp(alpha=0.2)),
    Case("MixUp(0.2, interpolate_loss=True)", lambda: MixUp(alpha=0.2, interpolate_loss=True),
         notes="includes a second loss evaluation"),
    Case("CutMix(1.0)", lambda: CutMix(alpha=1.0)),
    Case("CutMix(1.0, interpolate_loss=True)", lambda: CutMix(alpha=1.0, interpolate_loss=True),
         notes="includes a second loss evaluation"),
    Case("CutOut(1, 0.5)", lambda: CutOut(num_holes=1, length=0.5)),
    Case("ColOut(0.15, 0.15)", lambda: ColOut(p_row=0.15, p_col=0.15)),
    Case("ProgressiveResizing(initial_scale=0.5)", lambda: ProgressiveResizing(initial_scale=0.5, delay_fraction=0.0),
         notes="at the start of the ramp (scale 0.5)"),
    Case("SelectiveBackprop(keep=0.5)", lambda: SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0),
         notes="includes its no-grad forward of the whole batch"),
]


def make_model() -> ComposerClassifier:
    torch.manual_seed(0)
    return ComposerClassifier(ResNetCNN(num_classes=CLASSES, in_channels=CHANNELS), num_classes=CLASSES)


def fixed_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(BATCH, CHANNELS, SIZE, SIZE, generator=generator),
            torch.randint(0, CLASSES, (BATCH,), generator=generator))


def calibrated(step: Callable[[], object], seconds: float) -> Callable[[], float]:
    """A run of ``step`` lasting about ``seconds``; the run returns the milliseconds per call."""
    start = time.perf_counter()
    step()  # warm up (allocator, kernels, caches) and calibrate
    reps = max(1, int(seconds / max(time.perf_counter() - start, 1e-6)))

    def run() -> float:
        start = time.perf_counter()
        for _ in range(reps):
            step()
        return (time.perf_counter() - start) / reps * 1e3

    return run


def interleaved_medians(steps: dict[str, Callable[[], object]], seconds: float, runs: int) -> dict[str, float]:
    """Median milliseconds per call of each step, their runs interleaved so a busy moment hits all alike."""
    timers = {name: calibrated(step, seconds) for name, step in steps.items()}
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(runs):
        for name, run in timers.items():
            samples[name].append(run())
    return {name: statistics.median(values) for name, values in samples.items()}


def forward_backward(model: ComposerClassifier, batch: tuple[torch.Tensor, torch.Tensor]) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model.loss(model(batch), batch).backward()

    return step


def algorithm_step(case: Case, model: ComposerClassifier, batch: tuple[torch.Tensor, torch.Tensor]
                   ) -> tuple[Callable[[], State], State]:
    """One step of ``case``'s algorithm on a fresh copy of the state; returns the step and a sample state."""
    algorithm = case.make()
    state = State(model, max_duration="1000ba", seed=0)
    if case.prepare is not None:
        case.prepare(algorithm, state)
    with torch.no_grad():
        outputs = model(batch)
        loss = F.cross_entropy(outputs, batch[1])
    logger = Logger()

    def step() -> State:
        state.batch, state.outputs, state.loss = batch, outputs, loss
        for event in case.events:
            if algorithm.match(event, state):
                algorithm.apply(event, state, logger)
        return state

    return step, state


# --- surgery algorithms: one forward+backward of the model after surgery vs before ----------------
#: (label, configured algorithm, model); thresholds are lowered where Composer's defaults would
#: leave the small example models untouched.
SURGERY_CASES: list[tuple[str, Callable[[], Algorithm], str]] = [
    ("BlurPool()", BlurPool, "ResNetCNN"),
    ("ChannelsLast()", ChannelsLast, "ResNetCNN"),
    ("SqueezeExcite(latent_channels=0.25, min_channels=32)",
     lambda: SqueezeExcite(latent_channels=0.25, min_channels=32), "ResNetCNN"),
    ("StochasticDepth(drop_rate=0.2)", lambda: StochasticDepth(drop_rate=0.2), "ResNetCNN"),
    ("GhostBatchNorm(ghost_batch_size=16)", lambda: GhostBatchNorm(ghost_batch_size=16), "ResNetCNN"),
    ("WeightStandardization()", WeightStandardization, "ResNetCNN"),
    ("Factorize(min_channels=32, latent_channels=0.25)",
     lambda: Factorize(min_channels=32, latent_channels=0.25), "ResNetCNN"),
    ("LowPrecisionGroupNorm()", LowPrecisionGroupNorm, "GroupNorm CNN, bf16 autocast"),
    ("LowPrecisionLayerNorm()", LowPrecisionLayerNorm, "GPT, bf16 autocast"),
    ("GatedLinearUnits()", GatedLinearUnits, "GPT"),
    ("Alibi(max_sequence_length=128)", lambda: Alibi(max_sequence_length=128), "GPT"),
    ("GyroDropout()", GyroDropout, "GPT"),
]


def surgery_model(kind: str) -> tuple[nn.Module, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The model a surgery case changes, a fixed input and a loss on its output."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    if kind.startswith("GPT"):  # 16 sequences of 128 characters
        net: nn.Module = GPT(vocab_size=96, block_size=128, d_model=128, n_layers=2, n_heads=4, dropout=0.1)
        tokens = torch.randint(0, 96, (16, 129), generator=generator)
        return net, tokens[:, :-1], lambda out: F.cross_entropy(out.float().reshape(-1, 96), tokens[:, 1:].reshape(-1))
    images = torch.randn(BATCH, CHANNELS, SIZE, SIZE, generator=generator)
    labels = torch.randint(0, CLASSES, (BATCH,), generator=generator)
    if kind.startswith("GroupNorm"):
        net = nn.Sequential(nn.Conv2d(CHANNELS, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU(),
                            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.GroupNorm(8, 64), nn.ReLU(),
                            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, CLASSES))
    else:
        net = ResNetCNN(num_classes=CLASSES, in_channels=CHANNELS)
    return net, images, lambda out: F.cross_entropy(out.float(), labels)


def surgery_step(model: nn.Module, inputs: torch.Tensor, loss_of: Callable[[torch.Tensor], torch.Tensor],
                 autocast: bool) -> Callable[[], None]:
    def run() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_of(model(inputs))
        loss.backward()

    return run


def print_surgery_table(args: argparse.Namespace) -> None:
    """Forward+backward after each surgery vs before (train mode), interleaved run by run."""
    print("\n| surgery | model | forward+backward before (ms) | after (ms) | after ÷ before |")
    print("|---|---|---|---|---|")
    for label, make, kind in SURGERY_CASES:
        if args.only and not any(label.startswith(prefix) for prefix in args.only):
            continue
        net, inputs, loss_of = surgery_model(kind)
        changed = copy.deepcopy(net)
        state = State(changed, max_duration="1000ba", seed=0, precision="bf16-mixed")
        state.dataloader_len, state.batch = 100, (inputs, inputs)
        algorithm = make()
        for event in (Event.INIT, Event.AFTER_DATALOADER):  # surgery, then per-step set-up (generators)
            if algorithm.match(event, state):
                algorithm.apply(event, state, Logger())
        autocast = "autocast" in kind
        steps = {"before": surgery_step(net.train(), inputs, loss_of, autocast),
                 "after": surgery_step(changed.train(), inputs, loss_of, autocast)}
        times = interleaved_medians(steps, args.seconds, args.runs)
        print(f"| {label} | {kind} | {times['before']:.0f} | {times['after']:.0f} | "
              f"{times['after'] / times['before']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one run of a measurement")
    parser.add_argument("--runs", type=int, default=7, help="runs per measurement (the median is reported)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: stable on shared cores; 0 keeps torch's default)")
    parser.add_argument("--only", nargs="*", default=None, help="labels (prefixes) of the cases to run")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, batch = make_model(), fixed_batch()
    model.train()
    rows = []
    for case in CASES:
        if args.only and not any(case.label.startswith(prefix) for prefix in args.only):
            continue
        step, _ = algorithm_step(case, model, batch)
        left = step().batch
        left_batch = (left[0], batch[1][: left[0].shape[0]])  # targets only matter for the loss's cost
        steps = {"full": forward_backward(model, batch), "algorithm": step}
        if left_batch[0].shape != batch[0].shape:
            steps["left"] = forward_backward(model, left_batch)
        times = interleaved_medians(steps, args.seconds, args.runs)
        times.setdefault("left", times["full"])  # same shape, same work: no second (noisy) measurement
        shape = "x".join(str(s) for s in left[0].shape)
        rows.append((case.label, times, shape, case.notes))
    print(f"Batch {BATCH}x{CHANNELS}x{SIZE}x{SIZE}, {CLASSES} classes; model ResNetCNN(in_channels=3), train mode.\n")
    print("| algorithm | its cost per step (ms) | forward+backward (ms) | cost ÷ forward+backward | batch it leaves "
          "| forward+backward on it (ms) | step with it ÷ without | notes |")
    print("|---|---|---|---|---|---|---|---|")
    for label, times, shape, notes in rows:
        full, cost, after = times["full"], times["algorithm"], times["left"]
        print(f"| {label} | {cost:.3f} | {full:.0f} | {cost / full:.2%} | {shape} | {after:.0f} | "
              f"{(cost + after) / full:.2f} | {notes} |")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    print_surgery_table(args)
    print(f"\n{cpu}; {torch.get_num_threads()} torch thread(s); Python {platform.python_version()}, "
          f"torch {torch.__version__}; median of {args.runs} runs of about {args.seconds:g} s each.")


if __name__ == "__main__":
    main()
