"""Hyper-parameters given as times, and where they fall in a run (shared by the scheduled algorithms).

:func:`parse_time_hparam` takes time strings in chosen units (EMA, SWA); :func:`schedule_point`
takes a fraction of the run or a time string in ``dur``/``ep``/``ba`` (ProgressiveResizing,
SelectiveBackprop, StochasticDepth, SeqLengthWarmup, BatchSizeWarmup); :func:`fraction_of_run` and
:func:`elapsed_fraction` place such points in a run, and :func:`warmup_steps` counts a warmup's
length in optimizer steps. :func:`in_unit` (and :func:`steps_of`, its form for optimizer steps) is
the one place where epochs and batches are converted, with the run's ``dataloader_len``
(optimizer steps per epoch).

Examples:
    >>> from composer_bridge.core.time import TimeUnit
    >>> parse_time_hparam("EMA", "ema_start", "0.1dur", (TimeUnit.BATCH, TimeUnit.DURATION))
    Time(0.1, TimeUnit.DURATION)
    >>> schedule_point(0.5, "delay", "ProgressiveResizing"), schedule_point("3ep", "end", "SelectiveBackprop")
    (Time(0.5, TimeUnit.DURATION), Time(3, TimeUnit.EPOCH))
    >>> from composer_bridge.core.state import State
    >>> import torch
    >>> state = State(torch.nn.Linear(1, 1), max_duration="4ep", dataloader_len=25)
    >>> steps_of(Time(2, TimeUnit.EPOCH), state), steps_of(Time(0.5, TimeUnit.DURATION), state)
    (50.0, 50.0)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composer_bridge.core.time import Time, TimeUnit

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = [
    "elapsed_fraction",
    "fraction_of_run",
    "in_unit",
    "parse_time_hparam",
    "schedule_point",
    "steps_of",
    "warmup_steps",
]


def parse_time_hparam(owner: str, name: str, value: object, units: tuple[TimeUnit, ...], example: str = "") -> Time:
    """``value`` as a :class:`Time` in one of ``units``, non-negative and (for ``dur``) at most 1.

    Raises ``ValueError`` naming ``owner(name=value)``, the units allowed and, if given, an example.
    """
    parsed: Time | None = None
    if isinstance(value, (str, Time)):
        try:
            parsed = Time.from_input(value, None)
        except ValueError as error:
            raise ValueError(f"{owner}({name}={value!r}): {error}") from None
    if parsed is None or parsed.unit not in units:
        allowed = ", ".join(f"'{u.value}'" for u in units)
        hint = f", e.g. {example}" if example else ""
        raise ValueError(f"{owner}({name}={value!r}): must be a time string in {allowed}{hint}.")
    if parsed.value < 0 or (parsed.unit == TimeUnit.DURATION and parsed.value > 1):
        raise ValueError(f"{owner}({name}={value!r}): must be >= 0, and fractions of the run must lie in [0, 1].")
    return parsed


def schedule_point(value: float | str | Time, name: str, where: str, at_most_one_run: bool = True) -> Time:
    """A point (or length) of a schedule as a :class:`Time`: a bare number is a fraction of the run (``dur``).

    Only ``dur``, ``ep`` and ``ba`` are accepted; ``dur`` values must lie in ``[0, 1]`` unless
    ``at_most_one_run`` is false. Other units are converted when the run's length is known
    (:func:`fraction_of_run`). Raises ``ValueError`` naming ``where(name=value)`` and the forms accepted.
    """
    try:
        point = Time.from_input(value, TimeUnit.DURATION)
    except (TypeError, ValueError) as error:
        fraction = "a fraction of the run in [0, 1]" if at_most_one_run else "a fraction of the run"
        raise ValueError(
            f"{where}({name}={value!r}): expected {fraction} (e.g. 0.5), or a time string "
            f"such as '0.5dur', '3ep' or '200ba' ({error})."
        ) from None
    if at_most_one_run and point.unit == TimeUnit.DURATION and not 0 <= point.value <= 1:
        raise ValueError(f"{where}({name}={value!r}): a fraction of the run must be in [0, 1].")
    if point.unit not in (TimeUnit.DURATION, TimeUnit.EPOCH, TimeUnit.BATCH):
        raise ValueError(
            f"{where}({name}={value!r}): give schedule points as fractions ('0.5dur'), epochs ('3ep') or "
            f"batches ('200ba'), not '{point.unit.value}'."
        )
    return point


def in_unit(time: Time, unit: TimeUnit, state: State) -> float | None:
    """``time`` (``ba``, ``ep`` or ``dur``) counted in ``unit`` (``ba`` or ``ep``); ``None`` if that is unknown.

    Epochs and batches convert with ``state.dataloader_len`` (optimizer steps per epoch); a
    fraction of the run (``dur``) is that fraction of ``state.max_duration`` in ``unit``. Unknown:
    no ``dataloader_len`` where a conversion needs one, no ``max_duration`` for a fraction, or
    units that do not convert (samples, tokens, seconds).
    """
    if time.unit == unit:
        return float(time.value)
    if time.unit == TimeUnit.DURATION:
        total = state.max_duration
        whole = None if total is None else in_unit(total, unit, state)
        return None if whole is None else float(time.value) * whole
    per_epoch = state.dataloader_len
    if not per_epoch or per_epoch <= 0:
        return None
    if time.unit == TimeUnit.EPOCH and unit == TimeUnit.BATCH:
        return float(time.value) * per_epoch
    if time.unit == TimeUnit.BATCH and unit == TimeUnit.EPOCH:
        return float(time.value) / per_epoch
    return None


def steps_of(time: Time, state: State) -> float | None:
    """``time`` (``ba``, ``ep`` or ``dur``) in optimizer steps, or ``None`` when it cannot be known (:func:`in_unit`)."""
    return in_unit(time, TimeUnit.BATCH, state)


def warmup_steps(duration: Time, state: State, owner: str, name: str = "duration") -> int:
    """How many optimizer steps a warmup of ``duration`` (``dur``, ``ep`` or ``ba``) lasts in this run.

    Shared by the warmups (SeqLengthWarmup, BatchSizeWarmup) so they count a run alike. Raises
    ``ValueError`` naming ``owner`` and the fix where the run's length (for a fraction) or its
    steps per epoch (for epochs) are unknown.
    """
    total = state.max_duration
    if duration.unit == TimeUnit.DURATION:
        if total is None:
            raise ValueError(
                f"{owner}'s {name} is a fraction of the run, but the run has no max_duration: set the "
                f"Trainer's max_steps or max_epochs, or give {name} in batches ('500ba')."
            )
        if total.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH):
            raise ValueError(
                f"{owner} cannot schedule against max_duration={total}; use max_steps or max_epochs."
            )
    steps = steps_of(duration, state)
    if steps is None:  # only epochs are left to convert, and the steps per epoch are unknown
        if duration.unit == TimeUnit.EPOCH:
            raise ValueError(f"{owner}({name} in epochs) needs the number of steps per epoch.")
        raise ValueError(f"{owner} needs the number of steps per epoch to schedule in fractions.")
    return int(steps)


def fraction_of_run(point: Time, state: State, where: str) -> float:
    """``point`` as a fraction of the run's ``max_duration`` (``dur`` points are already fractions)."""
    if point.unit == TimeUnit.DURATION:
        return float(point.value)
    total = state.max_duration
    if total is None:
        raise ValueError(
            f"{where} cannot place {point} in the run: the run's length is unknown. Give the Trainer max_epochs "
            "or max_steps, or give the schedule as fractions of the run ('0.5dur')."
        )
    if point.unit == total.unit:
        return min(float(point.value) / float(total.value), 1.0) if total.value else 1.0
    point_steps, total_steps = steps_of(point, state), steps_of(total, state)
    if point_steps is not None and total_steps is not None:
        return min(point_steps / total_steps, 1.0)
    raise ValueError(
        f"{where} cannot convert {point} into a fraction of a run of {total}; give it as a fraction ('0.5dur') "
        f"or in '{total.unit.value}'."
    )


def elapsed_fraction(state: State, where: str) -> float:
    """How much of the run is done, in ``[0, 1]`` (Composer's ``state.get_elapsed_duration()``)."""
    elapsed = state.get_elapsed_duration()
    if elapsed is None:
        raise ValueError(
            f"{where} follows a schedule over the run, but the run's length is unknown: give the Trainer "
            "max_epochs or max_steps."
        )
    return float(elapsed.value)
