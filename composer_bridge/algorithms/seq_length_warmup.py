"""Sequence length warmup: train on short sequences first, growing them linearly to full length.

Examples:
    >>> import torch
    >>> batch = {"input_ids": torch.arange(12).view(2, 6), "labels": torch.arange(12).view(2, 6)}
    >>> set_batch_sequence_length(batch, 4)["input_ids"].tolist()
    [[0, 1, 2, 3], [6, 7, 8, 9]]
    >>> set_batch_sequence_length(batch, 3, truncate=False)["input_ids"].shape
    torch.Size([4, 3])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from composer_bridge.algorithms._schedule import schedule_point, warmup_steps
from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.event import Event
from composer_bridge.core.time import TimeUnit

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["SeqLengthWarmup", "set_batch_sequence_length"]


def _sequence_tensors(batch: Any) -> list[tuple[Any, torch.Tensor]]:
    items = batch.items() if isinstance(batch, Mapping) else enumerate(batch)
    return [(k, v) for k, v in items if isinstance(v, torch.Tensor) and v.ndim >= 2]


def _last_tokens_kept(batch: Any, curr_seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: where the last real token is (from ``attention_mask``), and where it goes after the cut."""
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2:
        raise ValueError(
            "set_batch_sequence_length(preserve_end_of_sequence=True) needs a dict batch with a (batch, sequence) "
            "'attention_mask' to find each row's last token; pass preserve_end_of_sequence=False for batches "
            "without one."
        )
    rows = torch.arange(mask.shape[0], device=mask.device)
    last = (mask.sum(dim=1).long() - 1).clamp(min=0)  # an empty row keeps its first position
    return rows, last, last.clamp(max=curr_seq_len - 1)


def set_batch_sequence_length(
    batch: Any, curr_seq_len: int, truncate: bool = True, preserve_end_of_sequence: bool = False
) -> Any:
    """Cut every ``(batch, sequence, ...)`` tensor of ``batch`` to ``curr_seq_len`` tokens.

    With ``truncate=True`` the tail of each sequence is dropped. With ``truncate=False`` the
    tokens are kept and re-cut into more, shorter sequences (``(B, T) -> (B * T // L, L)``; the
    last ``B * T % L`` tokens are dropped). ``batch`` is a dict (e.g. ``input_ids``, ``labels``,
    ``attention_mask``) or a tuple/list of tensors; tensors with fewer than two dimensions are
    left as they are. A new batch of the same kind is returned.

    Args:
        batch: the batch; every tensor with two or more dimensions is a token sequence.
        curr_seq_len: the sequence length to train on, ``>= 1``.
        truncate: drop the tail (``True``) or re-cut all tokens into shorter rows (``False``).
        preserve_end_of_sequence: when truncating, move each row's last real token (the last
            position of ``attention_mask``; e.g. an end-of-sequence token) into the last kept
            position if the cut removed it, in every sequence tensor: ``[10, 11, 12, 13, 14, 15]``
            cut to 3 gives ``[10, 11, 15]``. Needs a dict batch with ``attention_mask``. Ignored
            when ``truncate=False``, as in Composer.

    Examples:
        >>> import torch
        >>> batch = {"input_ids": torch.tensor([[10, 11, 12, 13, 14, 15], [20, 21, 22, 0, 0, 0]]),
        ...          "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]])}
        >>> set_batch_sequence_length(batch, 3, preserve_end_of_sequence=True)["input_ids"].tolist()
        [[10, 11, 15], [20, 21, 22]]
    """
    if isinstance(curr_seq_len, bool) or not isinstance(curr_seq_len, int) or curr_seq_len < 1:
        raise ValueError(f"set_batch_sequence_length(curr_seq_len={curr_seq_len!r}): needs an int >= 1.")
    if not isinstance(preserve_end_of_sequence, bool):
        raise TypeError(
            f"set_batch_sequence_length(preserve_end_of_sequence={preserve_end_of_sequence!r}): must be True or False."
        )
    tensors = _sequence_tensors(batch)
    if not tensors:
        raise ValueError(
            "set_batch_sequence_length found no (batch, sequence) tensor in the batch; SeqLengthWarmup needs "
            "token batches such as {'input_ids': (B, T), 'labels': (B, T)} or (inputs, targets)."
        )
    changed = {}
    move_last = truncate and preserve_end_of_sequence and any(t.shape[1] > curr_seq_len for _, t in tensors)
    if move_last:
        rows, last, target = _last_tokens_kept(batch, curr_seq_len)
    for key, tensor in tensors:
        if tensor.shape[1] <= curr_seq_len:
            continue
        if truncate:
            changed[key] = tensor[:, :curr_seq_len]
            if move_last:
                changed[key] = changed[key].clone()
                changed[key][rows, target] = tensor[rows, last]
        else:
            flat = tensor.reshape(tensor.shape[0] * tensor.shape[1], *tensor.shape[2:])
            keep = (flat.shape[0] // curr_seq_len) * curr_seq_len
            changed[key] = flat[:keep].reshape(-1, curr_seq_len, *tensor.shape[2:])
    if isinstance(batch, Mapping):
        return type(batch)({**batch, **changed}) if changed else batch
    items = [changed.get(i, v) for i, v in enumerate(batch)]
    return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)


class SeqLengthWarmup(Algorithm):
    """Grow the training sequence length from ``min_seq_length`` to ``max_seq_length`` over ``duration``.

    At ``AFTER_DATALOADER`` the batch's sequences are cut to the current length, which grows in
    steps of ``step_size`` tokens, linearly over the first ``duration`` of training (Composer's
    defaults: 30 % of the run, from 8 to 1024 tokens). Works with any module (no loss events).

    Args:
        duration: the part of the run spent warming up: a fraction or a Time string (``"0.3dur"``, ``"500ba"``).
        min_seq_length: the first sequence length, ``>= 1``.
        max_seq_length: the final sequence length (longer batches are cut to it after the warmup).
        step_size: the length grows in multiples of this many tokens.
        truncate: drop sequence tails (``True``) or re-cut all tokens into shorter rows (``False``).
        preserve_end_of_sequence: when truncating, keep each row's last real token (e.g. an
            end-of-sequence token) as the last kept token; needs dict batches with
            ``attention_mask`` (see :func:`set_batch_sequence_length`).

    Examples:
        >>> SeqLengthWarmup(duration=0.5, min_seq_length=4, max_seq_length=64, step_size=4)
        SeqLengthWarmup(duration=0.5, min_seq_length=4, max_seq_length=64, step_size=4, truncate=True,
                        preserve_end_of_sequence=False)
    """

    needs = frozenset({"sequence"})
    unique = True
    augments_data = True

    def __init__(
        self,
        duration: float | str = 0.3,
        min_seq_length: int = 8,
        max_seq_length: int = 1024,
        step_size: int = 8,
        truncate: bool = True,
        preserve_end_of_sequence: bool = False,
    ) -> None:
        self._duration = schedule_point(duration, "duration", "SeqLengthWarmup")
        for name, value in (("min_seq_length", min_seq_length), ("max_seq_length", max_seq_length),
                            ("step_size", step_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SeqLengthWarmup({name}={value!r}): {name} must be an int >= 1.")
        if max_seq_length < min_seq_length:
            raise ValueError(
                f"SeqLengthWarmup(min_seq_length={min_seq_length}, max_seq_length={max_seq_length}): "
                "max_seq_length must be at least min_seq_length."
            )
        if not isinstance(truncate, bool):
            raise TypeError(f"SeqLengthWarmup(truncate={truncate!r}): truncate must be True or False.")
        if not isinstance(preserve_end_of_sequence, bool):
            raise TypeError(
                f"SeqLengthWarmup(preserve_end_of_sequence={preserve_end_of_sequence!r}): must be True or False."
            )
        self.duration = duration
        self.min_seq_length = min_seq_length
        self.max_seq_length = max_seq_length
        self.step_size = step_size
        self.truncate = truncate
        self.preserve_end_of_sequence = preserve_end_of_sequence

    def current_length(self, state: State) -> int:
        """The sequence length for the current step."""
        warmup_steps = self._warmup_steps(state)
        step = int(state.timestamp.batch.value)
        if warmup_steps <= 0 or step >= warmup_steps:
            return self.max_seq_length
        increments = (self.max_seq_length - self.min_seq_length) // self.step_size + 1
        every = max(1, warmup_steps // increments)
        return max(self.min_seq_length, min(self.max_seq_length, self.min_seq_length + self.step_size * (step // every)))

    @property
    def needs_run_length(self) -> bool:
        """Whether ``duration`` is a fraction of the run (the bridge then needs the run's length at setup)."""
        return self._duration.unit == TimeUnit.DURATION

    def _warmup_steps(self, state: State) -> int:
        return warmup_steps(self._duration, state, "SeqLengthWarmup")

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        length = self.current_length(state)
        state.batch = set_batch_sequence_length(state.batch, length, self.truncate, self.preserve_end_of_sequence)
        logger.log_metrics({"SeqLengthWarmup/current_seq_length": length})
