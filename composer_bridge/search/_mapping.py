"""A frozen dataclass that also reads as a mapping of its fields, for results that were plain dicts before.

Examples:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Point(FieldsMapping):
    ...     x: int
    ...     y: int | None = None
    >>> point = Point(1)
    >>> point["x"], "y" in point, dict(point)
    (1, True, {'x': 1, 'y': None})
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import Any

__all__ = ["FieldsMapping"]


class FieldsMapping(Mapping[str, Any]):
    """Reads ``record[key]``, ``key in record``, ``record.get(key)`` and ``dict(record)`` from the fields.

    A subclass may list other keys (derived properties, or fields left out while unset) in :meth:`_keys`.
    """

    def _keys(self) -> list[str]:
        return [f.name for f in fields(self)]  # type: ignore[arg-type]

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def as_dict(self) -> dict[str, Any]:
        """Every key and its value, as a plain dict (for JSON and W&B)."""
        return dict(self.items())
