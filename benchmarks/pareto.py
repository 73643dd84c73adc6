"""Quality against training time over several run lengths: the baseline and each recipe, several seeds.

MosaicML's way of showing a speed-up method: train the baseline and the recipe at several budgets
(run lengths), each run with its whole schedule (learning rate, recipe schedules, EMA half-life)
scaled to its budget, and plot final quality against training time. A recipe helps where its
curve lies above (vision) or below (language) the baseline's.

Two tasks on data that ships with the installed packages:

- **vision**: ``ResNetCNN(widths=(16, 32))`` on scikit-learn's 8x8 digits (``examples/vision.py``'s
  set-up, narrower: SGD, one-cycle learning rate, batch 64), budgets of 12, 23, 46 and 92
  optimizer steps (half an epoch to 4 epochs); quality = validation accuracy (360 images). The
  recipes are ``recipes.vision(name, total_steps=...)`` for ``mild``, ``medium`` and ``short``,
  with the image-size adjustments of ``examples/vision.py`` (ProgressiveResizing from 6x6 in
  2-pixel steps). ``--vision-size large`` is the set-up for a GPU: the digits upsampled once to
  64x64 (bilinear), ``ResNetCNN(widths=(64, 128, 256))``, batch 128, the same step budgets (one
  to 8 epochs); ProgressiveResizing starts at the same fraction of the side (48x48) and grows in
  4-pixel steps.
- **language**: a 2-layer character-level GPT (d_model 64, context 128, batch 4) on Python's
  standard-library source (``examples/language.py``), budgets of 25, 50, 100 and 200 steps;
  quality = validation bits per character (lower is better), on the whole validation split at
  full context. Recipes: ``gpt-fast``, and ``gpt-fast`` with ALiBi's shorter training sequences.

For each seed, the **strict speed-up** of a recipe is: take the baseline's best quality Q over
its budgets; the baseline's training time to reach Q on its own curve, divided by the recipe's
time to reach Q on its curve (linear interpolation between budgets). A seed whose recipe never
reaches Q is a failure and counts as 0x in the mean. The same figure is also computed on the
seed-averaged curves. Training time leaves validation out. On the CPU (``--accelerator cpu``, the
default) it is the process's CPU time (one torch thread; on a machine shared with other jobs it
varies far less than wall time, which is recorded too). On a GPU (``--accelerator gpu``) CPU time
means nothing, so it is wall time with the device synchronised where training starts and stops
(``examples/vision.py``'s ``AccuracyTimeline``); both times are recorded either way and each run's
``clock`` says which one the curves use (runs.json files without it are CPU time). ``--precision``
(default ``32-true``) goes to the Trainer. Runs are interleaved round-robin (every configuration of a (task, budget, seed)
round in a shuffled order, tasks alternating) so a busy moment of the machine hits all alike, and
the load average is recorded at every run.

After the grid, the recipe with the best mean strict speed-up on each task is ablated: each of its
algorithms left out in turn, at the middle budget, same seeds.

    python benchmarks/pareto.py                 # full: about 6 CPU-minutes (22 min at load average 13)
    python benchmarks/pareto.py --quick         # 3 budgets, 2 seeds, fewer recipes: 1.4 CPU-minutes
    python benchmarks/pareto.py --tasks language --seeds 5
    python benchmarks/pareto.py --replot outputs/pareto/runs.json   # tables and PNGs, no training
    # On a CUDA GPU (not yet run: see docs/benchmarks.md, "On a GPU"):
    python benchmarks/pareto.py --tasks vision --vision-size large --accelerator gpu --precision bf16-mixed \
        --seeds 3 --out outputs/pareto_gpu

Writes ``runs.json`` (every run, written as it goes), ``pareto_<task>.png`` and ``pareto.md``
into ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import platform
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from composer_bridge.search.scoring import strict_speedup, time_to_reach  # noqa: F401  (for examples/demo.py and the tests)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import language  # noqa: E402  (examples/language.py)
import vision  # noqa: E402  (examples/vision.py)

# --- what one run is ---------------------------------------------------------------------------


@dataclass
class Run:
    """One training run of one configuration at one budget."""

    task: str
    config: str
    budget: int
    seed: int
    quality: float
    cpu_s: float  #: training CPU time of this process (validation excluded)
    wall_s: float  #: training wall time (validation excluded)
    load: float  #: 1-minute load average when the run started
    ablation: bool = False
    #: with ``--timing-repeats`` > 1: every repeat's CPU seconds (``cpu_s`` is their minimum)
    cpu_repeats: list[float] = field(default_factory=list)
    #: which of the two times the curves use: ``"cpu"`` (``cpu_s``) or ``"wall"`` (``wall_s``, device
    #: synchronised); runs.json files written before the GPU option have none and mean ``"cpu"``
    clock: str = "cpu"
    #: with ``--timing-repeats`` > 1: every repeat's wall seconds (``wall_s`` is their minimum)
    wall_repeats: list[float] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        """The training time the curves, tables and speed-ups use: the time of :attr:`clock`."""
        return self.wall_s if self.clock == "wall" else self.cpu_s


#: What each clock measures (axis labels and the report).
CLOCKS = {
    "cpu": "training CPU time of the process",
    "wall": "training wall time, device synchronised",
}


def training_clock(accelerator: str) -> str:
    """The clock that times training on ``accelerator``: ``"cpu"`` on the CPU, ``"wall"`` on a GPU.

    On the CPU, the process's CPU time (one torch thread) varies far less than wall time on a
    machine shared with other jobs. On a GPU it means nothing (the host mostly waits for the
    device), so the time is wall time, with the device synchronised where the timeline starts and
    stops (``examples/vision.py``'s ``AccuracyTimeline``).

    Example:
        >>> training_clock("cpu"), training_clock("gpu")
        ('cpu', 'wall')
    """
    if accelerator == "cpu":
        return "cpu"
    if accelerator in ("gpu", "cuda"):
        return "wall"
    raise ValueError(f"accelerator={accelerator!r}: expected 'cpu' or 'gpu' (benchmarks/pareto.py --accelerator).")


def _clock_of(runs: Sequence[Run]) -> str:
    """The one clock of ``runs`` (a report never mixes CPU seconds with wall seconds)."""
    clocks = {r.clock for r in runs}
    if len(clocks) > 1:
        raise ValueError(f"runs timed with different clocks {sorted(clocks)}: report them separately.")
    return clocks.pop() if clocks else "cpu"


class TrainerOptions(NamedTuple):
    """Where and in what precision every run trains (``--accelerator``, ``--precision``)."""

    accelerator: str = "cpu"
    precision: str = "32-true"


CPU_FP32 = TrainerOptions()  #: the default: the CPU in full precision, as every committed runs.json


@dataclass
class Task:
    """A task: its budgets, its configurations and how to train one run."""

    name: str
    unit: str  #: what a budget counts ("epochs", "steps")
    quality: str  #: what the quality is
    higher_is_better: bool
    budgets: list[int]
    #: configuration name → factory(total_steps) → algorithms
    configs: dict[str, Callable[[int], list[Any]]]
    train: Callable[[str, list[Any], int, int], Any] = field(repr=False)
    steps_for: Callable[[int], int] = field(repr=False)
    #: more fields for runs.json's task entry (the vision set-up)
    details: dict[str, Any] = field(default_factory=dict)


def _names(algorithms: Sequence[Any]) -> list[str]:
    return [type(a).__name__ for a in algorithms]


# --- vision ------------------------------------------------------------------------------------

#: Image-size adjustments for 8x8 digits (not run-length ones; see examples/vision.py).
VISION_IMAGE_OVERRIDES: dict[str, Any] = {"progressive_resizing": {"initial_scale": 0.75, "size_increment": 2}}


def vision_image_overrides(image_size: int) -> dict[str, Any]:
    """The image-size adjustments for ``image_size`` x ``image_size`` inputs.

    ProgressiveResizing starts at three quarters of the side, as on 8x8 digits (6x6), so a larger
    set-up starts at the same fraction of its images (48x48 of 64x64). It grows in steps of the
    published 4 pixels, or a quarter of the side where that is less (2 on 8x8).

    Example:
        >>> vision_image_overrides(8) == VISION_IMAGE_OVERRIDES
        True
        >>> vision_image_overrides(64)
        {'progressive_resizing': {'initial_scale': 0.75, 'size_increment': 4}}
    """
    if image_size < 4:
        raise ValueError(f"image_size={image_size!r}: expected at least 4 pixels.")
    return {"progressive_resizing": {"initial_scale": 0.75, "size_increment": min(4, image_size // 4)}}


def vision_recipe(name: str, image_size: int = 8) -> Callable[[int], list[Any]]:
    from composer_bridge import recipes

    # Only for the algorithms the recipe has: an override naming one it lacks would add it.
    present = {recipes.override_key(cls) for cls, _ in recipes.VISION_RECIPES[name]}
    overrides = {key: value for key, value in vision_image_overrides(image_size).items() if key in present}

    def build(total_steps: int) -> list[Any]:
        return recipes.vision(name, total_steps=total_steps, missing="drop", **overrides)

    return build


class Fit(NamedTuple):
    """What one training run measured."""

    quality: float  #: the validation metric after training
    cpu_s: float  #: training CPU time of this process (the final validation left out)
    wall_s: float  #: training wall time (the final validation left out)
    bridge: Any  #: the run's AlgorithmEngineCallback (its plan and cost report), or None


def _fit_and_validate(module: Any, loaders: tuple[Any, Any], algorithms: list[Any], steps: int, seed: int,
                      metric: str, options: TrainerOptions = CPU_FP32) -> Fit:
    """Train ``module`` for ``steps`` optimizer steps (no validation during training), then validate once.

    The timeline's wall time synchronises a CUDA device where it starts and stops, so on a GPU
    ``wall_s`` is the time the device took, not the time the host took to queue the work.
    """
    import lightning as L

    from composer_bridge import AlgorithmEngineCallback

    timeline = vision.AccuracyTimeline()
    bridge = AlgorithmEngineCallback(algorithms, seed=seed) if algorithms else None
    callbacks: list[Any] = [timeline] + ([bridge] if bridge is not None else [])
    trainer = L.Trainer(max_steps=steps, max_epochs=-1, accelerator=options.accelerator, devices=1,
                        precision=options.precision, logger=False,
                        callbacks=callbacks, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, loaders[0])
    metrics = trainer.validate(module, dataloaders=loaders[1], verbose=False)[0]
    return Fit(float(metrics[metric]), timeline.train_cpu_seconds, timeline.train_seconds, bridge)


VISION_WIDTHS = (16, 32)  # a quarter of the example's FLOPs: the benchmark must fit a shared 2-core machine


@dataclass(frozen=True)
class VisionSetup:
    """The vision task's input size, model and budgets (``--vision-size``)."""

    name: str
    image_size: int  #: the digits' side in pixels (8: as bundled; more: upsampled once, bilinear)
    widths: tuple[int, ...]  #: ResNetCNN's channels per stage
    batch_size: int
    budgets: tuple[int, ...]  #: optimizer steps
    quick_budgets: tuple[int, ...]
    #: ``cluttered_digits_loaders`` arguments (besides the size and batch) for cluttered digits; None: plain digits
    cluttered: tuple[tuple[str, Any], ...] | None = None


VISION_SETUPS = {
    # The CPU set-up: 8x8 digits, a narrow ResNet; half an epoch to 4 epochs.
    "small": VisionSetup("small", 8, VISION_WIDTHS, 64, (12, 23, 46, 92), (12, 23, 46)),
    # For a GPU: 64 times the pixels, 4 to 8 times the channels (1.3 TFLOP per batch of 128, forward
    # and backward, against 0.4 GFLOP per batch of 64 for "small"), so the device, not Lightning's
    # per-step work on the host, sets the time. The same step budgets (so the recipes' step-scaled
    # schedules are the same), each step seeing twice the images: one epoch to 8 epochs.
    "large": VisionSetup("large", 64, (64, 128, 256), 128, (12, 23, 46, 92), (12, 23, 46)),
    # The demo's CPU task where the methods can matter: cluttered digits at 16x16 (1,000 training
    # images, 1,297 validation), batch 32. Chosen on the baseline alone (seed 0: 0.55 accuracy at 150
    # steps, 0.63 at 300, 0.642 at 600, 0.644 at 1,200): from far below its plateau to on it.
    "cluttered": VisionSetup("cluttered", 16, VISION_WIDTHS, 32, (150, 300, 600), (150, 300),
                             cluttered=(("copies", 2), ("train_per_class", 50))),
}


@functools.lru_cache(maxsize=4)
def _upsampled_digits(image_size: int, seed: int) -> tuple[Any, Any]:
    """The seed's digits split with every image resized once to ``image_size`` (bilinear)."""
    from torch.utils.data import TensorDataset

    from composer_bridge.data import digits_datasets

    resized = []
    for split in digits_datasets(seed=seed):
        images, labels = split.tensors
        images = torch.nn.functional.interpolate(images, size=(image_size, image_size), mode="bilinear",
                                                 align_corners=False)
        resized.append(TensorDataset(images, labels))
    return resized[0], resized[1]


def vision_loaders(setup: VisionSetup, seed: int) -> tuple[Any, Any]:
    """Train and validation loaders of ``setup``'s digits (``digits_loaders`` itself at 8x8)."""
    from composer_bridge.data import cluttered_digits_loaders, digits_loaders

    if setup.cluttered is not None:
        return cluttered_digits_loaders(batch_size=setup.batch_size, seed=seed, image_size=setup.image_size,
                                        **dict(setup.cluttered))
    if setup.image_size == 8:
        return digits_loaders(batch_size=setup.batch_size, seed=seed)
    train, test = _upsampled_digits(setup.image_size, seed)
    # As digits_loaders: shuffled by a generator seeded per run, validation in batches of 256.
    return (torch.utils.data.DataLoader(train, batch_size=setup.batch_size, shuffle=True,
                                        generator=torch.Generator().manual_seed(seed)),
            torch.utils.data.DataLoader(test, batch_size=256))


def vision_module(total_steps: int, lr: float = 0.1, widths: tuple[int, ...] = VISION_WIDTHS) -> Any:
    """examples/vision.py's classifier (SGD + Nesterov, one-cycle over ``total_steps``), ``widths`` wide."""
    from composer_bridge import ComposerClassifier
    from composer_bridge.models import ResNetCNN

    return ComposerClassifier(
        ResNetCNN(num_classes=10, in_channels=1, widths=widths),
        num_classes=10,
        optimizer=lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4),
        scheduler=lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total_steps,
                                                                  pct_start=0.15),
    )


def vision_train(config: str, algorithms: list[Any], steps: int, seed: int,
                 setup: VisionSetup = VISION_SETUPS["small"], options: TrainerOptions = CPU_FP32) -> Fit:
    """One digits run of ``steps`` optimizer steps (its whole schedule scaled to them)."""
    import lightning as L

    L.seed_everything(seed, verbose=False)
    loaders = vision_loaders(setup, seed)
    module = vision_module(steps, widths=setup.widths)
    return _fit_and_validate(module, loaders, algorithms, steps, seed, "val/acc", options)


#: A variant chosen *after* the first full run, from its ablation (ProgressiveResizing and EMA cost
#: accuracy in short runs; BlurPool, LabelSmoothing and ChannelsLast did not). ``--posthoc`` runs it
#: against the baseline; run it on seeds the ablation did not see (``--first-seed 3``). The same
#: algorithms are now ``recipes.vision("short")``, which the full grid runs.
POSTHOC_VISION = "mild without ProgressiveResizing, EMA"


def vision_task(quick: bool, posthoc: bool = False, setup: VisionSetup = VISION_SETUPS["small"],
                options: TrainerOptions = CPU_FP32) -> Task:
    configs: dict[str, Callable[[int], list[Any]]] = {"baseline": lambda steps: []}
    if posthoc:
        # the same algorithms, under the name that run used
        configs[POSTHOC_VISION] = vision_recipe("short", setup.image_size)
    for name in () if posthoc else (("mild",) if quick else ("mild", "medium", "short")):
        configs[name] = vision_recipe(name, setup.image_size)
    # Small: from half an epoch (the baseline far from its best) to 4 epochs (where it has levelled off).
    details = {} if setup.name == "small" else {"setup": asdict(setup)}  # small: runs.json as before
    return Task(
        name="vision", unit="steps",
        quality="validation accuracy" + ("" if setup.image_size == 8 else f" ({setup.image_size}x{setup.image_size})"),
        higher_is_better=True, budgets=list(setup.quick_budgets if quick else setup.budgets),
        configs=configs, train=functools.partial(vision_train, setup=setup, options=options),
        steps_for=lambda steps: steps, details=details,
    )


# --- language ----------------------------------------------------------------------------------

LM_BLOCK, LM_BATCH, LM_D_MODEL, LM_LAYERS = 128, 4, 64, 2


def language_train(config: str, algorithms: list[Any], steps: int, seed: int,
                   options: TrainerOptions = CPU_FP32) -> Fit:
    """One character-level GPT run of ``steps`` optimizer steps (its whole schedule scaled to them)."""
    import lightning as L

    from composer_bridge.models.gpt import GPT

    L.seed_everything(seed, verbose=False)
    # Fresh loaders every run: a loader's seeded shuffling generator advances as it is used, so a
    # shared one would give each run of the same seed a different data order.
    gpt = GPT(vocab_size=language.VOCAB_SIZE, block_size=LM_BLOCK, d_model=LM_D_MODEL, n_layers=LM_LAYERS,
              n_heads=4)
    module = language.ComposerLanguageModel(gpt, total_steps=steps)
    return _fit_and_validate(module, language.text_loaders(LM_BLOCK, LM_BATCH, seed), algorithms, steps, seed, "val/bits_per_char",
                             options)


def language_recipe(name: str, **overrides: Any) -> Callable[[int], list[Any]]:
    from composer_bridge import recipes

    def build(total_steps: int) -> list[Any]:
        return recipes.language(name, max_seq_length=LM_BLOCK, total_steps=total_steps, missing="drop", **overrides)

    return build


def language_task(quick: bool, posthoc: bool = False, options: TrainerOptions = CPU_FP32) -> Task:
    configs: dict[str, Callable[[int], list[Any]]] = {"baseline": lambda steps: []}
    configs["gpt-fast"] = language_recipe("gpt-fast")
    # ALiBi's speed-up: train on sequences a quarter as long (4x as many of them: same tokens per
    # step), evaluate at full length.
    configs["gpt-fast, short ALiBi"] = language_recipe("gpt-fast", alibi={"train_sequence_length_scaling": 0.25})
    return Task(
        name="language", unit="steps", quality="validation bits per character", higher_is_better=False,
        budgets=[25, 50, 100] if quick else [25, 50, 100, 200],
        configs=configs, train=functools.partial(language_train, options=options), steps_for=lambda steps: steps,
    )


# --- the measurements --------------------------------------------------------------------------


def _curve(runs: list[Run]) -> list[tuple[float, float]]:
    """(time, quality) points ordered by budget."""
    return [(r.seconds, r.quality) for r in sorted(runs, key=lambda r: r.budget)]


def _mean_sd(values: Sequence[float], fmt: str) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.mean(values), fmt)} ± {format(statistics.stdev(values), fmt.replace('+', ''))}"


def _machine(accelerator: str = "cpu") -> str:
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    gpu = ""
    if accelerator != "cpu" and torch.cuda.is_available():
        gpu = f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}), driven by "
    return (f"{gpu}{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, {torch.get_num_threads()} "
            f"torch thread(s), Python {platform.python_version()}")


@dataclass
class Summary:
    """What the grid of one task shows."""

    task: str
    table: str
    speedups: dict[str, dict[str, Any]]
    best: str | None


def _fields(task: Task | dict[str, Any]) -> dict[str, Any]:
    """A task's fields as ``runs.json`` holds them (a ``--replot`` reads them back from there)."""
    return _task_meta(task) if isinstance(task, Task) else task


def _grid(task: Task | dict[str, Any], runs: list[Run]) -> tuple[dict[str, Any], list[Run], list[str], list[int]]:
    """``(task's fields, its grid runs (no ablation), their configurations, their budgets)``.

    The configurations come baseline first, then in the task's order (or as they first ran).
    """
    fields = _fields(task)
    grid = [r for r in runs if r.task == fields["name"] and not r.ablation]
    seen = list(dict.fromkeys([*fields.get("configs", []), *(r.config for r in grid)]))
    present = {r.config for r in grid}
    configs = sorted((c for c in seen if c in present), key=lambda c: c != "baseline")
    return fields, grid, configs, sorted({r.budget for r in grid})


def summarise(task: Task | dict[str, Any], runs: list[Run]) -> Summary:
    """The Markdown tables and strict speed-ups of one task's grid runs."""
    fields, grid, configs, budgets = _grid(task, runs)
    name, higher, unit = fields["name"], fields["higher_is_better"], fields["unit"]
    seeds = sorted({r.seed for r in grid})
    fmt = ".4f" if higher else ".3f"

    def runs_of(config: str, seed: int | None = None) -> list[Run]:
        return [r for r in grid if r.config == config and (seed is None or r.seed == seed)]

    lines = [f"| {unit} | " + " | ".join(configs) + " |", "|---|" + "---|" * len(configs)]
    for budget in budgets:
        cells = []
        for config in configs:
            at = [r for r in runs_of(config) if r.budget == budget]
            cells.append(f"{_mean_sd([r.quality for r in at], fmt)} in {_mean_sd([r.seconds for r in at], '.1f')} s"
                         if at else "—")
        lines.append(f"| {budget} | " + " | ".join(cells) + " |")

    def mean_curve(config: str) -> list[tuple[float, float]]:
        points = []
        for budget in budgets:
            at = [r for r in runs_of(config) if r.budget == budget]
            if len(at) == len(seeds):
                points.append((statistics.mean(r.seconds for r in at), statistics.mean(r.quality for r in at)))
        return points

    speedups: dict[str, dict[str, Any]] = {}
    base_mean = mean_curve("baseline")
    lines += ["", "| recipe | strict speed-up per seed | mean (failures = 0x) | seeds reaching Q "
              "| on the seed-averaged curves | at or better than the baseline from the middle budget up |",
              "|---|---|---|---|---|---|"]
    for config in configs[1:]:
        per_seed: list[float | None] = []
        for seed in seeds:
            base, mine = _curve(runs_of("baseline", seed)), _curve(runs_of(config, seed))
            if len(base) != len(budgets) or len(mine) != len(budgets):
                continue
            per_seed.append(strict_speedup(base, mine, higher)[0])
        mean_speed = statistics.mean(s or 0.0 for s in per_seed) if per_seed else None
        on_mean = strict_speedup(base_mean, mean_curve(config), higher) if base_mean and mean_curve(config) else None
        # The target "on or above the baseline from the middle budget up": the recipe's mean quality,
        # interpolated at the baseline's mean training time of each budget from the middle one (after
        # the recipe's longest run has finished, its last quality: see quality_by).
        above = []
        mine_mean = mean_curve(config)
        for t, q in base_mean[len(base_mean) // 2:]:
            q_mine = quality_by(mine_mean, t)
            above.append(None if q_mine is None else (q_mine >= q - 1e-12 if higher else q_mine <= q + 1e-12))
        verdict = ("yes" if above and all(a is True for a in above) else
                   "no" if any(a is False for a in above) else "before the recipe's first budget")
        speedups[config] = {"per_seed": per_seed, "mean": mean_speed,
                            "reached": sum(s is not None for s in per_seed), "seeds": len(per_seed),
                            "on_mean_curves": None if on_mean is None else on_mean[0], "above_from_middle": verdict}
        seeds_text = ", ".join("fail" if s is None else f"{s:.2f}x" for s in per_seed)
        lines.append(
            f"| {config} | {seeds_text} | {_mean_sd([s or 0.0 for s in per_seed], '.2f') + 'x' if per_seed else '—'} "
            f"| {speedups[config]['reached']}/{len(per_seed)} "
            f"| {'fail' if on_mean is None or on_mean[0] is None else f'{on_mean[0]:.2f}x'} | {verdict} |")
    ranked = sorted(speedups, key=lambda c: (speedups[c]["mean"] or 0.0, speedups[c]["on_mean_curves"] or 0.0),
                    reverse=True)
    return Summary(name, "\n".join(lines), speedups, ranked[0] if ranked else None)


def quality_by(curve: list[tuple[float, float]], t: float) -> float | None:
    """The quality the time-ordered ``curve`` has at time ``t``, for the curve check.

    Between its points: linear interpolation. After its last point: the last point's quality (a
    recipe whose longest run finished before ``t`` has that quality by ``t``; nothing is
    extrapolated upwards). Before its first point: ``None`` (not measured).

    Example:
        >>> quality_by([(1.0, 0.5), (3.0, 0.9)], 2.0), quality_by([(1.0, 0.5), (3.0, 0.9)], 5.0)
        (0.7, 0.9)
        >>> quality_by([(1.0, 0.5), (3.0, 0.9)], 0.5) is None
        True
    """
    if curve and t > curve[-1][0]:
        return curve[-1][1]
    return _interpolate(curve, t)


def _interpolate(curve: list[tuple[float, float]], t: float) -> float | None:
    """The quality of the piecewise-linear ``curve`` at time ``t`` (``None`` outside its range)."""
    for (t0, q0), (t1, q1) in zip(curve, curve[1:], strict=False):
        if t0 <= t <= t1:
            return q0 if t1 == t0 else q0 + (q1 - q0) * (t - t0) / (t1 - t0)
    if curve and abs(curve[-1][0] - t) < 1e-9:
        return curve[-1][1]
    return None


def ablation_table(task: Task | dict[str, Any], runs: list[Run]) -> str:
    fields = _fields(task)
    name, higher = fields["name"], fields["higher_is_better"]
    ablated = [r for r in runs if r.task == name and r.ablation]
    if not ablated:
        return ""
    fmt = ".4f" if higher else ".3f"
    budget = ablated[0].budget
    configs = list(dict.fromkeys(r.config for r in ablated))
    full = next((c for c in configs if " without " not in c), configs[0])
    configs = [full] + [c for c in configs if c != full]
    reference = {r.seed: r for r in ablated if r.config == full}
    seconds = "training CPU s" if _clock_of(ablated) == "cpu" else "training wall s"
    lines = [f"| at {budget} (middle budget) | quality | Δ quality vs full recipe (same seed) | {seconds} "
             "| Δ time vs full recipe |", "|---|---|---|---|---|"]
    for config in configs:
        at = [r for r in ablated if r.config == config]
        dq = [r.quality - reference[r.seed].quality for r in at if r.seed in reference]
        dt = [r.seconds / reference[r.seed].seconds - 1 for r in at if r.seed in reference]
        lines.append(f"| {config} | {_mean_sd([r.quality for r in at], fmt)} | "
                     f"{'—' if config == configs[0] else _mean_sd(dq, '+' + fmt)} | "
                     f"{_mean_sd([r.seconds for r in at], '.1f')} | "
                     f"{'—' if config == configs[0] else _mean_sd([100 * d for d in dt], '+.0f') + ' %'} |")
    return "\n".join(lines)


def plot(task: Task | dict[str, Any], runs: list[Run], path: Path, speedups: dict[str, dict[str, Any]]) -> None:
    """Quality against training time, one curve per configuration, seeds as error bars (± sd)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fields, grid, configs, budgets = _grid(task, runs)
    name, quality, higher = fields["name"], fields["quality"], fields["higher_is_better"]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    colours = ["#444444", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"]
    for i, config in enumerate(configs):
        xs, ys, xe, ye = [], [], [], []
        for budget in budgets:
            at = [r for r in grid if r.config == config and r.budget == budget]
            if not at:
                continue
            xs.append(statistics.mean(r.seconds for r in at))
            ys.append(statistics.mean(r.quality for r in at))
            xe.append(statistics.stdev(r.seconds for r in at) if len(at) > 1 else 0.0)
            ye.append(statistics.stdev(r.quality for r in at) if len(at) > 1 else 0.0)
        label = config
        if config in speedups and speedups[config]["mean"] is not None:
            s = speedups[config]
            label += f" (strict speed-up {s['mean']:.2f}x, {s['reached']}/{s['seeds']} seeds reach Q)"
        ax.errorbar(xs, ys, xerr=xe, yerr=ye, marker="o", markersize=4, capsize=3, color=colours[i % len(colours)],
                    label=label, linewidth=2.0 if config == "baseline" else 1.3)
    base = [r for r in grid if r.config == "baseline"]
    if base:
        by_budget = {b: statistics.mean(r.quality for r in base if r.budget == b) for b in budgets}
        best = max(by_budget.values()) if higher else min(by_budget.values())
        ax.axhline(best, color="#444444", linestyle=":", linewidth=1, label=f"baseline's best (mean) {best:.4g}")
    ax.set_xlabel("training CPU time, s (validation excluded)" if _clock_of(grid) == "cpu"
                  else "training wall time (device synchronised), s (validation excluded)")
    ax.set_ylabel(quality + ("" if higher else " (lower is better)"))
    ax.set_title(f"{name}: quality vs training time, {len(budgets)} budgets, mean ± sd over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right" if higher else "upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# --- running the grid --------------------------------------------------------------------------


def _schedule(tasks: list[Task], seeds: list[int], rng: random.Random) -> list[tuple[Task, int, int, list[str]]]:
    """Rounds of (task, budget, seed, configurations in a shuffled order), tasks alternating."""
    per_task = []
    for task in tasks:
        rounds = []
        for seed in seeds:
            for budget in task.budgets:
                order = list(task.configs)
                rng.shuffle(order)
                rounds.append((task, budget, seed, order))
        rng.shuffle(rounds)
        per_task.append(rounds)
    schedule = []
    for i in range(max(len(r) for r in per_task)):
        for rounds in per_task:
            if i < len(rounds):
                schedule.append(rounds[i])
    return schedule


def _algorithms(task: Task, config: str, budget: int, leave_out: int | None = None) -> list[Any]:
    """A fresh list of ``config``'s algorithms for ``budget`` (without the one at ``leave_out``)."""
    algorithms = task.configs[config](task.steps_for(budget))
    if leave_out is not None:
        del algorithms[leave_out]
    return algorithms


def _run_one(task: Task, config: str, build: Callable[[], list[Any]], budget: int, seed: int, ablation: bool,
             repeats: int = 1, clock: str = "cpu") -> Run:
    """Train one run; with ``repeats`` > 1 train it that many times and keep the least time of each clock.

    ``clock`` says which of the two times (CPU, wall) the run's curves use (:func:`training_clock`).

    One-thread CPU training is deterministic, so the repeats must reach the same quality (checked):
    they differ only in how much other work on the machine slowed them, which only ever adds time.
    """
    load = os.getloadavg()[0]
    fits = [task.train(config, build(), budget, seed) for _ in range(repeats)]
    qualities = {fit[0] for fit in fits}
    if len(qualities) > 1:
        raise RuntimeError(f"{task.name} {config!r} at {budget} {task.unit}, seed {seed}: repeats reached different "
                           f"qualities {sorted(qualities)}; timing repeats need deterministic training "
                           "(one torch thread, CPU): run with --timing-repeats 1.")
    cpu, wall = [fit[1] for fit in fits], [fit[2] for fit in fits]
    return Run(task.name, config, budget, seed, fits[0][0], min(cpu), min(wall), load, ablation,
               cpu if repeats > 1 else [], clock, wall if repeats > 1 else [])


def _save(path: Path, runs: list[Run], meta: dict[str, Any]) -> None:
    path.write_text(json.dumps({"meta": meta, "runs": [asdict(r) for r in runs]}, indent=1))


def _report(tasks_meta: list[dict[str, Any]], runs: list[Run], out: Path, meta: dict[str, Any]) -> str:
    parts = []
    for task in tasks_meta:
        summary = summarise(task, runs)
        plot(task, runs, out / f"pareto_{task['name']}.png", summary.speedups)
        parts += [f"### {task['name']}: {task['quality']}", "", summary.table, ""]
        ablation = ablation_table(task, runs)
        if ablation:
            parts += [ablation, ""]
    loads = [r.load for r in runs]
    parts.append(f"Machine: {meta['machine']}. Load average (1 min) at the start of the runs: min "
                 f"{min(loads):.1f}, median {statistics.median(loads):.1f}, max {max(loads):.1f}. "
                 f"Benchmark wall time {meta.get('minutes', float('nan')):.1f} min.")
    if "clock" in meta:  # runs.json files from before --accelerator say nothing: CPU, 32-true, CPU time
        parts[-1] += (f" Trainer: accelerator {meta['accelerator']}, precision {meta['precision']}, vision set-up "
                      f"{meta['vision_size']}; times are the {CLOCKS[meta['clock']]}.")
    text = "\n".join(parts)
    (out / "pareto.md").write_text(text + "\n")
    return text


def _task_meta(task: Task) -> dict[str, Any]:
    return {"name": task.name, "unit": task.unit, "quality": task.quality,
            "higher_is_better": task.higher_is_better, "budgets": task.budgets, "configs": list(task.configs),
            **task.details}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="3 budgets, 2 seeds, fewer recipes, ablation on one seed (~2 min)")
    parser.add_argument("--tasks", default="vision,language", help="comma-separated: vision, language")
    parser.add_argument("--seeds", type=int, default=None, help="default 3 (2 with --quick)")
    parser.add_argument("--no-ablation", action="store_true")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first_seed, first_seed + 1, ...")
    parser.add_argument("--posthoc", action="store_true",
                        help=f"vision: the baseline against {POSTHOC_VISION!r} (chosen from the first run's ablation)")
    parser.add_argument("--timing-repeats", type=int, default=1,
                        help="train every run this many times and keep its least time (the quality must repeat)")
    parser.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu",
                        help="cpu (default; timed in process CPU seconds) or gpu (one CUDA device; timed in "
                             "device-synchronised wall seconds)")
    parser.add_argument("--precision", default="32-true",
                        help="the Trainer's precision: 32-true (default), bf16-mixed, 16-mixed, ...")
    parser.add_argument("--vision-size", choices=sorted(VISION_SETUPS), default="small",
                        help="small (8x8 digits, widths 16/32: the CPU set-up), cluttered (cluttered digits at "
                             "16x16, batch 32: the demo's) or large (digits upsampled to 64x64, widths "
                             "64/128/256, batch 128: for a GPU)")
    parser.add_argument("--out", default="outputs/pareto")
    parser.add_argument("--replot", default=None, help="a runs.json: rebuild the tables and PNGs, train nothing")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.replot:
        data = json.loads(Path(args.replot).read_text())
        runs = [Run(**r) for r in data["runs"]]
        text = _report(data["meta"]["tasks"], runs, out, data["meta"])
        print(text)
        return {"runs": runs, "text": text}

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    if args.accelerator == "gpu" and not torch.cuda.is_available():
        parser.error("--accelerator gpu: torch sees no CUDA device (torch.cuda.is_available() is False); "
                     "run on a machine with one, or use --accelerator cpu.")
    # Steadier timings on shared cores; the models are too small to gain from more. On a GPU the
    # host only queues the work (and collates batches already in memory).
    torch.set_num_threads(1)
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    options = TrainerOptions(args.accelerator, args.precision)
    setup = VISION_SETUPS[args.vision_size]
    builders: dict[str, Callable[[], Task]] = {
        "vision": lambda: vision_task(args.quick, args.posthoc, setup, options),
        "language": lambda: language_task(args.quick, args.posthoc, options),
    }
    unknown = [n for n in names if n not in builders]
    if unknown:
        parser.error(f"--tasks: unknown {unknown}; choose from {sorted(builders)}")
    tasks = [builders[n]() for n in names]
    clock = training_clock(args.accelerator)
    seeds = list(range(args.first_seed, args.first_seed + (args.seeds if args.seeds else (2 if args.quick else 3))))
    if args.timing_repeats < 1:
        parser.error(f"--timing-repeats {args.timing_repeats}: expected 1 or more")
    meta: dict[str, Any] = {"machine": _machine(args.accelerator), "quick": args.quick, "posthoc": args.posthoc,
                            "seeds": seeds, "tasks": [_task_meta(t) for t in tasks],
                            "timing_repeats": args.timing_repeats, "accelerator": args.accelerator,
                            "precision": args.precision, "vision_size": args.vision_size,
                            "clock": clock, "clock_means": CLOCKS[clock]}

    # Warm-up (not recorded): the first steps of a process pay for PyTorch's lazy initialisation.
    for task in tasks:
        task.train("warm-up", [], 3, 0)

    started = time.perf_counter()
    runs: list[Run] = []
    rng = random.Random(0)
    schedule = _schedule(tasks, seeds, rng)
    total = sum(len(order) for *_, order in schedule)
    for task, budget, seed, order in schedule:
        for config in order:
            build = functools.partial(_algorithms, task, config, budget)
            run = _run_one(task, config, build, budget, seed, ablation=False, repeats=args.timing_repeats,
                           clock=clock)
            runs.append(run)
            print(f"[{len(runs)}/{total}] {task.name:<8} {config:<24} {budget:>4} {task.unit:<6} seed {seed}: "
                  f"{run.quality:.4f} in {run.cpu_s:.1f} CPU s ({run.wall_s:.1f} wall), load {run.load:.1f}",
                  flush=True)
            meta["minutes"] = (time.perf_counter() - started) / 60
            _save(out / "runs.json", runs, meta)

    if not args.no_ablation:
        quick = args.quick
        for task in tasks:
            best = summarise(task, runs).best
            if best is None:
                continue
            budget = task.budgets[len(task.budgets) // 2]
            full = _algorithms(task, best, budget)
            variants = [(best, None)] + [(f"{best} without {n}", i) for i, n in enumerate(_names(full))]
            print(f"\nablation of {best!r} on {task.name} at {budget} {task.unit}: {_names(full)}", flush=True)
            for seed in seeds[:1] if quick else seeds:
                order = list(variants)
                rng.shuffle(order)
                for label, leave_out in order:
                    build = functools.partial(_algorithms, task, best, budget, leave_out)
                    run = _run_one(task, label, build, budget, seed, ablation=True, repeats=args.timing_repeats,
                                   clock=clock)
                    runs.append(run)
                    print(f"  {label:<40} seed {seed}: {run.quality:.4f} in {run.cpu_s:.1f} CPU s, "
                          f"load {run.load:.1f}", flush=True)
                    meta["minutes"] = (time.perf_counter() - started) / 60
                    _save(out / "runs.json", runs, meta)

    meta["minutes"] = (time.perf_counter() - started) / 60
    _save(out / "runs.json", runs, meta)
    text = _report(meta["tasks"], runs, out, meta)
    print("\n" + text)
    return {"runs": runs, "text": text, "out": out}


if __name__ == "__main__":
    main()
