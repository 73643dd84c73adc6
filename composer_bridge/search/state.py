"""The search's state on disk: every fit so far, in one JSON file, written after every fit.

A search is a deterministic function of its settings and of the fits' results, so the state
holds only those: resuming replays the decisions with the recorded fits (no training) and trains
from the first fit that is missing. A finished search replays entirely from disk.

Examples:
    >>> import tempfile, pathlib
    >>> store = SearchState(pathlib.Path(tempfile.mkdtemp()) / "search.json", {"monitor": "val/acc"})
    >>> store.fits, store.overhead_s
    ([], 0.0)
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from composer_bridge.search.trial import FitRecord

__all__ = ["SearchState", "StaleStateError"]

VERSION = 1


#: settings that steer which fits a search reads, never what a fit trains: a state saved with other values resumes
#: (its fits are read where the search asks for them, the rest trained)
READ_ONLY_SETTINGS = ("screen", "first_look", "shortlist")


class StaleStateError(ValueError):
    """The state on disk belongs to a search with other settings."""


class SearchState:
    """The fits of one search (``path`` may not exist yet), checked against ``settings`` when loaded."""

    def __init__(self, path: Path | None, settings: dict[str, Any]) -> None:
        self.path = path
        self.settings = json.loads(json.dumps(settings))  # as it reads back from disk
        self.fits: list[FitRecord] = []
        self.overhead_s = 0.0  # the search's own wall time outside the fits, all calls so far
        self.overhead_cpu_s = 0.0  # ... and its CPU time
        if path is not None and path.exists():
            data = json.loads(path.read_text())
            if data.get("version") != VERSION:
                raise StaleStateError(f"{path}: state version {data.get('version')!r}, this library writes {VERSION}; "
                                      "use a new state_dir.")
            different = sorted(k for k in set(self.settings) | set(data["settings"])
                               if self.settings.get(k) != data["settings"].get(k) and k not in READ_ONLY_SETTINGS)
            if different:
                raise StaleStateError(
                    f"{path} holds a search with other settings ({', '.join(different)} differ: on disk "
                    f"{ {k: data['settings'].get(k) for k in different} }, now { {k: self.settings.get(k) for k in different} }). "
                    "Resume it with the same settings, or give this search a new state_dir."
                )
            self.fits = [FitRecord(**f) for f in data["fits"]]
            self.overhead_s = float(data.get("overhead_s", 0.0))
            self.overhead_cpu_s = float(data.get("overhead_cpu_s", 0.0))

    def lookup(self) -> dict[tuple[tuple[str, ...], int, int], FitRecord]:
        return {(tuple(f.config), f.seed, f.steps): f for f in self.fits}

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"version": VERSION, "settings": self.settings,
                           "overhead_s": self.overhead_s, "overhead_cpu_s": self.overhead_cpu_s,
                           "fits": [asdict(f) for f in self.fits]}, indent=1)
        # A temporary file of its own (two writers never share one), flushed to disk, then renamed over
        # the state: an interruption leaves the old or the new file, never half of one.
        handle, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(handle, "w") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
