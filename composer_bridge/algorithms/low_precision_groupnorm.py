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

from composer_bridge.algorithms import _low_precision
from composer_bridge.algorithms._surgery import Optimizers

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = ["LPGroupNorm", "LowPrecisionGroupNorm", "apply_low_precision_groupnorm"]


class LPGroupNorm(_low_precision.LowPrecisionNorm, nn.GroupNorm):
    """``nn.GroupNorm`` that, under autocast, normalises in the autocast dtype rather than fp32."""

    @classmethod
    def from_groupnorm(cls, layer: nn.GroupNorm) -> LPGroupNorm:
        """A low-precision twin of ``layer`` that shares its parameters (optimizers stay valid)."""
        new = cls(layer.num_groups, layer.num_channels, eps=layer.eps, affine=False, device="meta")
        new.affine = layer.affine
        return _low_precision.sharing_parameters(new, layer)

    def normalise(self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
        return F.group_norm(x, self.num_groups, weight, bias, self.eps)


def apply_low_precision_groupnorm(
    model: nn.Module, precision: str | None = None, optimizers: Optimizers = None
) -> int:
    """Replace every ``nn.GroupNorm`` of ``model`` with :class:`LPGroupNorm` (in place); the number replaced.

    The arguments are those of
    :func:`~composer_bridge.algorithms.low_precision_layernorm.apply_low_precision_layernorm`: nothing is
    replaced unless ``precision`` is ``"bf16-mixed"`` or ``"16-mixed"``, and optimizers stay valid.
    """
    return _low_precision.replace_norms_in_low_precision(
        model, precision, optimizers, "LowPrecisionGroupNorm", nn.GroupNorm, LPGroupNorm, LPGroupNorm.from_groupnorm
    )


class LowPrecisionGroupNorm(_low_precision.LowPrecisionNormSurgery):
    """Run GroupNorms in the autocast dtype, at ``apply_at`` as :class:`~composer_bridge.algorithms.LowPrecisionLayerNorm` does.

    Examples:
        >>> LowPrecisionGroupNorm(apply_at="after_load")
        LowPrecisionGroupNorm(apply_at='after_load')
    """

    def surgery(self, state: State) -> int:
        return apply_low_precision_groupnorm(state.model, state.precision, optimizers=state.optimizers)
