"""ChannelsLast: store 4-d weights in NHWC order, which GPU convolution kernels run faster on.

Outputs are unchanged (only the memory layout moves); inputs are converted by the convolutions
themselves, so no data loader change is needed.

Examples:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 1))
    >>> apply_channels_last(net)
    2
    >>> net[0].weight.is_contiguous(memory_format=torch.channels_last)
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from composer_bridge.algorithms._surgery import SurgeryAlgorithm, warn_no_effect

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = ["ChannelsLast", "apply_channels_last"]


def _layouts(model: nn.Module) -> dict[str, list[tuple[int, ...]]]:
    """The strides of every module's own 4-d tensors, by module name."""
    layouts = {}
    for name, module in model.named_modules():
        strides = [t.stride() for t in (*module.parameters(recurse=False), *module.buffers(recurse=False))
                   if t.dim() == 4]
        if strides:
            layouts[name] = strides
    return layouts


def apply_channels_last(model: nn.Module) -> int:
    """Convert ``model``'s 4-d parameters and buffers to ``torch.channels_last`` in place.

    Returns:
        The number of modules whose tensors were converted (zero, with a warning, when the model
        has no 4-d tensor or is already channels-last).
    """
    before = _layouts(model)
    model.to(memory_format=torch.channels_last)
    converted = sum(1 for name, strides in _layouts(model).items() if before.get(name) != strides)
    if converted == 0:
        warn_no_effect("ChannelsLast", "4-d weights (convolutions) in channels-first layout")
    return converted


class ChannelsLast(SurgeryAlgorithm):
    """Switch the model's convolution weights to channels-last memory layout at ``Event.INIT``.

    Composer's ChannelsLast is not required on load (weights load into any layout); here every
    surgery algorithm is, so that a resumed run trains with the same layout. No hyper-parameters.

    Not with FSDP2: torch's ``fully_shard`` refuses non-contiguous (channels-last) parameters, so
    the bridge refuses ChannelsLast under Lightning's ``ModelParallelStrategy`` at setup
    (``non_contiguous_weights``).

    Examples:
        >>> ChannelsLast()
        ChannelsLast()
    """

    converts_memory_format = True
    #: the weights it leaves are not contiguous (FSDP2 cannot shard them)
    non_contiguous_weights = True

    def __init__(self) -> None:
        pass

    def surgery(self, state: State) -> int:
        return apply_channels_last(state.model)
