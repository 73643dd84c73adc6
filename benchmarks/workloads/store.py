"""The benchmark's finished fits on disk, one JSON line each, so a run killed halfway resumes from them.

Every fit and every search is appended to ``<out>/fits.jsonl`` the moment it finishes, keyed by what
changes its numbers (:attr:`workloads.curve_fit.FitSpec.key`); a later run with the same ``--out``
trains only the keys the file lacks. A line cut short by a kill is dropped.

Examples:
    >>> import tempfile, pathlib
    >>> store = Store(pathlib.Path(tempfile.mkdtemp()))
    >>> store.add({"key": "a|baseline|0|8|0.001", "cpu_s": 1.0})
    >>> Store(store.folder).get("a|baseline|0|8|0.001")["cpu_s"]
    1.0
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["Store"]


class Store:
    """The records of ``folder/fits.jsonl``, by key."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / "fits.jsonl"
        self.records: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            text = self.path.read_text()
            for line in text.splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the last line of a run killed while writing it
                self.records[record["key"]] = record
            if text and not text.endswith("\n"):  # drop that cut line, or the next record would be glued to it
                self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records.values()))

    def get(self, key: str) -> dict[str, Any] | None:
        return self.records.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self.records

    def add(self, record: dict[str, Any]) -> None:
        self.records[record["key"]] = record
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
