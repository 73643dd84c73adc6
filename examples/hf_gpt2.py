"""Hugging Face example: a tiny GPT-2 built from a config, trained with the language recipe in Lightning.

    python examples/hf_gpt2.py                       # recipe "gpt-fast", W&B offline under outputs/wandb
    python examples/hf_gpt2.py --quick               # a few steps on a little text (a smoke run)
    python examples/hf_gpt2.py --recipe none         # the same GPT-2 without any algorithm
    python examples/hf_gpt2.py --recipe gpt --precision bf16-mixed --accelerator gpu

Needs ``pip install 'composer-bridge[hf]'`` (transformers). Nothing is downloaded: the model is
``transformers.GPT2LMHeadModel(GPT2Config(...))`` with fresh weights and a 128-symbol (ASCII)
vocabulary, the text is Python's own standard-library source (the same text as
``examples/language.py``). :class:`composer_bridge.hf.HuggingFaceModel` wraps the model;
``import composer_bridge.hf`` teaches the recipe's Alibi and GatedLinearUnits GPT-2's classes.
At the end the trained model is exported with ``save_pretrained`` (after surgery: see
docs/huggingface.md for how to load it back).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
import transformers
from language import VOCAB_SIZE, decode, encode, stdlib_text

from composer_bridge import AlgorithmEngineCallback, recipes
from composer_bridge.hf import HuggingFaceModel


class TokenChunks(torch.utils.data.Dataset):
    """Non-overlapping chunks of ``block_size`` characters as Hugging Face causal-LM examples.

    ``labels`` equal ``input_ids``: the model's loss shifts them by one token itself.
    """

    def __init__(self, ids: torch.Tensor, block_size: int) -> None:
        self.ids = ids[: (len(ids) // block_size) * block_size].view(-1, block_size)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.ids[i]
        return {"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row}


def loaders(block_size: int, batch_size: int, seed: int, max_chars: int | None
            ) -> tuple[torch.utils.data.DataLoader, torch.utils.data.DataLoader]:
    """Train (90 %) and validation (10 %) loaders of standard-library source."""
    ids = encode(stdlib_text(max_chars=max_chars))
    split = int(len(ids) * 0.9)
    train = torch.utils.data.DataLoader(TokenChunks(ids[:split], block_size), batch_size=batch_size, shuffle=True,
                                        drop_last=True, generator=torch.Generator().manual_seed(seed))
    val = torch.utils.data.DataLoader(TokenChunks(ids[split:], block_size), batch_size=batch_size)
    return train, val


def gpt2(block_size: int, d_model: int, n_layers: int) -> transformers.GPT2LMHeadModel:
    """A fresh GPT-2 of the given size over ASCII characters (no download)."""
    config = transformers.GPT2Config(vocab_size=VOCAB_SIZE, n_positions=block_size, n_embd=d_model,
                                     n_layer=n_layers, n_head=4, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def logger_for(args: argparse.Namespace) -> Any:
    if args.no_wandb:
        return False
    from lightning.pytorch.loggers import WandbLogger

    Path(args.out).mkdir(parents=True, exist_ok=True)
    return WandbLogger(project="composer-bridge-hf", name=f"gpt2-{args.recipe}", save_dir=str(args.out),
                       offline=True)


@torch.no_grad()
def sample(model: transformers.GPT2LMHeadModel, prompt: str, length: int, seed: int = 0) -> str:
    """Continue ``prompt`` by ``length`` characters with Hugging Face's ``generate`` (cached decoding, ALiBi too)."""
    model.eval()
    ids = encode(prompt)[None].to(model.device)
    torch.manual_seed(seed)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=length, do_sample=True,
                         temperature=0.8, pad_token_id=0)
    return decode(out[0].cpu())


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", choices=("none", *recipes.LANGUAGE_RECIPES), default="gpt-fast")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 steps on 20,000 characters, tiny model")
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-layers", type=int, default=3)
    parser.add_argument("--max-epochs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--max-chars", type=int, default=None, help="use only the first N characters of the text")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs", help="W&B offline runs and the exported model go here")
    parser.add_argument("--no-wandb", action="store_true", help="do not log to W&B")
    parser.add_argument("--sample", type=int, default=200, help="characters to generate at the end (0: none)")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_steps, args.max_chars, args.block_size, args.batch_size = 3, 20_000, 32, 8
        args.d_model, args.n_layers, args.sample = 32, 1, 20

    L.seed_everything(args.seed, verbose=False)
    train_loader, val_loader = loaders(args.block_size, args.batch_size, args.seed, args.max_chars)
    steps = args.max_steps if args.max_steps > 0 else args.max_epochs * len(train_loader)
    module = HuggingFaceModel(gpt2(args.block_size, args.d_model, args.n_layers),
                              optimizer=lambda params: torch.optim.AdamW(params, lr=2e-3, betas=(0.9, 0.95)))
    algorithms = [] if args.recipe == "none" else recipes.language(
        args.recipe, max_seq_length=args.block_size, total_steps=steps)
    if args.precision not in ("bf16-mixed", "16-mixed"):  # it only acts in mixed precision
        algorithms = [a for a in algorithms if type(a).__name__ != "LowPrecisionLayerNorm"]
    callbacks = [AlgorithmEngineCallback(algorithms, seed=args.seed)] if algorithms else []
    logger = logger_for(args)
    trainer = L.Trainer(
        max_epochs=args.max_epochs, max_steps=args.max_steps, accelerator=args.accelerator, devices=1,
        precision=args.precision, callbacks=callbacks, logger=logger, enable_checkpointing=False,
        num_sanity_val_steps=0, enable_progress_bar=not args.quick,
        val_check_interval=args.max_steps if 0 < args.max_steps < len(train_loader) else None,
    )
    print(f"{len(train_loader.dataset)} training sequences of {args.block_size} characters; GPT-2 with "
          f"{sum(p.numel() for p in module.parameters()):,} parameters; algorithms: "
          + (", ".join(type(a).__name__ for a in algorithms) or "none"))
    trainer.fit(module, train_loader, val_loader)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    loss = metrics.get("val/loss", float("nan"))
    print(f"val/loss {loss:.3f} ({loss / math.log(2):.3f} bits per character), "
          f"val/acc {metrics.get('val/acc', float('nan')):.3f}")
    if callbacks:
        print(callbacks[0].plan())
    export = Path(args.out) / "hf_gpt2"
    module.model.save_pretrained(export)
    print(f"exported with save_pretrained to {export}")
    if args.sample:
        print("--- sample ---")
        print(sample(module.model, "def ", args.sample, args.seed))
    if logger:
        import wandb

        wandb.finish()
    return metrics


if __name__ == "__main__":
    main()
