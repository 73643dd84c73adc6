"""The Lightning side of the bridge: the callback, Composer-style modules, loggers."""

import sys

from composer_bridge.lightning.callback import AlgorithmEngineCallback, BridgeConfigurationError
from composer_bridge.lightning.module import ComposerClassifier, ComposerModule, soft_cross_entropy
from composer_bridge.lightning.traces import TraceStore
from composer_bridge.training import algorithm_runs, checkpoint_state, cost_report, plan, step_clock
from composer_bridge.training.checkpoint_state import CheckpointStateError
from composer_bridge.training.cost_report import CostReport
from composer_bridge.training.plan import Plan

# The Lightning-free modules that lived in this package before 2026-11-24 stay importable by their old
# paths (composer_bridge.lightning.plan, ...): the same module objects, under both names.
for _module in (algorithm_runs, checkpoint_state, cost_report, plan, step_clock):
    sys.modules.setdefault(f"{__name__}.{_module.__name__.rpartition('.')[2]}", _module)
del _module

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
