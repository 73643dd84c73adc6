"""Factorize: replace wide linear layers and convolutions by two thinner ones (a low-rank product).

A ``Linear(in, out)`` becomes ``Linear(in, k, bias=False)`` then ``Linear(k, out)``; a ``KxK``
convolution becomes a ``KxK`` convolution to ``k`` channels then a ``1x1`` convolution. The surgery
only does so where ``k`` is small enough to save multiply-adds, and initialises the two factors
from the truncated SVD of the original weight, so the factorised layer is the best rank-``k``
approximation of the original (exactly the original when its weight has rank ``k`` or less).
Composer initialises the factors afresh instead. ``set_rank`` shrinks a factorised layer further,
fitting the new factors to its outputs on sample inputs (:func:`factorize_matrix`,
:func:`factorize_conv2d`).

Examples:
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

from composer_bridge.algorithms._low_rank import LowRankSolution, factorize_conv2d, factorize_matrix
from composer_bridge.algorithms._surgery import (
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
    "LowRankSolution",
    "apply_factorization",
    "factorize_conv2d",
    "factorize_matrix",
    "factorizing_could_speedup",
]


def _latent_size(latent: float, in_size: int, out_size: int) -> int:
    """A fraction below 1 of ``min(in_size, out_size)`` (at least 1), or an absolute size."""
    return max(1, int(latent * min(in_size, out_size))) if latent < 1 else int(latent)


def _max_rank_with_speedup(fan_in: int, out_size: int) -> int:
    """The largest rank whose two factors need fewer multiply-adds than the original layer."""
    return int(math.ceil(fan_in * out_size / (fan_in + out_size) - 1))


def factorizing_could_speedup(module: nn.Module, latent_size: float) -> bool:
    """Whether factorising ``module`` at ``latent_size`` saves multiply-adds.

    ``module`` is a ``Linear``, an ungrouped ``Conv2d``, or an already factorised layer (then:
    whether ``latent_size`` is below its current latent size); anything else gives ``False``.
    """
    if isinstance(module, _Factorized):
        return module.should_factorize(latent_size)
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


def _check_latent(where: str, name: str, requested: float, rank: int, largest: int, shape: str) -> None:
    """Refuse a latent size that saves no multiply-adds (Composer refuses these too)."""
    if largest < 1:
        raise ValueError(
            f"{where}({name}={requested!r}): no latent size saves multiply-adds on a {shape} layer; leave it "
            "unfactorised."
        )
    if not 1 <= rank <= largest:
        raise ValueError(
            f"{where}({name}={requested!r}): a latent size of {rank} saves no multiply-adds on a {shape} layer; "
            f"give a size between 1 and {largest} (the largest whose two factors cost less than the original)."
        )


class _Factorized(nn.Module):
    """What the two factorised layers share: the forward pass and rank changes (``set_rank``)."""

    module0: nn.Module
    module1: nn.Module
    latent_size: int
    in_size: int
    out_size: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module1(self.module0(x))

    def reset_parameters(self) -> None:
        """Re-initialise both factors as freshly built ``nn`` layers (Composer's initialisation)."""
        self.module0.reset_parameters()
        self.module1.reset_parameters()

    def should_factorize(self, proposed_rank: float) -> bool:
        """Whether ``proposed_rank`` is below the current latent size (so :meth:`set_rank` saves work)."""
        return _latent_size(proposed_rank, self.in_size, self.out_size) < self.latent_size

    def solution_for_rank(self, input: torch.Tensor, rank: int) -> LowRankSolution:
        """The rank-``rank`` factors that best preserve this layer's outputs on ``input`` (not installed)."""
        raise NotImplementedError

    def _weights_from(self, solution: LowRankSolution) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _set_latent_shapes(self, rank: int) -> None:
        raise NotImplementedError

    def apply_solution(self, solution: LowRankSolution) -> None:
        """Install ``solution``'s factors (new parameters: rebuild or update the optimizer afterwards)."""
        if solution.rank < 1 or solution.Wa is None or solution.Wb is None:
            raise ValueError(
                f"{type(self).__name__}.apply_solution needs a factorised solution (rank >= 1), got "
                f"rank={solution.rank}."
            )
        first, second = self._weights_from(solution)
        weight0, weight1 = self.module0.weight, self.module1.weight
        self.module0.weight = nn.Parameter(first.to(device=weight0.device, dtype=weight0.dtype),
                                           requires_grad=weight0.requires_grad)
        self.module1.weight = nn.Parameter(second.to(device=weight1.device, dtype=weight1.dtype),
                                           requires_grad=weight1.requires_grad)
        if self.module1.bias is not None and solution.bias is not None:
            with torch.no_grad():
                self.module1.bias.copy_(solution.bias)
        self.latent_size = solution.rank
        self._set_latent_shapes(solution.rank)

    def set_rank(self, input: torch.Tensor, rank: int) -> None:
        """Shrink the latent size to ``rank``, fitting the new factors to this layer's outputs on ``input``.

        The new factors minimise the squared error between the layer's outputs before and after on
        ``input`` (:func:`factorize_matrix`); ``rank`` equal to the current size changes nothing.
        The parameters are new objects: rebuild the optimizer (or its param group) afterwards.

        Raises:
            ValueError: ``rank`` is not a whole number between 1 and the current latent size.

        Examples:
            >>> layer = FactorizedLinear(32, 32, latent_features=8)
            >>> layer.set_rank(torch.randn(64, 32), 4)
            >>> layer.latent_features, tuple(layer.module1.weight.shape)
            (4, (32, 4))
        """
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= self.latent_size:
            raise ValueError(
                f"{type(self).__name__}.set_rank(rank={rank!r}): the rank can only shrink; give a whole number "
                f"between 1 and the current latent size {self.latent_size}."
            )
        if rank < self.latent_size:
            self.apply_solution(self.solution_for_rank(input, rank))


class FactorizedLinear(_Factorized):
    """``module1(module0(x))``: ``Linear(in, latent, bias=False)`` then ``Linear(latent, out)``.

    Composer's argument order (``bias`` before ``latent_features``). A latent size that saves no
    multiply-adds (see :meth:`max_allowed_latent_features`) raises ``ValueError``.

    Examples:
        >>> layer = FactorizedLinear(64, 32, latent_features=8)
        >>> layer.module0.weight.shape, FactorizedLinear.max_allowed_latent_features(64, 32)
        (torch.Size([8, 64]), 21)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, latent_features: float = 0.25) -> None:
        super().__init__()
        self.in_size, self.out_size = in_features, out_features
        self.latent_size = _latent_size(latent_features, in_features, out_features)
        _check_latent("FactorizedLinear", "latent_features", latent_features, self.latent_size,
                      _max_rank_with_speedup(in_features, out_features), f"{in_features} -> {out_features}")
        self.module0 = nn.Linear(in_features, self.latent_size, bias=False)
        self.module1 = nn.Linear(self.latent_size, out_features, bias=bias)

    in_features = property(lambda self: self.in_size, doc="As ``nn.Linear.in_features``.")
    out_features = property(lambda self: self.out_size, doc="As ``nn.Linear.out_features``.")
    latent_features = property(lambda self: self.latent_size, doc="The width between the two factors.")

    @staticmethod
    def max_allowed_latent_features(in_features: int, out_features: int) -> int:
        """The largest latent size whose two factors need fewer multiply-adds than ``Linear(in, out)``."""
        return _max_rank_with_speedup(in_features, out_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, module_ix: int = -1, latent_features: float = 0.25) -> FactorizedLinear:
        """The best rank-``latent_features`` approximation of ``linear`` (truncated SVD of its weight).

        ``module_ix`` is accepted for Composer's signature and unused.
        """
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, latent_features=latent_features)
        new.to(device=linear.weight.device, dtype=linear.weight.dtype)
        first, second = _svd_factors(linear.weight, new.latent_size)
        with torch.no_grad():
            new.module0.weight.copy_(first)
            new.module1.weight.copy_(second)
            if linear.bias is not None:
                new.module1.bias.copy_(linear.bias)
        return new

    def solution_for_rank(self, input: torch.Tensor, rank: int) -> LowRankSolution:
        inputs = input.detach().reshape(-1, self.in_size)
        with torch.no_grad():
            outputs = self(inputs)
        return factorize_matrix(inputs, outputs, self.module0.weight.T, self.module1.weight.T,
                                bias=self.module1.bias, rank=rank)

    def _weights_from(self, solution: LowRankSolution) -> tuple[torch.Tensor, torch.Tensor]:
        assert solution.Wa is not None and solution.Wb is not None
        return solution.Wa.T.contiguous(), solution.Wb.T.contiguous()

    def _set_latent_shapes(self, rank: int) -> None:
        self.module0.out_features = rank
        self.module1.in_features = rank

    # Composer names this static method of FactorizedLinear "..._channels"; both names work here.
    max_allowed_latent_channels = max_allowed_latent_features


class FactorizedConv2d(_Factorized):
    """A ``KxK`` convolution to ``latent_channels`` channels (no bias), then a ``1x1`` convolution.

    A latent size that saves no multiply-adds (see :meth:`max_allowed_latent_channels`) raises
    ``ValueError``; so do grouped convolutions (``NotImplementedError``, as in Composer).

    Examples:
        >>> layer = FactorizedConv2d(16, 16, 3, latent_channels=4, padding=1)
        >>> layer(torch.randn(1, 16, 8, 8)).shape, FactorizedConv2d.max_allowed_latent_channels(16, 16, 3)
        (torch.Size([1, 16, 8, 8]), 14)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        latent_channels: float = 0.25,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
    ) -> None:
        super().__init__()
        if groups != 1:
            raise NotImplementedError(f"FactorizedConv2d cannot factorise a grouped convolution (groups={groups}).")
        self.in_size, self.out_size = in_channels, out_channels
        self.kernel_size = _pair(kernel_size)
        self.latent_size = _latent_size(latent_channels, in_channels, out_channels)
        _check_latent("FactorizedConv2d", "latent_channels", latent_channels, self.latent_size,
                      self.max_allowed_latent_channels(in_channels, out_channels, kernel_size),
                      f"{in_channels} -> {out_channels} channels, {self.kernel_size[0]}x{self.kernel_size[1]}")
        self.convolution_kwargs = {"stride": stride, "padding": padding, "dilation": dilation,
                                   "padding_mode": padding_mode}
        self.module0 = nn.Conv2d(in_channels, self.latent_size, kernel_size, bias=False, **self.convolution_kwargs)
        self.module1 = nn.Conv2d(self.latent_size, out_channels, 1, bias=bias)

    in_channels = property(lambda self: self.in_size, doc="As ``nn.Conv2d.in_channels``.")
    out_channels = property(lambda self: self.out_size, doc="As ``nn.Conv2d.out_channels``.")
    latent_channels = property(lambda self: self.latent_size, doc="The channels between the two convolutions.")

    @staticmethod
    def max_allowed_latent_channels(in_channels: int, out_channels: int, kernel_size: int | tuple[int, int]) -> int:
        """The largest latent size whose two convolutions need fewer multiply-adds than the original."""
        kh, kw = _pair(kernel_size)
        return _max_rank_with_speedup(in_channels * kh * kw, out_channels)

    @classmethod
    def from_conv2d(cls, conv: nn.Conv2d, module_ix: int = -1, latent_channels: float = 0.25) -> FactorizedConv2d:
        """The best rank-``latent_channels`` approximation of ``conv`` (truncated SVD of its weight).

        ``module_ix`` is accepted for Composer's signature and unused.
        """
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, latent_channels, stride=conv.stride,
                  padding=conv.padding, dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None,
                  padding_mode=conv.padding_mode)
        new.to(device=conv.weight.device, dtype=conv.weight.dtype)
        first, second = _svd_factors(conv.weight.reshape(conv.out_channels, -1), new.latent_size)
        with torch.no_grad():
            new.module0.weight.copy_(first.reshape(new.module0.weight.shape))
            new.module1.weight.copy_(second.reshape(new.module1.weight.shape))
            if conv.bias is not None:
                new.module1.bias.copy_(conv.bias)
        return new

    def solution_for_rank(self, input: torch.Tensor, rank: int) -> LowRankSolution:
        return factorize_conv2d(input, self.module0.weight, self.module1.weight, rank=rank,
                                biasA=self.module0.bias, biasB=self.module1.bias, **self.convolution_kwargs)

    def _weights_from(self, solution: LowRankSolution) -> tuple[torch.Tensor, torch.Tensor]:
        assert solution.Wa is not None and solution.Wb is not None
        return solution.Wa.contiguous(), solution.Wb.contiguous()

    def _set_latent_shapes(self, rank: int) -> None:
        self.module0.out_channels = rank
        self.module1.in_channels = rank

    # Composer names this static method of FactorizedConv2d "..._features"; both names work here.
    max_allowed_latent_features = max_allowed_latent_channels


def _check(factorize_convs: bool, factorize_linears: bool, min_channels: int, latent_channels: float,
           min_features: int, latent_features: float) -> None:
    for name, value in (("factorize_convs", factorize_convs), ("factorize_linears", factorize_linears)):
        if not isinstance(value, bool):
            raise TypeError(f"Factorize({name}={value!r}): must be True or False.")
    for name, value in (("min_channels", min_channels), ("min_features", min_features)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"Factorize({name}={value!r}): must be an int >= 0 (0: no minimum width).")
    for name, value in (("latent_channels", latent_channels), ("latent_features", latent_features)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (value >= 1 and value != int(value)):
            raise ValueError(
                f"Factorize({name}={value!r}): give a fraction in (0, 1) of the layer's smaller side, or a whole "
                "number of latent units >= 1."
            )


def _conv1d_hint(model: nn.Module) -> str:
    """What to do when ``model`` computes with Hugging Face's ``Conv1D`` (GPT-2), which is no ``nn.Linear``."""
    if not any(type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers.") for m in model.modules()):
        return ""
    return (
        " The model's transformers Conv1D layers (GPT-2's) are linear layers with a transposed weight, not "
        "nn.Linear: convert them first with composer_bridge.hf.conv1d_to_linear(model)."
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
    # A parameter is tied when two *different* modules hold it (a head sharing the embedding's weight).
    # One module reachable under two names (self.conv1 and self.layers[0]) holds its parameters once:
    # it is not tied, and the surgery replaces it in both places.
    holders = Counter(id(p) for m in model.modules() for p in m.parameters(recurse=False))

    def tied(module: nn.Module) -> bool:
        return any(holders[id(p)] > 1 for p in module.parameters(recurse=False))

    def maybe_conv(conv: nn.Module, index: int) -> nn.Module | None:
        assert isinstance(conv, nn.Conv2d)
        wide = min(conv.in_channels, conv.out_channels) >= min_channels
        if wide and not tied(conv) and factorizing_could_speedup(conv, latent_channels):
            return FactorizedConv2d.from_conv2d(conv, latent_channels=latent_channels)
        return None

    def maybe_linear(linear: nn.Module, index: int) -> nn.Module | None:
        assert isinstance(linear, nn.Linear)
        wide = min(linear.in_features, linear.out_features) >= min_features
        if wide and not tied(linear) and factorizing_could_speedup(linear, latent_features):
            return FactorizedLinear.from_linear(linear, latent_features=latent_features)
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
        warn_no_effect(
            "Factorize", "Conv2d/Linear layer wide enough (min_channels/min_features) to gain from it",
            fix=f"Check the model (or Factorize's thresholds) if you expected it to change.{_conv1d_hint(model)}",
        )
    return len(done)


class Factorize(SurgeryAlgorithm):
    """Factorise wide convolutions and linear layers into low-rank pairs at ``Event.INIT``.

    Takes the arguments of :func:`apply_factorization`. The class keeps Composer's class defaults
    (``min_channels=256``, ``min_features=256``, ``latent_features=128``), which differ from the
    functional form's (512, 512, 0.25), as in Composer.

    Examples:
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

    def surgery_hparams(self, state: State, replaced: int) -> dict[str, int]:
        """Composer's keys: how many factorised convolutions / linear layers the model now has (for the kinds enabled)."""
        modules = list(state.model.modules())
        counts: dict[str, int] = {}
        if self.factorize_convs:
            counts["factorize/num_conv2d_replacements"] = sum(isinstance(m, FactorizedConv2d) for m in modules)
        if self.factorize_linears:
            counts["factorize/num_linear_replacements"] = sum(isinstance(m, FactorizedLinear) for m in modules)
        return counts
