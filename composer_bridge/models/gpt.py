"""A small GPT for character-level language modelling (and the surgeries that know it).

Token and learned position embeddings, ``n_layers`` pre-LayerNorm blocks of
:class:`CausalSelfAttention` and :class:`FeedForward`, a final LayerNorm and a linear head
(tied to the token embedding by default). ``forward(tokens)`` maps ``(batch, time)`` integer
tokens to ``(batch, time, vocab_size)`` logits.

Examples:
    >>> import torch
    >>> gpt = GPT(vocab_size=32, block_size=16, d_model=32, n_layers=2, n_heads=4)
    >>> gpt(torch.randint(0, 32, (2, 10))).shape
    torch.Size([2, 10, 32])
    >>> gpt.head.weight is gpt.tok_emb.weight
    True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "CausalSelfAttention", "FeedForward", "TransformerBlock"]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees only itself and earlier positions.

    ``qkv`` projects to queries, keys and values at once; ``proj`` maps the heads back.
    :meth:`attention_bias` is the hook position schemes override (ALiBi adds a per-head linear
    bias there); by default there is none and the plain causal mask is used.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"CausalSelfAttention: d_model={d_model} must be divisible by n_heads={n_heads}.")
        self.d_model = d_model
        self.n_heads = n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def attention_bias(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
        """An additive ``(n_heads, length, length)`` bias for the attention scores, or ``None``."""
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        q, k, v = (t.view(batch, length, self.n_heads, channels // self.n_heads).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        bias = self.attention_bias(length, x.device, q.dtype)
        if bias is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        else:
            future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
            mask = bias.to(q.dtype).masked_fill(future, float("-inf"))
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        y = y.transpose(1, 2).reshape(batch, length, channels)
        return self.resid_dropout(self.proj(y))


class FeedForward(nn.Module):
    """``dropout(fc2(activation(fc1(x))))``, with ``fc1`` widening to ``d_ff``."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: nn.Module | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.activation = activation if activation is not None else nn.GELU()
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(self.activation(self.fc1(x))))


class TransformerBlock(nn.Module):
    """Pre-LN block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = FeedForward(d_model, d_ff, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A decoder-only transformer language model.

    Args:
        vocab_size: number of token ids.
        block_size: the longest sequence the position embedding covers.
        d_model: embedding width.
        n_layers: transformer blocks.
        n_heads: attention heads per block.
        d_ff: feed-forward width (default ``4 * d_model``).
        dropout: dropout after the embeddings, attention and feed-forward layers.
        tie_weights: share the head's weight with the token embedding.
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int = 64,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        d_ff: int | None = None,
        dropout: float = 0.0,
        tie_weights: bool = True,
    ) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("block_size", block_size), ("d_model", d_model),
                            ("n_layers", n_layers), ("n_heads", n_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPT({name}={value!r}): must be an int >= 1.")
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(block_size, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(d_model, n_heads, d_ff or 4 * d_model, dropout) for _ in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(self._init_weights)
        if tie_weights:
            self.head.weight = self.tok_emb.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.block_size:
            raise ValueError(
                f"GPT got a sequence of {length} tokens but block_size is {self.block_size}; cut the sequences or "
                "build the model with a larger block_size."
            )
        positions = torch.arange(length, device=tokens.device)
        x = self.drop(self.tok_emb(tokens) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
