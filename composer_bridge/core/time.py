"""Training time: units (:class:`TimeUnit`), amounts (:class:`Time`) and progress (:class:`Timestamp`).

Composer measures training in epochs, batches, samples, tokens, iterations, wall-clock seconds,
or as a fraction of the whole run ("duration"). Amounts are written as time strings such as
``"10ep"``, ``"2_000ba"``, ``"0.5dur"`` or ``"1h20m"``::

    >>> Time.from_timestring("10ep")
    Time(10, TimeUnit.EPOCH)
    >>> Time.from_timestring("1h20m") == Time(4800, "sec")
    True
    >>> ts = Timestamp(epoch=1, batch=20).to_next_batch(samples=32)
    >>> ts.batch, ts.sample
    (Time(21, TimeUnit.BATCH), Time(32, TimeUnit.SAMPLE))
"""

from __future__ import annotations

import datetime
import math
import re
from enum import Enum
from typing import Any, Generic, TypeVar

__all__ = [
    "FractionalTimeError",
    "Time",
    "TimeInputError",
    "TimeUnit",
    "TimeUnitMismatchError",
    "Timestamp",
    "ensure_time",
]


# Composer raises RuntimeError where units differ or an input cannot be read as a Time, and
# TypeError for a fraction of a whole unit; we raise the more specific ValueError/TypeError. Each
# error below is both, so code written for Composer (``except RuntimeError``) and code written
# for us catch the same errors.
class TimeUnitMismatchError(ValueError, RuntimeError):
    """Arithmetic or ordering between Times of different units (e.g. ``Time(1, 'ep') < Time(1, 'ba')``)."""


class TimeInputError(TypeError, RuntimeError):
    """:meth:`Time.from_input` got something that is not a Time, a time string or a number with a unit."""


class FractionalTimeError(ValueError, TypeError):
    """A fractional amount of a whole-number unit (``'1.5ep'``, ``Time(2.5, 'ba')``)."""


class TimeUnit(str, Enum):
    """The units training time is counted in; the value is the suffix used in time strings.

    Examples:
        >>> TimeUnit("ep") is TimeUnit.EPOCH
        True
        >>> str(TimeUnit.DURATION)
        'dur'
    """

    EPOCH = "ep"
    ITERATION = "iter"
    BATCH = "ba"
    SAMPLE = "sp"
    TOKEN = "tok"
    DURATION = "dur"
    SECOND = "sec"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def _missing_(cls, value: object) -> TimeUnit | None:
        # Accept member names and any case ("EPOCH", "Ep") so config files need not match exactly.
        if isinstance(value, str):
            text = value.strip()
            for member in cls:
                if text.lower() == member.value or text.upper() == member.name:
                    return member
        return None

    @classmethod
    def parse(cls, unit: TimeUnit | str) -> TimeUnit:
        """``unit`` as a :class:`TimeUnit`; an unknown name raises ``ValueError`` listing the known ones."""
        if isinstance(unit, TimeUnit):
            return unit
        try:
            return cls(unit)
        except ValueError:
            raise ValueError(f"Unknown time unit {unit!r}; use one of {_UNIT_LIST}.") from None

    @property
    def is_integer(self) -> bool:
        """Whether amounts of this unit are whole numbers (everything except ``dur`` and ``sec``)."""
        return self not in (TimeUnit.DURATION, TimeUnit.SECOND)


_UNIT_LIST = ", ".join(repr(u.value) for u in TimeUnit)
_ACCEPTED_FORMS = (
    "a number followed by a unit, e.g. '10ep', '2_000ba', '512sp', '1000tok', '3iter', '0.5dur', '90sec' "
    f"(units: {_UNIT_LIST}; all but 'dur' and 'sec' need whole numbers), "
    "or hours/minutes/seconds such as '1h20m', '1h20m30s', '2m' or '90s'"
)

# The number part is deliberately permissive (underscores, exponent) and is checked by int()/float():
# str() of a float Time can be e.g. '1e-05dur', and that must parse back.
_NUMBER_UNIT = re.compile(r"(?P<number>[0-9_]*\.?[0-9_]*(?:[eE][+-]?[0-9]+)?)(?P<unit>[a-zA-Z]+)")
_HOURS_MINUTES_SECONDS = re.compile(r"(?:(?P<h>[0-9_]+)h)?(?:(?P<m>[0-9_]+)m)?(?:(?P<s>[0-9_]*\.?[0-9_]+)s)?")

TValue = TypeVar("TValue", int, float)
Number = int | float


def _check_value(value: Any, unit: TimeUnit) -> int | float:
    """``value`` validated for ``unit``: a finite, non-negative number, whole for integer units."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        # Accept numeric scalars that are not Python numbers (0-d tensors, numpy scalars).
        if hasattr(value, "item") and not isinstance(value, bool):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"A Time value must be an int or a float, not {type(value).__name__} ({value!r})."
            )
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"A Time value must be finite, got {value!r} {unit.value}.")
    if value < 0:
        raise ValueError(f"A Time value cannot be negative, got {value!r} {unit.value}.")
    if unit.is_integer:
        if isinstance(value, float):
            if not value.is_integer():
                raise FractionalTimeError(
                    f"{value!r} is not a whole number of {unit.name.lower()}s ('{unit.value}'): "
                    f"'{unit.value}' requires whole numbers. Use a fraction of the run such as "
                    f"'0.5dur', or a smaller unit (e.g. batches 'ba' instead of epochs 'ep')."
                )
            value = int(value)
        return int(value)
    return value


class Time(Generic[TValue]):
    """An amount of training time: a non-negative ``value`` in a :class:`TimeUnit`.

    ``ep``, ``iter``, ``ba``, ``sp`` and ``tok`` hold whole numbers; ``dur`` (a fraction of the
    whole run) and ``sec`` hold floats (or ints). ``unit`` may be a :class:`TimeUnit` or its string.

    Times of the same unit add, subtract, take remainders (``%``) and compare; a plain number
    stands for the same unit. ``Time * number`` and ``Time / number`` scale (integer units round
    toward zero, as in Composer); ``Time * Time(f, 'dur')`` takes the fraction ``f`` of it;
    ``Time / Time`` of one unit is their ratio as a float. A constructed Time is never negative,
    but results of arithmetic may be (``Time(1, 'ep') - Time(2, 'ep') == -Time(1, 'ep')``), as in
    Composer. Mixing units in arithmetic or ordering raises :class:`TimeUnitMismatchError` (a
    ``ValueError`` and, as in Composer, a ``RuntimeError``); ``==`` between units is simply
    ``False`` so Times of any unit can live in one set or dict.

    Examples:
        >>> t = Time(10, "ep")
        >>> t
        Time(10, TimeUnit.EPOCH)
        >>> str(t + Time.from_epoch(5)), t == "10ep", t / Time(20, "ep")
        ('15ep', True, 0.5)
        >>> Time(1000, "ba") * Time(0.25, "dur")
        Time(250, TimeUnit.BATCH)
    """

    __slots__ = ("_value", "_unit")

    def __init__(self, value: TValue, unit: TimeUnit | str) -> None:
        unit = TimeUnit.parse(unit)
        self._unit = unit
        self._value = _check_value(value, unit)

    # --- constructors -------------------------------------------------------------------------
    @classmethod
    def from_epoch(cls, epoch: int) -> Time[int]:
        """``Time(epoch, TimeUnit.EPOCH)``."""
        return cls(epoch, TimeUnit.EPOCH)

    @classmethod
    def from_iteration(cls, iteration: int) -> Time[int]:
        """``Time(iteration, TimeUnit.ITERATION)``."""
        return cls(iteration, TimeUnit.ITERATION)

    @classmethod
    def from_batch(cls, batch: int) -> Time[int]:
        """``Time(batch, TimeUnit.BATCH)``."""
        return cls(batch, TimeUnit.BATCH)

    @classmethod
    def from_sample(cls, sample: int) -> Time[int]:
        """``Time(sample, TimeUnit.SAMPLE)``."""
        return cls(sample, TimeUnit.SAMPLE)

    @classmethod
    def from_token(cls, token: int) -> Time[int]:
        """``Time(token, TimeUnit.TOKEN)``."""
        return cls(token, TimeUnit.TOKEN)

    @classmethod
    def from_duration(cls, duration: float) -> Time[float]:
        """``Time(duration, TimeUnit.DURATION)``: a fraction of the whole run (``1.0`` is all of it)."""
        return cls(duration, TimeUnit.DURATION)

    @classmethod
    def from_second(cls, second: float) -> Time[float]:
        """``Time(second, TimeUnit.SECOND)``: wall-clock seconds."""
        return cls(second, TimeUnit.SECOND)

    @classmethod
    def from_timestring(cls, timestring: str) -> Time:
        """Parse ``"10ep"``, ``"2_000ba"``, ``"0.5dur"``, ``"90sec"``, ``"1h20m30s"``, ``"90s"``, ...

        Surrounding whitespace is ignored. Anything else raises ``ValueError`` naming the string
        and the accepted forms.

        Examples:
            >>> Time.from_timestring(" 2_000ba ")
            Time(2000, TimeUnit.BATCH)
            >>> Time.from_timestring("1h20m30s")
            Time(4830, TimeUnit.SECOND)
        """
        if not isinstance(timestring, str):
            raise TypeError(f"A time string must be a str, not {type(timestring).__name__} ({timestring!r}).")
        text = timestring.strip()

        hms = _HOURS_MINUTES_SECONDS.fullmatch(text)
        if text and hms is not None:
            try:
                hours = int(hms["h"]) if hms["h"] else 0
                minutes = int(hms["m"]) if hms["m"] else 0
                seconds = _parse_number(hms["s"]) if hms["s"] else 0
            except ValueError:
                raise ValueError(
                    f"Invalid time string {timestring!r}: accepted forms are {_ACCEPTED_FORMS}."
                ) from None
            return cls(hours * 3600 + minutes * 60 + seconds, TimeUnit.SECOND)

        match = _NUMBER_UNIT.fullmatch(text)
        if match is None or not any(c.isdigit() for c in match["number"]):
            raise ValueError(f"Invalid time string {timestring!r}: accepted forms are {_ACCEPTED_FORMS}.")
        try:
            unit = TimeUnit(match["unit"].lower())
        except ValueError:
            raise ValueError(
                f"Invalid time string {timestring!r}: unknown unit {match['unit']!r}; "
                f"accepted forms are {_ACCEPTED_FORMS}."
            ) from None
        try:
            value = _parse_number(match["number"])
        except ValueError:
            raise ValueError(
                f"Invalid time string {timestring!r}: {match['number']!r} is not a number; "
                f"accepted forms are {_ACCEPTED_FORMS}."
            ) from None
        if unit.is_integer and not float(value).is_integer():
            raise FractionalTimeError(
                f"Invalid time string {timestring!r}: '{unit.value}' requires whole numbers. Use a fraction of "
                f"the run such as '0.5dur', or a smaller unit (e.g. 'ba' instead of 'ep'); "
                f"accepted forms are {_ACCEPTED_FORMS}."
            )
        return cls(value, unit)

    @classmethod
    def from_input(cls, value: Time | str | int | float, default_unit: TimeUnit | str | None = None) -> Time:
        """``value`` as a :class:`Time`: a Time as is, a str parsed as a time string, a number in ``default_unit``.

        Examples:
            >>> Time.from_input(3, "ep"), Time.from_input("5ba"), Time.from_input(Time(1, "sp"))
            (Time(3, TimeUnit.EPOCH), Time(5, TimeUnit.BATCH), Time(1, TimeUnit.SAMPLE))
        """
        if isinstance(value, Time):
            return value
        if isinstance(value, str):
            return cls.from_timestring(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if default_unit is None:
                raise TimeInputError(
                    f"Cannot tell the unit of the bare number {value!r}: pass a time string such as "
                    f"'{value}ep' or '{value}ba', a Time, or give a default_unit."
                )
            return cls(value, default_unit)
        raise TimeInputError(
            f"Expected a Time, a time string (e.g. '10ep', '0.5dur', '1h20m') or a number with a default unit; "
            f"got {type(value).__name__} ({value!r})."
        )

    # --- accessors ----------------------------------------------------------------------------
    @property
    def value(self) -> TValue:
        """The amount, in :attr:`unit`."""
        return self._value  # type: ignore[return-value]

    @property
    def unit(self) -> TimeUnit:
        """The :class:`TimeUnit` of :attr:`value`."""
        return self._unit

    def to_timestring(self) -> str:
        """The time string that :meth:`from_timestring` parses back to this Time, e.g. ``"10ep"``."""
        return f"{self._value!r}{self._unit.value}"

    def __str__(self) -> str:
        return self.to_timestring()

    def __repr__(self) -> str:
        return f"Time({self._value!r}, TimeUnit.{self._unit.name})"

    def __index__(self) -> int:
        if not isinstance(self._value, int):
            raise TypeError(
                f"{self} is not a whole number and cannot be used as an index; use int() or float()."
            )
        return self._value

    def __int__(self) -> int:
        return int(self._value)

    def __float__(self) -> float:
        return float(self._value)

    def __hash__(self) -> int:
        # hash(value) agrees with ``Time(3, 'ep') == 3``; Times of other units merely collide.
        return hash(self._value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Time, (self._value, self._unit.value))

    # --- arithmetic and comparison --------------------------------------------------------------
    def _same_unit(self, other: object, operation: str) -> Time | None:
        """``other`` as a Time of this unit (numbers and strings are converted); ``None`` if unsupported."""
        if isinstance(other, str):
            other = Time.from_timestring(other)
        elif isinstance(other, (int, float)) and not isinstance(other, bool):
            return _PlainNumber(other, self._unit)  # type: ignore[return-value]
        if not isinstance(other, Time):
            return None
        if other._unit != self._unit:
            raise TimeUnitMismatchError(
                f"Cannot {operation} {self} ({self._unit.name.lower()}, '{self._unit.value}') and {other} "
                f"({other._unit.name.lower()}, '{other._unit.value}'): the units differ. Convert one of them "
                f"first, e.g. with the epoch length or max_duration."
            )
        return other

    def _result(self, value: Number) -> Time:
        # Results of arithmetic may be negative (``remaining = max_duration - elapsed`` past the end,
        # ``a - b + c`` through a negative middle), as in Composer; only constructed Times must be >= 0.
        if self._unit.is_integer:
            value = _check_value(abs(value), self._unit) * (-1 if value < 0 else 1)
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"A Time value must be finite, got {value!r} {self._unit.value}.")
        return _trusted_time(value, self._unit)  # type: ignore[arg-type]

    def __add__(self, other: object) -> Time:
        same = self._same_unit(other, "add")
        if same is None:
            return NotImplemented
        return self._result(self._value + same._value)

    __radd__ = __add__

    def __sub__(self, other: object) -> Time:
        same = self._same_unit(other, "subtract")
        if same is None:
            return NotImplemented
        return self._result(self._value - same._value)

    def __rsub__(self, other: object) -> Time:
        same = self._same_unit(other, "subtract")
        if same is None:
            return NotImplemented
        return self._result(same._value - self._value)

    def __neg__(self) -> Time:
        return self._result(-self._value)

    def __pos__(self) -> Time:
        return self

    def __abs__(self) -> Time:
        return self._result(abs(self._value))

    def __mod__(self, other: object) -> Time:
        same = self._same_unit(other, "take the remainder of")
        if same is None:
            return NotImplemented
        return self._result(self._value % same._value)

    def _scaled(self, factor: float) -> Time:
        value = self._value * factor
        if self._unit.is_integer:
            # Composer rounds fractional amounts of whole units toward zero (e.g. warm-up of 0.1 of 15 epochs).
            value = int(value)
        return self._result(value)

    def __mul__(self, other: object) -> Time:
        if isinstance(other, Time):
            if other._unit != TimeUnit.DURATION:
                raise TimeUnitMismatchError(
                    f"Cannot multiply {self} by {other}: only a fraction of the run ('dur', e.g. '0.5dur') "
                    f"or a plain number can scale a Time."
                )
            return self._scaled(other._value)
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return self._scaled(other)
        return NotImplemented

    __rmul__ = __mul__

    def __truediv__(self, other: object) -> Any:
        if isinstance(other, (Time, str)):
            same = self._same_unit(other, "divide")
            assert same is not None
            return self._value / same._value
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return self._scaled(1 / other)
        return NotImplemented

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = Time.from_timestring(other)
            except ValueError:
                return False
        if isinstance(other, Time):
            return self._unit == other._unit and self._value == other._value
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return self._value == other
        return NotImplemented

    def _compare(self, other: object, operation: str) -> tuple[Number, Number] | None:
        same = self._same_unit(other, f"compare ({operation})")
        if same is None:
            return None
        return self._value, same._value

    def __lt__(self, other: object) -> bool:
        pair = self._compare(other, "<")
        return NotImplemented if pair is None else pair[0] < pair[1]

    def __le__(self, other: object) -> bool:
        pair = self._compare(other, "<=")
        return NotImplemented if pair is None else pair[0] <= pair[1]

    def __gt__(self, other: object) -> bool:
        pair = self._compare(other, ">")
        return NotImplemented if pair is None else pair[0] > pair[1]

    def __ge__(self, other: object) -> bool:
        pair = self._compare(other, ">=")
        return NotImplemented if pair is None else pair[0] >= pair[1]


class _PlainNumber:
    """A plain number taken in a Time's unit; unlike a Time it may be negative or fractional (``t > 2.5``)."""

    __slots__ = ("_value", "_unit")

    def __init__(self, value: Number, unit: TimeUnit) -> None:
        self._value = value
        self._unit = unit


def _parse_number(text: str) -> int | float:
    """An int if ``text`` is written as one (underscores allowed), else a float; ``ValueError`` otherwise."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def ensure_time(maybe_time: Time | str | int | float, default_unit: TimeUnit | str | None) -> Time:
    """Alias of :meth:`Time.from_input`: a Time, a time string, or a number in ``default_unit``.

    Examples:
        >>> ensure_time("0.5dur", "ep"), ensure_time(2, "ep")
        (Time(0.5, TimeUnit.DURATION), Time(2, TimeUnit.EPOCH))
    """
    return Time.from_input(maybe_time, default_unit)


_COUNTS: dict[str, TimeUnit] = {
    "iteration": TimeUnit.ITERATION,
    "epoch": TimeUnit.EPOCH,
    "batch": TimeUnit.BATCH,
    "sample": TimeUnit.SAMPLE,
    "token": TimeUnit.TOKEN,
    "epoch_in_iteration": TimeUnit.EPOCH,
    "token_in_iteration": TimeUnit.TOKEN,
    "batch_in_epoch": TimeUnit.BATCH,
    "sample_in_epoch": TimeUnit.SAMPLE,
    "token_in_epoch": TimeUnit.TOKEN,
}
_WALL_CLOCKS = ("total_wct", "iteration_wct", "epoch_wct", "batch_wct")
_ZERO = datetime.timedelta(0)


def _trusted_time(value: int, unit: TimeUnit) -> Time[int]:
    """A Time from a value already known to be valid for ``unit`` (no re-validation: hot path)."""
    time = Time.__new__(Time)
    time._value = value
    time._unit = unit
    return time


def _count(name: str, value: Time | int) -> Time[int]:
    unit = _COUNTS[name]
    if isinstance(value, Time):
        if value.unit != unit:
            raise ValueError(f"Timestamp {name} must be in '{unit.value}', got {value}.")
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Timestamp {name} must be an int or a Time in '{unit.value}', got {value!r}.")
    if value < 0:
        raise ValueError(f"Timestamp {name} must be >= 0 (a count), got {value}.")
    return Time(value, unit)


def _wall_clock(name: str, value: datetime.timedelta | float | None) -> float:
    """Seconds as a float: clocks are kept as floats (cheap to add every step), shown as timedeltas."""
    if value is None:
        return 0.0
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"Timestamp {name} must be a datetime.timedelta or seconds, got {value!r}.")


class Timestamp:
    """Where training is: counts of iterations, epochs, batches, samples and tokens, and wall-clock times.

    Counts are exposed as :class:`Time` (``ts.epoch`` is ``Time(n, 'ep')``), wall-clock times
    (``*_wct``) as ``datetime.timedelta``. A Timestamp compares with a Time (or a time string) by
    its count in that unit: ``ts < Time(10, 'ep')`` means fewer than 10 epochs done, as in Composer. A Timestamp does not change under you: the ``to_next_*``
    methods and :meth:`copy` return new ones (only :meth:`load_state_dict` updates in place).

    Examples:
        >>> ts = Timestamp(epoch=2, batch=100)
        >>> ts.epoch, ts.get("ba")
        (Time(2, TimeUnit.EPOCH), Time(100, TimeUnit.BATCH))
        >>> ts = ts.to_next_batch(samples=64).to_next_epoch()
        >>> ts.epoch.value, ts.batch.value, ts.sample.value, ts.batch_in_epoch.value
        (3, 101, 64, 0)
        >>> ts >= Time(3, "ep"), ts < "200ba"
        (True, True)
    """

    def __init__(
        self,
        iteration: Time | int = 0,
        epoch: Time | int = 0,
        batch: Time | int = 0,
        sample: Time | int = 0,
        token: Time | int = 0,
        epoch_in_iteration: Time | int = 0,
        token_in_iteration: Time | int = 0,
        batch_in_epoch: Time | int = 0,
        sample_in_epoch: Time | int = 0,
        token_in_epoch: Time | int = 0,
        total_wct: datetime.timedelta | float | None = None,
        iteration_wct: datetime.timedelta | float | None = None,
        epoch_wct: datetime.timedelta | float | None = None,
        batch_wct: datetime.timedelta | float | None = None,
    ) -> None:
        self._set(locals())

    def _set(self, fields: dict[str, Any]) -> None:
        # Validate everything before assigning anything, so a bad value leaves the Timestamp unchanged.
        counts = {name: _count(name, fields[name])._value for name in _COUNTS}
        clocks = {name: _wall_clock(name, fields[name]) for name in _WALL_CLOCKS}
        self._counts = counts
        self._clocks = clocks

    def _fields(self) -> dict[str, Any]:
        return {**self._counts, **self._clocks}

    # --- counts ---------------------------------------------------------------------------------
    @property
    def iteration(self) -> Time[int]:
        """Iterations completed (an iteration is a pass over several epochs, e.g. a curriculum stage)."""
        return _trusted_time(self._counts["iteration"], _COUNTS["iteration"])

    @property
    def epoch(self) -> Time[int]:
        """Epochs completed."""
        return _trusted_time(self._counts["epoch"], _COUNTS["epoch"])

    @property
    def batch(self) -> Time[int]:
        """Batches (optimizer steps) completed."""
        return _trusted_time(self._counts["batch"], _COUNTS["batch"])

    @property
    def sample(self) -> Time[int]:
        """Samples trained on."""
        return _trusted_time(self._counts["sample"], _COUNTS["sample"])

    @property
    def token(self) -> Time[int]:
        """Tokens trained on."""
        return _trusted_time(self._counts["token"], _COUNTS["token"])

    @property
    def epoch_in_iteration(self) -> Time[int]:
        """Epochs completed in the current iteration."""
        return _trusted_time(self._counts["epoch_in_iteration"], _COUNTS["epoch_in_iteration"])

    @property
    def token_in_iteration(self) -> Time[int]:
        """Tokens trained on in the current iteration."""
        return _trusted_time(self._counts["token_in_iteration"], _COUNTS["token_in_iteration"])

    @property
    def batch_in_epoch(self) -> Time[int]:
        """Batches completed in the current epoch."""
        return _trusted_time(self._counts["batch_in_epoch"], _COUNTS["batch_in_epoch"])

    @property
    def sample_in_epoch(self) -> Time[int]:
        """Samples trained on in the current epoch."""
        return _trusted_time(self._counts["sample_in_epoch"], _COUNTS["sample_in_epoch"])

    @property
    def token_in_epoch(self) -> Time[int]:
        """Tokens trained on in the current epoch."""
        return _trusted_time(self._counts["token_in_epoch"], _COUNTS["token_in_epoch"])

    # --- wall clock -----------------------------------------------------------------------------
    @property
    def total_wct(self) -> datetime.timedelta:
        """Wall-clock time spent training, in all."""
        return datetime.timedelta(seconds=self._clocks["total_wct"])

    @property
    def iteration_wct(self) -> datetime.timedelta:
        """Wall-clock time spent in the current iteration."""
        return datetime.timedelta(seconds=self._clocks["iteration_wct"])

    @property
    def epoch_wct(self) -> datetime.timedelta:
        """Wall-clock time spent in the current epoch."""
        return datetime.timedelta(seconds=self._clocks["epoch_wct"])

    @property
    def batch_wct(self) -> datetime.timedelta:
        """Wall-clock time of the last batch."""
        return datetime.timedelta(seconds=self._clocks["batch_wct"])

    def get(self, unit: TimeUnit | str) -> Time:
        """The total count in ``unit`` (``ep``, ``iter``, ``ba``, ``sp``, ``tok``), or ``total_wct`` for ``sec``.

        ``dur`` raises ``ValueError``: a fraction of the run needs ``max_duration``, which the
        :class:`~composer_bridge.core.state.State` knows (``State.get_elapsed_duration()``).
        """
        unit = TimeUnit.parse(unit)
        if unit == TimeUnit.DURATION:
            raise ValueError(
                "A Timestamp cannot give its progress in 'dur': that is a fraction of max_duration, which the "
                "Timestamp does not know. Use State.get_elapsed_duration(), or get() the unit of max_duration."
            )
        if unit == TimeUnit.SECOND:
            return Time(self.total_wct.total_seconds(), TimeUnit.SECOND)
        return {
            TimeUnit.ITERATION: self.iteration,
            TimeUnit.EPOCH: self.epoch,
            TimeUnit.BATCH: self.batch,
            TimeUnit.SAMPLE: self.sample,
            TimeUnit.TOKEN: self.token,
        }[unit]

    # --- progress -------------------------------------------------------------------------------
    def copy(self, **overrides: Any) -> Timestamp:
        """A new Timestamp with the same fields, except those given as keyword arguments.

        Examples:
            >>> Timestamp(epoch=3).copy(batch=7).batch
            Time(7, TimeUnit.BATCH)
        """
        unknown = sorted(set(overrides) - set(_COUNTS) - set(_WALL_CLOCKS))
        if unknown:
            raise TypeError(f"Timestamp has no field(s) {unknown}; fields are {[*_COUNTS, *_WALL_CLOCKS]}.")
        return Timestamp(**{**self._fields(), **overrides})

    def to_next_batch(
        self,
        samples: Time | int = 0,
        tokens: Time | int = 0,
        duration: datetime.timedelta | float | None = None,
    ) -> Timestamp:
        """The Timestamp after one more batch of ``samples`` samples and ``tokens`` tokens lasting ``duration``.

        Examples:
            >>> after = Timestamp().to_next_batch(samples=32, duration=0.5)
            >>> after.batch, after.sample, after.batch_wct.total_seconds()
            (Time(1, TimeUnit.BATCH), Time(32, TimeUnit.SAMPLE), 0.5)
        """
        return self.to_next_batches(1, samples, tokens, duration, last_duration=duration)

    def to_next_batches(
        self,
        batches: int,
        samples: Time | int = 0,
        tokens: Time | int = 0,
        duration: datetime.timedelta | float | None = None,
        last_duration: datetime.timedelta | float | None = None,
    ) -> Timestamp:
        """The Timestamp after ``batches`` more batches, together holding ``samples`` and ``tokens``.

        ``duration`` is their total wall-clock time and ``last_duration`` the last batch's (it
        becomes ``batch_wct``; default: ``duration / batches``). Equal to calling
        :meth:`to_next_batch` once per batch, for a loop that builds the Timestamp only when read.

        Examples:
            >>> one_by_one = Timestamp().to_next_batch(samples=8, duration=1.0).to_next_batch(samples=8, duration=3.0)
            >>> one_by_one == Timestamp().to_next_batches(2, samples=16, duration=4.0, last_duration=3.0)
            True
        """
        if type(batches) is not int or batches < 0:
            raise ValueError(f"Timestamp.to_next_batches(batches={batches!r}): batches must be an int >= 0.")
        # Plain ints and float seconds (what State.count_batch passes) skip the general validation.
        n_samples = samples if type(samples) is int and samples >= 0 else _count("sample", samples)._value
        n_tokens = tokens if type(tokens) is int and tokens >= 0 else _count("token", tokens)._value
        wct = duration if type(duration) is float else _wall_clock("duration", duration)
        if type(last_duration) is float:
            last = last_duration
        else:
            last = wct / batches if last_duration is None and batches else _wall_clock("last_duration", last_duration)
        # Runs once per optimizer step: the inputs are validated above, so build the new counts
        # directly rather than through copy()'s full validation.
        counts = self._counts.copy()
        counts["batch"] += batches
        counts["batch_in_epoch"] += batches
        if n_samples:
            counts["sample"] += n_samples
            counts["sample_in_epoch"] += n_samples
        if n_tokens:
            counts["token"] += n_tokens
            counts["token_in_epoch"] += n_tokens
            counts["token_in_iteration"] += n_tokens
        clocks = self._clocks
        new = Timestamp.__new__(Timestamp)
        new._counts = counts
        new._clocks = {
            "total_wct": clocks["total_wct"] + wct, "iteration_wct": clocks["iteration_wct"] + wct,
            "epoch_wct": clocks["epoch_wct"] + wct, "batch_wct": last,
        }
        return new

    def to_next_epoch(self, duration: datetime.timedelta | float | None = None) -> Timestamp:
        """The Timestamp at the start of the next epoch: ``epoch + 1``, per-epoch counts and clocks reset.

        ``duration`` (wall-clock time spent closing the epoch, e.g. evaluation) is added to
        ``total_wct`` and ``iteration_wct``, as in Composer.
        """
        extra = _wall_clock("duration", duration)
        return self.copy(
            epoch=self.epoch + 1,
            epoch_in_iteration=self.epoch_in_iteration + 1,
            batch_in_epoch=0,
            sample_in_epoch=0,
            token_in_epoch=0,
            total_wct=self._clocks["total_wct"] + extra,
            iteration_wct=self._clocks["iteration_wct"] + extra,
            epoch_wct=_ZERO,
            batch_wct=_ZERO,
        )

    def to_next_iteration(self, duration: datetime.timedelta | float | None = None) -> Timestamp:
        """The Timestamp at the start of the next iteration: ``iteration + 1``, per-iteration and per-epoch state reset.

        ``duration`` is added to ``total_wct``, as in Composer.
        """
        return self.copy(
            iteration=self.iteration + 1,
            epoch_in_iteration=0,
            token_in_iteration=0,
            batch_in_epoch=0,
            sample_in_epoch=0,
            token_in_epoch=0,
            total_wct=self._clocks["total_wct"] + _wall_clock("duration", duration),
            iteration_wct=_ZERO,
            epoch_wct=_ZERO,
            batch_wct=_ZERO,
        )

    # --- persistence ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int | float]:
        """Plain data (ints, and floats for seconds) that survives ``torch.load(weights_only=True)``."""
        state: dict[str, int | float] = dict(self._counts)
        state.update(self._clocks)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`'s output; missing fields are zero, unknown ones raise ``ValueError``."""
        unknown = sorted(set(state) - set(_COUNTS) - set(_WALL_CLOCKS))
        if unknown:
            raise ValueError(
                f"Unknown Timestamp state_dict key(s) {unknown}; expected some of {[*_COUNTS, *_WALL_CLOCKS]}."
            )
        fields: dict[str, Any] = {name: 0 for name in _COUNTS}
        fields.update({name: None for name in _WALL_CLOCKS})
        fields.update(state)
        self._set(fields)

    # --- comparison and display -----------------------------------------------------------------
    def _count_in_unit_of(self, other: object) -> tuple[Time, Time] | None:
        """``(this Timestamp's count in other's unit, other as a Time)`` for a Time or a time string."""
        if isinstance(other, str):
            other = Time.from_timestring(other)
        if not isinstance(other, Time):
            return None
        return self.get(other.unit), other

    def __eq__(self, other: object) -> bool:
        # Against a Time (or time string), the count in its unit: ``Timestamp(epoch=3) == Time(3, 'ep')``.
        if isinstance(other, Timestamp):
            return self._fields() == other._fields()
        pair = self._count_in_unit_of(other)
        return NotImplemented if pair is None else pair[0] == pair[1]

    def __lt__(self, other: object) -> bool:
        pair = self._count_in_unit_of(other)
        return NotImplemented if pair is None else pair[0] < pair[1]

    def __le__(self, other: object) -> bool:
        pair = self._count_in_unit_of(other)
        return NotImplemented if pair is None else pair[0] <= pair[1]

    def __gt__(self, other: object) -> bool:
        pair = self._count_in_unit_of(other)
        return NotImplemented if pair is None else pair[0] > pair[1]

    def __ge__(self, other: object) -> bool:
        pair = self._count_in_unit_of(other)
        return NotImplemented if pair is None else pair[0] >= pair[1]

    def __hash__(self) -> int:
        return hash(tuple(self._fields().values()))

    def __repr__(self) -> str:
        counts = ", ".join(f"{name}={count}" for name, count in self._counts.items())
        clocks = ", ".join(
            f"{name}={datetime.timedelta(seconds=clock)!r}" for name, clock in self._clocks.items() if clock
        )
        return f"Timestamp({counts}{', ' + clocks if clocks else ''})"
