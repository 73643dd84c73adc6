"""Functional forms of the algorithms: plain tensor/module functions, usable in any training loop.

Composer's names and argument order (``smooth_labels``, ``mixup_batch``, ``apply_blurpool``, ...).
"""

# Each algorithm module adds one import line below and its name to __all__ (keep both sorted).
from composer_bridge.algorithms.colout import colout_batch
from composer_bridge.algorithms.cutmix import cutmix_batch
from composer_bridge.algorithms.cutout import cutout_batch
from composer_bridge.algorithms.label_smoothing import smooth_labels
from composer_bridge.algorithms.mixup import mixup_batch
from composer_bridge.algorithms.progressive_resizing import resize_batch
from composer_bridge.algorithms.selective_backprop import select_using_loss, should_selective_backprop

__all__: list[str] = [
    "colout_batch",
    "cutmix_batch",
    "cutout_batch",
    "mixup_batch",
    "resize_batch",
    "select_using_loss",
    "should_selective_backprop",
    "smooth_labels",
]
