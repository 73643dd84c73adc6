"""The character-level text the language workloads share: Python's own standard-library source.

The text is the source of the modules in :data:`SOURCES` (the list ``examples/language.py`` uses), read
from ``os.path.dirname(os.__file__)`` once per process (nothing is downloaded) and encoded as ASCII
bytes (vocabulary 128; anything else becomes ``?``). The first 90 % is the training split, cut into
non-overlapping chunks; the validation chunks are a few (``val_chars // block_size``) spread evenly over
the last 10 %, so one validation pass stays cheap. The data is the same for every seed; the seed only
orders the training batches.

Every chunk is a window of ``block_size + 1`` characters (neighbouring windows share one character),
so every layout predicts the same ``block_size`` next characters per chunk with the same contexts:

* ``shifted=True`` (models that take the targets as they are): ``input_ids`` the first ``block_size``
  characters, ``labels`` the next character at each position;
* ``shifted=False`` (Hugging Face causal LMs, which shift the labels themselves): ``input_ids`` and
  ``labels`` both the whole window of ``block_size + 1`` characters.

Examples:
    >>> train, val = text_loaders(block_size=8, batch_size=2, seed=0, val_chars=64)
    >>> batch = next(iter(train))
    >>> batch["input_ids"].shape, bool((batch["input_ids"][:, 1:] == batch["labels"][:, :-1]).all())
    (torch.Size([2, 8]), True)
    >>> len(val.dataset)
    8
    >>> whole = next(iter(text_loaders(8, 2, 0, val_chars=64, shifted=False)[0]))
    >>> whole["input_ids"].shape, bool((whole["input_ids"] == whole["labels"]).all())
    (torch.Size([2, 9]), True)
"""

from __future__ import annotations

import functools
import os

import torch
from torch.utils.data import DataLoader, Dataset

__all__ = ["SOURCES", "VOCAB_SIZE", "CharChunks", "stdlib_ids", "text_loaders"]

#: Standard-library modules whose source is the text (those present are used).
SOURCES = ("textwrap.py", "functools.py", "string.py", "heapq.py", "bisect.py", "abc.py", "fnmatch.py",
           "shlex.py", "glob.py", "contextlib.py", "dataclasses.py", "enum.py")
VOCAB_SIZE = 128
VAL_BATCH_SIZE = 64


@functools.lru_cache(maxsize=1)
def stdlib_ids() -> torch.Tensor:
    """The modules of :data:`SOURCES`, concatenated, as ASCII ids (read once per process)."""
    root = os.path.dirname(os.__file__)
    parts = []
    for name in SOURCES:
        path = os.path.join(root, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
    if not parts:
        raise FileNotFoundError(f"none of {SOURCES} found under {root}")
    return torch.tensor(list("\n".join(parts).encode("ascii", errors="replace")), dtype=torch.long)


class CharChunks(Dataset):
    """Windows of ``block_size + 1`` characters starting every ``block_size`` characters (see the module doc).

    Args:
        ids: the character ids.
        block_size: characters predicted per chunk.
        shifted: ``{"input_ids": window[:-1], "labels": window[1:]}`` if true, else both the whole window.
        keep: how many chunks to keep, spread evenly over ``ids`` (all if ``None``).
    """

    def __init__(self, ids: torch.Tensor, block_size: int, shifted: bool = True, keep: int | None = None) -> None:
        n = (len(ids) - 1) // block_size
        starts = torch.arange(n) * block_size
        if keep is not None and keep < n:
            starts = starts[torch.linspace(0, n - 1, keep).round().long()]
        self.windows = torch.stack([ids[s: s + block_size + 1] for s in starts.tolist()])
        self.shifted = shifted

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        window = self.windows[i]
        if self.shifted:
            return {"input_ids": window[:-1], "labels": window[1:]}
        return {"input_ids": window, "labels": window}


def text_loaders(block_size: int, batch_size: int, seed: int, val_chars: int = 4096,
                 shifted: bool = True) -> tuple[DataLoader, DataLoader]:
    """Train (first 90 %, shuffled by ``seed``, full batches) and validation (``val_chars // block_size`` chunks)."""
    ids = stdlib_ids()
    split = int(len(ids) * 0.9)
    train = CharChunks(ids[:split], block_size, shifted)
    val = CharChunks(ids[split:], block_size, shifted, keep=max(1, val_chars // block_size))
    return (
        DataLoader(train, batch_size=batch_size, shuffle=True, drop_last=True,
                   generator=torch.Generator().manual_seed(seed)),
        DataLoader(val, batch_size=VAL_BATCH_SIZE),
    )
