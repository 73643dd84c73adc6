"""Weight Standardization (Qiao et al., 2019): convolutions use zero-mean, unit-variance filters.

Each ``nn.Conv1d/2d/3d`` weight is re-parametrised (``torch.nn.utils.parametrize``) so the
forward pass sees ``(W - mean) / sqrt(var + 1e-10)`` per output channel. The stored parameter is
moved to ``<conv>.parametrizations.weight.original``.

Examples:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
    >>> apply_weight_standardization(net, n_last_layers_ignore=1)
    1
    >>> w = net[0].weight
    >>> bool(w.mean(dim=(1, 2, 3)).abs().max() < 1e-6)
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.utils.parametrize as parametrize
from torch import nn

from composer_bridge.algorithms._surgery import SurgeryAlgorithm, warn_no_effect

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = ["WeightStandardization", "WeightStandardizer", "apply_weight_standardization", "standardize_weight"]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def standardize_weight(weight: torch.Tensor, eps: float = 1e-10) -> torch.Tensor:
    """Subtract each output channel's mean and divide by its (biased) standard deviation."""
    dims = tuple(range(1, weight.dim()))
    var, mean = torch.var_mean(weight, dim=dims, keepdim=True, unbiased=False)
    return (weight - mean) / torch.sqrt(var + eps)


class WeightStandardizer(nn.Module):
    """The parametrisation: maps the stored weight to its standardised version."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return standardize_weight(weight)


def _standardized(conv: nn.Module) -> bool:
    return parametrize.is_parametrized(conv, "weight") and any(
        isinstance(p, WeightStandardizer) for p in conv.parametrizations["weight"]
    )


def apply_weight_standardization(model: nn.Module, n_last_layers_ignore: int = 0) -> int:
    """Standardise the weights of ``model``'s convolutions in place, except the last ``n_last_layers_ignore``.

    "Last" is registration order (``model.modules()``), which is the execution order for
    sequential models; Composer uses a ``torch.fx`` trace when the model is traceable. The
    parameters themselves are kept (only re-homed), so optimizers need no change.

    Returns:
        The number of convolutions newly standardised (a warning is raised when it is zero).
    """
    if isinstance(n_last_layers_ignore, bool) or not isinstance(n_last_layers_ignore, int) or n_last_layers_ignore < 0:
        raise ValueError(
            f"WeightStandardization(n_last_layers_ignore={n_last_layers_ignore!r}): must be an int >= 0 (default 0)."
        )
    convs = [m for m in model.modules() if isinstance(m, _CONVS)]
    targets = convs[: max(len(convs) - n_last_layers_ignore, 0)]
    replaced = 0
    for conv in targets:
        if not _standardized(conv):
            parametrize.register_parametrization(conv, "weight", WeightStandardizer())
            replaced += 1
    if replaced == 0:
        warn_no_effect("WeightStandardization", "Conv1d/2d/3d layer outside the ignored last layers")
    return replaced


class WeightStandardization(SurgeryAlgorithm):
    """Standardise convolution weights at ``Event.INIT``.

    Composer's WeightStandardization is not marked required on load; here it is, because the
    parametrisation renames the weights in the state dict.

    Examples:
        >>> WeightStandardization(n_last_layers_ignore=1)
        WeightStandardization(n_last_layers_ignore=1)
    """

    replaced_hparam_key = "WeightStandardization/num_weights_standardized"  # Composer's log_hyperparameters key

    def __init__(self, n_last_layers_ignore: int = 0) -> None:
        if isinstance(n_last_layers_ignore, bool) or not isinstance(n_last_layers_ignore, int) or n_last_layers_ignore < 0:
            raise ValueError(
                f"WeightStandardization(n_last_layers_ignore={n_last_layers_ignore!r}): must be an int >= 0 (default 0)."
            )
        self.n_last_layers_ignore = n_last_layers_ignore

    def surgery(self, state: State) -> int:
        return apply_weight_standardization(state.model, self.n_last_layers_ignore)
