"""Batch size warmup: train on the first part of each batch early on, growing it linearly to the whole batch.

Examples:
    >>> import torch
    >>> batch = (torch.arange(8).view(4, 2), torch.tensor([0, 1, 2, 3]))
    >>> x, y = set_batch_size(batch, 2)
    >>> x.tolist(), y.tolist()
    ([[0, 1], [2, 3]], [0, 1])
    >>> set_batch_size({"input_ids": torch.zeros(4, 6), "lengths": torch.tensor(6)}, 3)["input_ids"].shape
    torch.Size([3, 6])
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

import torch

from composer_bridge.algorithms._schedule import schedule_point, warmup_steps
from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.event import Event
from composer_bridge.core.time import TimeUnit

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["BatchSizeWarmup", "batch_size_of", "set_batch_size"]

_EXPECTED = (
    "a tensor, a dict or a tuple/list (nested ones too) of tensors whose first dimension is the batch "
    "size, e.g. (inputs, targets) from a DataLoader"
)


def _first_dims(batch: Any, path: str = "batch") -> list[tuple[str, int]]:
    """``(where, first dimension)`` of every tensor with at least one dimension, in order, depth first."""
    if isinstance(batch, torch.Tensor):
        return [(path, int(batch.shape[0]))] if batch.ndim >= 1 else []
    if isinstance(batch, Mapping):
        items: Any = ((f"{path}[{key!r}]", value) for key, value in batch.items())
    elif isinstance(batch, (list, tuple)):
        items = ((f"{path}[{i}]", value) for i, value in enumerate(batch))
    else:
        return []
    return [found for where, item in items for found in _first_dims(item, where)]


def _describe(batch: Any) -> str:
    name = type(batch).__name__
    if isinstance(batch, Mapping):
        fields = ", ".join(f"{key!r}: {type(value).__name__}" for key, value in list(batch.items())[:8])
        return f"a {name} {{{fields}{', ...' if len(batch) > 8 else ''}}}"
    if isinstance(batch, (list, tuple)):
        items = ", ".join(type(value).__name__ for value in list(batch)[:8])
        return f"a {name} of ({items}{', ...' if len(batch) > 8 else ''})"
    if isinstance(batch, torch.Tensor):
        return "a 0-d tensor"
    return f"a {name}"


def batch_size_of(batch: Any) -> int:
    """The number of examples in ``batch``: the first dimension its tensors share.

    Every tensor with at least one dimension must hold one row per example (0-d tensors do not
    count). A batch whose tensors disagree is refused: which of them hold the examples cannot be
    told, and cutting the wrong ones would train on a broken batch (a graph batch, whose node
    and edge tensors hold several examples' rows, is such a batch).

    Raises:
        ValueError: the batch holds no tensor with at least one dimension, or its tensors' first
            dimensions disagree (it names the batch, each tensor's first dimension and the fix).

    Examples:
        >>> import torch
        >>> batch_size_of({"loss_weight": torch.tensor(0.5), "x": torch.zeros(6, 3), "y": torch.zeros(6)})
        6
    """
    dims = _first_dims(batch)
    if not dims:
        raise ValueError(
            "BatchSizeWarmup (set_batch_size) needs the batch's examples along the first dimension of its tensors; "
            f"got {_describe(batch)}, with no tensor of at least one dimension. Expected {_EXPECTED}. Fix: let the "
            "DataLoader collate the examples into tensors (its default collate_fn does), or leave BatchSizeWarmup "
            "out for this data."
        )
    sizes = {size for _, size in dims}
    if len(sizes) > 1:
        shown = ", ".join(f"{where}: {size}" for where, size in dims[:8]) + (", ..." if len(dims) > 8 else "")
        raise ValueError(
            "BatchSizeWarmup (set_batch_size) keeps the first examples of every tensor of the batch, so every tensor "
            f"must hold one row per example; this batch's tensors disagree on their first dimension ({shown}), so "
            "which hold the examples cannot be told (a graph batch, whose node and edge tensors hold several "
            "examples' rows, is such a batch). Fix: collate the batch so that every tensor has one row per example, "
            "or leave BatchSizeWarmup out for this data."
        )
    return sizes.pop()


def _cut(value: Any, full: int, n: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value[:n] if value.ndim >= 1 and value.shape[0] == full else value
    if isinstance(value, Mapping):
        cut = {key: _cut(item, full, n) for key, item in value.items()}
        # A copy keeps the mapping's kind (defaultdict, BatchEncoding) and whatever else it holds.
        if isinstance(value, MutableMapping):
            copied = copy.copy(value)
            copied.update(cut)
            return copied
        return type(value)(cut)  # type: ignore[call-arg]
    if isinstance(value, (list, tuple)):
        items = [_cut(item, full, n) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def set_batch_size(batch: Any, n: int) -> Any:
    """Keep the first ``n`` examples of ``batch``: each tensor whose first dimension is ``B`` becomes ``[:n]``.

    The batch size ``B`` is :func:`batch_size_of` (the first dimension the batch's tensors share; a batch
    whose tensors disagree is refused).
    ``batch`` is a tensor, a dict (any ``Mapping``), or a tuple or list (named tuples included),
    nested ones too; a new batch of the same kind is returned and ``batch`` is not changed.
    0-d tensors and everything that is not a tensor (strings, numbers, lists of file names) are kept
    as they are. With ``n >= B`` the batch itself
    is returned.

    Args:
        batch: the batch, its examples along the first dimension of its tensors.
        n: how many examples to keep, an int ``>= 1``.

    Raises:
        ValueError: ``n`` is not an int ``>= 1``, the batch holds no tensor with at least one dimension, or
            its tensors disagree on their first dimension.

    Examples:
        >>> import torch
        >>> from collections import namedtuple
        >>> Batch = namedtuple("Batch", "images labels")
        >>> cut = set_batch_size(Batch(torch.zeros(8, 3, 4, 4), torch.arange(8)), 2)
        >>> type(cut).__name__, cut.images.shape, cut.labels.tolist()
        ('Batch', torch.Size([2, 3, 4, 4]), [0, 1])
        >>> batch = torch.arange(5)
        >>> set_batch_size(batch, 5) is batch
        True
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_batch_size(n={n!r}): n must be an int >= 1 (the number of examples to keep).")
    full = batch_size_of(batch)
    if n >= full:
        return batch
    return _cut(batch, full, n)


class BatchSizeWarmup(Algorithm):
    """Train on the first part of each batch early on, growing it linearly to the whole batch over ``duration``.

    At ``AFTER_DATALOADER`` (training only) each batch keeps its first ``n`` examples,
    ``n = max(1, round_to_multiple(ceil(fraction * B)))``: ``B`` is the batch's size
    (:func:`batch_size_of`), and ``fraction`` rises linearly with the optimizer step from
    ``initial`` at the first step to 1 at the end of ``duration``; ``round_to_multiple`` rounds
    down to a multiple of ``multiple_of`` (at least ``multiple_of``, never above ``B``). After the
    warmup the batch is left as it is (the same object). The rest of each early batch is skipped,
    not accumulated.

    The schedule reads only ``state.timestamp`` (and the run's length), so a resumed run trims
    exactly as the uninterrupted one, and every DDP rank keeps the same number of its own
    examples. ``fraction * B`` is rounded to 6 decimal places before ``ceil``, so a float error
    cannot add an example (``0.07 * 100`` keeps 7, not 8). Works with any module (no loss events).

    Args:
        duration: the part of the run spent warming up: a fraction in ``(0, 1]`` or a Time string
            (``"0.1dur"``, ``"2ep"``, ``"500ba"``), greater than zero.
        initial: the fraction of each batch kept at the first step, in ``(0, 1]``.
        multiple_of: the kept size is rounded down to a multiple of this (e.g. 8 for GPU-friendly
            shapes), an int ``>= 1``.

    Examples:
        >>> BatchSizeWarmup(duration="100ba", initial=0.5, multiple_of=8)
        BatchSizeWarmup(duration='100ba', initial=0.5, multiple_of=8)
    """

    unique = True
    augments_data = True

    def __init__(self, duration: float | str = 0.1, initial: float = 0.25, multiple_of: int = 1) -> None:
        self._duration = schedule_point(duration, "duration", "BatchSizeWarmup")
        if not self._duration.value > 0:
            raise ValueError(
                f"BatchSizeWarmup(duration={duration!r}): the warmup must last longer than zero: give a fraction of "
                "the run in (0, 1] (e.g. 0.1) or a positive time ('2ep', '500ba'); without a warmup, leave "
                "BatchSizeWarmup out."
            )
        if isinstance(initial, bool) or not isinstance(initial, (int, float)) or not 0 < initial <= 1:
            raise ValueError(
                f"BatchSizeWarmup(initial={initial!r}): initial is the fraction of each batch kept at the first "
                "step and must be a number in (0, 1], e.g. 0.25."
            )
        if isinstance(multiple_of, bool) or not isinstance(multiple_of, int) or multiple_of < 1:
            raise ValueError(
                f"BatchSizeWarmup(multiple_of={multiple_of!r}): multiple_of must be an int >= 1 (1 keeps any size; "
                "8 keeps multiples of 8)."
            )
        self.duration = duration
        self.initial = initial
        self.multiple_of = multiple_of

    @property
    def needs_run_length(self) -> bool:
        """Whether ``duration`` is a fraction of the run (the bridge then needs the run's length at setup)."""
        return self._duration.unit == TimeUnit.DURATION

    def _warmup_steps(self, state: State) -> int:
        return warmup_steps(self._duration, state, "BatchSizeWarmup")

    def current_fraction(self, state: State) -> float:
        """The fraction of each batch kept at the current optimizer step (1.0 once the warmup is over)."""
        steps = self._warmup_steps(state)
        step = int(state.timestamp.batch.value)
        if step >= steps:
            return 1.0
        return self.initial + (1.0 - self.initial) * step / steps

    def kept_size(self, batch_size: int, fraction: float) -> int:
        """How many of ``batch_size`` examples to keep at ``fraction`` (see the class docstring)."""
        wanted = math.ceil(round(fraction * batch_size, 6))
        return max(1, min(batch_size, max(self.multiple_of, wanted // self.multiple_of * self.multiple_of)))

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        fraction = self.current_fraction(state)
        metrics: dict[str, float] = {"BatchSizeWarmup/fraction": fraction}
        if fraction < 1.0:
            kept = self.kept_size(batch_size_of(state.batch), fraction)
            state.batch = set_batch_size(state.batch, kept)
            metrics["BatchSizeWarmup/batch_size"] = kept
        logger.log_metrics(metrics)
