"""An encoder-decoder transformer on a synthetic translation task: the seq2seq workload.

The model is ``torch.nn.Transformer`` (``batch_first=True``, d_model 64, 2 encoder and 2 decoder layers,
4 heads, feed-forward 128, no dropout) with token embeddings, learned position embeddings and a Linear
output layer, trained with teacher forcing and cross-entropy that ignores padding.

The task is a fixed "language pair" built from ``torch.Generator().manual_seed(0)``: source sentences of
8 to 16 words drawn from a vocabulary of 24 words; the target is the word-by-word translation under a
fixed random word-to-word mapping, with every 3-word phrase reversed (local reordering), 4 of the
source words translating to two target words (so the alignment shifts along the sentence) and 3 target
words having a synonym chosen at random half of the time (the irreducible error, a ceiling near 0.95),
followed by EOS. Source and target words have their own token ranges; PAD, BOS and EOS are shared. 4,000 training
pairs, 600 validation pairs, the same for every seed. Quality is ``val/acc``: the token accuracy on the
non-pad target positions (EOS included) under teacher forcing; ``val/loss`` is logged beside it.

Calibration (one CPU thread, ``time.process_time``, batch 32, seed 0, each run its own full schedule):
B = 400 steps, about 23-27 ms a step, 9-11 s of training. At lr 3e-3: val/acc 0.889 at B/2, 0.944 at B,
0.948 at 2B (the plateau). At B: lr 1e-3 0.904, 3e-3 0.944, 1e-2 0.923, hence the grid (1e-3, 3e-3, 1e-2).
One validation pass (``trainer.validate``) 0.19-0.23 s.

Examples:
    from workloads.seq2seq import WORKLOAD
    train_loader, val_loader = WORKLOAD.make_data(0)
    module = WORKLOAD.make_module(WORKLOAD.budget_steps, WORKLOAD.lr_grid[1])
"""

from __future__ import annotations

import functools

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from workloads.base import Workload, adamw_warmup_cosine

BATCH_SIZE = 32
PAD, BOS, EOS = 0, 1, 2
N_WORDS = 24  # source words; the target language has N_WORDS + N_DOUBLE words
N_DOUBLE = 4  # source words that translate to two target words
N_SYNONYM = 3  # source words with two translations, either one at random (the irreducible error)
MIN_LEN, MAX_LEN = 8, 16
PHRASE = 3
N_TRAIN, N_VAL = 4000, 600
SRC_OFFSET = 3  # source word w is token SRC_OFFSET + w
TGT_OFFSET = SRC_OFFSET + N_WORDS  # target word v is token TGT_OFFSET + v
VOCAB = TGT_OFFSET + N_WORDS + N_DOUBLE + N_SYNONYM
SRC_LEN = MAX_LEN
TGT_LEN = 2 + 2 * MAX_LEN  # BOS, at most two target words a source word, EOS


def _language(g: torch.Generator) -> tuple[list[list[int]], dict[int, int]]:
    """The fixed translation of every source word (one or two target words) and the synonyms."""
    perm = torch.randperm(N_WORDS, generator=g).tolist()
    special = torch.randperm(N_WORDS, generator=g)[:N_DOUBLE + N_SYNONYM].tolist()
    table = [[perm[w]] for w in range(N_WORDS)]
    for i, w in enumerate(special[:N_DOUBLE]):
        table[w].append(N_WORDS + i)
    synonyms = {perm[w]: N_WORDS + N_DOUBLE + i for i, w in enumerate(special[N_DOUBLE:])}
    return table, synonyms


def _translate(words: list[int], table: list[list[int]], synonyms: dict[int, int], g: torch.Generator) -> list[int]:
    out: list[int] = []
    for start in range(0, len(words), PHRASE):
        for w in reversed(words[start:start + PHRASE]):
            out.extend(table[w])
    coins = torch.rand(len(out), generator=g).tolist()
    return [synonyms[v] if v in synonyms and c < 0.5 else v for v, c in zip(out, coins, strict=True)]


def _pairs(n: int, g: torch.Generator, table: list[list[int]], synonyms: dict[int, int]) -> TensorDataset:
    src = torch.full((n, SRC_LEN), PAD, dtype=torch.long)
    tgt = torch.full((n, TGT_LEN), PAD, dtype=torch.long)
    lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (n,), generator=g).tolist()
    for i, length in enumerate(lengths):
        words = torch.randint(0, N_WORDS, (length,), generator=g).tolist()
        out = _translate(words, table, synonyms, g)
        src[i, :length] = torch.tensor(words) + SRC_OFFSET
        seq = [BOS] + [v + TGT_OFFSET for v in out] + [EOS]
        tgt[i, :len(seq)] = torch.tensor(seq)
    return TensorDataset(src, tgt)


@functools.lru_cache(maxsize=1)
def _datasets() -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(0)
    table, synonyms = _language(g)
    return _pairs(N_TRAIN, g, table, synonyms), _pairs(N_VAL, g, table, synonyms)


class Seq2SeqTransformer(nn.Module):
    """``nn.Transformer`` with token and learned position embeddings and a Linear output layer."""

    def __init__(self, vocab: int = VOCAB, d_model: int = 64, nhead: int = 4, layers: int = 2,
                 dim_feedforward: int = 128, max_len: int = TGT_LEN):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model, padding_idx=PAD)
        self.src_pos = nn.Parameter(torch.randn(1, max_len, d_model))
        self.tgt_pos = nn.Parameter(torch.randn(1, max_len, d_model))
        self.transformer = nn.Transformer(d_model, nhead, layers, layers, dim_feedforward, dropout=0.0,
                                          batch_first=True)
        self.out = nn.Linear(d_model, vocab)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        s, t = src.shape[1], tgt_in.shape[1]
        src_x = self.embed(src) + self.src_pos[:, :s]
        tgt_x = self.embed(tgt_in) + self.tgt_pos[:, :t]
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=src.device, dtype=src_x.dtype)
        src_pad = torch.zeros(src.shape, dtype=src_x.dtype, device=src.device).masked_fill(src == PAD, float("-inf"))
        tgt_pad = torch.zeros(tgt_in.shape, dtype=src_x.dtype, device=src.device).masked_fill(
            tgt_in == PAD, float("-inf"))
        h = self.transformer(src_x, tgt_x, tgt_mask=causal, src_key_padding_mask=src_pad,
                             tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad, tgt_is_causal=True)
        return self.out(h)


class Seq2SeqModule(L.LightningModule):
    """The translation transformer trained with teacher forcing and the benchmark's AdamW schedule."""

    def __init__(self, total_steps: int, lr: float):
        super().__init__()
        self.total_steps = total_steps
        self.lr = lr
        self.model = Seq2SeqTransformer()

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.model(src, tgt_in)

    @staticmethod
    def _trim(src: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop the columns that are padding in the whole batch."""
        s = int((src != PAD).sum(1).max())
        t = int((tgt != PAD).sum(1).max())
        return src[:, :s], tgt[:, :t]

    def training_step(self, batch, batch_idx):
        src, tgt = self._trim(*batch)
        logits = self(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1), ignore_index=PAD)
        self.log("train/loss", loss, batch_size=len(src))
        return loss

    def validation_step(self, batch, batch_idx):
        src, tgt = self._trim(*batch)
        logits = self(src, tgt[:, :-1])
        target = tgt[:, 1:]
        mask = target != PAD
        n = int(mask.sum())
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=PAD)
        acc = (logits.argmax(-1) == target)[mask].float().mean()
        self.log("val/loss", loss, batch_size=n)
        self.log("val/acc", acc, batch_size=n)

    def configure_optimizers(self):
        return adamw_warmup_cosine(self.parameters(), self.lr, self.total_steps)


def make_module(total_steps: int, lr: float) -> Seq2SeqModule:
    return Seq2SeqModule(total_steps, lr)


def make_data(seed: int) -> tuple[DataLoader, DataLoader]:
    train, val = _datasets()
    train_loader = DataLoader(train, batch_size=BATCH_SIZE, shuffle=True, drop_last=True,
                              generator=torch.Generator().manual_seed(seed))
    return train_loader, DataLoader(val, batch_size=600, shuffle=False)


WORKLOAD = Workload(
    name="seq2seq",
    description="nn.Transformer encoder-decoder (d 64, 2+2 layers) on synthetic phrase-reordering translation",
    make_module=make_module,
    make_data=make_data,
    monitor="val/acc",
    mode="max",
    budget_steps=400,
    lr_grid=(1e-3, 3e-3, 1e-2),
    requires=(),
)
