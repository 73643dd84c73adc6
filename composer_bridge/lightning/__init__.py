"""The Lightning side of the bridge: the callback, Composer-style modules, loggers."""

from composer_bridge.lightning.callback import AlgorithmEngineCallback, BridgeConfigurationError
from composer_bridge.lightning.module import ComposerClassifier, ComposerModule, soft_cross_entropy
from composer_bridge.lightning.traces import TraceStore
from composer_bridge.training.checkpoint_state import CheckpointStateError
from composer_bridge.training.cost_report import CostReport
from composer_bridge.training.plan import Plan

__all__ = [
    "AlgorithmEngineCallback",
    "BridgeConfigurationError",
    "CheckpointStateError",
    "ComposerClassifier",
    "ComposerModule",
    "CostReport",
    "Plan",
    "TraceStore",
    "soft_cross_entropy",
]
