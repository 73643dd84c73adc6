"""Engine logger destinations that write to the Trainer's Lightning loggers.

Algorithms log through the engine :class:`~composer_bridge.core.logger.Logger`
(``logger.log_metrics({"BlurPool/num_replaced": 3})``); this destination forwards those calls to
every logger the Trainer has (CSV, TensorBoard, W&B, ...), on rank zero only.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from composer_bridge.core.logger import LoggerDestination

__all__ = ["LightningLoggers"]


def _to_number(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        return value.item()
    return value


class LightningLoggers(LoggerDestination):
    """Forward metrics and hyper-parameters to ``trainer.loggers`` (rank zero only).

    Example:
        >>> import lightning as L
        >>> destination = LightningLoggers(L.Trainer(logger=False, enable_progress_bar=False))
        >>> destination.log_metrics({"x": 1.0}, step=0)  # no logger: nothing to do
    """

    def __init__(self, trainer: L.Trainer) -> None:
        self.trainer = trainer

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if not self.trainer.is_global_zero or not self.trainer.loggers:
            return
        numbers = {k: _to_number(v) for k, v in metrics.items()}
        for logger in self.trainer.loggers:
            logger.log_metrics(numbers, step=step)

    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        if not self.trainer.is_global_zero:
            return
        for logger in self.trainer.loggers:
            logger.log_hyperparams(hyperparameters)
