"""GPT-2's ``Conv1D`` layers as ``nn.Linear`` (same function, transposed weight).

Hugging Face's GPT-2 family computes its projections with ``transformers.pytorch_utils.Conv1D``,
a linear layer whose weight is stored ``(in, out)``. Surgeries that look for ``nn.Linear``
(:class:`~composer_bridge.algorithms.Factorize`) do not see them; :func:`conv1d_to_linear` swaps
each for the equivalent ``nn.Linear`` first. The outputs are the same up to float rounding (the two
call different matrix-multiply kernels).

The swap changes the weights' shapes in the state dict, so a model saved afterwards with
``save_pretrained`` no longer loads into the stock GPT-2 class: :func:`linear_to_conv1d` swaps
back (for layers that were not factorised since).

Examples:
    >>> import torch, transformers
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16)
    >>> gpt2 = transformers.GPT2LMHeadModel(config)
    >>> conv1d_to_linear(gpt2)  # c_attn, c_proj, c_fc, mlp c_proj
    4
    >>> type(gpt2.transformer.h[0].attn.c_attn).__name__
    'Conv1DLinear'
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from composer_bridge.surgery import Optimizers, replace_modules

__all__ = ["Conv1DLinear", "conv1d_to_linear", "linear_to_conv1d"]


class Conv1DLinear(nn.Linear):
    """An ``nn.Linear`` made from a ``Conv1D`` (a distinct class, so :func:`linear_to_conv1d` finds it)."""

    @classmethod
    def from_conv1d(cls, conv: nn.Module) -> Conv1DLinear:
        fan_in, fan_out = conv.weight.shape
        new = cls(fan_in, fan_out, device=conv.weight.device, dtype=conv.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(conv.weight.t())
            new.bias.copy_(conv.bias)
        new.weight.requires_grad_(conv.weight.requires_grad)
        new.bias.requires_grad_(conv.bias.requires_grad)
        return new


def _to_conv1d(linear: nn.Module) -> Conv1D:
    assert isinstance(linear, nn.Linear)
    new = Conv1D(linear.out_features, linear.in_features).to(device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight.t())
        new.bias.copy_(linear.bias)
    return new


def conv1d_to_linear(model: nn.Module, optimizers: Optimizers = None) -> int:
    """Replace every ``transformers`` ``Conv1D`` of ``model`` by an equivalent ``nn.Linear``; return the count."""
    return len(replace_modules(model, {Conv1D: lambda conv, index: Conv1DLinear.from_conv1d(conv)},
                               optimizers=optimizers))


def linear_to_conv1d(model: nn.Module, optimizers: Optimizers = None) -> int:
    """Undo :func:`conv1d_to_linear` (e.g. before ``save_pretrained``); return the number of layers swapped back."""
    return len(replace_modules(model, {Conv1DLinear: lambda linear, index: _to_conv1d(linear)}, optimizers=optimizers))
