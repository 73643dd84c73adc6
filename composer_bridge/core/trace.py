"""Traces: the record of which algorithm ran at which event, and in which order.

Example:
    >>> from composer_bridge.core.event import Event
    >>> Trace("LabelSmoothing", Event.BEFORE_LOSS, None, 0, True)
    Trace(name='LabelSmoothing', event=<Event.BEFORE_LOSS: 'before_loss'>, exit_code=None, order=0, run=True)
"""

from __future__ import annotations

from dataclasses import dataclass

from composer_bridge.core.event import Event

__all__ = ["PlanTraces", "Trace", "Traces", "trace_key"]


@dataclass(slots=True, frozen=True)
class Trace:
    """One algorithm's execution at one event (immutable: the engine reuses equal traces).

    ``name`` is the algorithm's class name, ``exit_code`` what ``apply`` returned, ``order`` its
    position among the algorithms run at this event (``None`` if it did not run).
    """

    name: str = ""
    event: Event | None = None
    exit_code: int | None = None
    order: int | None = None
    run: bool = False


#: What :meth:`Engine.run_event` returns: ``"<AlgorithmClass>/<EVENT_NAME>"`` → :class:`Trace`, in run order.
Traces = dict[str, Trace]


class PlanTraces(dict):  # type: ignore[type-arg]
    """The traces of one cached plan when no ``apply`` returned an exit code.

    The engine hands the same object to its logger each time that plan runs, so a destination
    may cache work per plan (by identity); treat it as read-only.
    """


def trace_key(algorithm_name: str, event: Event) -> str:
    """The key of a trace: ``trace_key('MixUp', Event.BEFORE_LOSS) == 'MixUp/BEFORE_LOSS'``."""
    return f"{algorithm_name}/{event.name}"
