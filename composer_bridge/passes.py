"""Algorithm passes: reorder the algorithms that run at an event (see :mod:`composer_bridge.core.passes`)."""

from composer_bridge.core.passes import (
    DEFAULT_PASSES,
    AlgorithmPass,
    MultipleLossInterpolationWarning,
    set_filo_order,
    sort_low_precision_norms_last,
    sort_selective_backprop_first,
    sort_to_back,
    sort_to_front,
    warn_if_multiple_loss_interpolation,
)

__all__ = [
    "AlgorithmPass",
    "DEFAULT_PASSES",
    "MultipleLossInterpolationWarning",
    "set_filo_order",
    "sort_low_precision_norms_last",
    "sort_selective_backprop_first",
    "sort_to_back",
    "sort_to_front",
    "warn_if_multiple_loss_interpolation",
]
