"""Stochastic Weight Averaging (Izmailov et al. 2018): train on with the average of late weights.

Examples:
    >>> from composer_bridge.algorithms import SWA
    >>> SWA(swa_start="0.7dur", swa_end="0.97dur", update_interval="1ep")
    SWA(swa_start='0.7dur', swa_end='0.97dur', update_interval='1ep', schedule_swa_lr=False, anneal_strategy='linear', anneal_steps=10, swa_lr=None)
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from composer_bridge.algorithms._schedule import parse_time_hparam
from composer_bridge.algorithms._sharding import full_tensor, is_dtensor, like, reshard
from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.state import State
from composer_bridge.core.time import Time, TimeUnit

__all__ = ["SWA"]

_ANNEAL = {"linear": "linear", "lin": "linear", "cos": "cos", "cosine": "cos"}


def anneal_factor(progress: float, strategy: str) -> float:
    """How far the learning rate has moved from its start to ``swa_lr`` (0 to 1) at ``progress`` in [0, 1].

    Examples:
        >>> anneal_factor(0.5, "linear"), round(anneal_factor(0.5, "cos"), 6), anneal_factor(1.0, "cos")
        (0.5, 0.5, 1.0)
    """
    progress = min(max(progress, 0.0), 1.0)
    return progress if strategy == "linear" else (1.0 - math.cos(math.pi * progress)) / 2.0


class SWA(Algorithm):
    """Average the weights from ``swa_start`` on, then continue training from the average at ``swa_end``.

    From ``swa_start`` on, every ``update_interval`` (at ``BATCH_END`` for ``'ba'``, ``EPOCH_END``
    for ``'ep'``; any number of optimizer steps per epoch) the parameters join an equal-weight running
    average. When training passes ``swa_end`` the model's parameters are replaced by the average
    and training goes on; keep at least an epoch after ``swa_end`` so BatchNorm statistics adapt to
    the averaged weights (``swa_end='1dur'`` warns).

    With ``schedule_swa_lr=True``, SWA owns the learning rate while it averages: before every step
    each parameter group's rate is set to ``lr0 + (swa_lr - lr0) * a(k / anneal_steps)``, where
    ``lr0`` is the group's rate when SWA started, ``k`` the number of averages so far and ``a`` the
    linear or cosine ramp (PyTorch's ``SWALR``); ``swa_lr=None`` holds ``lr0``. Any scheduler of
    your own keeps stepping but its changes are overwritten until ``swa_end``.

    The average, its counters and the learning-rate state are in :meth:`state_dict`, so a resumed
    run continues exactly.

    Args:
        swa_start: when averaging starts (``'dur'``, ``'ep'`` or ``'ba'``). Default ``'0.7dur'``.
        swa_end: when the model is replaced by the average (same unit). Default ``'0.97dur'``.
        update_interval: how often to average (``'ba'`` or ``'ep'``). Default ``'1ep'``.
        schedule_swa_lr: set the learning rate during averaging (see above). Default ``False``.
        anneal_strategy: ``'linear'`` or ``'cos'``. Default ``'linear'``.
        anneal_steps: number of averages over which the rate anneals. Default ``10``.
        swa_lr: the rate to anneal to (all groups); ``None`` keeps each group's rate at SWA start.
    """

    unique = True
    averages_weights = True

    def __init__(
        self,
        swa_start: str = "0.7dur",
        swa_end: str = "0.97dur",
        update_interval: str = "1ep",
        schedule_swa_lr: bool = False,
        anneal_strategy: str = "linear",
        anneal_steps: int = 10,
        swa_lr: float | None = None,
    ) -> None:
        units = (TimeUnit.DURATION, TimeUnit.EPOCH, TimeUnit.BATCH)
        self._start = parse_time_hparam("SWA", "swa_start", swa_start, units)
        self._end = parse_time_hparam("SWA", "swa_end", swa_end, units)
        self._interval = parse_time_hparam("SWA", "update_interval", update_interval, (TimeUnit.BATCH, TimeUnit.EPOCH))
        if self._start.unit != self._end.unit:
            raise ValueError(
                f"SWA(swa_start={swa_start!r}, swa_end={swa_end!r}): give both in the same unit, e.g. '0.7dur' and '0.97dur'."
            )
        if not self._start < self._end:
            raise ValueError(f"SWA(swa_start={swa_start!r}, swa_end={swa_end!r}): swa_end must come after swa_start.")
        if self._interval.value < 1:
            raise ValueError(f"SWA(update_interval={update_interval!r}): must be at least 1 {self._interval.unit.value}.")
        if not isinstance(schedule_swa_lr, bool):
            raise TypeError(f"SWA(schedule_swa_lr={schedule_swa_lr!r}): must be True or False.")
        if not isinstance(anneal_strategy, str) or anneal_strategy.lower() not in _ANNEAL:
            raise ValueError(f"SWA(anneal_strategy={anneal_strategy!r}): must be 'linear' or 'cos'.")
        if isinstance(anneal_steps, bool) or not isinstance(anneal_steps, int) or anneal_steps <= 0:
            raise ValueError(f"SWA(anneal_steps={anneal_steps!r}): must be a positive int, e.g. 10.")
        if swa_lr is not None and (isinstance(swa_lr, bool) or not isinstance(swa_lr, (int, float)) or not swa_lr >= 0):
            raise ValueError(f"SWA(swa_lr={swa_lr!r}): must be a learning rate >= 0, or None to keep the rate at SWA start.")
        if self._end.unit == TimeUnit.DURATION and self._end.value == 1:
            warnings.warn(
                "SWA(swa_end='1dur') replaces the weights by the average only when training ends, so BatchNorm "
                "statistics are never re-estimated for them; end earlier (e.g. '0.97dur') to leave time for that.",
                stacklevel=2,
            )
        self.swa_start = swa_start
        self.swa_end = swa_end
        self.update_interval = update_interval
        self.schedule_swa_lr = schedule_swa_lr
        self.anneal_strategy = anneal_strategy
        self.anneal_steps = anneal_steps
        self.swa_lr = swa_lr

        self._average: dict[str, torch.Tensor] | None = None
        self.num_averaged = 0
        self.step_counter = 0
        self.swa_started = False
        self.swa_completed = False
        self._lr_start: list[list[float]] | None = None
        self._lr_steps = 0

    @property
    def needs_run_length(self) -> bool:
        """Whether the window is given as fractions of the run (the bridge then needs its length)."""
        return self._start.unit == TimeUnit.DURATION

    # --- schedule -----------------------------------------------------------------------------
    def _now(self, state: State) -> Time:
        if self._start.unit == TimeUnit.DURATION:
            elapsed = state.get_elapsed_duration()
            if elapsed is None:
                raise ValueError(
                    f"SWA(swa_start={self.swa_start!r}) is a fraction of the run, but the run has no max_duration; "
                    "give swa_start and swa_end in 'ep' or 'ba'."
                )
            return elapsed
        return state.timestamp.get(self._start.unit)

    @property
    def _update_event(self) -> Event:
        return Event.BATCH_END if self._interval.unit == TimeUnit.BATCH else Event.EPOCH_END

    def match(self, event: Event, state: State) -> bool:
        if self.swa_completed:
            return False
        if event == Event.BATCH_START:
            return self.schedule_swa_lr and self.swa_started
        return event == self._update_event and self._now(state) >= self._start

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.BATCH_START:
            self._set_learning_rates(state)
            return
        if not self.swa_started:
            self.swa_started = True
            if self.schedule_swa_lr:
                self._lr_start = [[float(g["lr"]) for g in opt.param_groups] for opt in state.optimizers]
                self._lr_steps = 0
        if self.step_counter % int(self._interval.value) == 0:
            self._update_average(state.model)
            if self.schedule_swa_lr:
                self._lr_steps += 1
            logger.log_metrics({"SWA/num_averaged": self.num_averaged})
        self.step_counter += 1
        if self._now(state) >= self._end:
            self.swa_completed = True
            elapsed = state.get_elapsed_duration()
            if elapsed is not None and float(elapsed.value) >= 1.0:
                warnings.warn(
                    "SWA replaced the weights by their average at the very end of training: BatchNorm statistics "
                    "were not re-estimated for them. End SWA earlier (swa_end) or re-estimate them "
                    "(torch.optim.swa_utils.update_bn).",
                    stacklevel=2,
                )
            self.get_swa_model(state.model)

    def _update_average(self, model: torch.nn.Module) -> None:
        reshard(model)  # FSDP2: average the shards, never a gathered copy
        with torch.no_grad():
            if self._average is None:
                self._average = {name: p.detach().clone() for name, p in model.named_parameters()}
            else:
                n = self.num_averaged
                for name, param in model.named_parameters():
                    average = self._average.get(name)
                    if average is None:
                        continue
                    if average.device != param.device or is_dtensor(average) != is_dtensor(param):
                        average = self._average[name] = like(average, param)  # a checkpoint's whole tensor
                    average.copy_(average + (param.detach() - average) / (n + 1))
        self.num_averaged += 1

    def _set_learning_rates(self, state: State) -> None:
        if self._lr_start is None:
            return
        factor = anneal_factor(self._lr_steps / self.anneal_steps, _ANNEAL[self.anneal_strategy.lower()])
        for optimizer, starts in zip(state.optimizers, self._lr_start, strict=False):
            for group, lr0 in zip(optimizer.param_groups, starts, strict=False):
                target = lr0 if self.swa_lr is None else float(self.swa_lr)
                group["lr"] = lr0 + (target - lr0) * factor

    # --- public helpers -----------------------------------------------------------------------
    @property
    def swa_weights(self) -> dict[str, torch.Tensor] | None:
        """A copy of the averaged parameters by name (``None`` before the first average)."""
        return None if self._average is None else {k: v.detach().clone() for k, v in self._average.items()}

    def get_swa_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Copy the averaged parameters into ``model`` (in place) and return it."""
        if self._average is None:
            raise RuntimeError("SWA has no average yet: it starts at the first update after swa_start.")
        reshard(model)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name in self._average:
                    param.copy_(like(self._average[name], param))
        return model

    # --- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Counters, learning-rate state and the average; whole tensors under FSDP2 (gathered: all ranks call it)."""
        return {
            "average": {} if self._average is None else {
                k: full_tensor(v.detach()).clone() for k, v in self._average.items()
            },
            "num_averaged": self.num_averaged,
            "step_counter": self.step_counter,
            "swa_started": self.swa_started,
            "swa_completed": self.swa_completed,
            "lr_start": self._lr_start,
            "lr_steps": self._lr_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = {"average", "num_averaged", "step_counter", "swa_started", "swa_completed", "lr_start", "lr_steps"}
        if set(state) != expected:
            raise ValueError(f"SWA state has keys {sorted(state)}; expected {sorted(expected)}.")
        average = state["average"]
        self._average = {k: v.clone() for k, v in average.items()} if average else None
        self.num_averaged = int(state["num_averaged"])
        self.step_counter = int(state["step_counter"])
        self.swa_started = bool(state["swa_started"])
        self.swa_completed = bool(state["swa_completed"])
        self._lr_start = [list(map(float, g)) for g in state["lr_start"]] if state["lr_start"] is not None else None
        self._lr_steps = int(state["lr_steps"])
