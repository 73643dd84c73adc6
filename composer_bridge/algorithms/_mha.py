"""One ``nn.MultiheadAttention`` rebuilt as a subclass that shares the original's parameters.

ALiBi and QKNorm both replace ``nn.MultiheadAttention`` (also inside ``nn.TransformerEncoderLayer``) by a
subclass whose ``forward`` differs; the new module is built on the meta device (no memory, no random
initialisation) with the original's configuration, then takes the original's parameters and output
projection, so that optimizers and checkpoints keep pointing at the same tensors.

Examples:
    >>> import torch
    >>> class Same(torch.nn.MultiheadAttention):
    ...     pass
    >>> mha = torch.nn.MultiheadAttention(8, 2)
    >>> twin = rebuild_multihead_attention(Same, mha)
    >>> twin.in_proj_weight is mha.in_proj_weight, twin.out_proj is mha.out_proj, type(twin).__name__
    (True, True, 'Same')
"""

from __future__ import annotations

from typing import TypeVar

from torch import nn

__all__ = ["rebuild_multihead_attention"]

M = TypeVar("M", bound=nn.MultiheadAttention)


def rebuild_multihead_attention(cls: type[M], mha: nn.MultiheadAttention, keep_bias_kv: bool = True) -> M:
    """An instance of ``cls`` configured as ``mha``, holding ``mha``'s parameters, in ``mha``'s train/eval mode.

    ``keep_bias_kv=False`` builds it without ``add_bias_kv``/``add_zero_attn`` (for a caller that refuses them).
    """
    new = cls(
        mha.embed_dim, mha.num_heads, dropout=mha.dropout, bias=mha.in_proj_bias is not None,
        add_bias_kv=keep_bias_kv and mha.bias_k is not None, add_zero_attn=keep_bias_kv and mha.add_zero_attn,
        kdim=mha.kdim, vdim=mha.vdim, batch_first=mha.batch_first, device="meta",
    )
    for name, param in mha.named_parameters(recurse=False):
        setattr(new, name, param)
    new.out_proj = mha.out_proj
    new.train(mha.training)
    return new
