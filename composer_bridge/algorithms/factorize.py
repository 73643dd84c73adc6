"""Factorize: replace wide linear layers and convolutions by two thinner ones (a low-rank product).

A ``Linear(in, out)`` becomes ``Linear(in, k, bias=False)`` then ``Linear(k, out)``; a ``KxK``
convolution becomes a ``KxK`` convolution to ``k`` channels then a ``1x1`` convolution. The surgery
only does so where ``k`` is small enough to save multiply-adds, and initialises the two factors
from the truncated SVD of the original weight, so the factorised layer is the best rank-``k``
approximation of the original (exactly the original at full rank). Composer initialises the
factors afresh instead.

Example:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    >>> apply_factorization(net, min_features=32, latent_features=0.25)
    1
    >>> net[0].module0.out_features
    16
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn.modules.utils import _pair

from composer_bridge.algorithms.surgery import (
    Optimizers,
    SurgeryAlgorithm,
    disable_fused_transformer_paths,
    replace_modules,
    warn_no_effect,
)

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = [
    "Factorize",
    "FactorizedConv2d",
    "FactorizedLinear",
    "apply_factorization",
    "factorizing_could_speedup",
]


def _latent_size(latent: float, in_size: int, out_size: int) -> int:
    """A fraction below 1 of ``min(in_size, out_size)`` (at least 1), or an absolute size."""
    return max(1, int(latent * min(in_size, out_size))) if latent < 1 else int(latent)


def _max_rank_with_speedup(fan_in: int, out_size: int) -> int:
    """The largest rank whose two factors need fewer multiply-adds than the original layer."""
    return int(math.ceil(fan_in * out_size / (fan_in + out_size) - 1))


def factorizing_could_speedup(module: nn.Module, latent_size: float) -> bool:
    """Whether factorising ``module`` (Linear or ungrouped Conv2d) at ``latent_size`` saves multiply-adds."""
    if isinstance(module, nn.Conv2d):
        if module.groups > 1:
            return False
        kh, kw = _pair(module.kernel_size)
        rank = _latent_size(latent_size, module.in_channels, module.out_channels)
        return rank <= _max_rank_with_speedup(module.in_channels * kh * kw, module.out_channels)
    if isinstance(module, nn.Linear):
        rank = _latent_size(latent_size, module.in_features, module.out_features)
        return rank <= _max_rank_with_speedup(module.in_features, module.out_features)
    return False


def _svd_factors(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, B)`` with ``B @ A`` the best rank-``rank`` approximation of ``weight`` (out x fan_in)."""
    u, s, vh = torch.linalg.svd(weight.detach().double(), full_matrices=False)
    root = s[:rank].sqrt()
    first = root[:, None] * vh[:rank]  # rank x fan_in
    second = u[:, :rank] * root[None, :]  # out x rank
    return first.to(weight.dtype), second.to(weight.dtype)


def _check_rank(name: str, rank: int, largest: int, what: str) -> None:
    if not 1 <= rank <= largest:
        raise ValueError(f"{name}: the latent size {rank} must be between 1 and {largest} ({what}).")


class FactorizedLinear(nn.Module):
    """``module1(module0(x))``: ``Linear(in, latent, bias=False)`` then ``Linear(latent, out)``."""

    def __init__(self, in_features: int, out_features: int, latent_features: float = 0.25, bias: bool = True) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.latent_features = _latent_size(latent_features, in_features, out_features)
        _check_rank("FactorizedLinear", self.latent_features, min(in_features, out_features), "min(in, out)")
        self.module0 = nn.Linear(in_features, self.latent_features, bias=False)
        self.module1 = nn.Linear(self.latent_features, out_features, bias=bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, latent_features: float = 0.25) -> FactorizedLinear:
        """The best rank-``latent_features`` approximation of ``linear`` (truncated SVD)."""
        new = cls(linear.in_features, linear.out_features, latent_features, bias=linear.bias is not None)
        new.to(device=linear.weight.device, dtype=linear.weight.dtype)
        first, second = _svd_factors(linear.weight, new.latent_features)
        with torch.no_grad():
            new.module0.weight.copy_(first)
            new.module1.weight.copy_(second)
            if linear.bias is not None:
                new.module1.bias.copy_(linear.bias)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module1(self.module0(x))


class FactorizedConv2d(nn.Module):
    """A ``KxK`` convolution to ``latent_channels`` channels (no bias), then a ``1x1`` convolution."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        latent_channels: float = 0.25,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.latent_channels = _latent_size(latent_channels, in_channels, out_channels)
        kh, kw = _pair(kernel_size)
        _check_rank("FactorizedConv2d", self.latent_channels, min(out_channels, in_channels * kh * kw),
                    "min(out_channels, in_channels * kernel area)")
        self.module0 = nn.Conv2d(in_channels, self.latent_channels, kernel_size, stride=stride, padding=padding,
                                 dilation=dilation, bias=False, padding_mode=padding_mode)
        self.module1 = nn.Conv2d(self.latent_channels, out_channels, 1, bias=bias)

    @classmethod
    def from_conv2d(cls, conv: nn.Conv2d, latent_channels: float = 0.25) -> FactorizedConv2d:
        """The best rank-``latent_channels`` approximation of ``conv`` (truncated SVD of its weight)."""
        if conv.groups != 1:
            raise ValueError(f"FactorizedConv2d cannot factorise a grouped convolution (groups={conv.groups}).")
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, latent_channels, stride=conv.stride,
                  padding=conv.padding, dilation=conv.dilation, bias=conv.bias is not None,
                  padding_mode=conv.padding_mode)
        new.to(device=conv.weight.device, dtype=conv.weight.dtype)
        first, second = _svd_factors(conv.weight.reshape(conv.out_channels, -1), new.latent_channels)
        with torch.no_grad():
            new.module0.weight.copy_(first.reshape(new.module0.weight.shape))
            new.module1.weight.copy_(second.reshape(new.module1.weight.shape))
            if conv.bias is not None:
                new.module1.bias.copy_(conv.bias)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module1(self.module0(x))


def _check(factorize_convs: bool, factorize_linears: bool, min_channels: int, latent_channels: float,
           min_features: int, latent_features: float) -> None:
    for name, value in (("factorize_convs", factorize_convs), ("factorize_linears", factorize_linears)):
        if not isinstance(value, bool):
            raise TypeError(f"Factorize({name}={value!r}): must be True or False.")
    for name, value in (("min_channels", min_channels), ("min_features", min_features)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"Factorize({name}={value!r}): must be an int >= 1.")
    for name, value in (("latent_channels", latent_channels), ("latent_features", latent_features)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (value >= 1 and value != int(value)):
            raise ValueError(
                f"Factorize({name}={value!r}): give a fraction in (0, 1) of the layer's smaller side, or a whole "
                "number of latent units >= 1."
            )


def apply_factorization(
    model: nn.Module,
    factorize_convs: bool = True,
    factorize_linears: bool = True,
    min_channels: int = 512,
    latent_channels: float = 0.25,
    min_features: int = 512,
    latent_features: float = 0.25,
    optimizers: Optimizers = None,
) -> int:
    """Factorise ``model``'s wide ``Conv2d`` and ``Linear`` layers in place where it saves multiply-adds.

    Args:
        model: the model to change.
        factorize_convs: consider ``nn.Conv2d`` layers.
        factorize_linears: consider ``nn.Linear`` layers.
        min_channels: leave convolutions with fewer input or output channels alone.
        latent_channels: the rank of convolutions: a fraction in (0, 1) of ``min(in, out)``, or a
            whole number.
        min_features: leave linear layers with fewer input or output features alone.
        latent_features: the rank of linear layers, as ``latent_channels``.
        optimizers: optimizers already built over ``model``: the replaced weights leave them, the
            factors join the same param group.

    Layers whose weight is shared with another module (tied embeddings) and the projections
    inside ``nn.MultiheadAttention`` (which reads their weights directly) are left alone.

    Returns:
        The number of layers factorised (a warning is raised when it is zero).
    """
    _check(factorize_convs, factorize_linears, min_channels, latent_channels, min_features, latent_features)
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))

    def tied(module: nn.Module) -> bool:
        return any(uses[id(p)] > 1 for p in module.parameters(recurse=False))

    def maybe_conv(conv: nn.Module, index: int) -> nn.Module | None:
        assert isinstance(conv, nn.Conv2d)
        wide = min(conv.in_channels, conv.out_channels) >= min_channels
        if wide and not tied(conv) and factorizing_could_speedup(conv, latent_channels):
            return FactorizedConv2d.from_conv2d(conv, latent_channels)
        return None

    def maybe_linear(linear: nn.Module, index: int) -> nn.Module | None:
        assert isinstance(linear, nn.Linear)
        wide = min(linear.in_features, linear.out_features) >= min_features
        if wide and not tied(linear) and factorizing_could_speedup(linear, latent_features):
            return FactorizedLinear.from_linear(linear, latent_features)
        return None

    policies = {}
    if factorize_convs:
        policies[nn.Conv2d] = maybe_conv
    if factorize_linears:
        policies[nn.Linear] = maybe_linear
    done = replace_modules(
        model, policies, optimizers=optimizers, skip=(FactorizedConv2d, FactorizedLinear, nn.MultiheadAttention)
    )
    if done:
        disable_fused_transformer_paths(model)
    else:
        warn_no_effect("Factorize", "Conv2d/Linear layer wide enough (min_channels/min_features) to gain from it")
    return len(done)


class Factorize(SurgeryAlgorithm):
    """Factorise wide convolutions and linear layers into low-rank pairs at ``Event.INIT``.

    Takes the arguments of :func:`apply_factorization`. The class keeps Composer's class defaults
    (``min_channels=256``, ``min_features=256``, ``latent_features=128``), which differ from the
    functional form's (512, 512, 0.25), as in Composer.

    Example:
        >>> Factorize(min_channels=64, latent_channels=0.5)  # doctest: +NORMALIZE_WHITESPACE
        Factorize(factorize_convs=True, factorize_linears=True, min_channels=64, latent_channels=0.5,
                  min_features=256, latent_features=128)
    """

    def __init__(
        self,
        factorize_convs: bool = True,
        factorize_linears: bool = True,
        min_channels: int = 256,
        latent_channels: float = 0.25,
        min_features: int = 256,
        latent_features: float = 128,
    ) -> None:
        _check(factorize_convs, factorize_linears, min_channels, latent_channels, min_features, latent_features)
        self.factorize_convs = factorize_convs
        self.factorize_linears = factorize_linears
        self.min_channels = min_channels
        self.latent_channels = latent_channels
        self.min_features = min_features
        self.latent_features = latent_features

    def surgery(self, state: State) -> int:
        return apply_factorization(
            state.model, self.factorize_convs, self.factorize_linears, self.min_channels, self.latent_channels,
            self.min_features, self.latent_features, optimizers=state.optimizers,
        )
