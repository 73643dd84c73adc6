"""The newer language methods on a Hugging Face Llama written as a plain LightningModule, on unseen seeds.

A user's module the usual way: ``transformers.LlamaForCausalLM`` built from a config (hidden size 64,
2 layers, 4 heads, RMSNorm, rotary embeddings, a 128-symbol ASCII vocabulary; nothing downloaded)
inside a plain ``LightningModule`` whose ``training_step`` returns ``self.model(**batch).loss``, AdamW
(lr 3e-3, betas 0.9/0.95) with a 5 % warm-up and cosine decay over the run. The text is Python's
standard-library source in chunks of 128 characters, batch 4 (``examples/hf_gpt2.py``'s loaders).
Every configuration trains at every run length on every seed, each fit as the recipe search trains
one (:func:`composer_bridge.search.executor.execute`: a fresh Trainer, validated once at the end,
training timed in process CPU seconds), one at a time in this process; the strict speed-up per seed
is computed as the demo and the search compute it (``benchmarks/pareto.py``'s ``summarise``).

The configurations are algorithm lists by class name, as ``language_methods.py``'s (default: the
baseline, and Muon(lr=0.02) + WarmupStableDecay + QKNorm + ZLoss, the combination measured there).

    python benchmarks/llama_methods.py                          # about 15 minutes on one idle core
    python benchmarks/llama_methods.py --dry-run --out /tmp/llama   # the pipeline at toy lengths (seconds)

Needs ``pip install 'composer-bridge[hf]'`` (transformers). Writes ``<out>.json`` and ``<out>.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
sys.path.insert(0, str(BENCHMARKS.parent / "examples"))

import gpu_campaign  # noqa: E402  (machine(): versions, commit, date)
import gpu_time_to_quality as ttq  # noqa: E402  (quiet, parse_language_config)
import language_methods as lm  # noqa: E402  (report: the demo's speed-ups and curves)
import pareto  # noqa: E402

BLOCK, BATCH = 128, 4
DEFAULT_CONFIGS = ('new-all=Muon{"lr": 0.02}+WarmupStableDecay+QKNorm+ZLoss',)
LENGTHS, SEEDS = (500, 1000, 2000), (1000, 1001, 1002)


def llama_module(total_steps: int) -> Any:
    """A plain LightningModule around a fresh ``LlamaForCausalLM``: ``training_step`` returns the model's own loss."""
    import lightning as L
    import transformers
    from language import VOCAB_SIZE

    config = transformers.LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=172,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                      max_position_embeddings=BLOCK, bos_token_id=0, eos_token_id=0, pad_token_id=0)

    class LlamaModule(L.LightningModule):
        batch_keys = {"input_key": "input_ids", "target_key": "labels"}  # where ZLoss finds the targets

        def __init__(self) -> None:
            super().__init__()
            self.model = transformers.LlamaForCausalLM(config)

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.model(**batch).loss

        def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
            self.log("val/bits_per_char", self.model(**batch).loss / math.log(2))

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
            warmup = max(1, total_steps // 20)

            def factor(step: int) -> float:
                if step < warmup:
                    return (step + 1) / warmup
                return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total_steps - warmup))))

            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return LlamaModule()


def llama_data(seed: int) -> Any:
    import hf_gpt2

    return hf_gpt2.loaders(BLOCK, BATCH, seed, None)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), metavar="NAME=ALGORITHMS")
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    p.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    p.add_argument("--out", default="benchmarks/llama_methods_cpu")
    p.add_argument("--dry-run", action="store_true", help="lengths 2/4/8, one seed: the pipeline; numbers mean nothing")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    ttq.quiet()
    from composer_bridge.search.executor import FitTask, execute

    seeds = args.seeds[:1] if args.dry_run else args.seeds
    lengths = [2, 4, 8] if args.dry_run else sorted(set(args.lengths))
    configs: dict[str, list[Any]] = {"baseline": []}
    for text in args.configs:
        config = ttq.parse_language_config(text, BLOCK)
        configs[config.name] = list(config.candidates)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {**gpu_campaign.machine(), "cpus": os.cpu_count()}
    settings = {"seeds": seeds, "lengths": lengths, "configs": list(configs), "monitor": lm.MONITOR, "clock": "cpu",
                "clock_means": pareto.CLOCKS["cpu"],
                "algorithms": {n: [dataclasses.asdict(c) for c in cs] for n, cs in configs.items()},
                "model": "LlamaForCausalLM(hidden 64, 2 layers, 4 heads, intermediate 172, vocab 128) in a plain "
                         "LightningModule returning model(**batch).loss; AdamW 3e-3, 5 % warm-up, cosine; batch 4 x 128"}
    runs: list[pareto.Run] = []
    started = time.perf_counter()
    todo = [(c, s, n) for n in sorted(lengths, reverse=True) for s in seeds for c in configs]
    print(f"Llama methods, torch {machine['torch']}, commit {machine['commit']}: {len(todo)} fits", flush=True)
    for config, seed, steps in todo:
        outcome = execute(FitTask(llama_module, llama_data, configs[config], steps, seed, lm.MONITOR, "cpu",
                                  {"accelerator": "cpu", "devices": 1}))
        if outcome.error:
            raise RuntimeError(f"{config} seed {seed} {steps} steps failed: {outcome.error}")
        runs.append(pareto.Run("language", config, steps, seed, outcome.quality, outcome.cpu_s, outcome.wall_s,
                               os.getloadavg()[0], clock="cpu"))
        print(f"  [{len(runs)}/{len(todo)}] {config:<10} seed {seed} {steps:>5} steps: {outcome.quality:.3f} bits/char "
              f"in {outcome.cpu_s:.1f} CPU s ({(time.perf_counter() - started) / 60:.1f} min)", flush=True)
    data = {"machine": machine, "settings": settings, "dry_run": args.dry_run,
            "runs": [dataclasses.asdict(r) for r in runs]}
    data["results"] = lm.report(settings, runs, out)
    (out.parent / f"{out.name}.json").write_text(json.dumps(data, indent=1))
    print("\n" + data["results"]["table"])
    return data


if __name__ == "__main__":
    main()
