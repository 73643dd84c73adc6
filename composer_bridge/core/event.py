"""Training-loop events, and Ignite-style filters over them.

An :class:`Event` names a moment of the training loop. Algorithms ``match`` on events; handlers
registered with :meth:`~composer_bridge.core.engine.Engine.on` listen to events or to filtered
events::

    >>> Event("before_loss") is Event("BEFORE_LOSS") is Event.BEFORE_LOSS
    True
    >>> Event.AFTER_LOSS.is_after_event, Event.AFTER_LOSS.canonical_name
    (True, 'loss')
    >>> f = Event.BATCH_END(every=100)
    >>> f.event is Event.BATCH_END
    True

Filters count with the counter that is natural for their event (see :func:`event_counter`).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Collection, Iterable
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from composer_bridge.core.state import State

__all__ = ["Event", "EventFilter", "EventList", "event_counter"]


class Event(str, Enum):
    """The 40 events of Composer's training loop, in Composer's order.

    The value of each member is its lowercase name. Look-up works by member, name or value in
    any case; an unknown name raises :class:`ValueError` that lists the closest names.

    Calling a member builds an :class:`EventFilter` (``Event.BATCH_END(every=10)``) and ``|``
    joins events and filters into an :class:`EventList`.

    Examples:
        >>> Event("Batch_End") is Event.BATCH_END
        True
        >>> [e.name for e in (Event.BEFORE_LOSS | Event.AFTER_LOSS)]
        ['BEFORE_LOSS', 'AFTER_LOSS']
    """

    INIT = "init"
    BEFORE_LOAD = "before_load"
    AFTER_LOAD = "after_load"
    FIT_START = "fit_start"
    ITERATION_START = "iteration_start"
    EPOCH_START = "epoch_start"
    BEFORE_DATALOADER = "before_dataloader"
    AFTER_DATALOADER = "after_dataloader"
    BATCH_START = "batch_start"
    BEFORE_TRAIN_BATCH = "before_train_batch"
    BEFORE_FORWARD = "before_forward"
    AFTER_FORWARD = "after_forward"
    BEFORE_LOSS = "before_loss"
    AFTER_LOSS = "after_loss"
    BEFORE_BACKWARD = "before_backward"
    AFTER_BACKWARD = "after_backward"
    AFTER_TRAIN_BATCH = "after_train_batch"
    BATCH_END = "batch_end"
    BATCH_CHECKPOINT = "batch_checkpoint"
    EPOCH_END = "epoch_end"
    EPOCH_CHECKPOINT = "epoch_checkpoint"
    ITERATION_END = "iteration_end"
    ITERATION_CHECKPOINT = "iteration_checkpoint"
    FIT_END = "fit_end"
    EVAL_BEFORE_ALL = "eval_before_all"
    EVAL_START = "eval_start"
    EVAL_BATCH_START = "eval_batch_start"
    EVAL_BEFORE_FORWARD = "eval_before_forward"
    EVAL_AFTER_FORWARD = "eval_after_forward"
    EVAL_BATCH_END = "eval_batch_end"
    EVAL_END = "eval_end"
    EVAL_AFTER_ALL = "eval_after_all"
    EVAL_STANDALONE_START = "eval_standalone_start"
    EVAL_STANDALONE_END = "eval_standalone_end"
    PREDICT_START = "predict_start"
    PREDICT_BATCH_START = "predict_batch_start"
    PREDICT_BEFORE_FORWARD = "predict_before_forward"
    PREDICT_AFTER_FORWARD = "predict_after_forward"
    PREDICT_BATCH_END = "predict_batch_end"
    PREDICT_END = "predict_end"

    @classmethod
    def _missing_(cls, value: object) -> Event:
        if isinstance(value, str):
            member = cls.__members__.get(value.strip().upper())
            if member is not None:
                return member
            close = difflib.get_close_matches(value.strip().upper(), list(cls.__members__), n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ValueError(
                f"Unknown event {value!r}.{hint} Events are named as in Composer "
                f"(e.g. 'BATCH_END' or 'batch_end'); see list(composer_bridge.Event)."
            )
        raise ValueError(
            f"Cannot look up an Event from {value!r} of type {type(value).__name__}: "
            "pass an Event member or its name as a string, e.g. Event.BATCH_END or 'batch_end'."
        )

    def __str__(self) -> str:
        return self.value

    @property
    def is_before_event(self) -> bool:
        """Whether this event opens a before/after pair: ``BEFORE_*``, ``EVAL_BEFORE_*`` or ``*_START``.

        As in Composer, ``FIT_START``, ``EPOCH_START``, ``BATCH_START``, ``EVAL_START`` ... count.
        """
        value = self.value
        return value.startswith("before_") or "_before_" in value or value.endswith("_start")

    @property
    def is_after_event(self) -> bool:
        """Whether this event closes a before/after pair: ``AFTER_*``, ``EVAL_AFTER_*`` or ``*_END``.

        As in Composer, the default passes reverse the algorithm order on these (``BATCH_END``,
        ``EPOCH_END``, ``FIT_END``, ... included).
        """
        value = self.value
        return value.startswith("after_") or "_after_" in value or value.endswith("_end")

    @property
    def canonical_name(self) -> str:
        """The name shared by both halves of a pair, as in Composer: the value without ``before_``,
        ``after_``, ``_start`` and ``_end`` (``AFTER_LOSS`` → ``'loss'``, ``EPOCH_END`` → ``'epoch'``,
        ``EVAL_BEFORE_ALL`` → ``'eval_all'``)."""
        name = self.value
        for marker in ("before_", "after_", "_start", "_end"):
            name = name.replace(marker, "")
        return name

    @property
    def is_eval(self) -> bool:
        """Whether the event belongs to evaluation (``EVAL_*``)."""
        return self.value.startswith("eval_")

    @property
    def is_predict(self) -> bool:
        """Whether the event belongs to prediction (``PREDICT_*``)."""
        return self.value.startswith("predict_")

    def __call__(
        self,
        event_filter: Callable[[State, Event], bool] | None = None,
        *,
        every: int | None = None,
        once: int | Collection[int] | None = None,
        before: int | None = None,
        after: int | None = None,
    ) -> EventFilter:
        """Build a filter on this event, as Ignite's ``Events.X(every=...)`` does."""
        return EventFilter(self, event_filter=event_filter, every=every, once=once, before=before, after=after)

    def __or__(self, other: object) -> EventList:  # type: ignore[override]
        return EventList(self) | other

    def __ror__(self, other: object) -> EventList:
        return EventList(other) | self  # type: ignore[arg-type]

    __hash__ = str.__hash__


# Which counter a filter on an event uses, and whether the loop has already advanced it when the
# event fires. The bridge advances ``timestamp.batch`` between AFTER_TRAIN_BATCH and BATCH_END and
# ``timestamp.epoch`` before EPOCH_END, as Composer does; the counters below are therefore the
# 1-based number of the step (epoch, eval batch) the event belongs to.
_BEFORE_INCREMENT = 1
_AFTER_INCREMENT = 0
_STEP_EVENTS_BEFORE = (
    Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_TRAIN_BATCH,
    Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS,
    Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH,
)
_COUNTERS: dict[Event, tuple[str, str, int]] = {
    **{e: ("timestamp", "batch", _BEFORE_INCREMENT) for e in _STEP_EVENTS_BEFORE},
    Event.BATCH_END: ("timestamp", "batch", _AFTER_INCREMENT),
    Event.BATCH_CHECKPOINT: ("timestamp", "batch", _AFTER_INCREMENT),
    Event.EPOCH_START: ("timestamp", "epoch", _BEFORE_INCREMENT),
    Event.EPOCH_END: ("timestamp", "epoch", _AFTER_INCREMENT),
    Event.EPOCH_CHECKPOINT: ("timestamp", "epoch", _AFTER_INCREMENT),
    Event.ITERATION_START: ("timestamp", "iteration", _BEFORE_INCREMENT),
    Event.ITERATION_END: ("timestamp", "iteration", _AFTER_INCREMENT),
    Event.ITERATION_CHECKPOINT: ("timestamp", "iteration", _AFTER_INCREMENT),
    **{
        e: ("eval_timestamp", "batch", _BEFORE_INCREMENT)
        for e in (Event.EVAL_BATCH_START, Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD,
                  Event.PREDICT_BATCH_START, Event.PREDICT_BEFORE_FORWARD, Event.PREDICT_AFTER_FORWARD)
    },
    Event.EVAL_BATCH_END: ("eval_timestamp", "batch", _AFTER_INCREMENT),
    Event.PREDICT_BATCH_END: ("eval_timestamp", "batch", _AFTER_INCREMENT),
}


def event_counter(event: Event, state: State) -> int | None:
    """The 1-based count a filter on ``event`` compares against, or ``None`` for occurrence counting.

    - training-step events (``BEFORE_DATALOADER`` … ``BATCH_CHECKPOINT``): the optimizer step
      the event belongs to (``timestamp.batch``, counted from 1);
    - epoch events: the epoch, from 1; iteration events: the iteration, from 1;
    - eval and predict batch events: the batch within the current evaluation or prediction, from 1;
    - every other event (``INIT``, ``FIT_START``, ``EVAL_START``, ...): ``None``, meaning the
      filter counts how many times the event has fired (from 1).

    Examples:
        >>> import torch
        >>> from composer_bridge.core.state import State
        >>> state = State(torch.nn.Linear(1, 1))
        >>> event_counter(Event.BATCH_START, state), event_counter(Event.INIT, state)
        (1, None)
    """
    spec = _COUNTERS.get(event)
    if spec is None:
        return None
    holder, unit, offset = spec
    return int(getattr(getattr(state, holder), unit).value) + offset


class EventFilter:
    """An event with a condition on its counter, built by calling an event: ``Event.BATCH_END(every=10)``.

    - ``every=n``: fires when the counter is a multiple of ``n``;
    - ``once=n`` or ``once={n, m}``: fires when the counter is one of these;
    - ``before=b`` / ``after=a``: fires while ``a < counter < b`` (either bound may be left out,
      and both combine with ``every``);
    - ``event_filter=fn``: fires when ``fn(state, event)`` is true.

    Examples:
        >>> f = Event.EPOCH_END(once={1, 3})
        >>> f
        Event.EPOCH_END(once=[1, 3])
    """

    __slots__ = ("event", "every", "once", "before", "after", "event_filter", "_occurrences")

    def __init__(
        self,
        event: Event,
        *,
        event_filter: Callable[[State, Event], bool] | None = None,
        every: int | None = None,
        once: int | Collection[int] | None = None,
        before: int | None = None,
        after: int | None = None,
    ) -> None:
        self.event = Event(event)
        given = [name for name, v in (("event_filter", event_filter), ("every", every), ("once", once)) if v is not None]
        if before is not None or after is not None:
            given = [g for g in given if g != "every"] + ["before/after"]
        if not given:
            raise ValueError(
                f"{self.event.name}() needs one of every=, once=, before=/after= or event_filter=; "
                f"to listen to every occurrence pass Event.{self.event.name} itself."
            )
        if len(given) > 1:
            raise ValueError(
                f"{self.event.name}(): {' and '.join(given)} cannot be combined "
                "(only every= combines with before=/after=); register two handlers instead."
            )
        for name, value in (("every", every), ("before", before), ("after", after)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "every" else 0)):
                allowed = "a positive int" if name == "every" else "a non-negative int"
                raise ValueError(f"{self.event.name}({name}={value!r}): {name} must be {allowed}.")
        if once is not None:
            values = [once] if isinstance(once, int) else list(once) if isinstance(once, Iterable) else [once]
            if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
                raise ValueError(
                    f"{self.event.name}(once={once!r}): once must be a positive int or a non-empty "
                    "collection of positive ints (counters start at 1)."
                )
            once = frozenset(values)
        if event_filter is not None:
            if not callable(event_filter):
                raise ValueError(
                    f"{self.event.name}(event_filter={event_filter!r}): event_filter must be a callable "
                    "taking (state, event) and returning a bool."
                )
            _check_arity(event_filter, 2, f"{self.event.name}(event_filter=...)", "(state, event)")
        self.every = every
        self.once = once
        self.before = before
        self.after = after
        self.event_filter = event_filter
        self._occurrences = 0

    def __call__(self, state: State) -> bool:
        """Whether the filter fires now; call once per occurrence of :attr:`event`."""
        if self.event_filter is not None:
            return bool(self.event_filter(state, self.event))
        count = event_counter(self.event, state)
        if count is None:
            self._occurrences += 1
            count = self._occurrences
        if self.once is not None:
            return count in self.once
        if self.before is not None and count >= self.before:
            return False
        if self.after is not None and count <= self.after:
            return False
        return self.every is None or count % self.every == 0

    def __or__(self, other: object) -> EventList:
        return EventList(self) | other

    def __ror__(self, other: object) -> EventList:
        return EventList(other) | self  # type: ignore[arg-type]

    def __repr__(self) -> str:
        parts = []
        for name in ("every", "before", "after"):
            if getattr(self, name) is not None:
                parts.append(f"{name}={getattr(self, name)}")
        if self.once is not None:
            parts.append(f"once={sorted(self.once)}")
        if self.event_filter is not None:
            parts.append(f"event_filter={getattr(self.event_filter, '__name__', self.event_filter)!r}")
        return f"Event.{self.event.name}({', '.join(parts)})"


class EventList:
    """Several events or filters, built with ``|``: ``Event.BATCH_END | Event.EPOCH_END(every=2)``.

    Examples:
        >>> len(Event.FIT_START | Event.FIT_END | Event.EPOCH_END(every=2))
        3
    """

    __slots__ = ("items",)

    def __init__(self, *items: Event | EventFilter | EventList) -> None:
        self.items: list[Event | EventFilter] = []
        for item in items:
            self._add(item)

    def _add(self, item: object) -> None:
        if isinstance(item, EventList):
            self.items.extend(item.items)
        elif isinstance(item, (Event, EventFilter)):
            self.items.append(item)
        elif isinstance(item, str):
            self.items.append(Event(item))
        else:
            raise ValueError(
                f"Cannot join {item!r} of type {type(item).__name__} into an event list: "
                "use Event members, their names, or filters such as Event.BATCH_END(every=10)."
            )

    def __or__(self, other: object) -> EventList:
        joined = EventList(self)
        joined._add(other)
        return joined

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return " | ".join(f"Event.{i.name}" if isinstance(i, Event) else repr(i) for i in self.items)


def _check_arity(fn: Callable[..., Any], n_args: int, what: str, expected: str, *extra: Any, **kwargs: Any) -> None:
    """Raise a clear error now if ``fn`` cannot be called with ``n_args`` positional arguments."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return
    try:
        signature.bind(*([None] * n_args), *extra, **kwargs)
    except TypeError as err:
        raise ValueError(
            f"{what}: {getattr(fn, '__qualname__', fn)!r} has signature {signature}, "
            f"which cannot be called as fn{expected}: {err}."
        ) from None
