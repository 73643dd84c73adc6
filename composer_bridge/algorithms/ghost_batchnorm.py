"""Ghost BatchNorm (Hoffer et al., 2017): batch statistics over small sub-batches, as a regulariser.

In training, each batch-norm layer normalises chunks of about ``ghost_batch_size`` samples
separately (with its momentum divided by the number of chunks, so the running statistics move
about as fast as before). In evaluation it is the original batch norm: same running statistics,
same output.

Examples:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4))
    >>> apply_ghost_batchnorm(net, ghost_batch_size=2)
    1
    >>> net.train()(torch.randn(8, 1, 5, 5)).shape
    torch.Size([8, 4, 3, 3])
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from composer_bridge.algorithms._surgery import Optimizers, SurgeryAlgorithm, replace_modules, warn_no_effect

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = ["GhostBatchNorm", "GhostBatchNormWrapper", "apply_ghost_batchnorm"]


class GhostBatchNormWrapper(nn.Module):
    """Run ``batchnorm`` on chunks of about ``ghost_batch_size`` samples in training; as is in evaluation.

    A batch no larger than ``ghost_batch_size`` is normalised in one piece (Composer raises an
    error instead; a short last batch is common and harmless here).
    """

    def __init__(self, batchnorm: _BatchNorm, ghost_batch_size: int = 32) -> None:
        super().__init__()
        self.batchnorm = batchnorm
        self.ghost_batch_size = ghost_batch_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = math.ceil(x.shape[0] / self.ghost_batch_size)
        if not self.training or chunks <= 1:
            return self.batchnorm(x)
        momentum = self.batchnorm.momentum
        if momentum is not None:
            self.batchnorm.momentum = momentum / chunks
        try:
            return torch.cat([self.batchnorm(chunk) for chunk in x.chunk(chunks, dim=0)], dim=0)
        finally:
            self.batchnorm.momentum = momentum


def _check(ghost_batch_size: int) -> None:
    if isinstance(ghost_batch_size, bool) or not isinstance(ghost_batch_size, int) or ghost_batch_size < 1:
        raise ValueError(
            f"GhostBatchNorm(ghost_batch_size={ghost_batch_size!r}): must be an int >= 1 (default 32), smaller than "
            "the per-device batch size to have an effect."
        )


def apply_ghost_batchnorm(model: nn.Module, ghost_batch_size: int = 32, optimizers: Optimizers = None) -> int:
    """Wrap every ``BatchNorm1d/2d/3d`` of ``model`` in a :class:`GhostBatchNormWrapper` (in place).

    The batch norms' parameters and buffers are kept (under ``<name>.batchnorm.``), so
    ``optimizers`` need no change; the argument is accepted for symmetry.

    Returns:
        The number of batch norms wrapped (a warning is raised when it is zero).
    """
    _check(ghost_batch_size)
    replaced = len(replace_modules(
        model, {_BatchNorm: lambda bn, index: GhostBatchNormWrapper(bn, ghost_batch_size)},
        optimizers=optimizers, skip=(GhostBatchNormWrapper,),
    ))
    if replaced == 0:
        warn_no_effect("GhostBatchNorm", "BatchNorm1d/2d/3d layer")
    return replaced


class GhostBatchNorm(SurgeryAlgorithm):
    """Normalise over sub-batches of ``ghost_batch_size`` samples in training, applied at ``Event.INIT``.

    Examples:
        >>> GhostBatchNorm(ghost_batch_size=16)
        GhostBatchNorm(ghost_batch_size=16)
    """

    replaced_hparam_key = "GhostBatchNorm/num_new_modules"  # Composer's log_hyperparameters key

    def __init__(self, ghost_batch_size: int = 32) -> None:
        _check(ghost_batch_size)
        self.ghost_batch_size = ghost_batch_size

    def surgery(self, state: State) -> int:
        return apply_ghost_batchnorm(state.model, self.ghost_batch_size, optimizers=state.optimizers)
