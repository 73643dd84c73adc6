"""The engine's markers in the Trainer's profiler: ``Trainer(profiler="simple")`` shows each algorithm.

Lightning times each callback hook in ``trainer.profiler`` (the row
``[Callback]AlgorithmEngineCallback.on_train_batch_end``), all the bridge's algorithms together.
:class:`TrainerProfilerMarkers` hands the :class:`~composer_bridge.Engine` a
:class:`~composer_bridge.core.profiler.Profiler` over ``trainer.profiler`` (its public
``start(action)``/``stop(action)``), so Composer's markers become rows and ranges of their own:

- ``SimpleProfiler`` and ``AdvancedProfiler``: a report row per ``algorithm/<Name>/event/<event>``,
  ``callback/<Name>/event/<event>`` and ``event/<span>``;
- ``PyTorchProfiler``: ``record_function`` ranges of those names (``[pl][profile]algorithm/...``)
  inside Lightning's range of the hook that fired the event, in its Chrome trace and TensorBoard,
  one trace per rank as Lightning writes them;
- ``PassThroughProfiler`` (the default): the engine gets no profiler at all (:func:`markers_for`
  returns ``None``), so a run without a profiler pays nothing.

Examples:
    >>> import lightning as L
    >>> markers_for(L.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False)) is None
    True
    >>> trainer = L.Trainer(profiler="simple", logger=False, enable_progress_bar=False, enable_checkpointing=False)
    >>> with markers_for(trainer).marker("algorithm/EMA/event/batch_end"):
    ...     pass
    >>> "algorithm/EMA/event/batch_end" in trainer.profiler.recorded_durations
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from composer_bridge.lightning.package import package_of

if TYPE_CHECKING:  # hints name lightning.pytorch's classes; pytorch_lightning's work the same (package.py)
    import lightning as L

__all__ = ["TrainerProfilerMarkers", "markers_for"]


class _ActionMarker:
    """One action of a Lightning profiler: ``start()`` is ``profiler.start(name)``, ``finish()`` its ``stop``."""

    __slots__ = ("name", "start_action", "stop_action")

    def __init__(self, profiler: Any, name: str) -> None:
        self.name = name
        self.start_action = profiler.start
        self.stop_action = profiler.stop

    def start(self) -> None:
        self.start_action(self.name)

    def finish(self) -> None:
        self.stop_action(self.name)

    def __enter__(self) -> _ActionMarker:
        self.start_action(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_action(self.name)


class TrainerProfilerMarkers:
    """A :class:`~composer_bridge.core.profiler.Profiler` whose markers are actions of a Lightning profiler.

    Args:
        profiler: ``trainer.profiler`` (any of Lightning's ``Profiler`` classes, of either package).
    """

    def __init__(self, profiler: Any) -> None:
        self.profiler = profiler

    def marker(self, name: str) -> _ActionMarker:
        return _ActionMarker(self.profiler, name)

    def __repr__(self) -> str:
        return f"TrainerProfilerMarkers({type(self.profiler).__name__})"


def markers_for(trainer: L.Trainer) -> TrainerProfilerMarkers | None:
    """The engine's profiler for ``trainer``: ``None`` under the default ``PassThroughProfiler`` (or none)."""
    profiler = getattr(trainer, "profiler", None)
    package = package_of(trainer)
    if profiler is None or package is None or isinstance(profiler, package.profilers.PassThroughProfiler):
        return None
    return TrainerProfilerMarkers(profiler)
