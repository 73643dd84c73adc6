"""Squeeze-and-Excitation (Hu et al., 2018): re-weight a convolution's channels by a global gate.

After each wide enough ``nn.Conv2d`` the surgery inserts a :class:`SqueezeExcite2d` block: global
average pool, a bottleneck MLP (ReLU, then sigmoid), and a per-channel multiplication.

Examples:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1))
    >>> apply_squeeze_excite(net, latent_channels=0.5, min_channels=8)
    1
    >>> net[0].se.fc1.out_features
    4
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from composer_bridge.algorithms._surgery import Optimizers, SurgeryAlgorithm, replace_modules, warn_no_effect

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = ["SqueezeExcite", "SqueezeExcite2d", "SqueezeExciteConv2d", "apply_squeeze_excite"]


def _latent(latent_channels: float, channels: int) -> int:
    return max(1, int(latent_channels if latent_channels >= 1 else latent_channels * channels))


class SqueezeExcite2d(nn.Module):
    """Multiply each channel of an NCHW input by ``sigmoid(fc2(relu(fc1(mean over H, W))))``.

    Args:
        num_features: channels of the input.
        latent_channels: hidden width of the MLP; below 1 it is a fraction of ``num_features``
            (at least 1; Composer's would be 0 for tiny fractions).

    Examples:
        >>> import torch
        >>> block = SqueezeExcite2d(16, latent_channels=0.25)
        >>> block(torch.randn(2, 16, 4, 4)).shape, block.fc1.out_features
        (torch.Size([2, 16, 4, 4]), 4)
    """

    def __init__(self, num_features: int, latent_channels: float = 0.125) -> None:
        super().__init__()
        self.latent_channels = _latent(latent_channels, num_features)
        self.fc1 = nn.Linear(num_features, self.latent_channels, bias=False)
        self.fc2 = nn.Linear(self.latent_channels, num_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean(dim=(2, 3))))))
        return x * gate[:, :, None, None]


class SqueezeExciteConv2d(nn.Module):
    """A convolution followed by a :class:`SqueezeExcite2d` block.

    ``SqueezeExciteConv2d(conv, latent_channels)`` wraps an existing convolution (kept with its
    parameters); as in Composer, ``SqueezeExciteConv2d(conv=conv, latent_channels=...)`` does the
    same, and ``SqueezeExciteConv2d(in_channels, out_channels, kernel_size, ..., latent_channels=...)``
    builds a fresh ``nn.Conv2d`` from its arguments.

    Examples:
        >>> import torch
        >>> layer = SqueezeExciteConv2d(3, 16, 3, padding=1, latent_channels=4)
        >>> layer(torch.randn(2, 3, 8, 8)).shape, layer.se.latent_channels
        (torch.Size([2, 16, 8, 8]), 4)
    """

    def __init__(self, *args: Any, latent_channels: float = 0.125, conv: nn.Conv2d | None = None, **kwargs: Any) -> None:
        super().__init__()
        if conv is None and args and isinstance(args[0], nn.Conv2d):  # SqueezeExciteConv2d(conv[, latent_channels])
            conv, rest = args[0], args[1:]
            if len(rest) > 1 or kwargs:
                raise TypeError("SqueezeExciteConv2d(conv, latent_channels) takes no other arguments.")
            if rest:
                latent_channels = rest[0]
            args = ()
        if conv is None:
            conv = nn.Conv2d(*args, **kwargs)
        elif args or kwargs:
            raise TypeError("SqueezeExciteConv2d: give conv=... or the nn.Conv2d arguments, not both.")
        self.conv = conv
        self.se = SqueezeExcite2d(conv.out_channels, latent_channels)

    @staticmethod
    def from_conv2d(module: nn.Conv2d, module_index: int = -1, latent_channels: float = 0.125) -> SqueezeExciteConv2d:
        """``module`` followed by a new block (Composer's conversion; ``module_index`` is unused)."""
        return SqueezeExciteConv2d(conv=module, latent_channels=latent_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se(self.conv(x))


def _check(latent_channels: float, min_channels: int) -> None:
    if isinstance(latent_channels, bool) or not isinstance(latent_channels, (int, float)) or latent_channels <= 0:
        raise ValueError(
            f"SqueezeExcite(latent_channels={latent_channels!r}): must be > 0 (a width >= 1, or a fraction of "
            "the convolution's output channels below 1); Composer's default is 64."
        )
    if isinstance(min_channels, bool) or not isinstance(min_channels, int) or min_channels < 0:
        raise ValueError(f"SqueezeExcite(min_channels={min_channels!r}): must be an int >= 0 (default 128).")


def apply_squeeze_excite(
    model: nn.Module, latent_channels: float = 64, min_channels: int = 128, optimizers: Optimizers = None
) -> int:
    """Add a Squeeze-and-Excitation block after every ``nn.Conv2d`` with ``min(in, out) >= min_channels``.

    Args:
        model: the model to change in place.
        latent_channels: hidden width of each block's MLP; below 1, a fraction of the
            convolution's output channels.
        min_channels: skip narrower convolutions (SE costs least deep in the network).
        optimizers: optimizers already built over ``model``; the new blocks' weights are added to
            the param group of the convolution they follow.

    Returns:
        The number of convolutions given a block (a warning is raised when it is zero).
    """
    _check(latent_channels, min_channels)

    def maybe_add(conv: nn.Module, index: int) -> nn.Module | None:
        assert isinstance(conv, nn.Conv2d)
        if min(conv.in_channels, conv.out_channels) >= min_channels:
            return SqueezeExciteConv2d(conv, latent_channels)
        return None

    replaced = len(replace_modules(model, {nn.Conv2d: maybe_add}, optimizers=optimizers, skip=(SqueezeExciteConv2d,)))
    if replaced == 0:
        warn_no_effect("SqueezeExcite", f"Conv2d with at least {min_channels} input and output channels")
    return replaced


class SqueezeExcite(SurgeryAlgorithm):
    """Add Squeeze-and-Excitation blocks after wide convolutions at ``Event.INIT``.

    Takes the arguments of :func:`apply_squeeze_excite` (Composer's defaults: ``latent_channels=64``,
    ``min_channels=128``).

    Examples:
        >>> SqueezeExcite(latent_channels=0.25, min_channels=16)
        SqueezeExcite(latent_channels=0.25, min_channels=16)
    """

    replaced_hparam_key = "squeeze_excite/num_squeeze_excite_layers"  # Composer's log_hyperparameters key

    def __init__(self, latent_channels: float = 64, min_channels: int = 128) -> None:
        _check(latent_channels, min_channels)
        self.latent_channels = latent_channels
        self.min_channels = min_channels

    def surgery(self, state: State) -> int:
        return apply_squeeze_excite(state.model, self.latent_channels, self.min_channels, optimizers=state.optimizers)
