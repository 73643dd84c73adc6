"""Gated Linear Units (Shazeer, 2020): feed-forward layers computed as ``act(x W) * (x V)``.

A transformer feed-forward block ``W2 act(W1 x)`` becomes ``W2 (act(G x) * (V x))``: a gated
projection ``G``, a non-gated projection ``V`` (both ``d_model -> d_ff``), their product, then the
output projection. The new layers start from a fresh initialisation (as in Composer), so apply it
before training.

What the surgery knows (its default *policy*):

- :class:`composer_bridge.models.gpt.FeedForward` → :class:`GatedFeedForward`;
- ``torch.nn.TransformerEncoderLayer`` → its ``linear1`` becomes a :class:`GatedProjection` and its
  activation the identity (in place; PyTorch's fused inference path is turned off for it).

Other libraries' classes are added to the defaults with :func:`register_glu_policy`
(:mod:`composer_bridge.hf` registers Hugging Face's BERT and GPT-2 feed-forward blocks; it is imported by
itself the first time a model holding ``transformers`` classes meets the surgery).
Your own classes: ``policy={MyFFN: fn}`` with ``fn(module, act_fn, gated_layer_bias,
non_gated_layer_bias)`` returning the replacement (or ``None``); ``act_fn`` is ``None`` when the
user left it to the model. :class:`GatedFeedForward` and :class:`GatedProjection` are building blocks.

Examples:
    >>> import torch
    >>> from composer_bridge.models import GPT
    >>> gpt = GPT(vocab_size=16, block_size=8, d_model=16, n_heads=2)
    >>> apply_gated_linear_units(gpt)
    2
    >>> type(gpt.blocks[0].mlp).__name__
    'GatedFeedForward'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from composer_bridge.algorithms._library_policies import load_library_policies, unloaded_policies_hint
from composer_bridge.algorithms._policy_registry import PolicyRegistry, check_policy
from composer_bridge.algorithms._surgery import (
    Optimizers,
    SurgeryAlgorithm,
    disable_fused_transformer_paths,
    replace_modules,
    warn_no_effect,
)
from composer_bridge.models.gpt import FeedForward

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = [
    "GatedFeedForward",
    "GatedLinearUnits",
    "GatedProjection",
    "GLUPolicy",
    "apply_gated_linear_units",
    "default_glu_policy",
    "register_glu_policy",
]

Activation = Callable[[torch.Tensor], torch.Tensor]
#: ``fn(module, act_fn, gated_layer_bias, non_gated_layer_bias) -> replacement | None``.
GLUPolicy = Mapping[type, Callable[..., "nn.Module | None"]]

_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "swish": nn.SiLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid,
}


def _activation(act_fn: str | Activation | None, fallback: Any) -> Activation:
    """A module for ``act_fn`` (a name, a callable, or ``None`` for the layer's own ``fallback``)."""
    chosen = fallback if act_fn is None else act_fn
    if isinstance(chosen, str):
        return _ACTIVATIONS[chosen]()
    if chosen is F.relu:
        return nn.ReLU()
    if chosen is F.gelu:
        return nn.GELU()
    return chosen


class GatedProjection(nn.Module):
    """``act(gated_layer(x)) * non_gated_layer(x)``: the widening half of a GLU feed-forward block."""

    def __init__(self, d_model: int, d_ff: int, act_fn: Activation, gated_layer_bias: bool = False,
                 non_gated_layer_bias: bool = False) -> None:
        super().__init__()
        self.gated_layer = nn.Linear(d_model, d_ff, bias=gated_layer_bias)
        self.non_gated_layer = nn.Linear(d_model, d_ff, bias=non_gated_layer_bias)
        self.act = act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.gated_layer(x)) * self.non_gated_layer(x)


class GatedFeedForward(nn.Module):
    """``dropout(wo(GatedProjection(x)))``: a GLU feed-forward block, a drop-in for the GPT's :class:`FeedForward`."""

    def __init__(self, d_model: int, d_ff: int, act_fn: Activation, dropout: float = 0.0,
                 gated_layer_bias: bool = False, non_gated_layer_bias: bool = False) -> None:
        super().__init__()
        self.gate = GatedProjection(d_model, d_ff, act_fn, gated_layer_bias, non_gated_layer_bias)
        self.wo = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.wo(self.gate(x)))


def _from_feed_forward(module: nn.Module, act_fn: Any, gated_layer_bias: bool,
                       non_gated_layer_bias: bool) -> nn.Module:
    assert isinstance(module, FeedForward)
    return GatedFeedForward(
        module.fc1.in_features, module.fc1.out_features, _activation(act_fn, module.activation),
        module.dropout.p, gated_layer_bias, non_gated_layer_bias,
    )


def _from_encoder_layer(layer: nn.Module, act_fn: Any, gated_layer_bias: bool,
                        non_gated_layer_bias: bool) -> nn.Module | None:
    assert isinstance(layer, nn.TransformerEncoderLayer)
    if isinstance(layer.linear1, GatedProjection):
        return None  # already done
    layer.linear1 = GatedProjection(
        layer.linear1.in_features, layer.linear1.out_features, _activation(act_fn, layer.activation),
        gated_layer_bias, non_gated_layer_bias,
    ).to(device=layer.linear1.weight.device, dtype=layer.linear1.weight.dtype)
    layer.activation = nn.Identity()
    return layer


# Filled only by register_glu_policy (an extension package registering its classes on import).
_POLICIES = PolicyRegistry("register_glu_policy")


def register_glu_policy(cls: type, fn: Callable[..., nn.Module | None]) -> None:
    """Add ``cls`` to the default policy: ``fn(module, act_fn, gated_layer_bias, non_gated_layer_bias)``.

    For packages that teach GatedLinearUnits another library's classes (``composer_bridge.hf`` does it
    for Hugging Face models, imported by :func:`apply_gated_linear_units` when the model holds
    ``transformers`` classes); registering a class again replaces its function.
    """
    _POLICIES.register(cls, fn)


def default_glu_policy() -> dict[type, Callable[..., nn.Module | None]]:
    """A fresh copy of the classes GatedLinearUnits knows and how it converts them (registered ones included)."""
    return _POLICIES.with_defaults({FeedForward: _from_feed_forward, nn.TransformerEncoderLayer: _from_encoder_layer})


def _check(act_fn: Any, gated_layer_bias: bool, non_gated_layer_bias: bool, policy: Any) -> None:
    if isinstance(act_fn, str) and act_fn not in _ACTIVATIONS:
        raise ValueError(f"GatedLinearUnits(act_fn={act_fn!r}): known names are {sorted(_ACTIVATIONS)}, or pass a callable.")
    if act_fn is not None and not isinstance(act_fn, str) and not callable(act_fn):
        raise TypeError(f"GatedLinearUnits(act_fn={act_fn!r}): must be None, an activation name or a callable.")
    for name, value in (("gated_layer_bias", gated_layer_bias), ("non_gated_layer_bias", non_gated_layer_bias)):
        if not isinstance(value, bool):
            raise TypeError(f"GatedLinearUnits({name}={value!r}): must be True or False.")
    check_policy(policy, "GatedLinearUnits", "module class: fn", "fn(module, act_fn, gated_layer_bias, non_gated_layer_bias)")


def apply_gated_linear_units(
    model: nn.Module,
    optimizers: Optimizers = None,
    act_fn: str | Activation | None = None,
    gated_layer_bias: bool = False,
    non_gated_layer_bias: bool = False,
    policy: GLUPolicy | None = None,
) -> int:
    """Turn ``model``'s feed-forward blocks into gated linear units, in place.

    Args:
        model: the model to change.
        optimizers: optimizers already built over ``model``: the old projections leave them,
            the new ones join their param group.
        act_fn: the gate's activation: a name (``"gelu"``, ``"relu"``, ``"silu"``, ...), a callable,
            or ``None`` for each block's own activation.
        gated_layer_bias: give the gated projection a bias (default no).
        non_gated_layer_bias: give the non-gated projection a bias (default no).
        policy: extra ``{class: fn}`` entries (see the module docs); they win over the defaults.

    Returns:
        The number of feed-forward blocks converted (a warning is raised when it is zero).
    """
    _check(act_fn, gated_layer_bias, non_gated_layer_bias, policy)
    load_library_policies(model)  # a transformers model: composer_bridge.hf registers its classes
    entries = {**dict(policy or {}), **{k: v for k, v in default_glu_policy().items() if k not in (policy or {})}}

    def bound(fn: Callable[..., nn.Module | None]) -> Callable[[nn.Module, int], nn.Module | None]:
        return lambda module, index: fn(module, act_fn, gated_layer_bias, non_gated_layer_bias)

    policies = {cls: bound(fn) for cls, fn in entries.items()}
    done = replace_modules(model, policies, optimizers=optimizers, skip=(GatedFeedForward, GatedProjection))
    if done:
        disable_fused_transformer_paths(model)
    else:
        known = ", ".join(sorted(cls.__name__ for cls in entries))
        warn_no_effect(
            "GatedLinearUnits", f"feed-forward block it knows ({known})",
            fix="For your own feed-forward class pass policy={YourFFN: fn(module, act_fn, gated_layer_bias, "
            f"non_gated_layer_bias)}}; for another library's, register_glu_policy(cls, fn).{unloaded_policies_hint()}",
        )
    return len(done)


class GatedLinearUnits(SurgeryAlgorithm):
    """Gated feed-forward blocks, applied at ``Event.INIT``.

    Takes the arguments of :func:`apply_gated_linear_units` (Composer's defaults). ``repr`` evaluates back
    when ``act_fn`` is ``None`` or a name and ``policy`` is ``None``.

    Examples:
        >>> GatedLinearUnits(act_fn="silu")
        GatedLinearUnits(act_fn='silu', gated_layer_bias=False, non_gated_layer_bias=False, policy=None)
    """

    def __init__(
        self,
        act_fn: str | Activation | None = None,
        gated_layer_bias: bool = False,
        non_gated_layer_bias: bool = False,
        policy: GLUPolicy | None = None,
    ) -> None:
        _check(act_fn, gated_layer_bias, non_gated_layer_bias, policy)
        self.act_fn = act_fn
        self.gated_layer_bias = gated_layer_bias
        self.non_gated_layer_bias = non_gated_layer_bias
        self.policy = policy

    def surgery(self, state: State) -> int:
        return apply_gated_linear_units(
            state.model, state.optimizers, self.act_fn, self.gated_layer_bias, self.non_gated_layer_bias, self.policy
        )
