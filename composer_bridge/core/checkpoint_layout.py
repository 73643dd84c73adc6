"""The layout of the bridge's entry in a checkpoint, for readers that must not depend on who wrote it.

The Lightning bridge writes one entry into ``checkpoint["callbacks"]`` (see
:mod:`composer_bridge.training.checkpoint_state`, which owns writing and checking it)::

    {"format": "composer_bridge/1", "algorithms": [{"class": "EMA", "state": {...}, ...}, ...], ...}

An algorithm that offers a reader of its own state (EMA's averaged weights) finds the entry here,
by its ``format``, never by the name of the callback class that wrote it.

Examples:
    >>> checkpoint = {"callbacks": {"MyBridge": {"format": FORMAT,
    ...                                          "algorithms": [{"class": "EMA", "state": {"n": 1}}]}}}
    >>> list(algorithm_states(checkpoint, "EMA"))
    [{'n': 1}]
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["FORMAT", "algorithm_states", "bridge_entries"]

#: The format tag of the bridge's checkpoint entry; a reader accepts only this one.
FORMAT = "composer_bridge/1"


def bridge_entries(checkpoint: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The bridge's entries among the checkpoint's callback states (one per bridge that wrote one)."""
    for entry in (checkpoint.get("callbacks") or {}).values():
        if isinstance(entry, Mapping) and entry.get("format") == FORMAT:
            yield entry


def algorithm_states(checkpoint: Mapping[str, Any], class_name: str) -> Iterator[Mapping[str, Any]]:
    """The saved states of the algorithms of class ``class_name``, in the order they were saved."""
    for entry in bridge_entries(checkpoint):
        for record in entry.get("algorithms", []):
            if isinstance(record, Mapping) and record.get("class") == class_name:
                yield record.get("state") or {}
