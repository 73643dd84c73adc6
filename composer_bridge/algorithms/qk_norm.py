"""QK-norm: queries and keys normalised per head before attention (Dehghani et al., 2023; OLMo 2, Qwen3, Gemma 3).

Each head's query and key vectors go through an RMSNorm over the head dimension, with a learnable
scale of ``head_dim`` entries shared by the heads (initialised to one) and ``eps=1e-6`` (the value
of Qwen3, Gemma 3 and OLMo 2), before the attention scores are taken, and before rotary embeddings
where the model has them. Attention then no longer depends on the scale of ``W_q`` and ``W_k``:
the attention logits cannot grow without bound, which is what lets higher learning rates train
without loss spikes.

The surgery wraps the projection that produces the queries and keys in a
:class:`QKNormProjection` (the projection, then the per-head norms on its query and key
columns), so the model's own attention code, rotary embeddings and kernels run unchanged, and
the projection's weights keep their values (their names gain ``.projection``). What it knows
(its default *policy*):

- :class:`composer_bridge.models.gpt.CausalSelfAttention`: its ``qkv`` projection;
- ``torch.nn.MultiheadAttention`` (also inside ``nn.TransformerEncoderLayer``) →
  :class:`QKNormMultiheadAttention`, which keeps the input and output projection parameters (the
  same tensors) and computes the attention itself (PyTorch's fused path is turned off for it);
- any attention module with one fused ``[q | k | v]`` ``nn.Linear`` (:func:`fused_qkv_layout`: timm's
  ``Attention.qkv``, nanoGPT's ``c_attn``, vit-pytorch's ``to_qkv``) beside a head count: timm's empty
  ``q_norm``/``k_norm`` slots are filled with the norms (a module whose slots already normalise is left
  alone); elsewhere the projection is wrapped.

Other libraries' classes are added to the defaults with :func:`register_qk_norm_policy`
(:mod:`composer_bridge.hf` registers Hugging Face's GPT-2, Llama, Qwen2, Mistral, Gemma, Phi-3 and
GPT-NeoX attention; it is imported by itself the first time a model holding ``transformers``
classes meets the surgery). Your own classes: ``policy={MyAttention: fn}`` with ``fn(module, eps)``
returning the module changed in place (see :func:`normalise_projection`), a replacement, or
``None`` to skip it.

Examples:
    >>> import torch
    >>> from composer_bridge.models import GPT
    >>> gpt = GPT(vocab_size=16, block_size=8, d_model=16, n_layers=2, n_heads=2)
    >>> apply_qk_norm(gpt)  # the two attention layers
    2
    >>> gpt.blocks[0].attn.qkv
    QKNormProjection(
      head_dim=8, queries=(0, 16), keys=(16, 32), blocks=1, eps=1e-06
      (projection): Linear(in_features=16, out_features=48, bias=True)
      (q_norm): HeadRMSNorm(head_dim=8, eps=1e-06)
      (k_norm): HeadRMSNorm(head_dim=8, eps=1e-06)
    )
    >>> gpt(torch.randint(0, 16, (1, 8))).shape
    torch.Size([1, 8, 16])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from composer_bridge.algorithms import _mha
from composer_bridge.algorithms._library_policies import load_library_policies, unloaded_policies_hint
from composer_bridge.algorithms._policy_registry import PolicyRegistry, user_first
from composer_bridge.algorithms._surgery import Optimizers, SurgeryAlgorithm
from composer_bridge.models.gpt import CausalSelfAttention

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = [
    "DEFAULT_EPS",
    "FUSED_QKV_NAMES",
    "HEAD_COUNT_NAMES",
    "HeadRMSNorm",
    "QKNorm",
    "QKNormMultiheadAttention",
    "QKNormPolicy",
    "QKNormProjection",
    "apply_qk_norm",
    "default_qk_norm_policy",
    "fused_qkv_layout",
    "normalise_projection",
    "register_qk_norm_policy",
]

#: RMSNorm's epsilon by default: Qwen3's, Gemma 3's and OLMo 2's ``rms_norm_eps``.
DEFAULT_EPS = 1e-6

#: ``fn(module, eps) -> module changed in place | replacement | None``.
QKNormPolicy = Mapping[type, Callable[[nn.Module, float], "nn.Module | None"]]


class HeadRMSNorm(nn.Module):
    """RMSNorm over the last dimension (one head's vector): ``x / sqrt(mean(x**2) + eps) * weight``.

    Computed in float32 and returned in the input's dtype, as Llama's and Qwen3's norms do.

    Examples:
        >>> norm = HeadRMSNorm(4)
        >>> [round(v, 4) for v in norm(torch.tensor([2.0, -2.0, 2.0, 2.0])).tolist()]
        [1.0, -1.0, 1.0, 1.0]
    """

    def __init__(self, head_dim: int, eps: float = DEFAULT_EPS) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.square().mean(dim=-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, eps={self.eps}"


class QKNormProjection(nn.Module):
    """A projection whose output's query and key columns are RMS-normalised per head.

    The output's last dimension is read as ``blocks`` equal blocks (one, or one per head where a
    model interleaves ``[q | k | v]`` per head, as GPT-NeoX does); inside each block, columns
    ``queries = (start, stop)`` hold query heads of ``head_dim`` columns each, and ``keys`` key
    heads. Either may be ``None`` (a projection of queries only, Llama's ``q_proj``).

    Args:
        projection: the original module (``nn.Linear``, GPT-2's ``Conv1D``, ...), kept as ``.projection``.
        head_dim: columns per head.
        queries: the query columns inside a block, or ``None``.
        keys: the key columns inside a block, or ``None``.
        blocks: how many equal blocks the output holds.
        eps: the norms' epsilon.

    Examples:
        >>> import torch
        >>> qk = QKNormProjection(torch.nn.Linear(4, 12), head_dim=2, queries=(0, 4), keys=(4, 8))
        >>> out = qk(torch.randn(3, 4)).detach()
        >>> round(float(out[0, :2].square().mean().sqrt()), 3)  # one query head: RMS 1
        1.0
    """

    def __init__(
        self, projection: nn.Module, head_dim: int, queries: tuple[int, int] | None, keys: tuple[int, int] | None,
        blocks: int = 1, eps: float = DEFAULT_EPS,
    ) -> None:
        super().__init__()
        for name, columns in (("queries", queries), ("keys", keys)):
            if columns is not None and ((columns[1] - columns[0]) % head_dim or columns[1] <= columns[0]):
                raise ValueError(f"QKNormProjection: {name}={columns} is not a whole number of heads of {head_dim}.")
        if queries is None and keys is None:
            raise ValueError("QKNormProjection needs queries=, keys= or both: which columns to normalise.")
        self.projection = projection
        self.head_dim = head_dim
        self.queries = tuple(queries) if queries is not None else None
        self.keys = tuple(keys) if keys is not None else None
        self.blocks = blocks
        self.eps = eps
        self.q_norm = HeadRMSNorm(head_dim, eps) if queries is not None else None
        self.k_norm = HeadRMSNorm(head_dim, eps) if keys is not None else None
        # the normalised column ranges in the order they come, fixed here: forward then only loops over a
        # constant list (torch 2.6's compiler and torch.export refuse a sort with keys inside forward)
        named = [(r, which) for r, which in ((self.queries, "q_norm"), (self.keys, "k_norm")) if r is not None]
        self._ranges: tuple[tuple[tuple[int, int], str], ...] = tuple(sorted(named))

    # Code that reads the projection's tensors through the attention module (ALiBi's surgery reads
    # ``qkv.bias``) finds them here as on the projection itself.
    @property
    def weight(self) -> torch.Tensor:
        """The projection's weight."""
        return self.projection.weight

    @property
    def bias(self) -> torch.Tensor | None:
        """The projection's bias (``None`` without one)."""
        return self.projection.bias

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        out = self.projection(*args, **kwargs)
        lead = out.shape[:-1]
        blocks = out.reshape(*lead, self.blocks, out.shape[-1] // self.blocks)
        pieces, position = [], 0
        for (start, stop), which in self._ranges:
            pieces.append(blocks[..., position:start])
            heads = blocks[..., start:stop].unflatten(-1, (-1, self.head_dim))
            pieces.append(getattr(self, which)(heads).flatten(-2))
            position = stop
        pieces.append(blocks[..., position:])
        return torch.cat(pieces, dim=-1).reshape(*lead, out.shape[-1])

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, queries={self.queries}, keys={self.keys}, blocks={self.blocks}, eps={self.eps}"


def normalise_projection(
    attention: nn.Module, name: str, head_dim: int, queries: tuple[int, int] | None, keys: tuple[int, int] | None,
    eps: float, blocks: int = 1,
) -> bool:
    """Wrap ``attention.<name>`` in a :class:`QKNormProjection`, in place; ``False`` if it is wrapped already.

    The building block of the policies: a policy for an attention class calls it for the
    projection(s) that produce its queries and keys, and returns the attention module.
    """
    projection = getattr(attention, name)
    if isinstance(projection, QKNormProjection):
        return False
    wrapped = QKNormProjection(projection, head_dim, queries, keys, blocks, eps)
    weight = next(iter(projection.parameters()), None)
    if weight is not None:  # the norms live where the projection does (surgery may run after .to(device))
        wrapped.to(device=weight.device, dtype=weight.dtype if weight.is_floating_point() else None)
    setattr(attention, name, wrapped)
    return True


def _gpt_attention(attention: nn.Module, eps: float) -> nn.Module | None:
    assert isinstance(attention, CausalSelfAttention)
    width = attention.d_model
    head_dim = width // attention.n_heads
    if not normalise_projection(attention, "qkv", head_dim, (0, width), (width, 2 * width), eps):
        return None
    return attention


class QKNormMultiheadAttention(_mha.MultiheadAttentionVariant):
    """``nn.MultiheadAttention`` with queries and keys RMS-normalised per head (shares the original's parameters).

    Computes the attention itself (``F.scaled_dot_product_attention``, or explicit softmax
    weights when ``need_weights=True``) with the same arguments and masks as the original:
    ``attn_mask`` (boolean ``True`` = not allowed, or additive; ``(L, S)`` or ``(N * heads, L, S)``),
    ``key_padding_mask``, ``is_causal``, ``batch_first``, separate ``kdim``/``vdim`` projections.
    ``add_bias_kv`` and ``add_zero_attn`` are refused.
    """

    q_norm: HeadRMSNorm
    k_norm: HeadRMSNorm

    @classmethod
    def from_multihead_attention(cls, mha: nn.MultiheadAttention, eps: float = DEFAULT_EPS) -> QKNormMultiheadAttention:
        if mha.bias_k is not None or mha.add_zero_attn:
            option = "add_bias_kv=True" if mha.bias_k is not None else "add_zero_attn=True"
            raise ValueError(
                f"QKNorm cannot normalise nn.MultiheadAttention with {option}: the extra key it appends is not a "
                "projection of the input, so its scale would not be normalised like the others. Fix: build the "
                "attention without it, or leave QKNorm out for this model."
            )
        new = _mha.rebuild_multihead_attention(cls, mha, keep_bias_kv=False)  # refused above: nothing to keep
        reference = mha.out_proj.weight
        new.q_norm = HeadRMSNorm(mha.head_dim, eps).to(device=reference.device, dtype=reference.dtype)
        new.k_norm = HeadRMSNorm(mha.head_dim, eps).to(device=reference.device, dtype=reference.dtype)
        new.train(mha.training)
        return new

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               options: _mha.AttentionOptions) -> tuple[torch.Tensor, torch.Tensor | None]:
        key_padding_mask = options.key_padding_mask
        batched = query.dim() == 3
        if not batched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        q, k, v = self._projected(query, key, value)  # (N, heads, L or S, head_dim)
        mask = self._additive_mask(options.attn_mask, key_padding_mask, options.is_causal, q)
        dropout = self.dropout if self.training else 0.0
        weights = None
        if options.need_weights:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            if mask is not None:
                scores = scores + mask
            weights = F.dropout(torch.softmax(scores, dim=-1), p=dropout)
            out = weights @ v
            if options.average_attn_weights:
                weights = weights.mean(dim=1)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        batch, length = out.shape[0], out.shape[2]
        out = self.out_proj(out.transpose(1, 2).reshape(batch, length, self.embed_dim))
        if not batched:
            return out.squeeze(0), (weights.squeeze(0) if weights is not None else None)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights

    def _projected(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b_q = b_k = b_v = None
        if self.in_proj_bias is not None:
            b_q, b_k, b_v = self.in_proj_bias.chunk(3)

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.unflatten(-1, (self.num_heads, self.head_dim))

        q = self.q_norm(heads(F.linear(query, w_q, b_q)))
        k = self.k_norm(heads(F.linear(key, w_k, b_k)))
        v = heads(F.linear(value, w_v, b_v))
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _additive_mask(self, attn_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None, is_causal: bool,
                       q: torch.Tensor) -> torch.Tensor | None:
        """``attn_mask`` and ``key_padding_mask`` as one additive mask broadcastable to ``(N, heads, L, S)``."""
        batch, _, length, _ = q.shape

        def additive(mask: torch.Tensor) -> torch.Tensor:
            return _mha.additive_mask(mask, q.dtype, q.device) if mask.dtype == torch.bool else mask.to(q.dtype)

        if attn_mask is None and is_causal:
            attn_mask = _mha.causal_mask(length, length, q.device)
        total = None
        if attn_mask is not None:
            total = additive(attn_mask)
            if total.dim() == 3:
                total = total.view(batch, self.num_heads, *total.shape[1:])
        if key_padding_mask is not None:
            padding = additive(key_padding_mask).view(batch, 1, 1, -1)
            total = padding if total is None else total + padding
        return total


#: Names of one fused projection whose output is ``[q | k | v]``, each head's columns together inside each
#: part: timm's ``Attention.qkv``, nanoGPT's ``c_attn``, vit-pytorch's ``to_qkv``, MosaicML's ``Wqkv``.
FUSED_QKV_NAMES = ("qkv", "c_attn", "to_qkv", "Wqkv")
#: Names of the head count beside it.
HEAD_COUNT_NAMES = ("num_heads", "n_heads", "n_head", "heads")


def fused_qkv_layout(module: nn.Module) -> tuple[str, int, int] | None:
    """``(projection name, width of q, head_dim)`` when ``module`` is attention with one fused ``[q | k | v]`` Linear.

    Recognised by structure, whatever the class: an ``nn.Linear`` named as in :data:`FUSED_QKV_NAMES`
    whose output is three equal parts, and an int head count named as in :data:`HEAD_COUNT_NAMES` that
    divides a part. The layout assumed is timm's and nanoGPT's (``reshape(B, N, 3, heads, head_dim)``,
    or ``split(width)`` then ``view(B, N, heads, head_dim)``); a model that interleaves ``[q | k | v]``
    per head (GPT-NeoX's ``query_key_value``) has its own policy.

    Examples:
        >>> class Attention(torch.nn.Module):  # timm's layout
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.num_heads, self.qkv = 2, torch.nn.Linear(8, 24)
        >>> fused_qkv_layout(Attention())
        ('qkv', 8, 4)
    """
    heads = next((getattr(module, n) for n in HEAD_COUNT_NAMES if isinstance(getattr(module, n, None), int)), None)
    if not heads or heads < 1 or isinstance(module, (CausalSelfAttention, nn.MultiheadAttention)):
        return None
    for name in FUSED_QKV_NAMES:
        projection = getattr(module, name, None)
        if isinstance(projection, nn.Linear) and projection.out_features % 3 == 0:
            width = projection.out_features // 3
            if width % heads == 0:
                return name, width, width // heads
    return None


def _fused_qkv_attention(attention: nn.Module, eps: float) -> nn.Module | None:
    """timm's slots where the module has them (``q_norm``/``k_norm`` as ``nn.Identity``), else the projection wrapped.

    A module whose ``q_norm``/``k_norm`` already normalise (timm's ``qk_norm=True``) is left alone.
    """
    layout = fused_qkv_layout(attention)
    assert layout is not None
    name, width, head_dim = layout
    slots = [getattr(attention, slot, None) for slot in ("q_norm", "k_norm")]
    if all(isinstance(slot, nn.Module) for slot in slots):
        if not all(isinstance(slot, nn.Identity) for slot in slots):
            return None  # it normalises queries and keys already
        weight = getattr(attention, name).weight
        for slot in ("q_norm", "k_norm"):
            setattr(attention, slot, HeadRMSNorm(head_dim, eps).to(device=weight.device, dtype=weight.dtype))
        return attention
    if not normalise_projection(attention, name, head_dim, (0, width), (width, 2 * width), eps):
        return None
    return attention


def _has_fused_qkv(module: nn.Module) -> bool:
    return fused_qkv_layout(module) is not None


def _multihead_attention(mha: nn.Module, eps: float) -> nn.Module:
    assert isinstance(mha, nn.MultiheadAttention)
    return QKNormMultiheadAttention.from_multihead_attention(mha, eps)


# Filled only by register_qk_norm_policy (an extension package registering its classes on import).
_POLICIES = PolicyRegistry("register_qk_norm_policy")


def register_qk_norm_policy(cls: type, fn: Callable[[nn.Module, float], nn.Module | None]) -> None:
    """Add ``cls`` to the default policy: ``fn(module, eps)`` converts its instances.

    For packages that teach QKNorm another library's classes (``composer_bridge.hf`` does it for
    Hugging Face models); registering a class again replaces its function.
    """
    _POLICIES.register(cls, fn)


def default_qk_norm_policy() -> dict[type, Callable[[nn.Module, float], nn.Module | None]]:
    """A fresh copy of the classes QKNorm knows and how it converts them (registered ones included)."""
    return _POLICIES.with_defaults({CausalSelfAttention: _gpt_attention, nn.MultiheadAttention: _multihead_attention})


def _merge_policy(policy: QKNormPolicy | None) -> dict[type, Callable[[nn.Module, float], nn.Module | None]]:
    return user_first(policy, default_qk_norm_policy(), "QKNorm", "fn(module, eps)", keys="attention class")


def _with_structural(policies: dict) -> dict:
    """The class policies first, then attention recognised by its fused ``[q | k | v]`` projection."""
    return {**policies, _has_fused_qkv: _fused_qkv_attention}


def _check_eps(eps: float) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(
            f"QKNorm(eps={eps!r}): must be a finite number > 0, added to the mean square before the square root "
            f"(default {DEFAULT_EPS}, as Qwen3, Gemma 3 and OLMo 2)."
        )


def apply_qk_norm(
    model: nn.Module, eps: float = DEFAULT_EPS, optimizers: Optimizers = None, policy: QKNormPolicy | None = None
) -> int:
    """Normalise the queries and keys of ``model``'s attention layers per head, in place.

    Args:
        model: the model to change.
        eps: the RMSNorms' epsilon (default ``1e-6``).
        optimizers: optimizers already built over ``model``: the norms' scales join the group of
            the projection they follow.
        policy: extra ``{class: fn(module, eps)}`` entries (see the module docs).

    Returns:
        The number of attention modules changed (a warning is raised when it is zero). Applying
        it twice changes nothing the second time.

    Examples:
        >>> import torch
        >>> layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, batch_first=True)
        >>> apply_qk_norm(layer)
        1
        >>> type(layer.self_attn).__name__
        'QKNormMultiheadAttention'
    """
    _check_eps(eps)
    load_library_policies(model)  # a transformers model: composer_bridge.hf registers its classes
    merged = _merge_policy(policy)

    def bound(fn: Callable[[nn.Module, float], nn.Module | None]) -> Callable[[nn.Module, int], nn.Module | None]:
        return lambda module, index: fn(module, eps)

    return _mha.replace_attention(
        model, {key: bound(fn) for key, fn in _with_structural(merged).items()}, optimizers,
        skip=(QKNormMultiheadAttention, QKNormProjection), algorithm="QKNorm", known=merged,
        fix="Models whose attention normalises queries and keys already (Qwen3, Gemma 3, OLMo 2) need nothing. "
        "For your own attention class pass policy={YourAttention: fn(module, eps)} (normalise_projection does "
        f"the wrapping); for another library's, register_qk_norm_policy(cls, fn).{unloaded_policies_hint()}",
    )


class QKNorm(SurgeryAlgorithm):
    """Queries and keys RMS-normalised per head (learnable scale), by surgery at ``Event.INIT``.

    Args:
        eps: the RMSNorms' epsilon; default ``1e-6`` (Qwen3, Gemma 3, OLMo 2).
        policy: your own ``{attention class: fn(module, eps)}`` surgery entries.

    Examples:
        >>> QKNorm()
        QKNorm(eps=1e-06, policy=None)
    """

    def __init__(self, eps: float = DEFAULT_EPS, policy: QKNormPolicy | None = None) -> None:
        _check_eps(eps)
        _merge_policy(policy)
        self.eps = eps
        self.policy = policy

    def surgery(self, state: State) -> int:
        return apply_qk_norm(state.model, self.eps, optimizers=state.optimizers, policy=self.policy)
