"""QKNorm for Hugging Face attention: GPT-2 and the Llama family (Llama, Qwen2, Mistral, Gemma, Phi-3, GPT-NeoX).

Each policy wraps the projection(s) that produce an attention module's queries and keys in a
:class:`~composer_bridge.algorithms.qk_norm.QKNormProjection`, in place: the attention's own
``forward`` then reshapes normalised heads, so the norm comes before the rotary embeddings and
whatever kernel ``attn_implementation`` picks runs unchanged.

=====================  ======================  ==============================================
attention class        projection              query / key columns
=====================  ======================  ==============================================
``LlamaAttention``,    ``q_proj``, ``k_proj``  each projection is all queries / all keys
``Qwen2Attention``,
``MistralAttention``,
``GemmaAttention``
``Phi3Attention``      ``qkv_proj``            ``[q (heads) | k (kv heads) | v]``
``GPTNeoXAttention``   ``query_key_value``     per head ``[q | k | v]`` (interleaved)
``GPT2Attention``      ``c_attn``              ``[q | k | v]``; cross-attention: ``q_attn``
                                               (queries), ``c_attn`` ``[k | v]``
=====================  ======================  ==============================================

Models that normalise queries and keys already (Qwen3, Gemma 3, OLMo 2) have other attention
classes, which QKNorm leaves alone. The new parameters (``...q_norm.weight``,
``...k_norm.weight``) and the projections' new names (``q_proj.projection.weight``) are in the
model's ``state_dict``; ``save_pretrained`` writes them, and the original class does not read them.

Examples:
    >>> import torch, transformers
    >>> from composer_bridge.functional import apply_qk_norm  # no other import: it finds these classes
    >>> config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
    ...     num_attention_heads=4, num_key_value_heads=2, vocab_size=32)
    >>> llama = transformers.LlamaForCausalLM(config)
    >>> apply_qk_norm(llama)
    2
    >>> llama.model.layers[0].self_attn.k_proj.k_norm
    HeadRMSNorm(head_dim=4, eps=1e-06)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from torch import nn

from composer_bridge.algorithms.qk_norm import normalise_projection

__all__ = ["QK_NORM_POLICY"]


def _separate_projections(attention: nn.Module, eps: float) -> nn.Module | None:
    """Llama, Qwen2, Mistral, Gemma: ``q_proj`` holds the query heads, ``k_proj`` the key heads."""
    head_dim = attention.head_dim
    q = normalise_projection(attention, "q_proj", head_dim, (0, attention.q_proj.out_features), None, eps)
    k = normalise_projection(attention, "k_proj", head_dim, None, (0, attention.k_proj.out_features), eps)
    return attention if q or k else None


def _phi3(attention: nn.Module, eps: float) -> nn.Module | None:
    head_dim = attention.head_dim
    queries = attention.config.num_attention_heads * head_dim
    keys = attention.num_key_value_heads * head_dim
    done = normalise_projection(attention, "qkv_proj", head_dim, (0, queries), (queries, queries + keys), eps)
    return attention if done else None


def _gpt_neox(attention: nn.Module, eps: float) -> nn.Module | None:
    head_dim = attention.head_size
    heads = attention.query_key_value.out_features // (3 * head_dim)
    done = normalise_projection(
        attention, "query_key_value", head_dim, (0, head_dim), (head_dim, 2 * head_dim), eps, blocks=heads
    )
    return attention if done else None


def _gpt2(attention: nn.Module, eps: float) -> nn.Module | None:
    width, head_dim = attention.embed_dim, attention.head_dim
    if attention.is_cross_attention:
        q = normalise_projection(attention, "q_attn", head_dim, (0, width), None, eps)
        k = normalise_projection(attention, "c_attn", head_dim, None, (0, width), eps)
        done = q or k
    else:
        done = normalise_projection(attention, "c_attn", head_dim, (0, width), (width, 2 * width), eps)
    return attention if done else None


_CLASSES: dict[tuple[str, str], Callable[[nn.Module, float], nn.Module | None]] = {
    ("llama", "LlamaAttention"): _separate_projections,
    ("qwen2", "Qwen2Attention"): _separate_projections,
    ("mistral", "MistralAttention"): _separate_projections,
    ("gemma", "GemmaAttention"): _separate_projections,
    ("phi3", "Phi3Attention"): _phi3,
    ("gpt_neox", "GPTNeoXAttention"): _gpt_neox,
    ("gpt2", "GPT2Attention"): _gpt2,
}


def _policy() -> dict[type, Callable[[nn.Module, float], nn.Module | None]]:
    policy = {}
    for (family, name), fn in _CLASSES.items():
        try:
            module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        except ImportError:  # pragma: no cover - a transformers release without this family
            continue
        cls = getattr(module, name, None)
        if cls is not None:
            policy[cls] = fn
    return policy


#: ``{Hugging Face attention class: fn(module, eps)}``, registered with
#: :func:`~composer_bridge.algorithms.qk_norm.register_qk_norm_policy` on import of :mod:`composer_bridge.hf`.
QK_NORM_POLICY: dict[type, Callable[[nn.Module, float], nn.Module | None]] = _policy()
