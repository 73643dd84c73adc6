"""Validating hyper-parameters given as Time strings (shared by the scheduled algorithms).

Example:
    >>> from composer_bridge.core.time import TimeUnit
    >>> parse_time_hparam("EMA", "ema_start", "0.1dur", (TimeUnit.BATCH, TimeUnit.DURATION))
    Time(0.1, TimeUnit.DURATION)
"""

from __future__ import annotations

from composer_bridge.core.time import Time, TimeUnit

__all__ = ["parse_time_hparam"]


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
