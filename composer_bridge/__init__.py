"""composer_bridge: MosaicML Composer's algorithm engine inside PyTorch Lightning.

Examples:
    >>> import composer_bridge
    >>> composer_bridge.Event.BATCH_END.value
    'batch_end'

The Lightning-facing names (``AlgorithmEngineCallback``, ``ComposerModule``,
``ComposerClassifier``) are imported on first use, so the engine core stays importable and fast
without touching Lightning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from composer_bridge._version import __version__ as __version__
from composer_bridge.core import (
    Algorithm,
    AlgorithmError,
    Callback,
    Engine,
    Event,
    Logger,
    LoggerDestination,
    State,
    Time,
    Timestamp,
    TimeUnit,
    Trace,
    Traces,
)

if TYPE_CHECKING:
    from composer_bridge.lightning import AlgorithmEngineCallback, ComposerClassifier, ComposerModule

__all__ = [
    "Algorithm",
    "AlgorithmEngineCallback",
    "AlgorithmError",
    "Callback",
    "ComposerClassifier",
    "ComposerModule",
    "Engine",
    "Event",
    "Logger",
    "LoggerDestination",
    "State",
    "Time",
    "TimeUnit",
    "Timestamp",
    "Trace",
    "Traces",
]

_LIGHTNING_NAMES = {"AlgorithmEngineCallback", "ComposerModule", "ComposerClassifier"}


def __getattr__(name: str) -> Any:
    if name in _LIGHTNING_NAMES:
        from composer_bridge import lightning

        return getattr(lightning, name)
    raise AttributeError(f"module 'composer_bridge' has no attribute {name!r}")
