"""The :class:`Engine`: runs algorithms, callbacks and handlers at each event, in a decided order.

At every :meth:`Engine.run_event`:

1. each algorithm in ``state.algorithms`` is asked ``match(event, state)``;
2. the passes order the matched ones (computed once per event and algorithm set, then cached);
3. ``apply`` runs in that order, and a :class:`Trace` is recorded for each, keyed
   ``"<label>/<EVENT>"`` (the label is the class name; ``Name#2``, ``Name#3``... for further
   instances of a class, see :class:`~composer_bridge.core.trace.AlgorithmLabels`);
4. the traces go to the logger; then every engine callback in ``state.callbacks`` runs;
5. then the handlers registered with :meth:`Engine.on` / :meth:`Engine.add_event_handler`.

With a profiler (:mod:`~composer_bridge.core.profiler`), each ``apply`` and each engine callback
runs inside its marker, and a ``before_*``/``after_*`` pair spans ``event/<canonical name>``.

Examples:
    >>> import torch
    >>> from composer_bridge.core import Algorithm, Event, State
    >>> class Double(Algorithm):
    ...     def match(self, event, state):
    ...         return event == Event.AFTER_LOSS
    ...     def apply(self, event, state, logger):
    ...         state.loss = state.loss * 2
    >>> state = State(torch.nn.Linear(1, 1), algorithms=[Double()])
    >>> engine = Engine(state)
    >>> state.loss = torch.tensor(1.5)
    >>> traces = engine.run_event("after_loss")
    >>> list(traces), state.loss.item()
    (['Double/AFTER_LOSS'], 3.0)
    >>> seen = []
    >>> handle = engine.add_event_handler(Event.BATCH_END, lambda state, event: seen.append(event.name))
    >>> _ = engine.run_event(Event.BATCH_END)
    >>> seen
    ['BATCH_END']
    >>> handle.remove()
    >>> engine.close()
"""

from __future__ import annotations

import logging
import operator
import random
from collections.abc import Callable
from typing import Any, NamedTuple

from composer_bridge.core.algorithm import Algorithm, AlgorithmError
from composer_bridge.core.event import Event, EventFilter, EventList, _check_arity
from composer_bridge.core.logger import Logger
from composer_bridge.core.passes import DEFAULT_PASSES, AlgorithmPass, normalize_passes
from composer_bridge.core.profiler import (
    CostProfiler,
    Marker,
    Profiler,
    algorithm_marker_name,
    callback_marker_name,
    event_marker_name,
)
from composer_bridge.core.state import State
from composer_bridge.core.trace import MAX_CACHED_PLANS, AlgorithmLabels, PlanTraces, Trace, Traces, trace_key

__all__ = ["Engine", "RemovableEventHandle", "resolve_passes"]

log = logging.getLogger(__name__)

Handler = Callable[..., Any]
# measure_cost times the first runs of each plan in full, then a random eighth of its runs, each
# weighted by 8: an unbiased estimate of the total at an eighth of the clock reads.
_TIMED_IN_FULL = 64
_SAMPLED_FRACTION = 0.125
# event -> (its span's marker name, whether it opens the span): the before/after pairs only
_EVENT_SPANS: dict[Event, tuple[str, bool]] = {
    event: (event_marker_name(event), event.is_before_event)
    for event in Event
    if event.is_before_event or event.is_after_event
}


class _Handler(NamedTuple):
    """One registration of :meth:`Engine.add_event_handler`: call ``handler(state, event, *args, **kwargs)``
    when ``event_filter`` (``None``: always) allows it."""

    event_filter: EventFilter | None
    handler: Handler
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class RemovableEventHandle:
    """Returned by :meth:`Engine.add_event_handler`; ``remove()`` unregisters the handler (also a context manager)."""

    def __init__(self, engine: Engine, entries: list[tuple[Event, _Handler]]) -> None:
        self._engine = engine
        self._entries = entries

    def remove(self) -> None:
        """Unregister the handler from every event it was added to. Safe to call twice."""
        for event, entry in self._entries:
            handlers = self._engine._handlers.get(event, [])
            if any(e is entry for e in handlers):
                handlers[:] = [e for e in handlers if e is not entry]
                if not handlers:  # no empty lists left behind: has_listeners reads the dict's size
                    del self._engine._handlers[event]
        self._entries = []

    def __enter__(self) -> RemovableEventHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class _Plan:
    """The cached order of one (event, matched algorithms), with everything the run loop reuses."""

    __slots__ = ("matched", "algorithms", "keys", "traces", "names", "cells", "cells_of", "cost_markers", "runs",
                 "counted", "profiled", "profiled_by", "both", "both_of")

    def __init__(self, matched: list[Algorithm], ordered: list[Algorithm], event: Event, labels: list[str]) -> None:
        self.matched = matched  # the algorithms that matched, in the run's order (the cache key)
        self.algorithms = ordered
        self.keys = [trace_key(label, event) for label in labels]
        # The trace of an ``apply`` that returns None is the same every time: build them once here.
        self.traces = PlanTraces(
            (key, Trace(label, event, None, i, True)) for i, (label, key) in enumerate(zip(labels, self.keys, strict=True))
        )
        #: each algorithm's marker name (``algorithm/<label>/event/<event>``)
        self.names = [algorithm_marker_name(label, event) for label in labels]
        #: The ``[calls, seconds]`` entries of the cost dict ``cells_of`` that each algorithm adds to,
        #: and the cost profiler's markers that time into them.
        self.cells: list[list[float]] = []
        self.cells_of: dict[str, list[float]] | None = None
        self.cost_markers: list[Marker] = []
        # the markers of the profiler ``profiled_by``, and those paired with the cost markers
        self.profiled: list[Marker] = []
        self.profiled_by: Profiler | None = None
        self.both: list[Marker] = []
        self.both_of: tuple[Profiler, list[Marker]] | None = None
        # Runs with cost measurement on, and how many of them the cells' call counts include: calls
        # are added up in fold_calls (when the cost is read), not one increment per apply.
        self.runs = 0
        self.counted = 0

    def find_cost_markers(self, profiler: CostProfiler) -> list[Marker]:
        cost = profiler.cost
        if self.cells_of is not cost or not cost:  # a new or cleared cost dict: find the entries again
            if self.cells_of is not cost:
                self.fold_calls()  # the runs so far belong to the previous dict
            markers = [profiler.marker(name) for name in self.names]
            self.cost_markers = markers  # type: ignore[assignment]
            self.cells = [marker.cell for marker in markers]
            self.cells_of = cost
            self.counted = self.runs  # (a cleared dict drops the runs before the clear)
        return self.cost_markers

    def markers_of(self, profiler: Profiler) -> list[Marker]:
        """The profiler's marker of each algorithm (asked once per profiler)."""
        if self.profiled_by is not profiler:
            self.profiled = [profiler.marker(name) for name in self.names]
            self.profiled_by = profiler
        return self.profiled

    def paired(self, profiler: Profiler, cost_markers: list[Marker]) -> list[Marker]:
        """Each algorithm's profiler marker around its cost marker, for a run both time."""
        if self.both_of is None or self.both_of[0] is not profiler or self.both_of[1] is not cost_markers:
            self.both = [_Pair(outer, inner) for outer, inner in zip(self.markers_of(profiler), cost_markers, strict=True)]
            self.both_of = (profiler, cost_markers)
        return self.both

    def fold_calls(self) -> None:
        """Add the runs since the last fold to each of the plan's call counts."""
        pending = self.runs - self.counted
        if pending:
            for cell in self.cells:
                cell[0] += pending
            self.counted = self.runs

    def traces_with(self, exit_codes: dict[int, Any], ran: int | None = None) -> Traces:
        """The traces of the first ``ran`` algorithms (all by default), with the exit codes by position."""
        traces: Traces = {}
        for i, (key, trace) in enumerate(self.traces.items()):
            if ran is not None and i >= ran:
                break
            code = exit_codes.get(i)
            traces[key] = trace if code is None else Trace(trace.name, trace.event, code, trace.order, True)
        return traces


class _Pair:
    """A profiler's marker around the cost report's: one run timed by both."""

    __slots__ = ("outer", "inner")

    def __init__(self, outer: Marker, inner: Marker) -> None:
        self.outer = outer
        self.inner = inner

    def start(self) -> None:
        self.outer.start()
        self.inner.start()

    def finish(self) -> None:
        self.inner.finish()
        self.outer.finish()

    def __enter__(self) -> _Pair:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


def _insert_pass(passes: list[AlgorithmPass], algorithm_pass: AlgorithmPass, index: int) -> None:
    if not callable(algorithm_pass) or isinstance(index, bool) or not isinstance(index, int):
        raise ValueError(
            f"register_pass({algorithm_pass!r}, index={index!r}): expected one pass (a callable "
            "(algorithms, event) -> list of algorithms) and an int index; call it once per pass."
        )
    if index == -1:
        passes.append(algorithm_pass)
    else:
        passes.insert(index, algorithm_pass)


def resolve_passes(algorithm_passes: Any = None) -> list[AlgorithmPass]:
    """The passes an :class:`Engine` built with ``algorithm_passes`` runs, in order, without building one.

    Examples:
        >>> from composer_bridge.core.passes import DEFAULT_PASSES
        >>> resolve_passes() == list(DEFAULT_PASSES)
        True
    """
    passes: list[AlgorithmPass] = list(DEFAULT_PASSES)
    for algorithm_pass, index in normalize_passes(algorithm_passes):
        _insert_pass(passes, algorithm_pass, index)
    return passes

class Engine:
    """Coordinates algorithms, engine callbacks and handlers over a :class:`State`.

    Args:
        state: the state algorithms read and change; its ``algorithms`` and ``callbacks`` are
            read at every event, so they may change during a run.
        logger: where traces and metrics go (a :class:`Logger` with no destination if omitted).
        algorithm_passes: extra passes, merged after the default ones: a pass, a ``(pass, index)``
            pair (tuple or two-item list, as Composer accepts), or a list of these (see
            :mod:`composer_bridge.core.passes`). Unlike the defaults, these passes are also asked
            at events where no algorithm matched (with an empty list), as in Composer.
        measure_cost: count every ``apply`` call and time a sample of them into :attr:`cost`.
        profiler: records Composer's markers (see :mod:`~composer_bridge.core.profiler`); ``None``:
            none, at the cost of one attribute check per event. May be set later (:attr:`profiler`).
    """

    def __init__(
        self,
        state: State,
        logger: Logger | None = None,
        algorithm_passes: Any = None,
        *,
        measure_cost: bool = False,
        profiler: Profiler | None = None,
    ) -> None:
        if not isinstance(state, State):
            raise TypeError(f"Engine needs a composer_bridge.State, got {type(state).__name__}: {state!r}.")
        self.state = state
        self.logger = logger if logger is not None else Logger()
        self._passes: list[AlgorithmPass] = list(DEFAULT_PASSES)
        # (event, ids of the matched algorithms) -> their order, trace keys, traces and cost entries
        self._order_cache: dict[tuple[Event, tuple[int, ...]], _Plan] = {}
        # event -> the plan it ran last: the usual case (the same algorithms match as last time) is
        # found by comparing the matched list with that plan's by identity, without building a key.
        self._last_plan: dict[Event, _Plan] = {}
        self._handlers: dict[Event, list[_Handler]] = {}
        # Whether passes beyond the defaults are registered: they see every event, even one where no
        # algorithm matched (as in Composer); the default passes have nothing to do then.
        self._user_passes = False
        self._labels = AlgorithmLabels()
        self._closed = False
        self.measure_cost = measure_cost
        self._cost: dict[str, list[float]] = {}
        self._cost_profiler = CostProfiler(self._cost)  # the cost report's timings are markers too
        self._sample = random.Random(0).random  # private: never touches the global random state
        self._profiler: Profiler | None = None
        self._span_markers: dict[str, Marker] = {}  # event span name -> the profiler's marker
        self._open_spans: set[str] = set()
        self._callback_markers: dict[tuple[int, Event], Marker] = {}
        self.profiler = profiler
        #: Called with no argument after a handler is added (a loop that skips events while nothing
        #: listens, see :meth:`has_listeners`, learns here that something does).
        self.on_handler_added: Callable[[], None] | None = None
        for algorithm_pass, index in normalize_passes(algorithm_passes):
            self.register_pass(algorithm_pass, index)

    @property
    def cost(self) -> dict[str, list[float]]:
        """``trace key`` → ``[calls, total seconds in apply]``, filled when ``measure_cost`` is on.

        Calls are exact. Seconds are measured on the first 64 runs of each (event, algorithms) plan,
        then on a random eighth of its runs weighted by 8: an unbiased estimate of the total for an
        eighth of the clock reads. The time between two ``apply`` calls of one event is charged to
        the second: the engine's own bookkeeping for an algorithm counts as part of its cost. They
        are measured with the markers of a :class:`~composer_bridge.core.profiler.CostProfiler`,
        where a :attr:`profiler`'s markers are (inside them when both time a run).
        """
        self._fold_calls()
        return self._cost

    @cost.setter
    def cost(self, value: dict[str, list[float]]) -> None:
        self._fold_calls()
        self._cost = value
        self._cost_profiler = CostProfiler(value)

    @property
    def profiler(self) -> Profiler | None:
        """The profiler whose markers the engine records (``None``: none). Setting another closes the
        open event spans on the previous one."""
        return self._profiler

    @profiler.setter
    def profiler(self, profiler: Profiler | None) -> None:
        if profiler is not None and not callable(getattr(profiler, "marker", None)):
            raise TypeError(f"Engine(profiler={profiler!r}): a profiler has a marker(name) method (see core.profiler).")
        self._close_spans()
        self._profiler = profiler
        self._span_markers.clear()
        self._callback_markers.clear()

    def _fold_calls(self) -> None:
        for plan in self._order_cache.values():
            plan.fold_calls()

    def _forget_plans(self) -> None:
        self._fold_calls()
        self._order_cache.clear()
        self._last_plan.clear()

    # --- passes and ordering ------------------------------------------------------------------
    @property
    def passes(self) -> list[AlgorithmPass]:
        """The passes, in the order they run (defaults first, then the registered ones)."""
        return list(self._passes)

    def register_pass(self, algorithm_pass: AlgorithmPass, index: int = -1) -> None:
        """Add a pass at ``index`` (``-1``: the end) and forget the cached orders."""
        _insert_pass(self._passes, algorithm_pass, index)
        self._user_passes = True
        self._forget_plans()

    def order(self, algorithms: list[Algorithm], event: Event | str) -> list[Algorithm]:
        """The order in which ``algorithms`` would run at ``event`` after the passes."""
        event = Event(event)
        return list(self._plan(algorithms, event).algorithms)

    def _plan(self, matched: list[Algorithm], event: Event) -> _Plan:
        key = (event, tuple(map(id, matched)))
        plan = self._order_cache.get(key)
        if plan is None:
            ordered = list(matched)
            for algorithm_pass in self._passes:
                result = algorithm_pass(ordered, event)
                _check_pass_result(algorithm_pass, ordered, result)
                ordered = result
            # Labels follow the run's list (``Name``, ``Name#2``...), not the order of this event.
            self._labels.add(self.state.algorithms)
            plan = _Plan(list(matched), ordered, event, [self._labels[a] for a in ordered])
            if len(self._order_cache) >= MAX_CACHED_PLANS:
                self._forget_plans()
            self._order_cache[key] = plan
        return plan

    # --- running ------------------------------------------------------------------------------
    def run_event(self, event: Event | str) -> Traces:
        """Run every matching algorithm, then the engine callbacks, then the handlers for ``event``.

        Returns the traces of the algorithms that ran, keyed ``"<label>/<EVENT_NAME>"`` where the
        label is the class name (``Name#2``, ``Name#3``... for further instances of a class).
        An algorithm that raises is reported as :class:`AlgorithmError` naming it and the event.
        """
        traces = self.fire(event)
        return dict(traces) if type(traces) is PlanTraces else traces  # a copy the caller may keep

    def fire(self, event: Event | str) -> Traces:
        """:meth:`run_event` for a loop that ignores the result: the traces returned may be the
        engine's own cached object (read-only), not a copy: no copy per event for a loop that fires many."""
        if self._closed:
            raise RuntimeError(
                f"Engine.run_event({event!r}) after close(): the engine is shut down; create a new Engine."
            )
        if type(event) is not Event:
            event = Event(event)
        state = self.state
        algorithms = state._algorithms  # not the property: this runs a dozen times per step
        profiler = self._profiler
        if profiler is None and not (algorithms or state.callbacks or self._handlers or self._user_passes):
            return {}  # nothing listens (no algorithm, callback, handler or pass): skip the bookkeeping below
        span = _EVENT_SPANS.get(event) if profiler is not None else None
        if span is not None and not span[1]:
            self._close_span(span[0])  # an after-event: its span ends where its own run starts
        traces = self._run_algorithms(event, state, algorithms) if algorithms or self._user_passes else {}
        if profiler is None:
            for callback in state.callbacks:
                callback.run_event(event, state, self.logger)
        else:
            for callback in state.callbacks:
                with self._callback_marker(callback, event):
                    callback.run_event(event, state, self.logger)
        if span is not None and span[1]:
            self._open_span(span[0])  # a before-event: its span starts where its own run ends
        handlers = self._handlers.get(event)
        if handlers:
            for entry in tuple(handlers):  # a copy: a handler may remove itself
                if entry.event_filter is None or entry.event_filter(state):
                    if entry.args or entry.kwargs:
                        entry.handler(state, event, *entry.args, **entry.kwargs)
                    else:  # the common case, without building an argument tuple and dict
                        entry.handler(state, event)
        return traces

    def _run_algorithms(self, event: Event, state: State, algorithms: list[Algorithm]) -> Traces:
        """Match, order (a cached plan), ``apply`` in that order (the one apply loop), log the traces."""
        matched = [a for a in algorithms if a.match(event, state)]
        if not matched and not self._user_passes:
            return {}
        plan = self._last_plan.get(event)
        if plan is None or len(plan.matched) != len(matched) or not all(map(operator.is_, matched, plan.matched)):
            plan = self._order_cache.get((event, tuple(map(id, matched))))
            if plan is None:
                plan = self._plan(matched, event)
            self._last_plan[event] = plan
        if not plan.algorithms:
            return {}
        logger = self.logger
        measuring = self.measure_cost
        # The one timing path: a run is timed (for the cost report, the profiler, or both) with one
        # marker per algorithm around its apply, or not at all.
        markers: list[Marker] | None = None
        if measuring:
            # Calls: this run counts once for every algorithm of the plan (fold_calls adds them up when
            # the cost is read; a failing run takes back what did not run). Time: see ``cost``.
            cost_profiler = self._cost_profiler
            cost_markers = plan.cost_markers if plan.cells_of is cost_profiler.cost and cost_profiler.cost \
                else plan.find_cost_markers(cost_profiler)
            plan.runs += 1
            if plan.runs <= _TIMED_IN_FULL:
                cost_profiler.begin_run(1.0)
                markers = cost_markers
            elif self._sample() < _SAMPLED_FRACTION:
                cost_profiler.begin_run(1.0 / _SAMPLED_FRACTION)
                markers = cost_markers
        profiler = self._profiler
        if profiler is not None:
            markers = plan.markers_of(profiler) if markers is None else plan.paired(profiler, markers)
        exit_codes: dict[int, Any] | None = None
        algorithm = None
        marks = iter(markers) if markers is not None else None  # each algorithm's marker, in order
        try:
            for algorithm in plan.algorithms:
                if marks is None:
                    exit_code = algorithm.apply(event, state, logger)
                else:
                    marker = next(marks)
                    marker.start()
                    exit_code = algorithm.apply(event, state, logger)
                    marker.finish()
                if exit_code is not None:
                    exit_codes = _add_exit_code(exit_codes, plan, algorithm, exit_code)
        except Exception as error:
            ran = _position(plan, algorithm)
            if markers is not None:
                markers[ran].finish()  # the failing apply's span ends with it
            if measuring:
                for cell in plan.cells[ran:]:  # the failing algorithm and those after it did not complete
                    cell[0] -= 1
            if ran:
                logger.log_traces(plan.traces_with(exit_codes or {}, ran))
            raise AlgorithmError(algorithm, event, error) from error  # type: ignore[arg-type]
        if exit_codes is None:
            # The plan's own traces go to the logger (the same object each time this plan runs,
            # which lets destinations cache per plan); run_event hands its caller a copy.
            logger.log_traces(plan.traces)
            return plan.traces
        traces = plan.traces_with(exit_codes)
        logger.log_traces(traces)
        return traces

    def run_marker_only_event(self, event: Event | str) -> None:
        """Record ``event``'s span marker without running anything (only with a :attr:`profiler`).

        A ``before_*`` event opens its ``event/<canonical name>`` span, an ``after_*`` one closes it
        (if open): the dataloader's span, opened before a batch is waited for, is closed this way at an
        epoch's end, where no batch comes and ``AFTER_DATALOADER`` never runs. Other events do nothing.
        """
        if type(event) is not Event:
            event = Event(event)
        span = _EVENT_SPANS.get(event) if self._profiler is not None else None
        if span is not None:
            if span[1]:
                self._open_span(span[0])
            else:
                self._close_span(span[0])

    def _open_span(self, name: str) -> None:
        if name in self._open_spans:  # opened by a marker-only event: it keeps its start
            return
        marker = self._span_markers.get(name)
        if marker is None:
            marker = self._span_markers[name] = self._profiler.marker(name)  # type: ignore[union-attr]
        marker.start()
        self._open_spans.add(name)

    def _close_span(self, name: str) -> None:
        if name in self._open_spans:  # an after-event whose before-event opened nothing does nothing
            self._open_spans.discard(name)
            self._span_markers[name].finish()

    def _close_spans(self) -> None:
        for name in list(self._open_spans):
            self._close_span(name)

    def _callback_marker(self, callback: Any, event: Event) -> Marker:
        key = (id(callback), event)
        marker = self._callback_markers.get(key)
        if marker is None:
            name = callback_marker_name(type(callback).__name__, event)
            marker = self._callback_markers[key] = self._profiler.marker(name)  # type: ignore[union-attr]
        return marker

    def has_listeners(self) -> bool:
        """Whether :meth:`run_event` could do anything: an algorithm, engine callback, handler or registered pass.

        The Lightning bridge reads this between steps to skip its per-step events while nothing listens.
        """
        state = self.state
        return bool(state._algorithms or state.callbacks or self._user_passes or self._handlers)

    def close(self) -> None:
        """Shut down: every callback's ``close``, then ``post_close`` for those whose ``close`` did not raise.

        Errors are logged, never re-raised, so one failing callback cannot stop the others from
        closing. Calling ``close`` again does nothing.
        """
        if self._closed:
            return
        self._closed = True
        self._fold_calls()  # the cost is complete once the engine is closed
        self._close_spans()  # no span is left open in the profiler
        closed_cleanly = []
        for callback in self.state.callbacks:
            try:
                callback.close(self.state, self.logger)
            except Exception:
                log.exception("Error in %s.close(); its post_close() will not run.", type(callback).__name__)
            else:
                closed_cleanly.append(callback)
        for callback in closed_cleanly:
            try:
                callback.post_close()
            except Exception:
                log.exception("Error in %s.post_close().", type(callback).__name__)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._closed

    # --- handlers (Ignite style) ---------------------------------------------------------------
    def add_event_handler(
        self, event: Event | str | EventFilter | EventList, handler: Handler, *args: Any, **kwargs: Any
    ) -> RemovableEventHandle:
        """Call ``handler(state, event, *args, **kwargs)`` at ``event`` (an event, a filter or a list).

        Example: ``engine.add_event_handler(Event.BATCH_END(every=100), save, "ckpt.pt")``.
        """
        if not callable(handler):
            raise TypeError(f"handler must be callable, got {handler!r} ({type(handler).__name__}).")
        _check_arity(handler, 2, "add_event_handler", "(state, event, *args, **kwargs)", *args, **kwargs)
        entries = []
        for item in _as_items(event):
            if isinstance(item, EventFilter):
                # A fresh filter per registration keeps occurrence counters independent.
                target, event_filter = item.event, _copy_filter(item)
            else:
                target, event_filter = item, None
            entry = _Handler(event_filter, handler, args, kwargs)
            self._handlers.setdefault(target, []).append(entry)
            entries.append((target, entry))
        if self.on_handler_added is not None:
            self.on_handler_added()
        return RemovableEventHandle(self, entries)

    def on(self, event: Event | str | EventFilter | EventList, *args: Any, **kwargs: Any) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`add_event_handler`::

            @engine.on(Event.EPOCH_END(every=2))
            def report(state, event): ...
        """

        def register(handler: Handler) -> Handler:
            self.add_event_handler(event, handler, *args, **kwargs)
            return handler

        return register

    def has_event_handler(self, handler: Handler, event: Event | str | None = None) -> bool:
        """Whether ``handler`` is registered (for ``event``, or for any event)."""
        events = [Event(event)] if event is not None else list(self._handlers)
        return any(
            entry.handler is handler or entry.handler == handler for e in events for entry in self._handlers.get(e, [])
        )

    def remove_event_handler(self, handler: Handler, event: Event | str) -> None:
        """Unregister ``handler`` from ``event``; raises ``ValueError`` if it was not registered there."""
        event = Event(event)
        handlers = self._handlers.get(event, [])
        kept = [entry for entry in handlers if not (entry.handler is handler or entry.handler == handler)]
        if len(kept) == len(handlers):
            raise ValueError(f"{handler!r} is not registered for Event.{event.name}.")
        handlers[:] = kept
        if not kept:
            del self._handlers[event]


def _as_items(event: Any) -> list[Event | EventFilter]:
    if isinstance(event, EventList):
        return list(event.items)
    if isinstance(event, EventFilter):
        return [event]
    if isinstance(event, (Event, str)):
        return [Event(event)]
    raise ValueError(
        f"Cannot listen to {event!r} ({type(event).__name__}): pass an Event, its name, a filter such as "
        "Event.BATCH_END(every=10), or events joined with |."
    )


def _position(plan: _Plan, algorithm: Algorithm | None) -> int:
    return next((i for i, a in enumerate(plan.algorithms) if a is algorithm), 0)


def _add_exit_code(exit_codes: dict[int, Any] | None, plan: _Plan, algorithm: Algorithm, code: Any) -> dict[int, Any]:
    exit_codes = {} if exit_codes is None else exit_codes
    exit_codes[_position(plan, algorithm)] = code
    return exit_codes


def _copy_filter(f: EventFilter) -> EventFilter:
    return EventFilter(f.event, event_filter=f.event_filter, every=f.every, once=f.once, before=f.before, after=f.after)


def _check_pass_result(algorithm_pass: AlgorithmPass, given: list[Algorithm], result: Any) -> None:
    name = getattr(algorithm_pass, "__qualname__", repr(algorithm_pass))
    if not isinstance(result, list):
        raise TypeError(
            f"Algorithm pass {name} returned {type(result).__name__} ({result!r}); a pass must return a list "
            "holding the algorithms it was given, reordered."
        )
    if len(result) != len(given) or {id(a) for a in result} != {id(a) for a in given}:
        raise ValueError(
            f"Algorithm pass {name} returned {result!r} for {given!r}: a pass may reorder algorithms but "
            "must not add, drop or duplicate any."
        )

