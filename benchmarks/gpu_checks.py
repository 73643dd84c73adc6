"""GPU measurements, side by side in one run: precision x memory format, batch algorithms, bridge overhead.

Needs a CUDA GPU (exits with a message otherwise). Three tables:

1. a ResNetCNN training step (plain PyTorch loop, synthetic 256x3x64x64 batch, 10 classes) in
   fp32 and bf16 autocast, contiguous and channels-last (``apply_channels_last``);
2. the GPU time of each batch algorithm's functional form on that batch (CUDA events);
3. a Lightning Trainer step of the same model: plain, + ``AlgorithmEngineCallback([])``, and
   + the "mild" vision recipe.

Usage::

    python benchmarks/gpu_checks.py --out gpu_checks.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import warnings
from typing import Any

import torch


def _model() -> torch.nn.Module:
    from composer_bridge.models import ResNetCNN

    torch.manual_seed(0)
    return ResNetCNN(num_classes=10, in_channels=3, widths=(64, 128, 256), blocks_per_stage=2)


def _batch(n: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    return (torch.randn(n, 3, 64, 64, device="cuda", generator=g), torch.randint(0, 10, (n,), device="cuda", generator=g))


def _cuda_ms(fn: Any, repeats: int) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` runs, timed with CUDA events after a warm-up."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def precision_and_memory_format(repeats: int) -> list[dict[str, Any]]:
    from composer_bridge.functional import apply_channels_last

    x, y = _batch()
    rows = []
    for dtype in (None, torch.bfloat16):
        for channels_last in (False, True):
            model = _model().cuda()
            inputs = x
            if channels_last:
                apply_channels_last(model)
                inputs = x.contiguous(memory_format=torch.channels_last)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

            def step(model: torch.nn.Module = model, inputs: torch.Tensor = inputs, optimizer: Any = optimizer,
                     dtype: Any = dtype) -> None:
                with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                    loss = torch.nn.functional.cross_entropy(model(inputs), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            rows.append({"precision": "bf16 autocast" if dtype else "fp32",
                         "memory format": "channels_last" if channels_last else "contiguous",
                         "ms/step": _cuda_ms(step, repeats)})
    base = rows[0]["ms/step"]
    for row in rows:
        row["speed-up vs fp32 contiguous"] = base / row["ms/step"]
    return rows


def batch_algorithms(repeats: int) -> list[dict[str, Any]]:
    import composer_bridge.functional as F

    x, y = _batch()
    g = torch.Generator(device="cuda").manual_seed(1)
    logits = torch.randn(x.shape[0], 10, device="cuda")
    calls = {
        "smooth_labels": lambda: F.smooth_labels(logits, y, 0.1),
        "mixup_batch": lambda: F.mixup_batch(x, y, alpha=0.2, generator=g),
        "cutmix_batch": lambda: F.cutmix_batch(x, y, alpha=1.0, generator=g),
        "cutout_batch": lambda: F.cutout_batch(x, num_holes=1, length=0.5, generator=g),
        "colout_batch": lambda: F.colout_batch(x, generator=g),
        "resize_batch (0.5, resize)": lambda: F.resize_batch(x, y, scale_factor=0.5, generator=g),
        "resize_batch (0.5, crop)": lambda: F.resize_batch(x, y, scale_factor=0.5, mode="crop", generator=g),
    }
    return [{"function": name, "ms/call": _cuda_ms(fn, repeats)} for name, fn in calls.items()]


def bridge_overhead(steps: int) -> list[dict[str, Any]]:
    import lightning as L

    from composer_bridge import AlgorithmEngineCallback, ComposerClassifier, recipes

    x, y = _batch(64)
    data = torch.utils.data.TensorDataset(x.cpu(), y.cpu())
    configs = {
        "plain Lightning": lambda: [],
        "+ AlgorithmEngineCallback([])": lambda: [AlgorithmEngineCallback([])],
        "+ mild recipe": lambda: [AlgorithmEngineCallback(recipes.vision("mild"))],
    }
    results: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(3):
        for name, make in configs.items():
            marks: list[float] = []
            module = ComposerClassifier(_model(), num_classes=10)
            trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=steps, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                callbacks=[_clock(marks), *make()])
            loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True, drop_last=True)
            trainer.fit(module, loader)
            results[name].append((marks[1] - marks[0]) / (steps - 1) * 1e3)
    base = statistics.median(results["plain Lightning"])
    return [{"configuration": name, "ms/step": statistics.median(v), "ratio to plain": statistics.median(v) / base}
            for name, v in results.items()]


def _clock(marks: list[float]) -> Any:
    """A Lightning callback appending the time of the first training batch and of the end of training."""
    import lightning as L

    class Clock(L.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            if not marks:
                torch.cuda.synchronize()
                marks.append(time.perf_counter())

        def on_train_end(self, *args: Any) -> None:
            torch.cuda.synchronize()
            marks.append(time.perf_counter())

    return Clock()


def _table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        lines.append("| " + " | ".join(f"{row[k]:.3f}" if isinstance(row[k], float) else str(row[k]) for k in keys) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu_checks.py needs a CUDA GPU; none is visible (torch.cuda.is_available() is False).")
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.backends.cudnn.benchmark = True
    results = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "precision_and_memory_format": precision_and_memory_format(args.repeats),
        "batch_algorithms": batch_algorithms(args.repeats),
        "bridge_overhead": bridge_overhead(args.steps),
    }
    print(f"{results['device']}, torch {results['torch']}\n")
    for key in ("precision_and_memory_format", "batch_algorithms", "bridge_overhead"):
        print(f"### {key}\n\n{_table(results[key])}\n")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
