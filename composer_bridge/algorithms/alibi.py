"""ALiBi (Press et al., 2021): attention biased by distance instead of position embeddings.

Each attention head adds ``-slope_h * |i - j|`` to the score of query ``i`` for key ``j`` (slopes
form a geometric sequence over heads), and the learned position embeddings are zeroed and
frozen. Models trained this way extrapolate to longer sequences, so :class:`Alibi` also trains on
shorter sequences (``train_sequence_length_scaling``), which is where the speed-up comes from.

What the surgery knows (its default *policy*):

- ``torch.nn.MultiheadAttention`` (also inside ``nn.TransformerEncoderLayer``) → :class:`AlibiMultiheadAttention`;
- :class:`composer_bridge.models.gpt.CausalSelfAttention` → :class:`AlibiCausalSelfAttention`;
- :class:`composer_bridge.models.gpt.GPT` → position embedding zeroed, frozen and resized to
  ``max_sequence_length`` (in place).

Other libraries' classes are added to the defaults with :func:`register_alibi_policy`
(:mod:`composer_bridge.hf` registers Hugging Face's GPT-2, BERT and Llama attention; it is imported
by itself the first time a model holding ``transformers`` classes meets the surgery).
Your own classes: pass ``policy={MyAttention: fn}`` where ``fn(module, max_sequence_length)``
returns the replacement (or the module changed in place, or ``None`` to skip it).
:func:`alibi_slopes` and :func:`alibi_bias` give the bias; entries you pass override the
defaults for the same class.

Examples:
    >>> import torch
    >>> from composer_bridge.models import GPT
    >>> gpt = GPT(vocab_size=16, block_size=8, d_model=16, n_heads=2)
    >>> apply_alibi(gpt, max_sequence_length=32)  # 2 attention layers + the GPT's position embedding
    3
    >>> gpt(torch.randint(0, 16, (1, 20))).shape  # longer than the original block_size
    torch.Size([1, 20, 16])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from composer_bridge.algorithms import _mha
from composer_bridge.algorithms._library_policies import load_library_policies, unloaded_policies_hint
from composer_bridge.algorithms._policy_registry import PolicyRegistry, user_first
from composer_bridge.algorithms._surgery import Optimizers, SurgeryAlgorithm
from composer_bridge.core.event import Event
from composer_bridge.models.gpt import GPT, CausalSelfAttention

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = [
    "Alibi",
    "AlibiCausalSelfAttention",
    "AlibiMultiheadAttention",
    "AlibiPolicy",
    "alibi_bias",
    "alibi_slopes",
    "apply_alibi",
    "default_alibi_policy",
    "register_alibi_policy",
]

#: ``fn(module, max_sequence_length) -> replacement | module changed in place | None``.
AlibiPolicy = Mapping[type, Callable[[nn.Module, int], "nn.Module | None"]]


def alibi_slopes(n_heads: int) -> list[float]:
    """The per-head slopes of Press et al.: ``2**(-8 i / n)`` for ``n`` a power of two, interleaved otherwise."""
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if n_heads < 1:
        raise ValueError(f"alibi_slopes(n_heads={n_heads}): needs at least one head.")
    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: n_heads - closest]


def alibi_bias(slopes: torch.Tensor, query_length: int, key_length: int) -> torch.Tensor:
    """The ``(heads, query_length, key_length)`` bias ``-slope * |i - j|``; queries are the last positions."""
    offset = key_length - query_length
    queries = torch.arange(query_length, device=slopes.device) + offset
    keys = torch.arange(key_length, device=slopes.device)
    distance = (queries[:, None] - keys[None, :]).abs().to(slopes.dtype)
    return -slopes[:, None, None] * distance


class AlibiCausalSelfAttention(CausalSelfAttention):
    """The GPT's attention with ALiBi biases (shares the original's projections)."""

    @classmethod
    def from_attention(cls, attention: CausalSelfAttention) -> AlibiCausalSelfAttention:
        new = cls(attention.d_model, attention.n_heads, attention.dropout, bias=attention.qkv.bias is not None)
        new.qkv, new.proj, new.resid_dropout = attention.qkv, attention.proj, attention.resid_dropout
        new.register_buffer("slopes", torch.tensor(alibi_slopes(attention.n_heads)), persistent=False)
        return new

    def attention_bias(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        return alibi_bias(self.slopes.to(device=device, dtype=torch.float32), length, length).to(dtype)


class AlibiMultiheadAttention(_mha.MultiheadAttentionVariant):
    """``nn.MultiheadAttention`` that adds ALiBi biases to ``attn_mask`` (shares the original's parameters)."""

    @classmethod
    def from_multihead_attention(cls, mha: nn.MultiheadAttention) -> AlibiMultiheadAttention:
        new = _mha.rebuild_multihead_attention(cls, mha)
        new.register_buffer("slopes", torch.tensor(alibi_slopes(mha.num_heads)), persistent=False)
        return new

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               options: _mha.AttentionOptions) -> tuple[torch.Tensor, torch.Tensor | None]:
        batched = query.dim() == 3
        time_dim = 1 if (batched and self.batch_first) else 0
        length, keys = query.shape[time_dim], key.shape[time_dim]
        dtype = query.dtype if query.is_floating_point() else torch.float32
        bias = alibi_bias(self.slopes.to(device=query.device, dtype=torch.float32), length, keys)
        attn_mask, key_padding_mask = options.attn_mask, options.key_padding_mask
        if options.is_causal and attn_mask is None:
            attn_mask = _mha.causal_mask(length, keys, query.device)
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                attn_mask = _mha.additive_mask(attn_mask, None, query.device)
            if attn_mask.dim() == 3:
                bias = bias.repeat(attn_mask.shape[0] // self.num_heads, 1, 1)
            bias = bias + attn_mask.float()
        if batched and bias.shape[0] == self.num_heads:
            batch = query.shape[0 if self.batch_first else 1]
            bias = bias.repeat(batch, 1, 1)
        if key_padding_mask is not None and key_padding_mask.dtype == torch.bool:
            key_padding_mask = _mha.additive_mask(key_padding_mask, dtype, query.device)
        # torch's own attention, with the bias as its mask (super().forward is the variant's, which calls attend)
        return nn.MultiheadAttention.forward(
            self, query, key, value, key_padding_mask=key_padding_mask, need_weights=options.need_weights,
            attn_mask=bias.to(dtype), average_attn_weights=options.average_attn_weights, is_causal=False,
        )


def _convert_gpt(gpt: nn.Module, max_sequence_length: int) -> nn.Module | None:
    assert isinstance(gpt, GPT)
    old = gpt.pos_emb
    if (old.num_embeddings == max_sequence_length and not old.weight.requires_grad
            and not bool(old.weight.detach().any())):
        return None  # already done
    new = nn.Embedding(max_sequence_length, old.embedding_dim, device=old.weight.device, dtype=old.weight.dtype)
    nn.init.zeros_(new.weight)
    new.weight.requires_grad_(False)
    gpt.pos_emb = new
    gpt.block_size = max_sequence_length
    return gpt


# Filled only by register_alibi_policy (an extension package registering its classes on import).
_POLICIES = PolicyRegistry("register_alibi_policy")


def register_alibi_policy(cls: type, fn: Callable[[nn.Module, int], nn.Module | None]) -> None:
    """Add ``cls`` to the default policy: ``fn(module, max_sequence_length)`` converts its instances.

    For packages that teach ALiBi another library's classes (``composer_bridge.hf`` does it for
    Hugging Face models, imported by :func:`apply_alibi` when the model holds ``transformers``
    classes); registering a class again replaces its function.
    """
    _POLICIES.register(cls, fn)


def default_alibi_policy() -> dict[type, Callable[[nn.Module, int], nn.Module | None]]:
    """A fresh copy of the classes ALiBi knows and how it converts them (registered ones included)."""
    return _POLICIES.with_defaults({
        GPT: _convert_gpt,
        CausalSelfAttention: lambda m, n: AlibiCausalSelfAttention.from_attention(m),  # type: ignore[arg-type]
        nn.MultiheadAttention: lambda m, n: AlibiMultiheadAttention.from_multihead_attention(m),  # type: ignore[arg-type]
    })


def _merge_policy(policy: AlibiPolicy | None) -> dict[type, Callable[[nn.Module, int], nn.Module | None]]:
    return user_first(policy, default_alibi_policy(), "Alibi", "fn(module, max_sequence_length)")


def _check(max_sequence_length: int, train_sequence_length_scaling: float = 1.0) -> None:
    if isinstance(max_sequence_length, bool) or not isinstance(max_sequence_length, int) or max_sequence_length < 1:
        raise ValueError(
            f"Alibi(max_sequence_length={max_sequence_length!r}): must be an int >= 1, at least the longest sequence "
            "the model will see in training or evaluation."
        )
    scaling = train_sequence_length_scaling
    if isinstance(scaling, bool) or not isinstance(scaling, (int, float)) or not 0 < scaling <= 1:
        raise ValueError(
            f"Alibi(train_sequence_length_scaling={scaling!r}): must be in (0, 1] (1 keeps the sequences as they "
            "are; Composer's default 0.25 trains on quarter-length sequences, four times as many)."
        )


def apply_alibi(
    model: nn.Module, max_sequence_length: int, optimizers: Optimizers = None, policy: AlibiPolicy | None = None
) -> int:
    """Switch ``model``'s attention to ALiBi and remove its position embeddings, in place.

    Args:
        model: the model to change.
        max_sequence_length: the longest sequence the model must accept afterwards.
        optimizers: optimizers already built over ``model``: the removed position embedding
            leaves them (the zeroed one is frozen and not added).
        policy: extra ``{class: fn(module, max_sequence_length)}`` entries (see the module docs).

    Returns:
        The number of modules replaced or changed (a warning is raised when it is zero).
    """
    _check(max_sequence_length)
    load_library_policies(model)  # a transformers model: composer_bridge.hf registers its classes

    def bound(fn: Callable[[nn.Module, int], nn.Module | None]) -> Callable[[nn.Module, int], nn.Module | None]:
        return lambda module, index: fn(module, max_sequence_length)

    merged = _merge_policy(policy)
    return _mha.replace_attention(
        model, {cls: bound(fn) for cls, fn in merged.items()}, optimizers,
        skip=(AlibiCausalSelfAttention, AlibiMultiheadAttention), algorithm="Alibi", known=merged,
        fix="For your own attention class pass policy={YourAttention: fn(module, max_sequence_length)}; for "
        f"another library's, register_alibi_policy(cls, fn).{unloaded_policies_hint()}",
    )


def _shorten(value: Any, scaling: float) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == 2:
        rows, length = value.shape
        new_length = length * scaling
        if new_length != int(new_length) or (rows * length) % int(new_length):
            raise ValueError(
                f"Alibi(train_sequence_length_scaling={scaling}) cannot reshape a batch of shape {tuple(value.shape)}: "
                f"the sequence length {length} times {scaling} must be a whole number. Pick a scaling that divides it."
            )
        return value.reshape(-1, int(new_length))
    if isinstance(value, dict):
        return {k: _shorten(v, scaling) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_shorten(v, scaling) for v in value)
    return value


class Alibi(SurgeryAlgorithm):
    """ALiBi attention at ``Event.INIT``; shorter training sequences at every ``AFTER_DATALOADER``.

    Args:
        max_sequence_length: the longest sequence the model must accept (required, as in Composer).
        train_sequence_length_scaling: training batches of shape ``(B, S)`` become
            ``(B / scaling, S * scaling)`` (every 2-d tensor of the batch: token ids, targets,
            masks), so the model trains on shorter sequences at the same token count. ``1`` keeps
            them. Evaluation batches are left alone.
        policy: your own ``{class: fn(module, max_sequence_length)}`` surgery entries.

    Examples:
        >>> Alibi(max_sequence_length=128)
        Alibi(max_sequence_length=128, train_sequence_length_scaling=0.25, policy=None)
    """

    def __init__(
        self, max_sequence_length: int, train_sequence_length_scaling: float = 0.25, policy: AlibiPolicy | None = None
    ) -> None:
        _check(max_sequence_length, train_sequence_length_scaling)
        _merge_policy(policy)
        self.max_sequence_length = max_sequence_length
        self.train_sequence_length_scaling = train_sequence_length_scaling
        self.policy = policy

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT or (event == Event.AFTER_DATALOADER and self.train_sequence_length_scaling != 1)

    def surgery(self, state: State) -> int:
        return apply_alibi(state.model, self.max_sequence_length, optimizers=state.optimizers, policy=self.policy)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.INIT:
            super().apply(event, state, logger)
        else:
            state.batch = _shorten(state.batch, self.train_sequence_length_scaling)
