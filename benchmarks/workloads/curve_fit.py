"""One fit of the workloads benchmark: a fresh module trained with a configuration, validated as it trains.

A fit trains ``total_steps`` optimizer steps (the module's schedule is that long) and validates every
``eval_every`` steps and at the end. Training time is counted in process CPU seconds and in wall
seconds with the validations left out, so the time to a target measures training, not measuring.
A fit that raises (an algorithm refusing the module at set-up, say) is returned with its error.

Examples:
    >>> spec = FitSpec("vit", "baseline", (), seed=0, lr=1e-3, total_steps=8, eval_every=4)
    >>> spec.key
    'vit|[]|0|8|0.001'
"""

from __future__ import annotations

import json
import time
import traceback
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import lightning as L
import torch

__all__ = ["Clock", "FitSpec", "run_curve_fit"]


@dataclass(frozen=True)
class FitSpec:
    """What one fit trains: a workload, a configuration (candidates as ``(class name, kwargs)``), a seed, a length."""

    workload: str
    config: str
    candidates: tuple[tuple[str, dict[str, Any]], ...]
    seed: int
    lr: float
    total_steps: int
    eval_every: int
    phase: str = "heldout"

    @property
    def key(self) -> str:
        """A fit's identity in the results file: what changes the numbers it measures (not the config's name,
        so a search that picks a published recipe reuses that recipe's fits)."""
        return f"{self.workload}|{json.dumps(self.candidates, sort_keys=True)}|{self.seed}|{self.total_steps}|{self.lr:g}"


class Clock(L.Callback):
    """Records ``(step, cpu seconds, wall seconds, metric)`` at every validation; training time only."""

    def __init__(self, monitor: str) -> None:
        self.monitor = monitor
        self.points: list[dict[str, float]] = []
        self.cpu = self.wall = 0.0
        self._since: tuple[float, float] | None = None

    def _start(self) -> None:
        self._since = (time.process_time(), time.perf_counter())

    def _stop(self, trainer: Any) -> None:
        if self._since is not None:
            if trainer.strategy.root_device.type == "cuda":
                torch.cuda.synchronize(trainer.strategy.root_device)
            self.cpu += time.process_time() - self._since[0]
            self.wall += time.perf_counter() - self._since[1]
            self._since = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._start()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._stop(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is not None:
            self.points.append({"step": trainer.global_step, "cpu_s": round(self.cpu, 4), "wall_s": round(self.wall, 4),
                                "quality": float(value)})
        if trainer.training or trainer.state.fn == "fit":
            self._start()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop(trainer)


def run_curve_fit(spec: FitSpec, trainer_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train ``spec`` and return its record: the spec, the validation points, the total training time, or the error."""
    import workloads
    from composer_bridge import AlgorithmEngineCallback
    from composer_bridge.search import Candidate

    workload = workloads.load(spec.workload)
    record: dict[str, Any] = {"key": spec.key, **asdict(spec)}
    record["candidates"] = [[name, kwargs] for name, kwargs in spec.candidates]
    started = time.perf_counter()
    try:
        L.seed_everything(spec.seed, verbose=False)
        module = workload.make_module(spec.total_steps, spec.lr)
        train, val = workload.make_data(spec.seed)
        clock = Clock(workload.monitor)
        callbacks: list[Any] = [clock]
        algorithms = [Candidate(name, kwargs).build(spec.total_steps) for name, kwargs in spec.candidates]
        if algorithms:
            callbacks.append(AlgorithmEngineCallback(algorithms, seed=spec.seed))
        kwargs = {"accelerator": "cpu", "devices": 1, **(trainer_kwargs or {})}
        trainer = L.Trainer(max_steps=spec.total_steps, max_epochs=-1, val_check_interval=spec.eval_every,
                            check_val_every_n_epoch=None, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                            callbacks=callbacks, **kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module, train, val)
            if not clock.points or clock.points[-1]["step"] != trainer.global_step:
                trainer.validate(module, val, verbose=False)  # the last point, at the end of training
        record.update(points=clock.points, cpu_s=round(clock.cpu, 4), wall_s=round(clock.wall, 4),
                      steps_done=trainer.global_step, error=None)
    except Exception as error:  # noqa: BLE001 - a configuration that cannot train is a result, kept with its reason
        record.update(points=[], cpu_s=None, wall_s=None, steps_done=0,
                      error=f"{type(error).__name__}: {error}".strip()[:2000],
                      traceback=traceback.format_exc(limit=6)[-3000:])
    record["fit_wall_s"] = round(time.perf_counter() - started, 3)
    return record
