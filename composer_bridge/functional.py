"""Functional forms of the algorithms: plain tensor/module functions, usable in any training loop.

Composer's names and argument order (``smooth_labels``, ``mixup_batch``, ``apply_blurpool``, ...).
"""

# Each algorithm module adds one import line below and its name to __all__ (keep both sorted).
from composer_bridge.algorithms.alibi import apply_alibi
from composer_bridge.algorithms.augmix import augmix_image
from composer_bridge.algorithms.batch_size_warmup import set_batch_size
from composer_bridge.algorithms.blurpool import apply_blurpool
from composer_bridge.algorithms.channels_last import apply_channels_last
from composer_bridge.algorithms.colout import colout_batch
from composer_bridge.algorithms.compile import compile_submodules
from composer_bridge.algorithms.cutmix import cutmix_batch
from composer_bridge.algorithms.cutout import cutout_batch
from composer_bridge.algorithms.ema import compute_ema
from composer_bridge.algorithms.factorize import apply_factorization, factorize_conv2d, factorize_matrix
from composer_bridge.algorithms.gated_linear_units import apply_gated_linear_units
from composer_bridge.algorithms.ghost_batchnorm import apply_ghost_batchnorm
from composer_bridge.algorithms.gradient_clipping import apply_gradient_clipping
from composer_bridge.algorithms.gyro_dropout import apply_gyro_dropout
from composer_bridge.algorithms.label_smoothing import smooth_labels
from composer_bridge.algorithms.layer_freezing import freeze_layers
from composer_bridge.algorithms.low_precision_groupnorm import apply_low_precision_groupnorm
from composer_bridge.algorithms.low_precision_layernorm import apply_low_precision_layernorm
from composer_bridge.algorithms.mixup import mixup_batch
from composer_bridge.algorithms.muon import apply_muon, muon_matrices, muon_parameters
from composer_bridge.algorithms.progressive_resizing import resize_batch
from composer_bridge.algorithms.qk_norm import apply_qk_norm
from composer_bridge.algorithms.randaugment import randaugment_image
from composer_bridge.algorithms.schedule_free import schedule_free_counterpart
from composer_bridge.algorithms.selective_backprop import select_using_loss, should_selective_backprop
from composer_bridge.algorithms.seq_length_warmup import set_batch_sequence_length
from composer_bridge.algorithms.squeeze_excite import apply_squeeze_excite
from composer_bridge.algorithms.stochastic_depth import apply_stochastic_depth
from composer_bridge.algorithms.warmup_stable_decay import wsd_multiplier
from composer_bridge.algorithms.weight_standardization import apply_weight_standardization
from composer_bridge.algorithms.z_loss import z_loss

__all__: list[str] = [
    "apply_alibi",
    "apply_blurpool",
    "apply_channels_last",
    "compile_submodules",
    "apply_factorization",
    "apply_gated_linear_units",
    "apply_ghost_batchnorm",
    "apply_gradient_clipping",
    "apply_gyro_dropout",
    "apply_low_precision_groupnorm",
    "apply_low_precision_layernorm",
    "apply_muon",
    "apply_qk_norm",
    "apply_squeeze_excite",
    "apply_stochastic_depth",
    "apply_weight_standardization",
    "augmix_image",
    "colout_batch",
    "compute_ema",
    "cutmix_batch",
    "cutout_batch",
    "factorize_conv2d",
    "factorize_matrix",
    "freeze_layers",
    "mixup_batch",
    "muon_matrices",
    "muon_parameters",
    "randaugment_image",
    "resize_batch",
    "schedule_free_counterpart",
    "select_using_loss",
    "set_batch_sequence_length",
    "set_batch_size",
    "should_selective_backprop",
    "smooth_labels",
    "wsd_multiplier",
    "z_loss",
]
