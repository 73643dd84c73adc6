"""Gradient clipping by global norm, by value, or adaptively per unit (AGC, Brock et al. 2021).

Examples:
    >>> import torch
    >>> model = torch.nn.Linear(3, 2)
    >>> model(torch.randn(4, 3)).pow(2).sum().mul(100).backward()
    >>> apply_gradient_clipping(model, "norm", clipping_threshold=1.0)
    >>> total = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    >>> round(total.item(), 4) <= 1.0
    True
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.state import State

__all__ = ["GradientClipping", "apply_gradient_clipping"]

CLIPPING_TYPES = ("norm", "value", "adaptive")
#: Floor of the weight norm in adaptive clipping (the AGC paper's epsilon): zero-initialised units
#: (BatchNorm biases, for instance) could otherwise never receive a gradient.
AGC_WEIGHT_EPS = 1e-3
#: Floor of the gradient norm in adaptive clipping, so zero gradients divide safely.
AGC_GRAD_EPS = 1e-6


def _check_clipping(clipping_type: object, clipping_threshold: object, where: str) -> None:
    if clipping_type not in CLIPPING_TYPES:
        raise ValueError(
            f"{where}(clipping_type={clipping_type!r}): must be one of {list(CLIPPING_TYPES)}: 'norm' scales all "
            "gradients so their global L2 norm is at most the threshold, 'value' clamps each entry to "
            "[-threshold, threshold], 'adaptive' limits each unit's gradient norm to threshold x its weight norm."
        )
    if isinstance(clipping_threshold, bool) or not isinstance(clipping_threshold, (int, float)):
        raise TypeError(f"{where}(clipping_threshold={clipping_threshold!r}): must be a positive number, e.g. 1.0.")
    if not (math.isfinite(clipping_threshold) and clipping_threshold > 0):
        raise ValueError(
            f"{where}(clipping_threshold={clipping_threshold!r}): must be a finite number > 0 (typical values: "
            "'norm' 1.0, 'value' 0.5, 'adaptive' 0.01-0.16)."
        )


def _unitwise_norm(tensor: torch.Tensor) -> torch.Tensor:
    """L2 norm per output unit: over everything but dim 0 for matrices and kernels, whole tensor for vectors."""
    if tensor.ndim <= 1:
        return torch.linalg.vector_norm(tensor, ord=2)
    return torch.linalg.vector_norm(tensor, ord=2, dim=tuple(range(1, tensor.ndim)), keepdim=True)


def _adaptive_clip_(parameters: Iterable[torch.Tensor], clipping_threshold: float) -> None:
    for param in parameters:
        if param.grad is None:
            continue
        grad = param.grad.detach()
        weight_norm = _unitwise_norm(param.detach().float()).clamp_min(AGC_WEIGHT_EPS)
        grad_norm = _unitwise_norm(grad.float()).clamp_min(AGC_GRAD_EPS)
        scale = (weight_norm * clipping_threshold / grad_norm).clamp_max(1.0)
        grad.mul_(scale.to(grad.dtype))


def _fsdp_roots(model: torch.nn.Module) -> list[torch.nn.Module]:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - torch built without distributed
        return []
    return [m for m in model.modules() if isinstance(m, FullyShardedDataParallel) and m.check_is_root()]


def apply_gradient_clipping(
    model: torch.nn.Module | Iterable[torch.Tensor],
    clipping_type: str,
    clipping_threshold: float,
    fsdp_enabled: bool = False,
) -> None:
    """Clip the gradients of ``model`` (a module or an iterable of parameters) in place.

    - ``'norm'``: scale every gradient by ``min(1, threshold / total_norm)``, where ``total_norm`` is
      the L2 norm of all gradients together (``torch.nn.utils.clip_grad_norm_``);
    - ``'value'``: clamp every gradient entry to ``[-threshold, threshold]``;
    - ``'adaptive'``: unit-wise adaptive gradient clipping (AGC, Brock et al. 2021, "High-performance
      large-scale image recognition without normalization"): for each output unit ``i`` of each
      parameter (a row of a matrix, an output channel of a kernel; a whole bias vector), scale its
      gradient ``G_i`` by ``min(1, threshold * max(|W_i|, 1e-3) / |G_i|)``.

    Args:
        model: the module (or its parameters) whose ``.grad`` to clip.
        clipping_type: ``'norm'``, ``'value'`` or ``'adaptive'``.
        clipping_threshold: the maximum norm, the maximum absolute value, or the maximum ratio of
            gradient norm to weight norm.
        fsdp_enabled: the model holds FSDP (v1) modules; ``'norm'`` clips with their sharding-aware
            ``clip_grad_norm_`` (found automatically too). ``'adaptive'`` is not available there.
            FSDP2 (``fully_shard``, ``DTensor`` gradients) needs nothing: torch's clipping functions
            compute the global norm over all ranks' shards, and every unit of AGC lies within one shard.

    Examples:
        >>> import torch
        >>> layer = torch.nn.Linear(2, 1)
        >>> layer.weight.grad = torch.tensor([[3.0, -4.0]]); layer.bias.grad = torch.tensor([0.5])
        >>> apply_gradient_clipping([layer.weight, layer.bias], "value", 1.0)
        >>> layer.weight.grad.tolist(), layer.bias.grad.tolist()
        ([[1.0, -1.0]], [0.5])
    """
    _check_clipping(clipping_type, clipping_threshold, "apply_gradient_clipping")
    roots = _fsdp_roots(model) if isinstance(model, torch.nn.Module) else []
    if fsdp_enabled or roots:
        if clipping_type == "adaptive":
            raise ValueError(
                "apply_gradient_clipping(clipping_type='adaptive') is not available for FSDP-sharded models: each "
                "rank holds only a shard of every unit. Use 'norm' or 'value'."
            )
        if clipping_type == "norm":
            for root in roots:  # the global norm over every rank's shards
                root.clip_grad_norm_(max_norm=clipping_threshold)  # type: ignore[operator]
            if roots:
                return
        # 'value' clamps each entry: the same on a shard as on the whole tensor (Composer instead scales
        # by the infinity norm under FSDP1, which is not what 'value' does without FSDP)
    parameters = list(model.parameters() if isinstance(model, torch.nn.Module) else model)
    if clipping_type == "norm":
        torch.nn.utils.clip_grad_norm_(parameters, max_norm=clipping_threshold)
    elif clipping_type == "value":
        torch.nn.utils.clip_grad_value_(parameters, clip_value=clipping_threshold)
    else:
        _adaptive_clip_(parameters, clipping_threshold)


class GradientClipping(Algorithm):
    """Clip gradients after all micro-batches' backward passes, before every optimizer step.

    Runs on ``Event.AFTER_TRAIN_BATCH``, which the Lightning bridge fires at
    ``on_before_optimizer_step``: gradients are complete (all accumulated micro-batches) and already
    unscaled under fp16 AMP. Under SAM, which evaluates the loss twice per step, it clips both
    gradients, as Composer and Lightning's ``gradient_clip_val`` do.

    Args:
        clipping_type: ``'norm'``, ``'value'`` or ``'adaptive'`` (see :func:`apply_gradient_clipping`).
        clipping_threshold: the threshold for that type.

    Examples:
        >>> GradientClipping(clipping_type="norm", clipping_threshold=1.0)
        GradientClipping(clipping_type='norm', clipping_threshold=1.0)
    """

    unique = True
    clips_gradients = True

    def __init__(self, clipping_type: str, clipping_threshold: float) -> None:
        _check_clipping(clipping_type, clipping_threshold, "GradientClipping")
        self.clipping_type = clipping_type
        self.clipping_threshold = clipping_threshold

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_TRAIN_BATCH

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        stepping = state.stepping_optimizer
        if stepping is not None and len(state.optimizers) > 1:
            # Several optimizers stepped one at a time (manual optimization): clip what this one is
            # about to step, so each gets its own norm and none is clipped against another's gradients.
            parameters = [p for group in stepping.param_groups for p in group["params"]]
            apply_gradient_clipping(parameters, self.clipping_type, float(self.clipping_threshold))
            return
        apply_gradient_clipping(state.model, self.clipping_type, float(self.clipping_threshold))
