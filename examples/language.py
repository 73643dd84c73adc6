"""Language example: a small character-level GPT trained on Python's own standard-library source.

    python examples/language.py                                  # no algorithm
    python examples/language.py --alibi --gated-linear-units     # pick algorithms one by one
    python examples/language.py --seq-length-warmup --max-epochs 3
    python examples/language.py --low-precision-layernorm --precision bf16-mixed
    python examples/language.py --recipe gpt-fast                # composer_bridge.recipes.language

The text is a few modules read from ``os.path.dirname(os.__file__)`` (nothing is downloaded),
encoded as ASCII bytes (128 symbols). :class:`ComposerLanguageModel` wraps
:class:`composer_bridge.models.GPT` in Composer's convention, with batches as dicts
``{"input_ids": (B, T), "labels": (B, T)}`` (labels are the next characters), the layout
Composer's language algorithms expect.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F

from composer_bridge import AlgorithmEngineCallback, ComposerModule, recipes
from composer_bridge.models.gpt import GPT

#: Standard-library modules whose source is the training text.
SOURCES = ("textwrap.py", "functools.py", "string.py", "heapq.py", "bisect.py", "abc.py", "fnmatch.py",
           "shlex.py", "glob.py", "contextlib.py", "dataclasses.py", "enum.py")
VOCAB_SIZE = 128


def stdlib_text(names: tuple[str, ...] = SOURCES, max_chars: int | None = None) -> str:
    """The source code of the standard-library modules ``names`` (those present), concatenated."""
    root = os.path.dirname(os.__file__)
    parts = []
    for name in names:
        path = os.path.join(root, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
    if not parts:
        raise FileNotFoundError(f"None of {names} found under {root}: pass other module names.")
    text = "\n".join(parts)
    return text[:max_chars] if max_chars else text


def encode(text: str) -> torch.Tensor:
    """Characters → ids: ASCII code points (anything else becomes ``?``)."""
    return torch.tensor(list(text.encode("ascii", errors="replace")), dtype=torch.long)


def decode(ids: torch.Tensor) -> str:
    return bytes(int(i) for i in ids).decode("ascii", errors="replace")


class CharChunks(torch.utils.data.Dataset):
    """Non-overlapping chunks of ``block_size + 1`` characters as ``{"input_ids", "labels"}``."""

    def __init__(self, ids: torch.Tensor, block_size: int) -> None:
        n = (len(ids) - 1) // block_size
        self.chunks = ids[: n * block_size + 1]
        self.block_size = block_size
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start = i * self.block_size
        window = self.chunks[start: start + self.block_size + 1]
        return {"input_ids": window[:-1], "labels": window[1:]}


def text_loaders(block_size: int = 128, batch_size: int = 32, seed: int = 0, max_chars: int | None = None
                 ) -> tuple[torch.utils.data.DataLoader, torch.utils.data.DataLoader]:
    """Train (90 %) and validation (10 %) loaders over the standard-library text."""
    ids = encode(stdlib_text(max_chars=max_chars))
    split = int(len(ids) * 0.9)
    train, val = CharChunks(ids[:split], block_size), CharChunks(ids[split:], block_size)
    return (
        torch.utils.data.DataLoader(train, batch_size=batch_size, shuffle=True, drop_last=True,
                                    generator=torch.Generator().manual_seed(seed)),
        torch.utils.data.DataLoader(val, batch_size=batch_size),
    )


class ComposerLanguageModel(ComposerModule):
    """A causal language model in Composer's ``forward(batch)`` / ``loss(outputs, batch)`` convention.

    Args:
        model: maps ``(B, T)`` token ids to ``(B, T, vocab)`` logits (e.g. :class:`GPT`).
        lr: AdamW learning rate (cosine decay with a short warm-up over ``total_steps``).
        total_steps: length of the learning-rate schedule.
    """

    #: where algorithms find the inputs and targets of this module's dict batches (ZLoss reads the targets)
    batch_keys = {"input_key": "input_ids", "target_key": "labels"}

    def __init__(self, model: torch.nn.Module, lr: float = 3e-3, total_steps: int = 1000) -> None:
        super().__init__()
        self.model = model
        self.lr = lr
        self.total_steps = total_steps

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(batch["input_ids"])

    def loss(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        labels = batch["labels"][:, : outputs.shape[1]]
        return F.cross_entropy(outputs.flatten(0, 1).float(), labels.flatten())

    def update_eval_metrics(self, outputs: Any, batch: Any, prefix: str) -> None:
        loss = self.loss(outputs, batch).detach()
        self.log(f"{prefix}/loss", loss, prog_bar=True)
        self.log(f"{prefix}/bits_per_char", loss / math.log(2), prog_bar=True)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, betas=(0.9, 0.95), weight_decay=0.01)
        warmup = max(1, self.total_steps // 20)

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, self.total_steps - warmup))
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def chosen_algorithms(args: argparse.Namespace) -> list[Any]:
    """The algorithms the flags ask for (or the ``--recipe``)."""
    if args.recipe != "none":
        return recipes.language(args.recipe, max_seq_length=args.block_size, missing="drop")
    from composer_bridge import algorithms

    wanted = [
        (args.alibi, "Alibi", {"max_sequence_length": args.block_size, "train_sequence_length_scaling": 1.0}),
        (args.gated_linear_units, "GatedLinearUnits", {}),
        (args.low_precision_layernorm, "LowPrecisionLayerNorm", {}),
        (args.seq_length_warmup, "SeqLengthWarmup",
         {"duration": 0.3, "min_seq_length": 8, "max_seq_length": args.block_size, "step_size": 8}),
    ]
    chosen: list[Any] = []
    for on, name, kwargs in wanted:
        if not on:
            continue
        if not hasattr(algorithms, name):
            raise SystemExit(f"composer_bridge.algorithms has no {name} in this version; leave out its flag.")
        chosen.append(getattr(algorithms, name)(**kwargs))
    return chosen


@torch.no_grad()
def sample(model: torch.nn.Module, prompt: str, length: int, block_size: int, seed: int = 0) -> str:
    """Continue ``prompt`` by ``length`` characters, sampling from the model at temperature 0.8."""
    model.eval()
    device = next(model.parameters()).device
    ids = encode(prompt).to(device)[None]
    generator = torch.Generator(device=device).manual_seed(seed)
    for _ in range(length):
        logits = model(ids[:, -block_size:])[:, -1].float() / 0.8
        next_id = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
        ids = torch.cat([ids, next_id], dim=1)
    return decode(ids[0].cpu())


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alibi", action="store_true", help="ALiBi attention biases instead of position embeddings")
    parser.add_argument("--seq-length-warmup", action="store_true", help="grow the sequence length over 30%% of the run")
    parser.add_argument("--low-precision-layernorm", action="store_true", help="acts with --precision bf16-mixed/16-mixed")
    parser.add_argument("--gated-linear-units", action="store_true", help="GLU feed-forward layers")
    parser.add_argument("--recipe", choices=("none", *recipes.LANGUAGE_RECIPES), default="none",
                        help="a composer_bridge.recipes.language recipe instead of the flags")
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-layers", type=int, default=3)
    parser.add_argument("--max-epochs", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--max-chars", type=int, default=None, help="use only the first N characters of the text")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--devices", default="auto")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample", type=int, default=200, help="characters to generate at the end (0: none)")
    args = parser.parse_args(argv)

    L.seed_everything(args.seed, verbose=False)
    train_loader, val_loader = text_loaders(args.block_size, args.batch_size, args.seed, args.max_chars)
    steps = args.max_steps if args.max_steps > 0 else args.max_epochs * len(train_loader)
    gpt = GPT(vocab_size=VOCAB_SIZE, block_size=args.block_size, d_model=args.d_model, n_layers=args.n_layers,
              n_heads=4)
    module = ComposerLanguageModel(gpt, total_steps=steps)
    algorithms = chosen_algorithms(args)
    callbacks = [AlgorithmEngineCallback(algorithms, seed=args.seed)] if algorithms else []
    devices: Any = int(args.devices) if str(args.devices).isdigit() else args.devices
    trainer = L.Trainer(
        max_epochs=args.max_epochs, max_steps=args.max_steps, accelerator=args.accelerator, devices=devices,
        precision=args.precision, callbacks=callbacks, logger=False, enable_checkpointing=False,
        num_sanity_val_steps=0, gradient_clip_val=None,
        val_check_interval=args.max_steps if 0 < args.max_steps < len(train_loader) else None,
    )
    print(f"{len(train_loader.dataset)} training sequences of {args.block_size} characters; algorithms: "
          + (", ".join(type(a).__name__ for a in algorithms) or "none"))
    trainer.fit(module, train_loader, val_loader)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    print(f"val/loss {metrics.get('val/loss', float('nan')):.3f}, "
          f"{metrics.get('val/bits_per_char', float('nan')):.3f} bits per character")
    if callbacks:
        print(callbacks[0].plan())
    if args.sample:
        print("--- sample ---")
        print(sample(module.model, "def ", args.sample, args.block_size, args.seed))
    return metrics


if __name__ == "__main__":
    main()
