"""The algorithm library: one module per algorithm, Composer's names and defaults.

Each module holds a functional form (also exported from :mod:`composer_bridge.functional`) and
an :class:`~composer_bridge.Algorithm` class. None of them imports Lightning.
"""

# Each algorithm module adds one import line below and its name to __all__ (keep both sorted).
from composer_bridge.algorithms.colout import ColOut
from composer_bridge.algorithms.cutmix import CutMix
from composer_bridge.algorithms.cutout import CutOut
from composer_bridge.algorithms.label_smoothing import LabelSmoothing
from composer_bridge.algorithms.mixup import MixUp
from composer_bridge.algorithms.progressive_resizing import ProgressiveResizing
from composer_bridge.algorithms.selective_backprop import SelectiveBackprop

__all__: list[str] = [
    "ColOut",
    "CutMix",
    "CutOut",
    "LabelSmoothing",
    "MixUp",
    "ProgressiveResizing",
    "SelectiveBackprop",
]
