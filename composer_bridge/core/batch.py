"""Reading and replacing parts of a batch, whatever its shape (tuple, list, dict, object).

Algorithms name the part they need with a *key*: an ``int`` index (tuples, lists), a ``str``
(dicts, or attributes of objects), or a ``(getter, setter)`` pair of callables for anything
else. Tuples are rebuilt rather than mutated, so the caller always uses the returned batch.

Examples:
    >>> batch = ("x", "y")
    >>> get_batch_item(batch, 1)
    'y'
    >>> set_batch_item(batch, 1, "z")
    ('x', 'z')
    >>> set_batch_item({"input": 1}, "input", 2)
    {'input': 2}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

__all__ = ["BatchKey", "get_batch_item", "set_batch_item"]

BatchKey = int | str | tuple[Callable[[Any], Any], Callable[[Any, Any], Any]]


def _is_getter_setter(key: object) -> bool:
    return isinstance(key, tuple) and len(key) == 2 and callable(key[0]) and callable(key[1])


def get_batch_item(batch: Any, key: BatchKey) -> Any:
    """Return the part of ``batch`` named by ``key`` (see the module docstring)."""
    if _is_getter_setter(key):
        return key[0](batch)  # type: ignore[index]
    if callable(key):
        return key(batch)
    try:
        if isinstance(key, str) and not isinstance(batch, Mapping) and hasattr(batch, key):
            return getattr(batch, key)
        return batch[key]
    except (KeyError, IndexError, TypeError) as err:
        raise KeyError(_explain(batch, key, err)) from None


def set_batch_item(batch: Any, key: BatchKey, value: Any) -> Any:
    """Return ``batch`` with the part named by ``key`` replaced by ``value``.

    Lists and dicts are changed in place and returned; tuples (named tuples included, by index or
    field name) are rebuilt; a ``(getter, setter)`` key calls ``setter(batch, value)`` and returns its result,
    or ``batch`` if it returns ``None``.
    """
    if _is_getter_setter(key):
        result = key[1](batch, value)  # type: ignore[index]
        return batch if result is None else result
    if isinstance(batch, tuple) and isinstance(key, int):
        items = list(batch)
        try:
            items[key] = value
        except IndexError as err:
            raise KeyError(_explain(batch, key, err)) from None
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    if isinstance(batch, tuple) and isinstance(key, str) and key in getattr(batch, "_fields", ()):
        return batch._replace(**{key: value})  # a named tuple's field, by name
    if isinstance(batch, MutableMapping) or (isinstance(batch, Sequence) and not isinstance(batch, (str, bytes))):
        try:
            if isinstance(batch, MutableMapping) and key not in batch:
                raise KeyError(key)
            batch[key] = value
        except (KeyError, IndexError, TypeError) as err:
            raise KeyError(_explain(batch, key, err)) from None
        return batch
    if isinstance(key, str) and hasattr(batch, key):
        setattr(batch, key, value)
        return batch
    raise KeyError(_explain(batch, key, TypeError("unsupported batch type")))


def _explain(batch: Any, key: object, err: Exception) -> str:
    shape = (
        f"a dict with keys {sorted(map(str, batch))}" if isinstance(batch, Mapping)
        else f"a {type(batch).__name__} of length {len(batch)}" if isinstance(batch, Sequence)
        else f"a {type(batch).__name__}"
    )
    return (
        f"Cannot find batch item {key!r} in {shape} ({err}). Pass the algorithm an input_key/target_key "
        "that matches your batch: an int index for tuples/lists, a str for dicts, or a (getter, setter) pair."
    )
