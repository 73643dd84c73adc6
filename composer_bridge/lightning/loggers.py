"""Engine logger destinations that write to the Trainer's Lightning loggers.

Algorithms log through the engine :class:`~composer_bridge.core.logger.Logger`
(``logger.log_metrics({"BlurPool/num_replaced": 3})``, and Composer's surgery counts with
``logger.log_hyperparameters({"GhostBatchNorm/num_new_modules": 5})``); this destination
forwards those calls to every logger the Trainer has (CSV, TensorBoard, W&B, ...:
``log_metrics`` and ``log_hyperparams``), on rank zero only, as Lightning does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from composer_bridge.core.logger import LoggerDestination

if TYPE_CHECKING:
    import lightning as L

__all__ = ["LightningLoggers"]


def _to_number(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        return value.item()
    return value


class LightningLoggers(LoggerDestination):
    """Forward metrics and hyper-parameters to ``trainer.loggers`` (rank zero only).

    Examples:
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
        """Forward to every logger's ``log_hyperparams`` (Composer's algorithms log surgery counts so)."""
        if not self.trainer.is_global_zero or not self.trainer.loggers:
            return
        values = {k: _to_number(v) for k, v in hyperparameters.items()}
        for logger in self.trainer.loggers:
            logger.log_hyperparams(values)
