"""LowPrecisionLayerNorm: run LayerNorm in the autocast dtype (bf16/fp16) instead of fp32.

Under ``torch.autocast``, PyTorch runs ``layer_norm`` in fp32; :class:`LPLayerNorm` casts its
input and affine parameters to the autocast dtype and normalises there, which saves memory
traffic (Composer's replacement for fused LayerNorm kernels). Outside autocast it is an ordinary
``nn.LayerNorm``. The surgery only applies with a mixed precision (``"bf16-mixed"``,
``"16-mixed"``): in fp32 it would change nothing.

Examples:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    >>> apply_low_precision_layernorm(net, precision="bf16-mixed")
    1
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     net(torch.randn(2, 8)).dtype
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

__all__ = ["LPLayerNorm", "LowPrecisionLayerNorm", "apply_low_precision_layernorm"]


class LPLayerNorm(_low_precision.LowPrecisionNorm, nn.LayerNorm):
    """``nn.LayerNorm`` that, under autocast, normalises in the autocast dtype rather than fp32."""

    @classmethod
    def from_layernorm(cls, layer: nn.LayerNorm) -> LPLayerNorm:
        """A low-precision twin of ``layer`` that shares its parameters (optimizers stay valid)."""
        new = cls(layer.normalized_shape, eps=layer.eps, elementwise_affine=False, device="meta")
        new.elementwise_affine = layer.elementwise_affine
        return _low_precision.sharing_parameters(new, layer)

    def normalise(self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


def apply_low_precision_layernorm(
    model: nn.Module, precision: str | None = None, optimizers: Optimizers = None
) -> int:
    """Replace every ``nn.LayerNorm`` of ``model`` with :class:`LPLayerNorm` (in place).

    Args:
        model: the model to change.
        precision: the run's precision (Lightning's strings). Nothing is replaced unless it is
            ``"bf16-mixed"`` or ``"16-mixed"`` (a :class:`NoEffectWarning` says so).
        optimizers: accepted for symmetry; the parameters are shared, so optimizers stay valid.

    Returns:
        The number of layers replaced.
    """
    return _low_precision.replace_norms_in_low_precision(
        model, precision, optimizers, "LowPrecisionLayerNorm", nn.LayerNorm, LPLayerNorm, LPLayerNorm.from_layernorm
    )


class LowPrecisionLayerNorm(_low_precision.LowPrecisionNormSurgery):
    """Run LayerNorms in the autocast dtype; applied at ``apply_at`` (``Event.INIT`` by default).

    Args:
        apply_at: ``"init"``, ``"before_load"`` or ``"after_load"`` (an :class:`Event` works too;
            it is stored as its string value so that ``repr`` evaluates back).

    Examples:
        >>> LowPrecisionLayerNorm()
        LowPrecisionLayerNorm(apply_at='init')
    """

    def surgery(self, state: State) -> int:
        return apply_low_precision_layernorm(state.model, state.precision, optimizers=state.optimizers)
