"""LowPrecisionGroupNorm: run GroupNorm in the autocast dtype (bf16/fp16) instead of fp32.

The GroupNorm counterpart of :mod:`~composer_bridge.algorithms.low_precision_layernorm`: under
``torch.autocast``, :class:`LPGroupNorm` normalises in the autocast dtype; outside autocast it is
an ordinary ``nn.GroupNorm``. Applies only with ``"bf16-mixed"`` or ``"16-mixed"`` precision.

Examples:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.GroupNorm(2, 4))
    >>> apply_low_precision_groupnorm(net, precision="bf16-mixed")
    1
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     net(torch.randn(2, 1, 5, 5)).dtype
    torch.bfloat16
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from composer_bridge.algorithms._low_precision import (
    LowPrecisionNormSurgery,
    autocast_dtype,
    cast_if,
    replace_norms_in_low_precision,
)
from composer_bridge.algorithms._surgery import Optimizers

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = ["LPGroupNorm", "LowPrecisionGroupNorm", "apply_low_precision_groupnorm"]


class LPGroupNorm(nn.GroupNorm):
    """``nn.GroupNorm`` that, under autocast, normalises in the autocast dtype rather than fp32."""

    @classmethod
    def from_groupnorm(cls, layer: nn.GroupNorm) -> LPGroupNorm:
        """A low-precision twin of ``layer`` that shares its parameters (optimizers stay valid)."""
        new = cls(layer.num_groups, layer.num_channels, eps=layer.eps, affine=False, device="meta")
        new.affine = layer.affine
        new.weight = layer.weight
        new.bias = layer.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = autocast_dtype(x)
        if dtype is None:
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            return F.group_norm(x.to(dtype), self.num_groups, cast_if(self.weight, dtype), cast_if(self.bias, dtype), self.eps)


def apply_low_precision_groupnorm(
    model: nn.Module, precision: str | None = None, optimizers: Optimizers = None
) -> int:
    """Replace every ``nn.GroupNorm`` of ``model`` with :class:`LPGroupNorm` (in place).

    Args:
        model: the model to change.
        precision: the run's precision (Lightning's strings). Nothing is replaced unless it is
            ``"bf16-mixed"`` or ``"16-mixed"`` (a :class:`NoEffectWarning` says so).
        optimizers: accepted for symmetry; the parameters are shared, so optimizers stay valid.

    Returns:
        The number of layers replaced.
    """
    return replace_norms_in_low_precision(
        model, precision, optimizers, "LowPrecisionGroupNorm", nn.GroupNorm, LPGroupNorm, LPGroupNorm.from_groupnorm
    )


class LowPrecisionGroupNorm(LowPrecisionNormSurgery):
    """Run GroupNorms in the autocast dtype; applied at ``apply_at`` (``Event.INIT`` by default).

    Args:
        apply_at: ``"init"``, ``"before_load"`` or ``"after_load"`` (an :class:`Event` works too).

    Examples:
        >>> LowPrecisionGroupNorm(apply_at="after_load")
        LowPrecisionGroupNorm(apply_at='after_load')
    """

    def surgery(self, state: State) -> int:
        return apply_low_precision_groupnorm(state.model, state.precision, optimizers=state.optimizers)
