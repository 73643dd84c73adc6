"""GPU measurements, side by side in one run: precision x memory format, batch algorithms, bridge overhead.

Needs a CUDA GPU (exits with a message otherwise). Three tables:

1. a ResNetCNN training step on a synthetic 256x3x64x64 batch (10 classes), fp32 and bf16-mixed,
   contiguous and channels-last, both in a plain PyTorch loop and through a Lightning Trainer with
   the bridge (``AlgorithmEngineCallback([])`` or ``[ChannelsLast()]``). Median step time after a
   warm-up, with ``torch.cuda.synchronize()`` around every timed step. The input batch stays NCHW
   contiguous in both (as a data loader delivers it); the channels-last weights make the first
   convolution's output channels-last;
2. the GPU time of each batch algorithm's functional form on that batch (CUDA events), given a
   CUDA generator (the scalar draws of mixup/cutmix/cutout/crop then cost a sync; the algorithms
   themselves pass a CPU generator, see tests/gpu);
3. the bridge's overhead on the GPU: a Trainer step of a tiny model (bf16-mixed): plain,
   + ``AlgorithmEngineCallback([])`` and + the "mild" vision recipe.

The Trainer runs read an iterable that yields the same device-resident batch every step, so host
to device copies and data loading are not part of any number.

Usage (from the repository root; about 1-2 minutes on an H100)::

    PYTHONPATH=$PWD python benchmarks/gpu_checks.py --out gpu_checks.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable without installing the package

#: ``COMPOSER_BRIDGE_GPU_DRY_RUN=1`` runs every path on the CPU at toy sizes (the numbers mean nothing).
DRY_RUN = os.environ.get("COMPOSER_BRIDGE_GPU_DRY_RUN") == "1"


class Setup:
    """Sizes and device of one run: the real ones on a GPU, toy ones for the CPU dry run."""

    def __init__(self, dry_run: bool, repeats: int, steps: int, warmup: int) -> None:
        self.device = "cpu" if dry_run else "cuda"
        self.accelerator = "cpu" if dry_run else "gpu"
        self.batch_size, self.image = (8, 16) if dry_run else (256, 64)
        self.widths = (8, 16) if dry_run else (64, 128, 256)
        self.blocks = 1 if dry_run else 2
        self.repeats = min(repeats, 3) if dry_run else repeats
        self.steps = min(steps, 8) if dry_run else steps
        self.warmup = min(warmup, 2) if dry_run else warmup
        self.rounds = 1 if dry_run else 3

    def synchronize(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()


def _model(setup: Setup, tiny: bool = False) -> torch.nn.Module:
    from composer_bridge.models import ResNetCNN

    torch.manual_seed(0)
    if tiny:
        return ResNetCNN(num_classes=10, in_channels=3, widths=(8, 16), blocks_per_stage=1)
    return ResNetCNN(num_classes=10, in_channels=3, widths=setup.widths, blocks_per_stage=setup.blocks)


def _batch(setup: Setup, n: int | None = None, size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=setup.device).manual_seed(0)
    n, size = n or setup.batch_size, size or setup.image
    x = torch.randn(n, 3, size, size, device=setup.device, generator=g)
    return x, torch.randint(0, 10, (n,), device=setup.device, generator=g)


def _event_ms(setup: Setup, fn: Callable[[], Any]) -> float:
    """Median milliseconds of ``fn()`` over ``setup.repeats`` calls after 5 warm-up calls (CUDA events on a GPU)."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(setup.repeats):
        if setup.device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _wall_ms(setup: Setup, step: Callable[[], Any]) -> float:
    """Median wall-clock milliseconds of ``step()`` after ``setup.warmup`` steps, synchronising around each."""
    for _ in range(setup.warmup):
        step()
    times = []
    for _ in range(setup.steps):
        setup.synchronize()
        t0 = time.perf_counter()
        step()
        setup.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class SameBatch:
    """An iterable of ``length`` batches that are all the same device-resident batch."""

    def __init__(self, batch: tuple[torch.Tensor, torch.Tensor], length: int) -> None:
        self.batch, self.length = batch, length

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.length):
            yield self.batch


def _step_clock(setup: Setup, marks: list[float]) -> Any:
    """A Lightning callback recording the (synchronised) time at the start of every training step and at the end."""
    import lightning as L

    class StepClock(L.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            setup.synchronize()
            marks.append(time.perf_counter())

        def on_train_end(self, *args: Any) -> None:
            setup.synchronize()
            marks.append(time.perf_counter())

    return StepClock()


def _trainer_ms(setup: Setup, module: Any, callbacks: list[Any], precision: str, batch: Any, steps: int) -> float:
    """Median milliseconds between successive training-step starts of a Trainer run, after the warm-up steps."""
    import lightning as L

    marks: list[float] = []
    trainer = L.Trainer(
        accelerator=setup.accelerator, devices=1, precision=precision, max_steps=setup.warmup + steps, max_epochs=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[_step_clock(setup, marks), *callbacks],
    )
    trainer.fit(module, SameBatch(batch, setup.warmup + steps))
    intervals = [(b - a) * 1e3 for a, b in zip(marks, marks[1:], strict=False)]
    return statistics.median(intervals[setup.warmup:])


def precision_and_memory_format(setup: Setup) -> list[dict[str, Any]]:
    """(a) ResNetCNN step time: {fp32, bf16-mixed} x {contiguous, channels-last} x {plain loop, Trainer + bridge}."""
    from composer_bridge import AlgorithmEngineCallback, ComposerClassifier
    from composer_bridge.algorithms import ChannelsLast
    from composer_bridge.functional import apply_channels_last

    x, y = _batch(setup)
    rows = []
    for precision in ("32-true", "bf16-mixed"):
        for channels_last in (False, True):
            model = _model(setup).to(setup.device)
            if channels_last:
                apply_channels_last(model)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            autocast = precision == "bf16-mixed"

            def step(model: torch.nn.Module = model, optimizer: Any = optimizer, autocast: bool = autocast) -> None:
                with torch.autocast(setup.device, dtype=torch.bfloat16, enabled=autocast):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            loop_ms = _wall_ms(setup, step)
            module = ComposerClassifier(_model(setup), num_classes=10,
                                        optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
            bridge = AlgorithmEngineCallback([ChannelsLast()] if channels_last else [])
            trainer_ms = _trainer_ms(setup, module, [bridge], precision, (x, y), setup.steps)
            rows.append({"precision": precision, "memory format": "channels_last" if channels_last else "contiguous",
                         "plain loop ms/step": loop_ms, "Trainer + bridge ms/step": trainer_ms})
    base_loop, base_trainer = rows[0]["plain loop ms/step"], rows[0]["Trainer + bridge ms/step"]
    for row in rows:
        row["loop speed-up"] = base_loop / row["plain loop ms/step"]
        row["Trainer speed-up"] = base_trainer / row["Trainer + bridge ms/step"]
    return rows


def batch_algorithms(setup: Setup) -> list[dict[str, Any]]:
    """(b) GPU time per call of each batch algorithm's functional form on the benchmark batch."""
    import composer_bridge.functional as F

    x, y = _batch(setup)
    g = torch.Generator(device=setup.device).manual_seed(1)
    logits = torch.randn(x.shape[0], 10, device=setup.device)
    selector = _model(setup, tiny=True).to(setup.device)

    def per_example_loss(outputs: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs, target, reduction=reduction)

    calls: dict[str, Callable[[], Any]] = {
        "smooth_labels(0.1)": lambda: F.smooth_labels(logits, y, 0.1),
        "mixup_batch(alpha=0.2)": lambda: F.mixup_batch(x, y, alpha=0.2, generator=g),
        "cutmix_batch(alpha=1)": lambda: F.cutmix_batch(x, y, alpha=1.0, generator=g),
        "cutout_batch(1 hole, 0.5)": lambda: F.cutout_batch(x, num_holes=1, length=0.5, generator=g),
        "colout_batch": lambda: F.colout_batch(x, generator=g),
        "resize_batch(0.5, resize)": lambda: F.resize_batch(x, y, scale_factor=0.5, generator=g),
        "resize_batch(0.5, crop)": lambda: F.resize_batch(x, y, scale_factor=0.5, mode="crop", generator=g),
        "select_using_loss(keep=0.5, tiny net)": lambda: F.select_using_loss(x, y, selector, per_example_loss,
                                                                               keep=0.5, generator=g),
    }
    return [{"function": name, "ms/call": _event_ms(setup, fn)} for name, fn in calls.items()]


def bridge_overhead(setup: Setup) -> list[dict[str, Any]]:
    """(c) Trainer step time of a tiny model: plain, + an empty bridge, + the mild recipe (rounds interleaved)."""
    from composer_bridge import AlgorithmEngineCallback, ComposerClassifier, recipes

    batch = _batch(setup, n=64, size=32)
    configs: dict[str, Callable[[], list[Any]]] = {
        "plain Lightning": lambda: [],
        "+ AlgorithmEngineCallback([])": lambda: [AlgorithmEngineCallback([])],
        "+ mild recipe": lambda: [AlgorithmEngineCallback(recipes.vision("mild"))],
    }
    results: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(setup.rounds):
        for name, make in configs.items():
            module = ComposerClassifier(_model(setup, tiny=True), num_classes=10,
                                        optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
            results[name].append(_trainer_ms(setup, module, make(), "bf16-mixed", batch, 4 * setup.steps))
    base = statistics.median(results["plain Lightning"])
    return [{"configuration": name, "ms/step": statistics.median(v), "ratio to plain": statistics.median(v) / base,
             "rounds": ", ".join(f"{t:.3f}" for t in v)} for name, v in results.items()]


def _table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        lines.append("| " + " | ".join(f"{row[k]:.3f}" if isinstance(row[k], float) else str(row[k]) for k in keys) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per functional form (default 50)")
    parser.add_argument("--steps", type=int, default=30, help="timed training steps per configuration (default 30)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed warm-up steps per configuration (default 10)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON to this path")
    args = parser.parse_args(argv)
    if min(args.repeats, args.steps, args.warmup + 1) < 1:
        parser.error(f"--repeats and --steps must be >= 1 and --warmup >= 0, got {args.repeats}, {args.steps}, "
                     f"{args.warmup}")
    if not torch.cuda.is_available() and not DRY_RUN:
        sys.exit("benchmarks/gpu_checks.py needs a CUDA GPU, and torch.cuda.is_available() is False here. "
                 "Run it on a machine with an NVIDIA GPU and a CUDA build of PyTorch.")
    setup = Setup(DRY_RUN, args.repeats, args.steps, args.warmup)
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if setup.device == "cuda":
        torch.backends.cudnn.benchmark = True
    started = time.perf_counter()
    import lightning

    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if setup.device == "cuda" else "cpu (dry run: numbers mean nothing)",
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "batch": f"{setup.batch_size}x3x{setup.image}x{setup.image}, 10 classes",
        "steps": setup.steps, "warmup": setup.warmup, "repeats": setup.repeats,
        "precision_and_memory_format": precision_and_memory_format(setup),
        "batch_algorithms": batch_algorithms(setup),
        "bridge_overhead": bridge_overhead(setup),
    }
    results["seconds"] = time.perf_counter() - started
    print(f"{results['device']}, torch {results['torch']}, lightning {results['lightning']}, "
          f"batch {results['batch']} ({results['seconds']:.0f} s)\n")
    for key in ("precision_and_memory_format", "batch_algorithms", "bridge_overhead"):
        print(f"### {key}\n\n{_table(results[key])}\n")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
