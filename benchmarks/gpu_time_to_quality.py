"""Wall-clock time to quality on one CUDA GPU: the baseline against the recipes, side by side in one run.

Does a recipe reach the baseline's quality sooner on a GPU, in wall-clock seconds? Two tasks, each
trained at three run lengths (every run's whole schedule scaled to its length) over three seeds,
baseline and recipes interleaved, in ``bf16-mixed`` on one device:

- **vision**: cluttered digits (:func:`composer_bridge.data.cluttered_digits_loaders`) at 64x64
  with ``ResNetCNN(widths=(128, 256))`` (``composer_bridge.models``), batch 256, the baseline
  against ``recipes.vision("mild")``, both channels-last (the baseline runs ``ChannelsLast`` alone:
  nobody trains convolutions on a tensor-core GPU without it; ``--plain-baseline`` drops it);
- **language**: the character-level GPT (``composer_bridge.models.GPT``) on the demo's
  standard-library text (``examples/language.py``), the baseline against
  ``recipes.language("gpt-fast")``, plus any configuration named with ``--language-configs``.

Quality is measured once, after training (validation accuracy; validation bits per character).
The clock is wall time with the device synchronised where training starts and stops
(``examples/vision.py``'s ``AccuracyTimeline``; validation left out). For each seed the **strict
speed-up** is the baseline's time to its own best quality Q divided by the recipe's time to Q
(:func:`composer_bridge.search.scoring.strict_speedup`, through ``benchmarks/pareto.py``'s
``summarise``, exactly as ``examples/demo.py`` reports it); a seed whose recipe never gets to Q
counts as 0x in the mean.

Why these sizes. A Lightning training step costs the host about 20 ms whatever the model
(``benchmarks/gpu_checks.py`` on an H100: 20 ms per Trainer step for a batch the device finishes in
about 2 ms). A step the device finishes sooner than that measures Lightning, not the recipe: the
demo's 16x16 digits and narrow ResNet would be launch-bound. ResNetCNN with widths 64/128/256 on a
256-image 64x64 batch took the device 15.5 ms in bf16 channels-last (the same script), still under
the host's share (2.6 TFLOP per step: about 170 TFLOP/s); widths 128/256 at 64x64 are 7.0 TFLOP per
256-image step (forward and backward, ``torch.utils.flop_counter``), so at that rate the device
needs about 40 ms, twice the host's work: the GPU sets the pace. (Widths 64/128 would be 1.75 TFLOP,
about 10 ms: launch-bound.) The run lengths (60, 120, 240 steps of 256 images = 8, 15 and 31 epochs
of the 2,000 training images) follow the demo's 16x16 task, whose baseline levels off at about 19
epochs: from far below the plateau to on it. The language half cannot be made device-bound on this
corpus (295,000 characters: a GPT large enough to keep an H100 busy would memorise it within the
run lengths), so its GPT is small (d_model 128, 4 layers, context 128) and its batch large (64: the
host sets a step's time either way), 80, 160 and 320 steps (2.6 million tokens, 10 passes over the
training text, at the longest), and its wall-clock speed-up includes the host's share of every step:
methods that save tokens per step (SeqLengthWarmup) save less wall time here than on a CPU. None of
these lengths was calibrated on a GPU: the JSON records, per seed, at which length the baseline's
best quality lies (``baseline_best_at``); at the longest on every seed means the baseline was still
improving there. Every size is a flag.

Time. The whole run is meant for about 4 minutes of an H100: ``--budget-s 225``, counted from the
start of ``main``, and about 15 s of Python's imports before it (the machine's own start-up comes on
top). It prints the planned work and an estimate from assumed rates first; then a warm-up fit of
each configuration (not recorded) measures each configuration's seconds per step and per fit on this
device, and it prints the measured estimate. If that exceeds the budget, every run length is scaled
down by one factor to fit (``--no-scale``: stop instead, exit 3, before any measured run), and the
JSON says so. A run that would start after 1.15 x the budget is not started: what finished is
written, whole seeds first. A plain PyTorch loop of the vision step (same model, batch and
precision) is timed beside the Trainer's step, so the JSON shows how much of a step is the device's.

Writes ``<out>.json`` (the machine, torch/CUDA/cuDNN versions, the git commit and date, the
settings, the estimate, every run's point, the strict speed-ups and tables) and
``<out>_vision.png`` / ``<out>_language.png`` (quality against wall time, mean ± sd over seeds).
Without a CUDA GPU it exits with 2 and runs nothing. ``--dry-run`` runs the same code on the CPU
at toy sizes in full precision (seconds; its numbers mean nothing): the test suite runs it.

On the GPU, after the campaign (two commands: each fits one 10-minute device call)::

    python benchmarks/gpu_campaign.py --out gpu_campaign
    python benchmarks/gpu_time_to_quality.py --out benchmarks/gpu_time_to_quality

(In a copy of the repository without its git history, add ``--commit <hash>``; without an
installed package, prefix ``PYTHONPATH=$PWD``.)

More language configurations, by algorithm class names resolved in ``composer_bridge.algorithms``
when the script runs (arguments as JSON; ``"{max_seq_length}"`` is the context length; a
language recipe's name expands to its algorithms)::

    python benchmarks/gpu_time_to_quality.py --language-configs glu=GatedLinearUnits \\
        'glu+slw=GatedLinearUnits+SeqLengthWarmup{"duration": 0.3, "max_seq_length": "{max_seq_length}"}'
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import re
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from composer_bridge import Algorithm
from composer_bridge.search import Candidate

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))  # pareto.py (runs, speed-ups, plots) and gpu_campaign.py (machine, GPU check)
sys.path.insert(0, str(BENCHMARKS.parent / "examples"))  # language.py: the text and the language module

import gpu_campaign  # noqa: E402
import language  # noqa: E402
import pareto  # noqa: E402

#: The context length placeholder a ``--language-configs`` argument may use.
CONTEXT_PLACEHOLDER = "{max_seq_length}"
#: A budget overrun tolerated before no further run starts (the estimate is an estimate).
OVERRUN = 1.15
#: Assumed H100 rates for the estimate printed before anything runs: seconds per step, per fit.
ASSUMED = {"vision": (0.045, 1.5), "language": (0.015, 1.5)}


@dataclass(frozen=True)
class LanguageSetup:
    """The character-level GPT, its batches and run lengths."""

    d_model: int
    n_layers: int
    n_heads: int
    block: int  #: context length (training and validation)
    batch_size: int
    budgets: tuple[int, ...]  #: optimizer steps
    max_chars: int | None = None  #: only the first characters of the text (the dry run)


@dataclass(frozen=True)
class LanguageConfig:
    """A named language configuration: algorithm class names (and arguments) from ``composer_bridge.algorithms``."""

    name: str
    candidates: tuple[Candidate, ...]  #: built afresh for each run, scaled to its length

    def build(self, total_steps: int) -> list[Algorithm]:
        return [c.build(total_steps) for c in self.candidates]


def parse_language_config(text: str, block: int) -> LanguageConfig:
    """``NAME=ITEM+ITEM...`` → a :class:`LanguageConfig`; an item is a class name with optional JSON arguments.

    An item may also name a language recipe (``gpt-fast``), which stands for its algorithms. The
    names are checked now, so a typo fails before any device time is spent.

    Example:
        >>> config = parse_language_config(
        ...     'glu+clip=GatedLinearUnits+GradientClipping{"clipping_type": "norm", "clipping_threshold": 1.0}', 128)
        >>> config.name, [type(a).__name__ for a in config.build(100)]
        ('glu+clip', ['GatedLinearUnits', 'GradientClipping'])
    """
    from composer_bridge import recipes
    from composer_bridge.search import from_recipe
    from composer_bridge.search.candidates import as_candidates

    name, sep, spec = text.partition("=")
    if not sep or not name.strip() or not spec.strip():
        raise ValueError(f"--language-configs {text!r}: expected NAME=Algorithm+Algorithm{{json arguments}}..., "
                         "e.g. glu=GatedLinearUnits")
    decoder = json.JSONDecoder()
    items: list[Candidate] = []
    position = 0
    while position < len(spec):
        match = re.compile(r"\s*([A-Za-z][\w-]*)\s*").match(spec, position)
        if not match:
            raise ValueError(f"--language-configs {text!r}: expected an algorithm name at {spec[position:]!r}")
        item, position = match.group(1), match.end()
        kwargs: dict[str, Any] = {}
        if position < len(spec) and spec[position] == "{":
            kwargs, position = decoder.raw_decode(spec, position)
            if not isinstance(kwargs, dict):
                raise ValueError(f"--language-configs {text!r}: {item}'s arguments must be a JSON object {{...}}")
        kwargs = {k: block if v == CONTEXT_PLACEHOLDER else v for k, v in kwargs.items()}
        if item in recipes.LANGUAGE_RECIPES and not kwargs:
            items += from_recipe(item, max_seq_length=block)
        else:
            items.append(Candidate(item, kwargs, name=f"{item}#{len(items)}"))
        rest = spec[position:].lstrip()
        if rest and not rest.startswith("+"):
            raise ValueError(f"--language-configs {text!r}: expected '+' between algorithms at {rest!r}")
        position = len(spec) - len(rest) + 1 if rest else len(spec)
    # Unknown names (with the close matches) and wrong arguments fail here, before training.
    return LanguageConfig(name.strip(), tuple(as_candidates(items)))


@dataclass(frozen=True)
class Plan:
    """Everything one run of the script trains, where, and in what precision."""

    vision: pareto.VisionSetup
    language: LanguageSetup
    seeds: tuple[int, ...]
    options: pareto.TrainerOptions
    tasks: tuple[str, ...]
    plain_baseline: bool
    language_configs: tuple[LanguageConfig, ...] = ()
    warmup_steps: int = 8
    budget_s: float = 225.0
    dry_run: bool = False
    #: configurations whose warm-up fit failed, left out of the measured runs: name → the error
    dropped: tuple[tuple[str, str], ...] = ()

    def configs(self, task: str) -> dict[str, Callable[[int], list[Any]]]:
        """Configuration name → factory(total_steps) → algorithms, baseline first."""
        from composer_bridge import recipes
        from composer_bridge.algorithms import ChannelsLast

        configs: dict[str, Callable[[int], list[Any]]]
        if task == "vision":
            base: Callable[[int], list[Any]] = (lambda steps: []) if self.plain_baseline else (lambda steps: [ChannelsLast()])
            configs = {"baseline": base, "mild": pareto.vision_recipe("mild", self.vision.image_size)}
        else:
            block = self.language.block
            configs = {
                "baseline": lambda steps: [],
                "gpt-fast": lambda steps: recipes.language("gpt-fast", max_seq_length=block, total_steps=steps,
                                                           missing="drop"),
            }
            for extra in self.language_configs:
                configs[extra.name] = extra.build
        dropped = {key for key, _ in self.dropped}
        return {name: build for name, build in configs.items() if f"{task}/{name}" not in dropped}

    def budgets(self, task: str) -> list[int]:
        return list(self.vision.budgets if task == "vision" else self.language.budgets)

    def train(self, task: str) -> Callable[[str, list[Any], int, int], pareto.Fit]:
        if task == "vision":
            return lambda config, algorithms, steps, seed: pareto.vision_train(config, algorithms, steps, seed,
                                                                               setup=self.vision, options=self.options)
        return lambda config, algorithms, steps, seed: language_train(self.language, algorithms, steps, seed, self.options)


def language_train(setup: LanguageSetup, algorithms: list[Any], steps: int, seed: int,
                   options: pareto.TrainerOptions) -> pareto.Fit:
    """One GPT run of ``steps`` optimizer steps (its whole schedule scaled to them), validated once at the end."""
    import lightning as L

    from composer_bridge.models import GPT

    L.seed_everything(seed, verbose=False)
    gpt = GPT(vocab_size=language.VOCAB_SIZE, block_size=setup.block, d_model=setup.d_model,
              n_layers=setup.n_layers, n_heads=setup.n_heads)
    module = language.ComposerLanguageModel(gpt, total_steps=steps)
    loaders = language.text_loaders(setup.block, setup.batch_size, seed, setup.max_chars)
    # pareto's one fit-and-validate, so that both tasks (and the demo) are timed by the same code
    return pareto._fit_and_validate(module, loaders, algorithms, steps, seed, "val/bits_per_char", options)


TASKS = {
    "vision": {"name": "vision", "unit": "steps", "quality": "validation accuracy", "higher_is_better": True},
    "language": {"name": "language", "unit": "steps", "quality": "validation bits per character",
                 "higher_is_better": False},
}

#: The GPU defaults (see the module docstring) and the dry run's toy sizes.
GPU_DEFAULTS = {"image_size": 64, "widths": (128, 256), "batch_size": 256, "copies": 2, "train_per_class": 100,
                "vision_lengths": (60, 120, 240), "lm_d_model": 128, "lm_layers": 4, "lm_heads": 4, "lm_block": 128,
                "lm_batch": 64, "language_lengths": (80, 160, 320), "seeds": 3, "precision": "bf16-mixed",
                "warmup_steps": 8}
DRY_DEFAULTS = {"image_size": 16, "widths": (8, 16), "batch_size": 16, "copies": 1, "train_per_class": 8,
                "vision_lengths": (1, 2, 4), "lm_d_model": 16, "lm_layers": 1, "lm_heads": 2, "lm_block": 32,
                "lm_batch": 4, "language_lengths": (1, 2, 4), "seeds": 2, "precision": "32-true", "warmup_steps": 1}


def plan_from(args: argparse.Namespace) -> Plan:
    """The :class:`Plan` the flags ask for (each size: the flag, else the GPU's or the dry run's default)."""
    defaults = DRY_DEFAULTS if args.dry_run else GPU_DEFAULTS

    def pick(name: str) -> Any:
        value = getattr(args, name)
        return defaults[name] if value is None else value

    cluttered: tuple[tuple[str, Any], ...] = (("copies", pick("copies")), ("train_per_class", pick("train_per_class")))
    if args.dry_run:
        cluttered += (("test_per_class", 4),)
    vision_lengths = tuple(sorted(set(pick("vision_lengths"))))
    vision = pareto.VisionSetup("gpu-cluttered", pick("image_size"), tuple(pick("widths")), pick("batch_size"),
                                vision_lengths, vision_lengths, cluttered=cluttered)
    block = pick("lm_block")
    lm = LanguageSetup(pick("lm_d_model"), pick("lm_layers"), pick("lm_heads"), block, pick("lm_batch"),
                       tuple(sorted(set(pick("language_lengths")))), 20_000 if args.dry_run else None)
    extra = tuple(parse_language_config(text, block) for text in args.language_configs)
    names = [c.name for c in extra]
    clash = sorted({n for n in names if names.count(n) > 1 or n in ("baseline", "gpt-fast")})
    if clash:
        raise ValueError(f"--language-configs: the names {clash} are taken; give each configuration its own name.")
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"--tasks {args.tasks!r}: choose from {sorted(TASKS)}")
    accelerator = "cpu" if args.dry_run else "gpu"
    return Plan(vision, lm, tuple(range(pick("seeds"))), pareto.TrainerOptions(accelerator, pick("precision")), tasks,
                args.plain_baseline, extra, pick("warmup_steps"), args.budget_s, args.dry_run)


# --- the estimate and the guard ----------------------------------------------------------------


@dataclass
class Rates:
    """A task's measured costs on this device: seconds per fit (set-up, validation) and per step of each configuration."""

    per_fit_s: float
    per_step_s: dict[str, float]


def planned_seconds(plan: Plan, rates: dict[str, Rates]) -> dict[str, float]:
    """Seconds of every task's measured runs at ``rates``: ``{task: seconds}``."""
    out = {}
    for task in plan.tasks:
        r = rates[task]
        out[task] = sum(r.per_fit_s + steps * r.per_step_s[config]
                        for config in plan.configs(task) for _ in plan.seeds for steps in plan.budgets(task))
    return out


def assumed_rates(plan: Plan) -> dict[str, Rates]:
    """The rates assumed before anything ran (:data:`ASSUMED`: an H100 at the default sizes)."""
    return {task: Rates(ASSUMED[task][1], {c: ASSUMED[task][0] for c in plan.configs(task)}) for task in plan.tasks}


def measure_rates(plan: Plan) -> tuple[Plan, dict[str, Rates], dict[str, Any]]:
    """Warm-up fits (not recorded) of every configuration at ``k`` steps: each one's seconds per step and per fit.

    A fit's training time (device synchronised, as the measured runs') over ``k`` is its
    configuration's seconds per step; the rest of the call (the Trainer's set-up, the validation)
    is per-fit time, averaged over the task's fits. The first fit of each task pays the device's
    and the libraries' lazy initialisation and is repeated. A configuration whose warm-up fit
    raises is left out of the returned plan (its error printed and kept in ``plan.dropped``), so
    one bad configuration does not cost the others their device time.
    """
    k = plan.warmup_steps
    rates, timings = {}, {}
    dropped = list(plan.dropped)
    for task in plan.tasks:
        train, configs = plan.train(task), plan.configs(task)
        train("warm-up", configs["baseline"](k), k, 0)  # lazy initialisation
        steps, outside = {}, []
        for config, build in configs.items():
            started = time.perf_counter()
            try:
                fit = train("warm-up", build(k), k, 0)
            except Exception as error:  # noqa: BLE001 - reported and recorded; the other configurations go on
                if config == "baseline":
                    raise
                message = f"{type(error).__name__}: {error}"
                print(f"  {task} {config!r} failed in its warm-up fit and is left out: {message}", flush=True)
                dropped.append((f"{task}/{config}", message))
                continue
            steps[config] = fit.wall_s / k
            outside.append(max(0.0, time.perf_counter() - started - fit.wall_s))
        rates[task] = Rates(sum(outside) / len(outside), steps)
        timings[task] = {"warmup_steps": k, "per_fit_s": round(rates[task].per_fit_s, 4),
                         "per_step_s": {c: round(s, 5) for c, s in steps.items()}}
    return dataclasses.replace(plan, dropped=tuple(dropped)), rates, timings


def scaled_budgets(budgets: Sequence[int], factor: float) -> list[int]:
    """``budgets`` times ``factor``, rounded, at least 1 and all distinct (ascending).

    Example:
        >>> scaled_budgets([60, 120, 240], 0.5), scaled_budgets([1, 2, 4], 0.1)
        ([30, 60, 120], [1, 2, 3])
    """
    out: list[int] = []
    for b in sorted(budgets):
        out.append(max(round(b * factor), 1, out[-1] + 1 if out else 1))
    return out


def fit_to_budget(plan: Plan, rates: dict[str, Rates], elapsed: float) -> tuple[Plan, float]:
    """``(plan, factor)``: the plan, its run lengths scaled by one factor if its estimate overruns the budget.

    ``factor`` is 1.0 when it fits; 0.0 when even one step per run would not fit.
    """
    seconds = planned_seconds(plan, rates)
    if elapsed + sum(seconds.values()) <= plan.budget_s:
        return plan, 1.0
    fixed = sum(rates[t].per_fit_s * len(plan.configs(t)) * len(plan.seeds) * len(plan.budgets(t)) for t in plan.tasks)
    training = sum(seconds.values()) - fixed
    factor = (plan.budget_s - elapsed - fixed) / training if training > 0 else 0.0
    if factor <= 0:
        return plan, 0.0
    vision = dataclasses.replace(plan.vision, budgets=tuple(scaled_budgets(plan.vision.budgets, factor)))
    lm = dataclasses.replace(plan.language, budgets=tuple(scaled_budgets(plan.language.budgets, factor)))
    return dataclasses.replace(plan, vision=vision, language=lm), factor


# --- the device's share of a vision step ---------------------------------------------------------


def plain_vision_step_ms(plan: Plan, steps: int = 10) -> float:
    """Milliseconds per step of the vision model in a plain PyTorch loop: same model, batch, precision, channels-last.

    Beside the Trainer's seconds per step, it says how much of a Trainer step the device's work is.
    """
    device = torch.device("cuda" if plan.options.accelerator == "gpu" else "cpu")
    module = pareto.vision_module(100, widths=plan.vision.widths).module.to(device)
    module = module.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    images, labels = next(iter(pareto.vision_loaders(plan.vision, 0)[0]))
    images = images.to(device).contiguous(memory_format=torch.channels_last)
    labels = labels.to(device)
    autocast = plan.options.precision.startswith("bf16")

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.cross_entropy(module(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        step()
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return 1000 * (time.perf_counter() - started) / steps


def step_flop(plan: Plan) -> float:
    """Floating-point operations of one vision training step (forward and backward), counted on the CPU."""
    from torch.utils.flop_counter import FlopCounterMode

    module = pareto.vision_module(100, widths=plan.vision.widths).module
    x = torch.zeros(2, 1, plan.vision.image_size, plan.vision.image_size)
    with FlopCounterMode(display=False) as counter:
        module(x).sum().backward()
    return counter.get_total_flops() / 2 * plan.vision.batch_size


# --- the measured runs ---------------------------------------------------------------------------


def schedule(plan: Plan) -> list[tuple[str, int, int, str]]:
    """``(task, steps, seed, config)`` in running order: seed by seed (so a stop leaves whole seeds),
    run length by run length, the tasks alternating, each round's configurations shuffled."""
    rng = random.Random(0)
    order = []
    for seed in plan.seeds:
        for i in range(max(len(plan.budgets(t)) for t in plan.tasks)):
            for task in plan.tasks:
                budgets = plan.budgets(task)
                if i < len(budgets):
                    configs = list(plan.configs(task))
                    rng.shuffle(configs)
                    order += [(task, budgets[i], seed, c) for c in configs]
    return order


def task_meta(plan: Plan, task: str) -> dict[str, Any]:
    """The task's fields for pareto.summarise/plot and the JSON (budgets, configurations, set-up)."""
    configs = plan.configs(task)
    longest = plan.budgets(task)[-1]
    setup = dataclasses.asdict(plan.vision if task == "vision" else plan.language)
    return {**TASKS[task], "budgets": plan.budgets(task), "configs": list(configs), "setup": setup,
            "algorithms": {c: [type(a).__name__ for a in build(longest)] for c, build in configs.items()}}


def summarise(plan: Plan, task: str, runs: list[pareto.Run]) -> dict[str, Any]:
    """A task's strict speed-ups and table: the demo's and the search's computation (pareto.summarise)."""
    mine = [r for r in runs if r.task == task]
    summary = pareto.summarise(task_meta(plan, task), mine)
    best_at = {}
    for seed in sorted({r.seed for r in mine}):
        base = [r for r in mine if r.config == "baseline" and r.seed == seed]
        pick = max if TASKS[task]["higher_is_better"] else min
        best_at[seed] = pick(base, key=lambda r: r.quality).budget
    return {"speedups": summary.speedups, "table": summary.table, "baseline_best_at": best_at}


def run_all(plan: Plan, started: float) -> tuple[list[pareto.Run], bool]:
    """Train every run of the plan; ``(runs, stopped)``, ``stopped`` when the budget's overrun stopped it early."""
    runs: list[pareto.Run] = []
    order = schedule(plan)
    trains = {task: plan.train(task) for task in plan.tasks}
    configs = {task: plan.configs(task) for task in plan.tasks}
    for i, (task, steps, seed, config) in enumerate(order, 1):
        if time.perf_counter() - started > OVERRUN * plan.budget_s:
            print(f"  stopped: {time.perf_counter() - started:.0f} s is past {OVERRUN} x the budget of "
                  f"{plan.budget_s:.0f} s; {len(order) - i + 1} runs not started", flush=True)
            return runs, True
        fit = trains[task](config, configs[task][config](steps), steps, seed)
        runs.append(pareto.Run(task, config, steps, seed, fit.quality, fit.cpu_s, fit.wall_s, os.getloadavg()[0],
                               clock="wall"))
        print(f"  [{i:>2}/{len(order)}] {task:<8} {config:<12} {steps:>4} steps seed {seed}: "
              f"{TASKS[task]['quality']} {fit.quality:.4f} in {fit.wall_s:.2f} s", flush=True)
    return runs, False


def quiet() -> None:
    """Lightning's and the libraries' warnings and info lines off: the script prints what it measures."""
    os.environ.setdefault("WANDB_SILENT", "true")
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _estimate_text(plan: Plan, rates: dict[str, Rates], label: str) -> str:
    seconds = planned_seconds(plan, rates)
    parts = ", ".join(f"{t} {s:.0f} s" for t, s in seconds.items())
    return f"{label}: {sum(seconds.values()):.0f} s of runs ({parts}); budget {plan.budget_s:.0f} s"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true",
                   help="the same code on the CPU at toy sizes, fp32, 2 seeds (seconds; the numbers mean nothing)")
    p.add_argument("--out", default="benchmarks/gpu_time_to_quality",
                   help="path prefix: writes PREFIX.json, PREFIX_vision.png, PREFIX_language.png")
    p.add_argument("--budget-s", type=float, default=225.0,
                   help="seconds for the whole run from the start of main (default 225: with the imports, 4 minutes)")
    p.add_argument("--no-scale", action="store_true",
                   help="when the measured estimate overruns the budget, stop (exit 3) instead of shortening the runs")
    p.add_argument("--commit", default=None,
                   help="the commit to record where the checkout has no git history (default: git rev-parse)")
    p.add_argument("--tasks", default="vision,language", help="comma-separated: vision, language")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 3; dry run 2)")
    p.add_argument("--precision", default=None, help="the Trainer's precision (default bf16-mixed; dry run 32-true)")
    p.add_argument("--warmup-steps", type=int, default=None, help="steps of each warm-up fit (default 8)")
    p.add_argument("--image-size", type=int, default=None, help="cluttered digits' side in pixels (default 64)")
    p.add_argument("--widths", type=int, nargs="+", default=None, help="ResNetCNN's widths (default 128 256)")
    p.add_argument("--batch-size", type=int, default=None, help="vision batch (default 256)")
    p.add_argument("--copies", type=int, default=None, help="corrupted copies of each training digit (default 2)")
    p.add_argument("--train-per-class", type=int, default=None, help="training digits per class (default 100)")
    p.add_argument("--vision-lengths", type=int, nargs="+", default=None, help="run lengths in steps (default 60 120 240)")
    p.add_argument("--plain-baseline", action="store_true", help="vision baseline without ChannelsLast")
    p.add_argument("--lm-d-model", type=int, default=None, help="GPT width (default 128)")
    p.add_argument("--lm-layers", type=int, default=None, help="GPT layers (default 4)")
    p.add_argument("--lm-heads", type=int, default=None, help="GPT attention heads (default 4)")
    p.add_argument("--lm-block", type=int, default=None, help="context length (default 128)")
    p.add_argument("--lm-batch", type=int, default=None, help="language batch (default 64)")
    p.add_argument("--language-lengths", type=int, nargs="+", default=None,
                   help="run lengths in steps (default 80 160 320)")
    p.add_argument("--language-configs", nargs="+", default=[], metavar="NAME=ALGORITHMS",
                   help='more language configurations: NAME=Class+Class{"arg": value} (classes of '
                        'composer_bridge.algorithms, resolved at run time; a language recipe name stands for its '
                        'algorithms; "{max_seq_length}" is the context length)')
    return p


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    p = parser()
    args = p.parse_args(argv)
    if not args.dry_run:
        reason = gpu_campaign.no_gpu_reason()
        if reason:
            print(reason.replace("gpu_campaign:", "gpu_time_to_quality:"), file=sys.stderr)
            return 2
    try:
        plan = plan_from(args)
    except ValueError as error:  # SearchInputError too: unknown algorithm names, wrong arguments
        p.error(str(error))
    quiet()
    if args.dry_run:
        torch.set_num_threads(1)  # a shared core in the test suite
    machine = {**gpu_campaign.machine(), "cpus": os.cpu_count(),
               **({"commit": args.commit} if args.commit else {}),
               "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None}
    print(f"time to quality on {machine['gpu']}, torch {machine['torch']} (CUDA {machine['cuda']}), "
          f"commit {machine['commit']}; {plan.options.precision}, seeds {list(plan.seeds)}")
    for task in plan.tasks:
        n = len(plan.configs(task)) * len(plan.seeds) * len(plan.budgets(task))
        print(f"  {task}: {list(plan.configs(task))} at {plan.budgets(task)} steps: {n} runs")
    print("  " + _estimate_text(plan, assumed_rates(plan), "estimate before running (assumed H100 rates)"), flush=True)

    flop = step_flop(plan) if "vision" in plan.tasks else None
    plan, rates, warmup = measure_rates(plan)
    elapsed = time.perf_counter() - started
    print(f"  warm-up done after {elapsed:.0f} s; " + _estimate_text(plan, rates, "measured estimate"), flush=True)
    planned = {t: plan.budgets(t) for t in plan.tasks}
    plan, factor = fit_to_budget(plan, rates, elapsed)
    if factor == 0.0 or (factor < 1.0 and args.no_scale):
        print(f"gpu_time_to_quality: the measured estimate overruns the budget of {plan.budget_s:.0f} s"
              + (" (--no-scale)" if args.no_scale else " even at one step per run")
              + "; nothing measured. Raise --budget-s, or lower --seeds or the run lengths.", file=sys.stderr)
        return 3
    if factor < 1.0:
        print(f"  over budget: every run length scaled by {factor:.2f}: "
              + ", ".join(f"{t} {plan.budgets(t)}" for t in plan.tasks)
              + "; " + _estimate_text(plan, rates, "new estimate"), flush=True)
    device_step = None
    if "vision" in plan.tasks:
        device_step = {"plain_loop_ms": round(plain_vision_step_ms(plan), 3),
                       "trainer_ms": round(1000 * rates["vision"].per_step_s["baseline"], 3),
                       "step_tflop": round(flop / 1e12, 4) if flop else None}
        print(f"  vision step: {device_step['plain_loop_ms']:.1f} ms in a plain loop, {device_step['trainer_ms']:.1f} ms "
              f"in the Trainer ({device_step['step_tflop']} TFLOP)", flush=True)

    runs, stopped = run_all(plan, started)
    report: dict[str, Any] = {
        "machine": machine, "dry_run": plan.dry_run, "clock": "wall", "clock_means": pareto.CLOCKS["wall"],
        "precision": plan.options.precision, "accelerator": plan.options.accelerator, "seeds": list(plan.seeds),
        "budget_s": plan.budget_s, "estimate": {"assumed_s": planned_seconds(plan, assumed_rates(plan)),
                                                "measured_s": planned_seconds(plan, rates), "warmup": warmup},
        "planned_budgets": planned, "scaled_by": round(factor, 4), "stopped_at_budget": stopped,
        "vision_step": device_step, "dropped_configs": dict(plan.dropped), "tasks": {},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print()
    for task in plan.tasks:
        summary = summarise(plan, task, runs)
        png = out.parent / f"{out.name}_{task}.png"
        pareto.plot(task_meta(plan, task), [r for r in runs if r.task == task], png, summary["speedups"])
        report["tasks"][task] = {**task_meta(plan, task), **summary, "png": png.name,
                                 "runs": [dataclasses.asdict(r) for r in runs if r.task == task]}
        best_at = summary["baseline_best_at"]
        still = " (the longest on every seed: the baseline was still improving)" if best_at and all(
            b == plan.budgets(task)[-1] for b in best_at.values()) else ""
        print(f"{task}: {TASKS[task]['quality']} against wall time, Q = the baseline's best per seed\n{summary['table']}\n"
              f"the baseline's best at: " + ", ".join(f"seed {s}: {b} steps" for s, b in best_at.items()) + still + "\n")
    report["total_s"] = round(time.perf_counter() - started, 1)
    path = out.parent / f"{out.name}.json"
    path.write_text(json.dumps(report, indent=1))
    means = "; ".join(f"{t} {c} {s['mean']:.2f}x ({s['reached']}/{s['seeds']} seeds reach Q)"
                      for t, task in report["tasks"].items() for c, s in task["speedups"].items() if s["mean"] is not None)
    print(f"{report['total_s']:.0f} s in all; strict speed-ups (wall clock): {means or 'none'}; written {path}"
          + ("; STOPPED at the budget: later seeds missing" if stopped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
