"""What Muon costs per step on this CPU, and why: ``torch.optim.Muon`` orthogonalises in bfloat16.

Two measurements, interleaved run by run on one torch thread:

1. one matrix product ``(X X^T) X`` of the workloads benchmark ViT's widest hidden matrix (256 x 64), in
   float32 and in bfloat16 (the Newton-Schulz iteration's work);
2. training steps of that ViT (the workloads benchmark's ``vit``, its frozen learning rate), plain and with
   ``Muon(lr=0.02)``, timed in process CPU seconds (validation off).

On a CPU whose vector units multiply bfloat16 natively (AVX-512 with BF16, AMX) the two products cost about the
same; where they do not (AVX2), PyTorch converts every element, and Muon's step costs several times the plain one.

Usage::

    .venv/bin/python benchmarks/muon_cpu_precision.py            # --runs 3 --steps 40
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def product_us(dtype: torch.dtype, repeats: int = 200) -> float:
    """Microseconds of one ``(X X^T) X`` with ``X`` 64 x 256 (the wide orientation Newton-Schulz uses)."""
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)).to(dtype)
    started = time.perf_counter()
    for _ in range(repeats):
        (x @ x.T) @ x
    return (time.perf_counter() - started) / repeats * 1e6


def step_seconds(algorithms: list, steps: int) -> float:
    """CPU seconds per training step of the ViT workload with ``algorithms``."""
    import lightning as L
    import workloads

    from composer_bridge import AlgorithmEngineCallback

    workload = workloads.load("vit")
    L.seed_everything(0, verbose=False)
    module = workload.make_module(lr=0.001, total_steps=steps)
    train, _ = workload.make_data(0)
    callbacks = [AlgorithmEngineCallback(algorithms)] if algorithms else []
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=callbacks)
    started = time.process_time()
    trainer.fit(module, train)
    return (time.process_time() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    from composer_bridge.algorithms import Muon

    times: dict[str, list[float]] = {"float32": [], "bfloat16": [], "plain": [], "Muon": []}
    for _ in range(args.runs):
        times["float32"].append(product_us(torch.float32))
        times["bfloat16"].append(product_us(torch.bfloat16))
        times["plain"].append(step_seconds([], args.steps))
        times["Muon"].append(step_seconds([Muon(lr=0.02)], args.steps))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"CPU: {platform.processor() or platform.machine()}, ATen capability "
          f"{torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, one thread, median of {args.runs}")
    print(f"(X X^T) X, 64x256: float32 {med['float32']:.0f} us, bfloat16 {med['bfloat16']:.0f} us "
          f"({med['bfloat16'] / med['float32']:.1f}x)")
    print(f"ViT training step: plain {1e3 * med['plain']:.1f} ms, with Muon {1e3 * med['Muon']:.1f} ms "
          f"({med['Muon'] / med['plain']:.2f}x)")


if __name__ == "__main__":
    main()
