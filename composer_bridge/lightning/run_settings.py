"""What a run needs of the callback that owns it: the callback's configuration, and no handle back to it.

:class:`~composer_bridge.AlgorithmEngineCallback` builds one :class:`RunSettings` for each run it
starts (:class:`~composer_bridge.lightning.run.BridgeRun`); the run reads these fields and nothing
else of the callback. What the callback must do in answer to the run (show its per-step hooks
while something listens, reopen an epoch a fit resumed at its end) it reads from the run.

Examples:
    >>> from composer_bridge.algorithms import LabelSmoothing
    >>> settings = RunSettings(algorithms=[LabelSmoothing(0.1)], seed=7)
    >>> settings.seed, settings.trace_mode, settings.checkpoint.add_missing_on_load
    (7, 'summary', False)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.callback import Callback as EngineCallback
from composer_bridge.core.passes import AlgorithmPass
from composer_bridge.lightning.package import CALLBACK_BASES
from composer_bridge.lightning.traces import TraceMode
from composer_bridge.training.checkpoint_state import BridgeCheckpoint

if TYPE_CHECKING:  # hints name lightning.pytorch's classes; pytorch_lightning's work the same (package.py)
    pass

__all__ = ["RunSettings", "check_engine_callbacks"]


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """The settings of one run, built by the callback when the run starts.

    Args:
        algorithms: the callback's algorithm list (the same list: algorithms a checkpoint
            re-creates are appended to it, so the callback's next run has them too).
        engine_callbacks: engine-side callbacks, run after the algorithms.
        algorithm_passes: the extra ordering passes, as ``(pass, index)`` pairs.
        seed: the algorithms' seed (``None``: Lightning's ``seed_everything`` seed, else torch's).
        measure_cost: time each algorithm's ``apply``.
        trace_mode: how often traces go to the Lightning loggers.
        trace_file: a file for the text trace, or ``None``.
        checkpoint: the callback's checkpoint rules and a restore waiting for setup (kept across its runs).
        state_key: the key of the callback's entry in a Lightning checkpoint's ``"callbacks"``.
    """

    algorithms: list[Algorithm]
    engine_callbacks: list[EngineCallback] = field(default_factory=list)
    algorithm_passes: list[tuple[AlgorithmPass, int]] = field(default_factory=list)
    seed: int | None = None
    measure_cost: bool = True
    trace_mode: TraceMode = "summary"
    trace_file: str | os.PathLike[str] | None = None
    checkpoint: BridgeCheckpoint = field(default_factory=BridgeCheckpoint)
    state_key: str = "AlgorithmEngineCallback"


def check_engine_callbacks(callbacks: object) -> list[EngineCallback]:
    """The ``callbacks=`` argument of the callback as a list of engine callbacks; Lightning callbacks refused."""
    if callbacks is None:
        return []
    items = [callbacks] if isinstance(callbacks, EngineCallback) else callbacks
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"callbacks must be a list of composer_bridge.Callback, got {type(callbacks).__name__}.")
    for i, callback in enumerate(items):
        if isinstance(callback, CALLBACK_BASES):
            raise TypeError(
                f"callbacks[{i}] = {callback!r} is a Lightning callback; pass it to lightning.Trainer(callbacks=[...]). "
                "AlgorithmEngineCallback(callbacks=...) takes engine-side composer_bridge.Callback objects."
            )
        if not isinstance(callback, EngineCallback):
            raise TypeError(
                f"callbacks[{i}] = {callback!r} ({type(callback).__name__}) is not a composer_bridge.Callback."
            )
    return list(items)
