"""Exponential moving average (EMA) of the weights, evaluated in place of the training weights.

Examples:
    >>> import torch
    >>> model, average = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    >>> with torch.no_grad():
    ...     _ = model.weight.fill_(1.0); _ = average.weight.fill_(0.0)
    >>> compute_ema(model, average, smoothing=0.75)
    >>> average.weight.tolist()
    [[0.25, 0.25]]
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from composer_bridge.algorithms._schedule import in_unit, parse_time_hparam
from composer_bridge.algorithms._sharding import full_tensor, is_dtensor, like, reshard
from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.checkpoint_layout import algorithm_states
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.state import State
from composer_bridge.core.time import Time, TimeUnit

__all__ = ["EMA", "compute_ema", "ema_weights_from_checkpoint"]

#: ``half_life="auto"``: this fraction of the run ...
AUTO_HALF_LIFE_FRACTION = 0.05
#: ... but never longer than Composer's default half-life.
AUTO_HALF_LIFE_CAP = Time(1000, TimeUnit.BATCH)
#: Warn when the half-life is longer than this fraction of the run.
WARN_HALF_LIFE_FRACTION = 0.2


def _averaged_entries(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors EMA averages: trainable parameters and every buffer, by state-dict name."""
    for name, param in model.named_parameters():
        if param.requires_grad:
            yield name, param
    yield from model.named_buffers()


def compute_ema(
    model: torch.nn.Module, ema_model: torch.nn.Module | Mapping[str, torch.Tensor], smoothing: float = 0.99
) -> None:
    """Move ``ema_model``'s weights towards ``model``'s: ``ema = smoothing * ema + (1 - smoothing) * w``.

    ``ema_model`` is a module of the same architecture or a mapping from parameter/buffer names
    to tensors (e.g. what :meth:`EMA.state_dict` holds); entries of ``model`` it lacks are
    skipped. Floating-point tensors are averaged; integer buffers (BatchNorm's
    ``num_batches_tracked``) are copied. The half-life in updates is ``-log(2) / log(smoothing)``.

    Args:
        model: the model with the latest weights.
        ema_model: the running average, updated in place.
        smoothing: how much of the old average to keep per update, in ``[0, 1]`` (1 leaves it unchanged).

    Examples:
        >>> import torch
        >>> model = torch.nn.Linear(1, 1, bias=False)
        >>> ema = {"weight": torch.zeros(1, 1)}
        >>> with torch.no_grad():
        ...     _ = model.weight.fill_(4.0)
        >>> compute_ema(model, ema, smoothing=0.5)
        >>> ema["weight"].item()
        2.0
    """
    if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"compute_ema(smoothing={smoothing!r}): must be a number in [0, 1], e.g. 0.99.")
    targets = dict(ema_model.state_dict(keep_vars=True)) if isinstance(ema_model, torch.nn.Module) else ema_model
    with torch.no_grad():
        for name, tensor in _averaged_entries(model):
            average = targets.get(name)
            if average is None:
                continue
            current = like(tensor.detach(), average)
            if average.is_floating_point():
                average.copy_(average * smoothing + current * (1.0 - smoothing))
            else:
                average.copy_(current)


class EMA(Algorithm):
    """Keep an exponential moving average of the weights and evaluate with it.

    After every ``update_interval`` (once the run passes ``ema_start``) the average moves towards
    the current weights: ``ema = s * ema + (1 - s) * w`` with ``s = 2 ** (-update_interval /
    half_life)``; the first update copies the weights. Validation, test and prediction run with
    the average swapped in (``EVAL_START``/``EVAL_END``, ``PREDICT_START``/``PREDICT_END``, also for
    a standalone ``trainer.validate``/``test``/``predict``); training always continues from the
    training weights.

    Default half-life: Composer's fixed ``'1000ba'`` is longer than many whole runs, and then the
    average is mostly early, poor weights. ``half_life='auto'`` (the default) uses 5% of the
    run (``max_duration`` converted with the number of optimizer steps per epoch), capped at
    ``1000ba``; a half-life longer than 20% of the run warns.

    Checkpoints: the model weights in a checkpoint are the *training* weights (resuming continues
    training exactly); the average is in this algorithm's state (``ema_weights``, tensors). Read
    it with :func:`ema_weights_from_checkpoint`, or copy it into a model with
    :meth:`get_ema_model`. A checkpoint written while the average is swapped in (a callback that
    saves during validation) records the training weights too, and resuming puts them back.

    Args:
        half_life: ``'auto'``, or a time string in ``'ba'``, ``'ep'`` or ``'dur'`` (fraction of
            the run). ``None`` when ``smoothing`` is given (giving ``smoothing`` with the default
            ``'auto'`` also works).
        smoothing: the per-update factor ``s`` in ``[0, 1]``, instead of a half-life (``1`` keeps the
            weights of the first update, as in Composer).
        ema_start: when averaging begins (``'ba'``, ``'ep'`` or ``'dur'``). Default ``'0.0dur'``.
        update_interval: how often to update (``'ba'`` or ``'ep'``); default one unit of
            ``half_life`` (``'1ba'`` for ``'auto'``, ``'dur'`` or ``smoothing``).

    Examples:
        >>> EMA()
        EMA(half_life='auto', smoothing=None, ema_start='0.0dur', update_interval=None)
        >>> round(EMA(half_life="10ba").smoothing_for(state=None), 4)  # 2 ** (-1 / 10)
        0.933
    """

    unique = True
    averages_weights = True

    def __init__(
        self,
        half_life: str | None = "auto",
        smoothing: float | None = None,
        ema_start: str = "0.0dur",
        update_interval: str | None = None,
    ) -> None:
        if smoothing is not None:
            if half_life not in (None, "auto"):
                raise ValueError(
                    f"EMA(half_life={half_life!r}, smoothing={smoothing!r}): give only one of them "
                    "(half_life=None with smoothing, or no smoothing)."
                )
            if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0.0 <= smoothing <= 1.0:
                raise ValueError(f"EMA(smoothing={smoothing!r}): must be a number in [0, 1], e.g. 0.999.")
        elif half_life is None:
            raise ValueError("EMA(half_life=None, smoothing=None): give a half-life (e.g. 'auto', '100ba') or a smoothing.")
        self.half_life = half_life
        self.smoothing = smoothing
        self.ema_start = ema_start
        self.update_interval = update_interval

        self._start = parse_time_hparam("EMA", "ema_start", ema_start, (TimeUnit.BATCH, TimeUnit.EPOCH, TimeUnit.DURATION))
        self._half_life: Time | None = None
        if smoothing is None and half_life != "auto":
            self._half_life = parse_time_hparam("EMA", "half_life", half_life, (TimeUnit.BATCH, TimeUnit.EPOCH, TimeUnit.DURATION))
            if self._half_life.value == 0:
                raise ValueError(f"EMA(half_life={half_life!r}): must be > 0; for no averaging, do not use EMA.")
        if update_interval is None:
            default_unit = self._half_life.unit if self._half_life is not None else TimeUnit.BATCH
            self._interval = Time(1, TimeUnit.BATCH if default_unit == TimeUnit.DURATION else default_unit)
        else:
            self._interval = parse_time_hparam("EMA", "update_interval", update_interval, (TimeUnit.BATCH, TimeUnit.EPOCH))
            if self._interval.value < 1:
                raise ValueError(f"EMA(update_interval={update_interval!r}): must be at least 1 {self._interval.unit.value}.")
        if self._half_life is not None and self._half_life.unit not in (self._interval.unit, TimeUnit.DURATION):
            raise ValueError(
                f"EMA(half_life={half_life!r}, update_interval={update_interval!r}): the units must match "
                f"(e.g. half_life='100{self._interval.unit.value}'), or give the half-life as a fraction of the run ('0.05dur')."
            )

        self._ema: dict[str, torch.Tensor] | None = None  # the average; the training weights while swapped in
        self._swapped_into: torch.nn.Module | None = None  # the model holding the average, during eval/predict
        self._smoothing: float | None = float(smoothing) if smoothing is not None else None
        self._pending_training: dict[str, torch.Tensor] | None = None
        self.num_updates = 0

    # --- schedule -----------------------------------------------------------------------------
    def smoothing_for(self, state: State | None) -> float:
        """The per-update smoothing this run uses (resolving ``'auto'``/``'dur'`` half-lives with ``state``)."""
        if self._smoothing is not None:
            return self._smoothing
        interval = float(self._interval.value)
        unit = self._interval.unit
        if self._half_life is not None and self._half_life.unit != TimeUnit.DURATION:
            return 2.0 ** (-interval / float(self._half_life.value))
        if state is None:
            raise ValueError(f"EMA(half_life={self.half_life!r}) needs the run's length to resolve its half-life.")
        if self._half_life is not None:  # a fraction of the run
            half_life = in_unit(self._half_life, unit, state)
            if half_life is None:
                raise ValueError(
                    f"EMA(half_life={self.half_life!r}): the run's length in '{unit.value}' is unknown (max_duration="
                    f"{state.max_duration}, steps per epoch={state.dataloader_len}); give the half-life in '{unit.value}'."
                )
        else:  # 'auto'
            fraction = in_unit(Time(AUTO_HALF_LIFE_FRACTION, TimeUnit.DURATION), unit, state)
            cap = in_unit(AUTO_HALF_LIFE_CAP, unit, state)
            if fraction is None:
                warnings.warn(
                    f"EMA(half_life='auto'): the run's length is unknown (max_duration={state.max_duration}, steps per "
                    f"epoch={state.dataloader_len}); using Composer's {AUTO_HALF_LIFE_CAP}. Give half_life explicitly.",
                    stacklevel=3,
                )
                half_life = cap if cap is not None else float(AUTO_HALF_LIFE_CAP.value)
            else:
                half_life = min(fraction, cap) if cap is not None else fraction
        return 2.0 ** (-interval / max(half_life, interval))

    def _warn_if_long(self, state: State, smoothing: float) -> None:
        total = in_unit(Time(1.0, TimeUnit.DURATION), self._interval.unit, state)  # the whole run
        if total is None or smoothing <= 0.0 or smoothing >= 1.0:  # log(1) = 0: an infinite half-life, asked for
            return
        half_life = float(self._interval.value) * math.log(0.5) / math.log(smoothing)
        if half_life > WARN_HALF_LIFE_FRACTION * total:
            unit = self._interval.unit.value
            warnings.warn(
                f"EMA's half-life is {half_life:.0f}{unit}, {100 * half_life / total:.0f}% of this {total:.0f}{unit} run: "
                "most of the average then comes from early, poorly trained weights and evaluates badly. Use "
                "half_life='auto' (5% of the run) or a shorter half-life, or start later with ema_start.",
                stacklevel=3,
            )

    @property
    def needs_run_length(self) -> bool:
        """Whether a half-life or start is a fraction of the run ('auto' falls back to a fixed cap without one)."""
        fractional_half_life = self._half_life is not None and self._half_life.unit == TimeUnit.DURATION
        late_start = self._start.unit == TimeUnit.DURATION and float(self._start.value) > 0
        return fractional_half_life or late_start

    def _should_start(self, state: State) -> bool:
        if self._start.unit == TimeUnit.DURATION:
            if float(self._start.value) <= 0:  # from the start, whether or not the run's length is known
                return True
            elapsed = state.get_elapsed_duration()
            return elapsed is not None and float(elapsed.value) >= float(self._start.value)
        return float(state.timestamp.get(self._start.unit).value) >= float(self._start.value)

    # --- engine -------------------------------------------------------------------------------
    def match(self, event: Event, state: State) -> bool:
        if event == Event.BATCH_END:
            return self._interval.unit == TimeUnit.BATCH
        if event == Event.EPOCH_END:
            return self._interval.unit == TimeUnit.EPOCH
        return event in (
            Event.BATCH_START, Event.EVAL_START, Event.EVAL_END, Event.PREDICT_START, Event.PREDICT_END, Event.AFTER_LOAD,
            Event.FIT_START,
        )

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.AFTER_LOAD:
            self._restore_training_weights(state.model)
        elif event == Event.FIT_START:
            if self._ema is not None:  # restored from a checkpoint on the CPU: follow the model to its device
                self._ensure_device(state.model)
        elif event in (Event.EVAL_START, Event.PREDICT_START):
            self._swap_in(state.model)
        elif event in (Event.EVAL_END, Event.PREDICT_END, Event.BATCH_START):
            self._swap_out(state.model)
        else:
            self._maybe_update(state, logger)

    def _maybe_update(self, state: State, logger: Logger) -> None:
        self._swap_out(state.model)
        if self._ema is None and not self._should_start(state):
            return
        reshard(state.model)  # FSDP2: average the shards, never a gathered copy
        count = state.timestamp.get(self._interval.unit).value
        if self._ema is not None and int(count) % int(self._interval.value) != 0:
            return
        if self._ema is None:
            smoothing = self.smoothing_for(state)
            self._smoothing = smoothing
            self._warn_if_long(state, smoothing)
            self._ema = {name: t.detach().clone() for name, t in _averaged_entries(state.model)}
            logger.log_metrics({"EMA/smoothing": smoothing})
        else:
            self._ensure_device(state.model)
            compute_ema(state.model, self._ema, self._smoothing if self._smoothing is not None else 0.0)
        self.num_updates += 1

    # --- swapping -----------------------------------------------------------------------------
    def _ensure_device(self, model: torch.nn.Module) -> None:
        """Follow the model's device and dtype, and its sharding (a whole tensor from a checkpoint is sliced)."""
        assert self._ema is not None
        for name, tensor in _averaged_entries(model):
            stored = self._ema.get(name)
            if stored is not None and (
                stored.device != tensor.device or stored.dtype != tensor.dtype or is_dtensor(stored) != is_dtensor(tensor)
            ):
                self._ema[name] = like(stored, tensor)

    def _exchange(self, model: torch.nn.Module) -> None:
        assert self._ema is not None
        reshard(model)  # FSDP2 leaves the root's parameters gathered after an evaluation forward
        self._ensure_device(model)
        with torch.no_grad():
            for name, tensor in _averaged_entries(model):
                stored = self._ema.get(name)
                if stored is None:
                    continue
                held = tensor.detach().clone()
                tensor.copy_(stored)
                stored.copy_(held)

    def _swap_in(self, model: torch.nn.Module) -> None:
        if self._ema is not None and self._swapped_into is None:
            self._exchange(model)
            self._swapped_into = model

    def _swap_out(self, model: torch.nn.Module) -> None:
        if self._swapped_into is not None:
            self._exchange(model)
            self._swapped_into = None

    @property
    def _swapped(self) -> bool:
        return self._swapped_into is not None

    def _restore_training_weights(self, model: torch.nn.Module) -> None:
        pending, self._pending_training = self._pending_training, None
        if not pending:
            return
        reshard(model)
        with torch.no_grad():
            for name, tensor in _averaged_entries(model):
                if name in pending:
                    tensor.copy_(like(pending[name], tensor))

    # --- public helpers -----------------------------------------------------------------------
    @property
    def ema_weights(self) -> dict[str, torch.Tensor] | None:
        """The averaged tensors by state-dict name (``None`` before averaging starts); copies.

        Under FSDP2 they are ``DTensor`` shards like the parameters (``.full_tensor()`` gathers one).
        """
        if self._ema is None:
            return None
        if self._swapped:
            raise RuntimeError("EMA.ema_weights read while the average is swapped into the model; read the model instead.")
        return {name: t.detach().clone() for name, t in self._ema.items()}

    def get_ema_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Copy the average into ``model`` (in place) and return it; e.g. to export the EMA weights after fit."""
        if self._ema is None:
            raise RuntimeError("EMA has no average yet: it starts at the first update after ema_start.")
        if self._swapped:
            return model
        reshard(model)
        with torch.no_grad():
            for name, tensor in _averaged_entries(model):
                if name in self._ema:
                    tensor.copy_(like(self._ema[name], tensor))
        return model

    # --- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The average and counters; whole tensors also under FSDP2 (gathered: every rank must call it).

        Lightning writes callback state from rank zero alone, so a shard would lose the other ranks'
        part of the average; :meth:`load_state_dict` keeps the whole tensors and the next use slices
        them like the model's parameters.
        """
        state: dict[str, Any] = {
            "num_updates": self.num_updates,
            "smoothing": self._smoothing if self._ema is not None else None,
            "ema_weights": {},
            "model_holds_ema_weights": self._swapped,
        }
        if self._ema is None:
            return state
        if self._swapped:
            # The model (saved by the Trainer) holds the average; record the training weights too.
            model = self._swapped_into
            assert model is not None
            reshard(model)
            state["ema_weights"] = {
                name: full_tensor(t.detach()).clone() for name, t in _averaged_entries(model) if name in self._ema
            }
            state["training_weights"] = {name: full_tensor(t.detach()).clone() for name, t in self._ema.items()}
        else:
            state["ema_weights"] = {name: full_tensor(t.detach()).clone() for name, t in self._ema.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = {"num_updates", "smoothing", "ema_weights", "model_holds_ema_weights", "training_weights"}
        unknown = sorted(set(state) - expected)
        if unknown or "ema_weights" not in state:
            raise ValueError(f"EMA state has keys {sorted(state)}; expected {sorted(expected)}.")
        weights = state["ema_weights"]
        if not all(isinstance(t, torch.Tensor) for t in weights.values()):
            raise ValueError("EMA state's ema_weights must map names to tensors.")
        self.num_updates = int(state["num_updates"])
        self._ema = {name: t.clone() for name, t in weights.items()} if weights else None
        self._smoothing = float(state["smoothing"]) if state["smoothing"] is not None else self._smoothing
        self._swapped_into = None
        training = state.get("training_weights")
        self._pending_training = {name: t for name, t in training.items()} if training else None


def ema_weights_from_checkpoint(checkpoint: Mapping[str, Any] | str | Path) -> dict[str, torch.Tensor]:
    """The model ``state_dict`` with the EMA weights, from a Lightning checkpoint written with :class:`EMA`.

    Use it to deploy or evaluate the average without the bridge:
    ``model.load_state_dict(ema_weights_from_checkpoint("last.ckpt"))``.
    """
    if not isinstance(checkpoint, Mapping):
        checkpoint = torch.load(checkpoint, map_location="cpu", weights_only=True)
    weights = dict(checkpoint.get("state_dict", {}))
    for saved in algorithm_states(checkpoint, "EMA"):
        if saved.get("ema_weights"):
            weights.update(saved["ema_weights"])
            return weights
    raise ValueError(
        "This checkpoint holds no EMA weights: it was not written by an AlgorithmEngineCallback running EMA, or "
        "EMA had not started averaging yet (see EMA(ema_start=...))."
    )
