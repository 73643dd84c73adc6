"""The algorithm library: one module per algorithm, Composer's names and defaults.

Each module holds a functional form (also exported from :mod:`composer_bridge.functional`) and
an :class:`~composer_bridge.Algorithm` class. None of them imports Lightning, and none imports
another algorithm module: what several share lives in private modules (``_surgery``,
``_schedule``, ``_draws``, ...). The surgery base class for your own algorithms,
:class:`SurgeryAlgorithm`, its :func:`replace_modules` and :class:`NoEffectWarning` are
re-exported here.
"""

# Each algorithm module adds one import line below and its name to __all__ (keep both sorted).
# __all__ lists Algorithm classes only (tests iterate it); dataset transforms and the surgery tools are
# re-exported with `as`.
from composer_bridge.algorithms._surgery import NoEffectWarning as NoEffectWarning
from composer_bridge.algorithms._surgery import SurgeryAlgorithm as SurgeryAlgorithm
from composer_bridge.algorithms._surgery import replace_modules as replace_modules
from composer_bridge.algorithms.alibi import Alibi
from composer_bridge.algorithms.augmix import AugmentAndMixTransform as AugmentAndMixTransform
from composer_bridge.algorithms.augmix import AugMix
from composer_bridge.algorithms.batch_size_warmup import BatchSizeWarmup
from composer_bridge.algorithms.blurpool import BlurPool
from composer_bridge.algorithms.channels_last import ChannelsLast
from composer_bridge.algorithms.colout import ColOut
from composer_bridge.algorithms.colout import ColOutTransform as ColOutTransform
from composer_bridge.algorithms.compile import Compile
from composer_bridge.algorithms.cutmix import CutMix
from composer_bridge.algorithms.cutout import CutOut
from composer_bridge.algorithms.ema import EMA
from composer_bridge.algorithms.factorize import Factorize
from composer_bridge.algorithms.gated_linear_units import GatedLinearUnits
from composer_bridge.algorithms.ghost_batchnorm import GhostBatchNorm
from composer_bridge.algorithms.gradient_clipping import GradientClipping
from composer_bridge.algorithms.gyro_dropout import GyroDropout
from composer_bridge.algorithms.label_smoothing import LabelSmoothing
from composer_bridge.algorithms.layer_freezing import LayerFreezing
from composer_bridge.algorithms.low_precision_groupnorm import LowPrecisionGroupNorm
from composer_bridge.algorithms.low_precision_layernorm import LowPrecisionLayerNorm
from composer_bridge.algorithms.mixup import MixUp
from composer_bridge.algorithms.muon import Muon
from composer_bridge.algorithms.progressive_resizing import ProgressiveResizing
from composer_bridge.algorithms.qk_norm import QKNorm
from composer_bridge.algorithms.randaugment import RandAugment
from composer_bridge.algorithms.randaugment import RandAugmentTransform as RandAugmentTransform
from composer_bridge.algorithms.sam import SAM
from composer_bridge.algorithms.schedule_free import ScheduleFree
from composer_bridge.algorithms.selective_backprop import SelectiveBackprop
from composer_bridge.algorithms.seq_length_warmup import SeqLengthWarmup
from composer_bridge.algorithms.squeeze_excite import SqueezeExcite
from composer_bridge.algorithms.squeeze_excite import SqueezeExcite2d as SqueezeExcite2d
from composer_bridge.algorithms.squeeze_excite import SqueezeExciteConv2d as SqueezeExciteConv2d
from composer_bridge.algorithms.stochastic_depth import StochasticDepth
from composer_bridge.algorithms.swa import SWA
from composer_bridge.algorithms.warmup_stable_decay import WarmupStableDecay
from composer_bridge.algorithms.weight_standardization import WeightStandardization
from composer_bridge.algorithms.z_loss import ZLoss

__all__: list[str] = [
    "Alibi",
    "AugMix",
    "BatchSizeWarmup",
    "BlurPool",
    "ChannelsLast",
    "Compile",
    "ColOut",
    "CutMix",
    "CutOut",
    "EMA",
    "Factorize",
    "GatedLinearUnits",
    "GhostBatchNorm",
    "GradientClipping",
    "GyroDropout",
    "LabelSmoothing",
    "LayerFreezing",
    "LowPrecisionGroupNorm",
    "LowPrecisionLayerNorm",
    "MixUp",
    "Muon",
    "ProgressiveResizing",
    "QKNorm",
    "RandAugment",
    "SAM",
    "SWA",
    "ScheduleFree",
    "SelectiveBackprop",
    "SeqLengthWarmup",
    "SqueezeExcite",
    "StochasticDepth",
    "WarmupStableDecay",
    "WeightStandardization",
    "ZLoss",
]
