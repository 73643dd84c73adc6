"""ALiBi for Hugging Face attention: GPT-2, BERT and Llama.

Hugging Face attention modules take an ``attention_mask`` that is *added* to the attention scores
(or a boolean mask, or ``None`` for "causal, no padding"). The ALiBi version of an attention class
turns whatever mask it is given into an additive one and adds ALiBi's ``-slope_h * |i - j|`` to it,
then runs the original ``forward``: the projections, the cache handling and the attention kernel
(``"eager"`` or ``"sdpa"``) stay Hugging Face's. The position information is removed where it lives:

- GPT-2 and BERT: the learned position embedding is zeroed, frozen and resized to
  ``max_sequence_length`` (and ``config.max_position_embeddings`` updated, so that
  ``save_pretrained`` writes a consistent config);
- Llama: the rotary embedding is switched off inside the attention (``cos = 1``, ``sin = 0``).

The surgery changes attention modules *in place* (their class becomes the ALiBi subclass): the
parameters, their names and the optimizer's references stay the same, so checkpoints keep their
keys. Cross-attention and ``attn_implementation`` other than ``"eager"`` and ``"sdpa"`` are
refused with an error.

Examples:
    >>> import torch, transformers
    >>> from composer_bridge.functional import apply_alibi  # no other import: it finds these classes
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16)
    >>> gpt2 = transformers.GPT2LMHeadModel(config)
    >>> apply_alibi(gpt2, max_sequence_length=64)  # the GPT2Model's wpe + one attention layer
    2
    >>> gpt2(torch.randint(0, 32, (1, 40))).logits.shape  # longer than n_positions was
    torch.Size([1, 40, 32])
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.models.bert import modeling_bert
from transformers.models.bert.modeling_bert import BertModel, BertSelfAttention
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Model
from transformers.models.llama.modeling_llama import LlamaAttention

from composer_bridge.algorithms.alibi import alibi_bias, alibi_slopes

__all__ = [
    "AlibiAttention",
    "AlibiBertSelfAttention",
    "AlibiGPT2Attention",
    "AlibiLlamaAttention",
    "alibi_attention_mask",
    "convert_attention",
    "convert_bert_model",
    "convert_gpt2_model",
    "to_alibi",
]

SUPPORTED_ATTENTION = ("eager", "sdpa")


def alibi_attention_mask(
    mask: torch.Tensor | None,
    slopes: torch.Tensor,
    query_length: int,
    key_length: int,
    causal: bool,
    dtype: torch.dtype,
) -> torch.Tensor:
    """An additive ``(batch or 1, heads, query_length, key_length)`` mask: ``mask`` plus ALiBi's bias.

    Args:
        mask: what the Hugging Face model passed to its attention: ``None`` (no padding), a
            boolean mask (``True`` = may attend) or an additive float mask, broadcastable to
            ``(batch, heads, query_length, key_length)``.
        slopes: one slope per head (:func:`~composer_bridge.algorithms.alibi.alibi_slopes`).
        query_length: the number of queries; they are the last ``query_length`` of the keys.
        key_length: the number of keys (cached ones included).
        causal: with ``mask=None``, hide the keys after each query.
        dtype: the dtype of the result; masked entries hold its most negative finite value.

    Examples:
        >>> m = alibi_attention_mask(None, torch.tensor([0.5]), 3, 3, causal=True, dtype=torch.float32)
        >>> m[0, 0, 2, :2].tolist(), bool(m[0, 0, 0, 1] < -1e30)
        ([-1.0, -0.5], True)
    """
    bias = alibi_bias(slopes.float(), query_length, key_length)[None]
    lowest = torch.finfo(dtype).min
    if mask is None:
        if causal:
            offset = key_length - query_length
            queries = torch.arange(query_length, device=bias.device)[:, None] + offset
            future = torch.arange(key_length, device=bias.device)[None, :] > queries
            bias = bias.masked_fill(future, lowest)
    elif mask.dtype == torch.bool:
        bias = bias.masked_fill(~mask.to(bias.device), lowest)
    else:
        bias = bias + mask.float()
    return bias.clamp(min=lowest).to(dtype)


class AlibiAttention(nn.Module):
    """Mixed in before a Hugging Face attention class: its ``forward`` with ALiBi added to the mask.

    Subclasses are ``class AlibiX(AlibiAttention, X)``; instances are made by :func:`to_alibi`
    (which :func:`convert_attention` calls for the known classes) from an existing ``X``: the class
    is swapped in place and a non-persistent ``alibi_slopes`` buffer added. ``forward`` binds its arguments to ``X.forward``'s
    signature, so the keyword or positional order of the Hugging Face version does not matter.
    """

    #: Llama-style models encode positions by rotating queries and keys; ALiBi turns that off.
    disables_rotary: ClassVar[bool] = False
    _signature: ClassVar[inspect.Signature]
    _var_keyword: ClassVar[str | None]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        original = next(base for base in cls.__mro__[1:] if base is not AlibiAttention and "forward" in vars(base))
        cls._signature = inspect.signature(original.forward)
        cls._var_keyword = next((p.name for p in cls._signature.parameters.values()
                                 if p.kind is inspect.Parameter.VAR_KEYWORD), None)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        bound = self._signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        if arguments.get("encoder_hidden_states") is not None:
            raise NotImplementedError(
                f"{type(self).__name__}: ALiBi is not defined for cross-attention (encoder_hidden_states was given). "
                "Apply Alibi to decoder-only or encoder-only models."
            )
        hidden = arguments["hidden_states"]
        mask = arguments.get("attention_mask")
        query_length = hidden.shape[-2]
        key_length = mask.shape[-1] if mask is not None else query_length + _cached_length(self, arguments)
        dtype = mask.dtype if mask is not None and mask.is_floating_point() else hidden.dtype
        slopes: torch.Tensor = self.alibi_slopes  # type: ignore[assignment]
        arguments["attention_mask"] = alibi_attention_mask(
            mask, slopes, query_length, key_length, bool(getattr(self, "is_causal", False)), dtype
        )
        if self.disables_rotary and arguments.get("position_embeddings") is not None:
            cos, sin = arguments["position_embeddings"]
            arguments["position_embeddings"] = (torch.ones_like(cos), torch.zeros_like(sin))
        return super().forward(*bound.args[1:], **bound.kwargs)


def _cached_length(module: AlibiAttention, arguments: dict[str, Any]) -> int:
    """How many keys the cache holds for ``module``'s layer before this call (0 without a cache).

    The cache is found by its type, not by its argument's name: transformers calls it
    ``past_key_values`` up to 5.23 and ``cache`` from 5.24 on (where a caller may still pass the old
    name, which then arrives in ``**kwargs``). With ``attention_mask=None`` (the sdpa path) a missed
    cache would shorten the ALiBi bias to the new queries only, broadcast over all the keys.
    """
    extra = arguments.get(module._var_keyword, {}) if module._var_keyword else {}
    found = [v for v in (*arguments.values(), *extra.values()) if isinstance(v, Cache)]
    if not found:
        return 0
    cache = getattr(found[0], "self_attention_cache", found[0])  # EncoderDecoderCache: the decoder's part
    return int(cache.get_seq_length(getattr(module, "layer_idx", 0) or 0))


class AlibiGPT2Attention(AlibiAttention, GPT2Attention):
    """GPT-2's attention with ALiBi biases."""


class AlibiBertSelfAttention(AlibiAttention, BertSelfAttention):
    """BERT's self-attention with (bidirectional) ALiBi biases."""


class AlibiLlamaAttention(AlibiAttention, LlamaAttention):
    """Llama's attention with ALiBi biases instead of rotary position embeddings."""

    disables_rotary = True


_ALIBI_CLASS: dict[type, type[AlibiAttention]] = {
    GPT2Attention: AlibiGPT2Attention,
    BertSelfAttention: AlibiBertSelfAttention,
    LlamaAttention: AlibiLlamaAttention,
}

# transformers 4.x builds BERT with a separate sdpa subclass (5.x picks the kernel at run time instead).
_BertSdpaSelfAttention = getattr(modeling_bert, "BertSdpaSelfAttention", None)
if _BertSdpaSelfAttention is not None:  # pragma: no cover - depends on the transformers version

    class AlibiBertSdpaSelfAttention(AlibiAttention, _BertSdpaSelfAttention):  # type: ignore[misc, valid-type]
        """BERT's sdpa self-attention (transformers 4.x) with ALiBi biases."""

    _ALIBI_CLASS[_BertSdpaSelfAttention] = AlibiBertSdpaSelfAttention


def _heads(module: nn.Module) -> int:
    for name in ("num_heads", "num_attention_heads"):
        if isinstance(getattr(module, name, None), int):
            return int(getattr(module, name))
    return int(module.config.num_attention_heads)


def convert_attention(module: nn.Module, max_sequence_length: int) -> nn.Module | None:
    """Give a GPT-2, BERT or Llama attention module ALiBi, in place; ``None`` if it already has it."""
    if isinstance(module, AlibiAttention):
        return None
    if getattr(module, "is_cross_attention", False):
        return None  # GPT-2's cross-attention (encoder-decoder use): left as it is
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
    if implementation not in (None, *SUPPORTED_ATTENTION):
        raise ValueError(
            f"Alibi on {type(module).__name__}: attn_implementation={implementation!r} is not supported (the "
            f"ALiBi bias travels in the attention mask, which only {SUPPORTED_ATTENTION} accept in full). Build "
            "the model with attn_implementation='sdpa' (or 'eager')."
        )
    new_class = _ALIBI_CLASS.get(type(module))
    if new_class is None:
        raise TypeError(
            f"Alibi knows {', '.join(c.__name__ for c in _ALIBI_CLASS)} but not their subclass "
            f"{type(module).__name__}, whose forward may differ. Pass Alibi(policy={{{type(module).__name__}: fn}}) "
            "with fn = lambda module, length: composer_bridge.hf.to_alibi(module, YourAlibiClass)."
        )
    _grow_causal_buffer(module, max_sequence_length)
    return to_alibi(module, new_class)


def _grow_causal_buffer(module: nn.Module, length: int) -> None:
    """Older GPT-2 attention (transformers 4.x) masks with a ``bias`` buffer sized ``n_positions``: grow it."""
    bias = getattr(module, "bias", None)
    if isinstance(bias, torch.Tensor) and bias.dtype == torch.bool and bias.ndim == 4 and bias.shape[-1] < length:
        causal = torch.ones(length, length, dtype=torch.bool, device=bias.device).tril().view(1, 1, length, length)
        module.register_buffer("bias", causal, persistent=False)


def to_alibi(module: nn.Module, alibi_class: type[AlibiAttention]) -> nn.Module:
    """Make ``module`` an instance of ``alibi_class`` (``class X(AlibiAttention, type(module))``) in place.

    The parameters, their names and the optimizer's references stay; a non-persistent
    ``alibi_slopes`` buffer (one slope per head) is added. Returns ``module``.
    """
    if not (isinstance(alibi_class, type) and issubclass(alibi_class, AlibiAttention)
            and issubclass(alibi_class, type(module))):
        raise TypeError(
            f"to_alibi({type(module).__name__}, {alibi_class!r}): the class must be "
            f"`class Alibi{type(module).__name__}(AlibiAttention, {type(module).__name__})`."
        )
    heads = _heads(module)
    device = next(module.parameters()).device
    module.__class__ = alibi_class
    module.register_buffer("alibi_slopes", torch.tensor(alibi_slopes(heads), device=device), persistent=False)
    return module


def _zeroed_positions(old: nn.Embedding, max_sequence_length: int) -> nn.Embedding | None:
    """A frozen all-zero position embedding of ``max_sequence_length`` rows, or ``None`` if ``old`` is one."""
    if old.num_embeddings == max_sequence_length and not old.weight.requires_grad and not bool(old.weight.any()):
        return None
    new = nn.Embedding(max_sequence_length, old.embedding_dim, device=old.weight.device, dtype=old.weight.dtype)
    nn.init.zeros_(new.weight)
    new.weight.requires_grad_(False)
    return new


def convert_gpt2_model(model: nn.Module, max_sequence_length: int) -> nn.Module | None:
    """Zero and freeze a ``GPT2Model``'s ``wpe``, sized ``max_sequence_length`` (in place)."""
    assert isinstance(model, GPT2Model)
    new = _zeroed_positions(model.wpe, max_sequence_length)
    if new is None:
        return None
    model.wpe = new
    model.config.n_positions = max_sequence_length
    return model


def convert_bert_model(model: nn.Module, max_sequence_length: int) -> nn.Module | None:
    """Zero and freeze a ``BertModel``'s position embedding, sized ``max_sequence_length`` (in place).

    The embeddings' ``position_ids`` and ``token_type_ids`` buffers are resized with it.
    """
    assert isinstance(model, BertModel)
    embeddings = model.embeddings
    new = _zeroed_positions(embeddings.position_embeddings, max_sequence_length)
    if new is None:
        return None
    embeddings.position_embeddings = new
    device = embeddings.position_ids.device
    positions = torch.arange(max_sequence_length, device=device).expand((1, -1))
    embeddings.register_buffer("position_ids", positions, persistent=False)
    embeddings.register_buffer("token_type_ids", torch.zeros(positions.shape, dtype=torch.long, device=device),
                               persistent=False)
    model.config.max_position_embeddings = max_sequence_length
    return model


#: ``{Hugging Face class: fn(module, max_sequence_length)}``, registered with :class:`~composer_bridge.algorithms.Alibi`.
ALIBI_POLICY: dict[type, Any] = {
    GPT2Model: convert_gpt2_model,
    BertModel: convert_bert_model,
    GPT2Attention: convert_attention,
    BertSelfAttention: convert_attention,
    LlamaAttention: convert_attention,
}
