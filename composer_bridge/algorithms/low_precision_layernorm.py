"""LowPrecisionLayerNorm: run LayerNorm in the autocast dtype (bf16/fp16) instead of fp32.

Under ``torch.autocast``, PyTorch runs ``layer_norm`` in fp32; :class:`LPLayerNorm` casts its
input and affine parameters to the autocast dtype and normalises there, which saves memory
traffic (Composer's replacement for fused LayerNorm kernels). Outside autocast it is an ordinary
``nn.LayerNorm``. The surgery only applies with a mixed precision (``"bf16-mixed"``,
``"16-mixed"``): in fp32 it would change nothing.

Example:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    >>> apply_low_precision_layernorm(net, precision="bf16-mixed")
    1
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     net(torch.randn(2, 8)).dtype
    torch.bfloat16
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from composer_bridge.algorithms.surgery import (
    NoEffectWarning,
    Optimizers,
    SurgeryAlgorithm,
    replace_modules,
    warn_no_effect,
)
from composer_bridge.core.event import Event

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = ["LPLayerNorm", "LowPrecisionLayerNorm", "apply_low_precision_layernorm"]

#: Lightning's (and Composer's) names of the mixed precisions in which low-precision norms help.
MIXED_PRECISIONS = frozenset({"bf16-mixed", "16-mixed", "amp_bf16", "amp_fp16", "bf16", "16"})
_APPLY_AT = (Event.INIT, Event.BEFORE_LOAD, Event.AFTER_LOAD)


def autocast_dtype(tensor: torch.Tensor) -> torch.dtype | None:
    """The autocast dtype for ``tensor``'s device, or ``None`` when autocast is off there."""
    device = tensor.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return None


def _cast(tensor: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    return tensor if tensor is None or dtype is None else tensor.to(dtype)


class LPLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` that, under autocast, normalises in the autocast dtype rather than fp32."""

    @classmethod
    def from_layernorm(cls, layer: nn.LayerNorm) -> LPLayerNorm:
        """A low-precision twin of ``layer`` that shares its parameters (optimizers stay valid)."""
        new = cls(layer.normalized_shape, eps=layer.eps, elementwise_affine=False, device="meta")
        new.elementwise_affine = layer.elementwise_affine
        new.weight = layer.weight
        new.bias = layer.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = autocast_dtype(x)
        if dtype is None:
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(
                x.to(dtype), self.normalized_shape, _cast(self.weight, dtype), _cast(self.bias, dtype), self.eps
            )


def check_mixed(precision: str | None, algorithm: str, stacklevel: int = 3) -> bool:
    """Whether ``precision`` is a mixed precision; warn that ``algorithm`` has no effect otherwise."""
    if precision is not None and not isinstance(precision, str):
        raise TypeError(f"{algorithm}: precision must be a string such as 'bf16-mixed', got {precision!r}.")
    if precision in MIXED_PRECISIONS:
        return True
    warnings.warn(
        NoEffectWarning(
            f"{algorithm} only helps with a mixed precision ('bf16-mixed' or '16-mixed'), not precision={precision!r}; "
            "the model was left unchanged."
        ),
        stacklevel=stacklevel,
    )
    return False


def replace_norms_in_low_precision(
    model: nn.Module,
    precision: str | None,
    optimizers: Optimizers,
    algorithm: str,
    norm: type[nn.Module],
    low_precision: type[nn.Module],
    make_twin: Callable[[nn.Module], nn.Module],
) -> int:
    """The body of the ``apply_low_precision_*`` functions: swap every ``norm`` for ``make_twin(layer)``.

    Nothing changes unless ``precision`` is mixed; layers already of type ``low_precision`` are left
    alone. Both no-effect warnings point at the caller of the ``apply_low_precision_*`` function.
    Returns the number of layers replaced.
    """
    if not check_mixed(precision, algorithm, stacklevel=4):
        return 0
    done = replace_modules(
        model, {norm: lambda layer, index: make_twin(layer)}, optimizers=optimizers, skip=(low_precision,)
    )
    if not done:
        warn_no_effect(algorithm, f"nn.{norm.__name__}", stacklevel=4)
    return len(done)


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
    return replace_norms_in_low_precision(
        model, precision, optimizers, "LowPrecisionLayerNorm", nn.LayerNorm, LPLayerNorm, LPLayerNorm.from_layernorm
    )


def check_apply_at(apply_at: Event | str, algorithm: str) -> str:
    """``apply_at`` as the event's string value, if it is one of INIT, BEFORE_LOAD, AFTER_LOAD."""
    try:
        event = Event(apply_at)
    except ValueError as error:
        raise ValueError(f"{algorithm}(apply_at={apply_at!r}): {error}") from None
    if event not in _APPLY_AT:
        raise ValueError(
            f"{algorithm}(apply_at={apply_at!r}): must be one of 'init', 'before_load' or 'after_load' "
            "(the surgery has to happen before training)."
        )
    return event.value


class LowPrecisionNormSurgery(SurgeryAlgorithm):
    """What the low-precision norm algorithms share: ``apply_at`` and running last among surgeries."""

    runs_last = True

    def __init__(self, apply_at: Event | str = Event.INIT) -> None:
        self.apply_at = check_apply_at(apply_at, type(self).__name__)

    def match(self, event: Event, state: State) -> bool:
        return event == self.apply_at


class LowPrecisionLayerNorm(LowPrecisionNormSurgery):
    """Run LayerNorms in the autocast dtype; applied at ``apply_at`` (``Event.INIT`` by default).

    Args:
        apply_at: ``"init"``, ``"before_load"`` or ``"after_load"`` (an :class:`Event` works too;
            it is stored as its string value so that ``repr`` evaluates back).

    Example:
        >>> LowPrecisionLayerNorm()
        LowPrecisionLayerNorm(apply_at='init')
    """

    def surgery(self, state: State) -> int:
        return apply_low_precision_layernorm(state.model, state.precision, optimizers=state.optimizers)
