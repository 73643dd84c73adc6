"""One fit of the recipe search: a fresh module and data, the user's Trainer settings, timed training.

Every fit trains from scratch for ``steps`` optimizer steps (the module factory receives the run
length so its schedule can scale to it), without validation during training, and then validates
once; the quality is the validation metric ``monitor``. Training is timed by
:class:`TrainingClock` from ``on_train_start`` to ``on_train_end``.

Examples:
    >>> clock = TrainingClock("cpu")
    >>> clock.seconds("cpu"), clock.seconds("steps")
    (0.0, 0.0)
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

import torch

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.lightning.package import CALLBACK_BASES, LIGHTNING, package_of
from composer_bridge.search.curve_rule import CurveRecorder, CurveRule
from composer_bridge.search.fit_task import RAISED

__all__ = ["CLOCKS", "FitRecord", "TrainingClock", "build_module", "load_data", "run_fit"]

#: What each clock of the search measures.
CLOCKS = {
    "cpu": "training CPU time of the process (time.process_time), validation excluded",
    "wall": "training wall time (time.perf_counter, CUDA synchronised), validation excluded",
    "steps": "optimizer steps (a deterministic clock: equal per-step cost assumed; for reproducibility checks)",
}

#: Trainer arguments the search sets itself for every fit.
OWNED_TRAINER_KWARGS = ("max_steps", "max_epochs", "max_time", "callbacks", "logger", "enable_checkpointing")


@dataclass
class FitRecord:
    """One fit: its configuration (candidate labels; empty = baseline), seed, run length and what it measured."""

    config: list[str]
    seed: int
    steps: int
    quality: float
    seconds: float  #: on the search's clock
    cpu_s: float
    wall_s: float
    phase: str  #: ``"search"`` or ``"confirm"``
    _: KW_ONLY
    fit_wall_s: float = 0.0  #: the whole fit and validation, Lightning's set-up included
    error: str | None = None  #: why the fit failed (its process died twice); then quality is NaN
    processes: int = 1  #: the fit's Trainer world size (2 for DDP on two devices)
    #: the validations along a run validated as it trains (``[step, seconds, quality]``), else ``None``
    points: list[list[float]] | None = None
    stopped: str | None = None  #: why that run stopped before its end (``None``: it trained to the end)
    rule: str | None = None  #: the :class:`~composer_bridge.search.curve_rule.CurveRule` it ran under, as text

    @property
    def raised(self) -> bool:
        """Whether the candidates raised in this fit (their failure on this model: every run length would)."""
        return bool(self.error) and self.error.startswith(RAISED)  # type: ignore[union-attr]


class TrainingClock(*CALLBACK_BASES):  # type: ignore[misc]
    """Times training in three clocks: process CPU time, wall time (device synchronised) and optimizer steps.

    A callback of both Lightning packages, so either Trainer takes it.
    """

    def __init__(self, clock: str) -> None:
        self.clock = clock
        self._start: tuple[float, float] | None = None
        self.cpu_s = self.wall_s = 0.0
        self.steps = 0

    def _sync(self, trainer: Any) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._sync(trainer)
        self._start = (time.process_time(), time.perf_counter())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._start is not None:
            self._sync(trainer)
            self.cpu_s += time.process_time() - self._start[0]
            self.wall_s += time.perf_counter() - self._start[1]
            self._start = None
        self.steps = trainer.global_step

    def seconds(self, clock: str) -> float:
        return {"cpu": self.cpu_s, "wall": self.wall_s, "steps": float(self.steps)}[clock]


def build_module(make_module: Callable[..., Any], steps: int) -> Any:
    """``make_module(steps)`` when it takes an argument (the run length), else ``make_module()``."""
    try:
        params = [p for p in inspect.signature(make_module).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    except (TypeError, ValueError):
        params = []
    return make_module(steps) if params else make_module()


def load_data(make_data: Callable[..., Any], seed: int) -> tuple[Any, Any]:
    """``(train loader, validation loader)`` from ``make_data(seed)`` (a pair, or a LightningDataModule)."""
    data = make_data(seed)
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return data[0], data[1]
    if hasattr(data, "train_dataloader") and hasattr(data, "val_dataloader"):
        data.prepare_data()
        data.setup("fit")
        return data.train_dataloader(), data.val_dataloader()
    raise TypeError(f"make_data({seed}) returned {type(data).__name__}; expected (train_loader, val_loader) "
                    "or a LightningDataModule with train_dataloader() and val_dataloader().")


def trainer_for(module: Any, steps: int, trainer_kwargs: dict[str, Any], callbacks: Sequence[Any]) -> Any:
    """A Trainer of the module's Lightning package (``lightning`` or ``pytorch_lightning``) with the user's
    settings, ``steps`` optimizer steps long, quiet, with ``callbacks``."""
    kwargs = {"enable_progress_bar": False, "enable_model_summary": False, "num_sanity_val_steps": 0,
              **trainer_kwargs}
    trainer_class = (package_of(module) or LIGHTNING).Trainer
    return trainer_class(max_steps=steps, max_epochs=-1, logger=False, enable_checkpointing=False,
                     callbacks=list(callbacks), **kwargs)


def run_fit(make_module: Callable[..., Any], make_data: Callable[..., Any], algorithms: list[Any], steps: int,
            seed: int, monitor: str, clock: str, trainer_kwargs: dict[str, Any],
            curve: CurveRule | None = None) -> tuple[float, Any, Any]:
    """Train a fresh module for ``steps`` steps with ``algorithms`` on ``seed``; return ``(quality, clock, module)``.

    With ``curve``, the run is validated every ``curve.eval_every`` steps as it trains and stops by the rule
    (the clock is then a :class:`~composer_bridge.search.curve_rule.CurveRecorder` holding the points); the
    quality is the last validation's."""
    LIGHTNING.module.seed_everything(seed, verbose=False)  # the same function in both packages
    module = build_module(make_module, steps)
    train, val = load_data(make_data, seed)
    timer: Any = TrainingClock(clock) if curve is None else CurveRecorder(curve, monitor, clock)
    callbacks: list[Any] = [timer]
    if algorithms:
        callbacks.append(AlgorithmEngineCallback(algorithms, seed=seed))
    if curve is None:
        trainer = trainer_for(module, steps, trainer_kwargs, callbacks)
        trainer.fit(module, train)
        metrics = trainer.validate(module, dataloaders=val, verbose=False)[0]
        if monitor not in metrics:
            raise KeyError(f"monitor={monitor!r} was not logged by validation; it logged {sorted(metrics)}.")
        return float(metrics[monitor]), timer, module
    accumulate = int(trainer_kwargs.get("accumulate_grad_batches", 1))  # validations every eval_every optimizer steps
    kwargs = {**trainer_kwargs, "val_check_interval": curve.eval_every * accumulate, "check_val_every_n_epoch": None}
    trainer = trainer_for(module, steps, kwargs, callbacks)
    trainer.fit(module, train, val)
    if timer.stopped is None and (not timer.points or timer.points[-1][0] != trainer.global_step):
        trainer.validate(module, dataloaders=val, verbose=False)  # the run's last point, at its end
    timer.steps = trainer.global_step
    return timer.points[-1][2], timer, module
