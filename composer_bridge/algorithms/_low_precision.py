"""What LowPrecisionLayerNorm and LowPrecisionGroupNorm share: the low-precision forward, the twin
that shares the original's parameters, the mixed precisions they apply in, the surgery body and the
``apply_at`` handling.

Examples:
    >>> import torch
    >>> autocast_dtype(torch.zeros(1)) is None
    True
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     autocast_dtype(torch.zeros(1))
    torch.bfloat16
    >>> check_apply_at("after_load", "LowPrecisionLayerNorm")
    'after_load'
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from composer_bridge.algorithms._surgery import (
    NoEffectWarning,
    Optimizers,
    SurgeryAlgorithm,
    replace_modules,
    warn_no_effect,
)
from composer_bridge.core.event import Event

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = [
    "MIXED_PRECISIONS",
    "LowPrecisionNorm",
    "LowPrecisionNormSurgery",
    "autocast_dtype",
    "cast_if",
    "check_apply_at",
    "check_mixed",
    "replace_norms_in_low_precision",
    "sharing_parameters",
]

#: Lightning's (and Composer's) names of the mixed precisions in which low-precision norms help.
MIXED_PRECISIONS = frozenset({"bf16-mixed", "16-mixed", "amp_bf16", "amp_fp16", "bf16", "16"})
_APPLY_AT = (Event.INIT, Event.BEFORE_LOAD, Event.AFTER_LOAD)


def autocast_dtype(tensor: torch.Tensor) -> torch.dtype | None:
    """The autocast dtype for ``tensor``'s device, or ``None`` when autocast is off there."""
    device = tensor.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return None


def cast_if(tensor: torch.Tensor | None, dtype: torch.dtype | None) -> torch.Tensor | None:
    """``tensor`` in ``dtype``; ``None`` (no tensor, or no autocast dtype) leaves it as it is."""
    return tensor if tensor is None or dtype is None else tensor.to(dtype)


class LowPrecisionNorm(nn.Module):
    """The base of a norm layer (``class LPGroupNorm(LowPrecisionNorm, nn.GroupNorm)``) that, under autocast,
    normalises in the autocast dtype rather than fp32; outside autocast it is the norm it subclasses.

    A subclass says how it normalises in :meth:`normalise`, given the input and its affine parameters
    already in the autocast dtype.
    """

    weight: torch.Tensor | None
    bias: torch.Tensor | None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = autocast_dtype(x)
        if dtype is None:
            return super().forward(x)  # the norm's own forward (next in the subclass's MRO)
        with torch.autocast(x.device.type, enabled=False):
            return self.normalise(x.to(dtype), cast_if(self.weight, dtype), cast_if(self.bias, dtype))

    def normalise(self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
        """``x`` normalised with ``weight`` and ``bias`` (all in the autocast dtype), autocast off."""
        raise NotImplementedError(f"{type(self).__name__} must define normalise(x, weight, bias).")


N = TypeVar("N", bound=nn.Module)


def sharing_parameters(twin: N, layer: nn.Module) -> N:
    """``twin`` (built on the meta device) holding ``layer``'s weight and bias, so optimizers stay valid."""
    twin.weight = layer.weight
    twin.bias = layer.bias
    return twin


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
        warn_no_effect(algorithm, f"nn.{norm.__name__}", stacklevel=4, fix=_rms_norm_hint(model, algorithm))
    return len(done)


def _rms_norm_hint(model: nn.Module, algorithm: str) -> str:
    """The no-effect advice, naming RMS norm layers (Llama's ``LlamaRMSNorm``, ``nn.RMSNorm``) if the model has them."""
    advice = "Check the model if you expected it to change."
    rms = sorted({type(m).__name__ for m in model.modules() if "RMSNorm" in type(m).__name__})
    if not rms:
        return advice
    return f"{advice} Its {', '.join(rms)} layers are RMS norms, not the norm {algorithm} replaces; they are left alone."


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
