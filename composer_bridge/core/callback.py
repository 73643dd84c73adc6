"""Engine-side callbacks: code that observes every event, after the algorithms have run.

Example:
    >>> from composer_bridge.core.event import Event
    >>> class CountSteps(Callback):
    ...     def __init__(self):
    ...         self.steps = 0
    ...     def batch_end(self, state, logger):
    ...         self.steps += 1
    >>> cb = CountSteps()
    >>> cb.run_event(Event.BATCH_END, state=None, logger=None)
    >>> cb.steps
    1
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from composer_bridge.core.event import Event
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["Callback"]


class Callback:
    """Base class for engine callbacks: one method per event, named by the event's value.

    :meth:`run_event` calls the method named after the event (``batch_end`` for
    ``Event.BATCH_END``), so override the events you need; override ``run_event`` itself to
    see every event. ``close`` and ``post_close`` run once when the engine shuts down, also
    after an exception; ``state_dict``/``load_state_dict`` make the callback resumable.
    """

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        """Dispatch ``event`` to the method of the same name."""
        getattr(self, event.value)(state, logger)

    def close(self, state: State, logger: Logger) -> None:
        """Release resources (flush files, finish runs). Runs at teardown and on exceptions."""

    def post_close(self) -> None:
        """Runs after every callback's ``close``, only if this callback's ``close`` did not raise."""

    def state_dict(self) -> dict[str, Any]:
        """Resumable state (tensors and plain data only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


def _noop(self: Callback, state: State, logger: Logger) -> None:
    """Does nothing; override to act on this event."""


def _install_event_methods() -> None:
    from composer_bridge.core.event import Event

    for event in Event:
        if not hasattr(Callback, event.value):
            setattr(Callback, event.value, _noop)


_install_event_methods()
