"""Traces: the record of which algorithm ran at which event, and in which order.

Each algorithm instance of a run has a *label*: its class name, or ``Name#k`` for the k-th
instance (k ≥ 2) of a class that appears several times. A trace's key is ``"<label>/<EVENT>"``,
so two instances of one class keep separate traces and cost entries.

Examples:
    >>> from composer_bridge.core.event import Event
    >>> Trace("LabelSmoothing", Event.BEFORE_LOSS, None, 0, True)
    Trace(name='LabelSmoothing', event=<Event.BEFORE_LOSS: 'before_loss'>, exit_code=None, order=0, run=True)
    >>> class Code:
    ...     pass
    >>> algorithm_labels([Code(), Code(), object()])
    ['Code', 'Code#2', 'object']
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from composer_bridge.core.event import Event

__all__ = ["MAX_CACHED_PLANS", "AlgorithmLabels", "PlanTraces", "Trace", "Traces", "algorithm_labels", "trace_key"]


@dataclass(slots=True, frozen=True)
class Trace:
    """One algorithm's execution at one event (immutable: the engine reuses equal traces).

    ``name`` is the algorithm's label (its class name; ``Name#2``, ``Name#3``, ... for later
    instances of a class used several times), ``exit_code`` what ``apply`` returned, ``order``
    its position among the algorithms run at this event (``None`` if it did not run).
    """

    name: str = ""
    event: Event | None = None
    exit_code: int | None = None
    order: int | None = None
    run: bool = False


#: What :meth:`Engine.run_event` returns: ``"<label>/<EVENT_NAME>"`` → :class:`Trace`, in run order.
Traces = dict[str, Trace]


#: The most plans the engine caches (it forgets them all when full); a destination caching work per
#: plan uses the same bound, so its cache never outgrows the engine's.
MAX_CACHED_PLANS = 4096


class PlanTraces(dict):  # type: ignore[type-arg]
    """The traces of one cached plan when no ``apply`` returned an exit code.

    The engine hands the same object to its logger each time that plan runs, so a destination
    may cache work per plan (by identity, at most :data:`MAX_CACHED_PLANS`); treat it as read-only.
    """


def trace_key(algorithm_name: str, event: Event) -> str:
    """The key of a trace: ``trace_key('MixUp', Event.BEFORE_LOSS) == 'MixUp/BEFORE_LOSS'``."""
    return f"{algorithm_name}/{event.name}"


class AlgorithmLabels:
    """Gives each algorithm instance a label that stays with it: ``Name``, then ``Name#2``, ``Name#3``...

    Instances are numbered per class in the order they are first :meth:`add`-ed (the engine adds
    ``state.algorithms`` in list order), so the first instance of a class keeps the plain class
    name. The instances are held, so a label is never handed on to a new object at a reused id.

    Examples:
        >>> class Code:
        ...     pass
        >>> first, second = Code(), Code()
        >>> labels = AlgorithmLabels()
        >>> labels.add([first, second])
        >>> labels[second], labels[first]
        ('Code#2', 'Code')
    """

    def __init__(self) -> None:
        self._labels: dict[int, tuple[Any, str]] = {}
        self._per_class: dict[str, int] = {}

    def add(self, algorithms: Iterable[Any]) -> None:
        """Label the instances not labelled yet, in the given order."""
        for algorithm in algorithms:
            if id(algorithm) not in self._labels:
                name = type(algorithm).__name__
                count = self._per_class.get(name, 0) + 1
                self._per_class[name] = count
                self._labels[id(algorithm)] = (algorithm, name if count == 1 else f"{name}#{count}")

    def __getitem__(self, algorithm: Any) -> str:
        entry = self._labels.get(id(algorithm))
        if entry is None:
            self.add((algorithm,))
            entry = self._labels[id(algorithm)]
        return entry[1]


def algorithm_labels(algorithms: Iterable[Any]) -> list[str]:
    """The labels of ``algorithms`` (a run's list, in order): class names, ``Name#k`` for repeats."""
    algorithms = list(algorithms)
    labels = AlgorithmLabels()
    labels.add(algorithms)
    return [labels[a] for a in algorithms]
