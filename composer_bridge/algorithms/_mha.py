"""What ALiBi and QKNorm share: the attention surgery, and ``nn.MultiheadAttention`` rebuilt as a subclass.

:func:`replace_attention` is the body of ``apply_alibi`` and ``apply_qk_norm``: replace what the policy
knows, turn PyTorch's fused transformer paths off where it did, warn (naming the classes known) where it
did nothing. Both also replace ``nn.MultiheadAttention`` (also inside ``nn.TransformerEncoderLayer``) by a
subclass whose attention differs. :class:`MultiheadAttentionVariant` is that subclass's base: its ``forward``
takes ``nn.MultiheadAttention``'s arguments, once for both, and hands them to the subclass's ``attend`` as
one :class:`AttentionOptions`. :func:`rebuild_multihead_attention` builds the new module on the meta device
(no memory, no random initialisation) with the original's configuration, then gives it the original's
parameters and output projection, so that optimizers and checkpoints keep pointing at the same tensors.

Examples:
    >>> import torch
    >>> class Same(MultiheadAttentionVariant):
    ...     def attend(self, query, key, value, options):
    ...         return nn.MultiheadAttention.forward(self, query, key, value, *options)
    >>> mha = torch.nn.MultiheadAttention(8, 2)
    >>> twin = rebuild_multihead_attention(Same, mha)
    >>> twin.in_proj_weight is mha.in_proj_weight, twin.out_proj is mha.out_proj, type(twin).__name__
    (True, True, 'Same')
    >>> x = torch.randn(3, 1, 8)
    >>> torch.equal(twin(x, x, x, need_weights=False)[0], mha(x, x, x, need_weights=False)[0])
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple, TypeVar

import torch
from torch import nn

from composer_bridge.algorithms._surgery import (
    Optimizers,
    PolicyKey,
    ReplacementFunction,
    disable_fused_transformer_paths,
    replace_modules,
    warn_no_effect,
)

__all__ = [
    "AttentionOptions",
    "MultiheadAttentionVariant",
    "additive_mask",
    "causal_mask",
    "rebuild_multihead_attention",
    "replace_attention",
]

M = TypeVar("M", bound=nn.MultiheadAttention)


class AttentionOptions(NamedTuple):
    """The arguments of ``nn.MultiheadAttention.forward`` after ``query, key, value``, in its order.

    A named tuple, not a dataclass: ``torch.compile`` traces it as a plain tuple.
    """

    key_padding_mask: torch.Tensor | None
    need_weights: bool
    attn_mask: torch.Tensor | None
    average_attn_weights: bool
    is_causal: bool


class MultiheadAttentionVariant(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` whose attention a subclass computes in :meth:`attend`, called with the same arguments."""

    def forward(  # type: ignore[override]
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        options = AttentionOptions(key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal)
        return self.attend(query, key, value, options)

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               options: AttentionOptions) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The output and attention weights, as ``nn.MultiheadAttention.forward`` returns them."""
        raise NotImplementedError(f"{type(self).__name__} must define attend(query, key, value, options).")


def causal_mask(queries: int, keys: int, device: torch.device) -> torch.Tensor:
    """The boolean ``(queries, keys)`` mask of ``is_causal=True``: ``True`` above the diagonal (not allowed)."""
    return torch.ones(queries, keys, dtype=torch.bool, device=device).triu(1)


def additive_mask(mask: torch.Tensor, dtype: torch.dtype | None, device: torch.device) -> torch.Tensor:
    """A boolean mask (``True`` = not allowed) as ``0``/``-inf`` in ``dtype`` (``None``: torch's default dtype)."""
    return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(mask, float("-inf"))


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


def replace_attention(
    model: nn.Module, policies: Mapping[PolicyKey, ReplacementFunction], optimizers: Optimizers,
    *, skip: tuple[type, ...], algorithm: str, known: Iterable[type], fix: str,
) -> int:
    """Replace ``model``'s attention modules by ``policies``; the number replaced or changed.

    Where something changed, PyTorch's fused transformer paths are turned off (they would bypass the new
    attention); where nothing did, a :class:`NoEffectWarning` names the ``known`` classes and the ``fix``,
    at the caller of the ``apply_*`` function that calls this one.
    """
    done = replace_modules(model, policies, optimizers=optimizers, skip=skip)
    if done:
        disable_fused_transformer_paths(model)
    else:
        names = ", ".join(sorted(cls.__name__ for cls in known))
        warn_no_effect(algorithm, f"attention module it knows ({names})", stacklevel=4, fix=fix)
    return len(done)
