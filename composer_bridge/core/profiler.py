"""Profiler markers: how the :class:`~composer_bridge.core.engine.Engine` times what it runs.

The engine asks a :class:`Profiler` for one :class:`Marker` per name, once, and keeps it. The
names are Composer's:

- ``event/<canonical name>``: a span from the end of a ``before_*`` event's run to the start of
  its ``after_*`` event's run (``event/forward`` is the forward pass itself, ``event/dataloader``
  the wait for a batch); :meth:`Engine.run_marker_only_event` opens or closes one without running
  anything (the dataloader span at an epoch's end, when no batch comes);
- ``algorithm/<label>/event/<event>`` around each algorithm's ``apply`` (the label is the
  algorithm's trace label: its class name, ``Name#2`` for a second instance);
- ``callback/<Name>/event/<event>`` around each engine callback's ``run_event``.

The engine starts and finishes each marker in pairs (never twice, never a finish without a
start), so an implementation may be strict. With no profiler the engine checks one attribute
per event and does nothing else.

The cost report (:attr:`Engine.cost`) is the other implementation, :class:`CostProfiler`: the
engine times a sample of the ``apply`` calls with its markers, so the report's seconds and a
profiler's algorithm ranges are measured around the same calls, in one place (its markers read
the clock once per ``apply``, as the report always did).

Examples:
    >>> import torch
    >>> from composer_bridge.core import Algorithm, Engine, Event, State
    >>> class Recorder:
    ...     def __init__(self):
    ...         self.seen = []
    ...     def marker(self, name):
    ...         return RecordingMarker(name, self.seen)
    >>> class Halve(Algorithm):
    ...     def match(self, event, state):
    ...         return event == Event.AFTER_LOSS
    ...     def apply(self, event, state, logger):
    ...         state.loss = state.loss / 2
    >>> state = State(torch.nn.Linear(1, 1), algorithms=[Halve()])
    >>> profiler = Recorder()
    >>> engine = Engine(state, profiler=profiler)
    >>> state.loss = torch.tensor(1.0)
    >>> for event in ("before_loss", "after_loss"):
    ...     _ = engine.run_event(event)
    >>> profiler.seen
    [('start', 'event/loss'), ('finish', 'event/loss'), ('start', 'algorithm/Halve/event/after_loss'), ('finish', 'algorithm/Halve/event/after_loss')]
"""

from __future__ import annotations

import time
from typing import Any, Protocol, runtime_checkable

from composer_bridge.core.event import Event

__all__ = ["CostProfiler", "Marker", "Profiler", "RecordingMarker", "algorithm_marker_name", "callback_marker_name",
           "event_marker_name"]


@runtime_checkable
class Marker(Protocol):
    """A named span: ``start()``/``finish()`` for one that crosses events, or a ``with`` block."""

    def start(self) -> None: ...

    def finish(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> Any: ...


@runtime_checkable
class Profiler(Protocol):
    """Gives the :class:`Marker` of a name; the engine asks once per name and keeps it."""

    def marker(self, name: str) -> Marker: ...


def event_marker_name(event: Event) -> str:
    """``event/<canonical name>``: the span between a ``before_*`` event and its ``after_*``.

    Examples:
        >>> event_marker_name(Event.BEFORE_DATALOADER), event_marker_name(Event.AFTER_FORWARD)
        ('event/dataloader', 'event/forward')
    """
    return f"event/{event.canonical_name}"


def algorithm_marker_name(label: str, event: Event) -> str:
    """``algorithm/<label>/event/<event>``, around one ``apply``.

    Examples:
        >>> algorithm_marker_name("LabelSmoothing", Event.AFTER_LOSS)
        'algorithm/LabelSmoothing/event/after_loss'
    """
    return f"algorithm/{label}/event/{event.value}"


def callback_marker_name(name: str, event: Event) -> str:
    """``callback/<Name>/event/<event>``, around one engine callback's ``run_event``.

    Examples:
        >>> callback_marker_name("SpeedMonitor", Event.BATCH_END)
        'callback/SpeedMonitor/event/batch_end'
    """
    return f"callback/{name}/event/{event.value}"


class RecordingMarker:
    """A marker that appends ``("start", name)`` and ``("finish", name)`` to a list (tests, examples)."""

    __slots__ = ("name", "seen")

    def __init__(self, name: str, seen: list[tuple[str, str]]) -> None:
        self.name = name
        self.seen = seen

    def start(self) -> None:
        self.seen.append(("start", self.name))

    def finish(self) -> None:
        self.seen.append(("finish", self.name))

    def __enter__(self) -> RecordingMarker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


class _CostMarker:
    """Adds, at ``finish()``, the seconds since the profiler's last clock read (times its weight) to one cost entry.

    One clock read per ``apply``: the engine starts a timed run with :meth:`CostProfiler.begin_run`,
    and each ``finish()`` laps from the previous one, so the time between two ``apply`` calls of one
    event (the engine's bookkeeping for an algorithm) is charged to the second. ``start()`` reads
    nothing; it is the builtin ``tuple``, a C call that makes no Python frame (the engine calls it at
    every timed ``apply``). Used alone, ``with marker:`` times its block.
    """

    __slots__ = ("cell", "profiler")
    start = staticmethod(tuple)  # see the class docstring: the lap starts at the previous finish

    def __init__(self, cell: list[float], profiler: CostProfiler) -> None:
        self.cell = cell
        self.profiler = profiler

    def finish(self) -> None:
        profiler = self.profiler
        now = time.perf_counter()
        self.cell[1] += (now - profiler.last) * profiler.weight
        profiler.last = now

    def __enter__(self) -> _CostMarker:
        self.profiler.last = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


class CostProfiler:
    """The cost report's profiler: each ``algorithm/<label>/event/<event>`` marker adds its seconds to
    ``cost["<label>/<EVENT>"][1]`` (the engine counts the calls, ``[0]``, and chooses which runs to time).

    Args:
        cost: trace key → ``[calls, seconds]``; entries are created as markers are asked for.

    Examples:
        >>> cost = {}
        >>> with CostProfiler(cost).marker("algorithm/EMA/event/batch_end"):
        ...     pass
        >>> list(cost), cost["EMA/BATCH_END"][0]
        (['EMA/BATCH_END'], 0)
    """

    def __init__(self, cost: dict[str, list[float]]) -> None:
        self.cost = cost
        #: what each timed second counts for (the engine sets 8 for a run sampled at one in eight)
        self.weight = 1.0
        #: the clock's last reading (the start of a timed run, or the previous finish)
        self.last = 0.0

    def begin_run(self, weight: float) -> None:
        """A timed run of an event's algorithms starts now; its seconds count ``weight`` times."""
        self.weight = weight
        self.last = time.perf_counter()

    def marker(self, name: str) -> _CostMarker:
        parts = name.split("/")
        if len(parts) != 4 or parts[0] != "algorithm" or parts[2] != "event":
            raise ValueError(f"CostProfiler times algorithms only (algorithm/<label>/event/<event>), not {name!r}.")
        return _CostMarker(self.cost.setdefault(f"{parts[1]}/{Event(parts[3]).name}", [0, 0.0]), self)
