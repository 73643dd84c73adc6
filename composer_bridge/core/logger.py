"""The engine :class:`Logger`: fans metrics, hyper-parameters and traces out to destinations.

A destination is any object with some of the methods of :class:`LoggerDestination`; the Lightning
bridge adds one that forwards to every Lightning logger. With no destination, logging is free.

Examples:
    >>> class Printer(LoggerDestination):
    ...     def log_metrics(self, metrics, step=None):
    ...         print(step, metrics)
    >>> logger = Logger([Printer()])
    >>> logger.log_metrics({"mixup/alpha": 0.2}, step=3)
    3 {'mixup/alpha': 0.2}
    >>> Logger().log_metrics({"ignored": 1.0})
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from composer_bridge.core.trace import Traces

__all__ = ["Logger", "LoggerDestination"]


class LoggerDestination:
    """Where logged data goes. Override what you store; the rest is ignored."""

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Numbers at a step."""

    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        """The run's configuration."""

    def log_traces(self, traces: Traces, step: int | None = None) -> None:
        """The traces of one :meth:`Engine.run_event`."""


class Logger:
    """Sends everything it is given to each of its destinations, in order."""

    def __init__(self, destinations: Sequence[Any] | None = None) -> None:
        self.destinations: list[Any] = list(destinations or [])
        self.step: int | None = None

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Log numbers; ``step`` defaults to :attr:`step`, which the loop keeps current."""
        for destination in self.destinations:
            destination.log_metrics(metrics, self.step if step is None else step)

    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        """Log the run's configuration."""
        for destination in self.destinations:
            destination.log_hyperparameters(hyperparameters)

    def log_traces(self, traces: Traces) -> None:
        """Log the traces of one event."""
        for destination in self.destinations:
            destination.log_traces(traces, self.step)
