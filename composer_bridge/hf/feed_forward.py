"""GatedLinearUnits for Hugging Face feed-forward blocks: BERT and GPT-2.

Both models compute their feed-forward block as ``out(act(up(x)))`` with the widening projection
``up`` and the activation in one module (BERT's ``BertIntermediate``: ``dense`` then
``intermediate_act_fn``; GPT-2's ``GPT2MLP``: ``c_fc`` then ``act``). The surgery replaces ``up``
with a :class:`~composer_bridge.algorithms.gated_linear_units.GatedProjection`
(``act(G x) * (V x)``, freshly initialised, as in Composer) and the activation with the identity,
in place; the output projection, dropout and (BERT) the residual LayerNorm stay as they were. So
BERT's block becomes ``LayerNorm(x + dropout(W_o (act(G x) * V x)))``.

Llama's MLP is already gated (SwiGLU): GatedLinearUnits leaves it alone.

Examples:
    >>> import transformers
    >>> from composer_bridge.functional import apply_gated_linear_units  # no other import needed
    >>> config = transformers.BertConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2,
    ...                                  intermediate_size=32, vocab_size=32)
    >>> bert = transformers.BertForMaskedLM(config)
    >>> apply_gated_linear_units(bert)
    2
    >>> type(bert.bert.encoder.layer[0].intermediate.dense).__name__
    'GatedProjection'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.models.bert.modeling_bert import BertIntermediate
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

from composer_bridge.algorithms.gated_linear_units import GatedProjection

__all__ = ["GLU_POLICY", "gate_bert_intermediate", "gate_gpt2_mlp"]


def _activation(act_fn: Any, own: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``act_fn`` as a callable: the block's ``own`` activation for ``None``, Hugging Face's for a name."""
    if act_fn is None:
        return own
    if isinstance(act_fn, str):
        return ACT2FN[act_fn]
    return act_fn


def _gated(d_model: int, d_ff: int, act: Callable[[torch.Tensor], torch.Tensor], like: torch.Tensor,
           gated_layer_bias: bool, non_gated_layer_bias: bool) -> GatedProjection:
    return GatedProjection(d_model, d_ff, act, gated_layer_bias, non_gated_layer_bias).to(
        device=like.device, dtype=like.dtype
    )


def gate_bert_intermediate(module: nn.Module, act_fn: Any, gated_layer_bias: bool,
                           non_gated_layer_bias: bool) -> nn.Module | None:
    """Turn a ``BertIntermediate`` into the gated half of a GLU block, in place (``None`` if done already)."""
    assert isinstance(module, BertIntermediate)
    if isinstance(module.dense, GatedProjection):
        return None
    dense = module.dense
    module.dense = _gated(dense.in_features, dense.out_features, _activation(act_fn, module.intermediate_act_fn),
                          dense.weight, gated_layer_bias, non_gated_layer_bias)
    module.intermediate_act_fn = nn.Identity()
    return module


def gate_gpt2_mlp(module: nn.Module, act_fn: Any, gated_layer_bias: bool,
                  non_gated_layer_bias: bool) -> nn.Module | None:
    """Turn a ``GPT2MLP``'s ``c_fc`` (a ``Conv1D``, weight ``(in, out)``) into a gated projection, in place."""
    assert isinstance(module, GPT2MLP)
    if isinstance(module.c_fc, GatedProjection):
        return None
    weight = module.c_fc.weight
    d_model, d_ff = (weight.shape[1], weight.shape[0]) if isinstance(module.c_fc, nn.Linear) else weight.shape
    module.c_fc = _gated(d_model, d_ff, _activation(act_fn, module.act), weight, gated_layer_bias,
                         non_gated_layer_bias)
    module.act = nn.Identity()
    return module


#: ``{Hugging Face class: fn(module, act_fn, gated_layer_bias, non_gated_layer_bias)}``, registered with
#: :class:`~composer_bridge.algorithms.GatedLinearUnits`.
GLU_POLICY: dict[type, Any] = {BertIntermediate: gate_bert_intermediate, GPT2MLP: gate_gpt2_mlp}
