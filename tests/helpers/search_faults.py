"""Module factories for the recipe search's fault tests: they kill the process that trains a fit.

Defined at module level so a child process or a Ray worker can import them; the process that
built the factory (the test, the search's driver) is never killed.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from helpers import search_support as task


class KillingFactory:
    """``make_module`` that kills its own process when asked for a run of ``steps`` steps.

    With ``marker`` (a file path) only the first such call anywhere kills (it leaves the file
    behind); without, every one does.
    """

    def __init__(self, steps: int, marker: str | None = None, factory: Any = task.make_module) -> None:
        self.steps, self.marker, self.factory = steps, marker, factory
        self.driver = os.getpid()

    def __call__(self, total_steps: int) -> Any:
        if os.getpid() != self.driver and total_steps == self.steps:
            if self.marker is None or not Path(self.marker).exists():
                if self.marker is not None:
                    Path(self.marker).touch()
                os.kill(os.getpid(), signal.SIGKILL)
        return self.factory(total_steps)


class UnpicklableError(Exception):
    """An error whose ``__init__`` takes two arguments: pickle rebuilds it with one and fails."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")


class RaisingFactory:
    """``make_module`` that raises :class:`UnpicklableError` in a process other than the driver's."""

    def __init__(self) -> None:
        self.driver = os.getpid()

    def __call__(self, total_steps: int) -> Any:
        if os.getpid() != self.driver:
            raise UnpicklableError("make_module", "a bug in the user's code")
        return task.make_module(total_steps)
