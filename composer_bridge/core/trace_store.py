"""The in-memory trace store: every trace of a run by step, per-key totals and a bounded timeline.

Nothing here knows Lightning: any loop that runs an :class:`~composer_bridge.core.engine.Engine` can
record its traces in a :class:`TraceStore` (it is a logger destination: it has ``log_traces``).
The Lightning bridge keeps one per callback (``callback.traces``).

Example:
    >>> from composer_bridge.core.event import Event
    >>> from composer_bridge.core.trace import Trace
    >>> store = TraceStore()
    >>> store.log_traces({"LayerFreezing/EPOCH_END": Trace("LayerFreezing", Event.EPOCH_END, None, 0, True)}, step=3)
    >>> store.keys_at(3), store.stats["LayerFreezing/EPOCH_END"].count
    (['LayerFreezing/EPOCH_END'], 1)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from composer_bridge.core.trace import PlanTraces, Trace, Traces, trace_key

__all__ = ["Timeline", "TraceStats", "TraceStore"]


@dataclass
class TraceStats:
    """What one trace key did over the run: how often, first and last step, positions it ran at."""

    count: int = 0
    first_step: int = 0
    last_step: int = 0
    orders: set[int] = field(default_factory=set)
    last_exit_code: int | None = None


class Timeline:
    """Which trace keys ran in which steps, in bounded memory.

    Steps are counted in columns of ``bin_size`` steps; when a step falls beyond
    ``max_columns * bin_size``, neighbouring columns merge and ``bin_size`` doubles, so a
    20,000-step run takes no more memory than a 2,000-step one.

    Example:
        >>> timeline = Timeline(max_columns=4)
        >>> for step in range(10):
        ...     timeline.add("A/BATCH_END", step)
        >>> timeline.bin_size, timeline.rows["A/BATCH_END"]
        (4, [4, 4, 2])
    """

    def __init__(self, max_columns: int = 1024) -> None:
        if not isinstance(max_columns, int) or max_columns < 2:
            raise ValueError(f"Timeline(max_columns={max_columns!r}): max_columns must be an int >= 2.")
        self.max_columns = max_columns
        self.bin_size = 1
        #: trace key → runs per column (column ``i`` covers steps ``[i * bin_size, (i + 1) * bin_size)``).
        self.rows: dict[str, list[int]] = {}
        self.last_step = 0

    def add(self, key: str, step: int) -> None:
        """Count one run of ``key`` at ``step``."""
        self.add_all((key,), step)

    def add_all(self, keys: Iterable[str], step: int) -> None:
        """Count one run of each of ``keys`` at ``step`` (the traces of one event)."""
        step = int(step) if step > 0 else 0
        while step >= self.max_columns * self.bin_size:
            self._halve()
        column = step // self.bin_size
        rows = self.rows
        for key in keys:
            row = rows.get(key)
            if row is None:
                row = rows[key] = []
            if len(row) <= column:
                row.extend([0] * (column + 1 - len(row)))
            row[column] += 1
        if step > self.last_step:
            self.last_step = step

    def add_rows(self, rows: list[list[int]], step: int) -> None:
        """Count one run at ``step`` in each of ``rows`` (lists from :meth:`row`: a cached event's keys)."""
        step = int(step) if step > 0 else 0
        while step >= self.max_columns * self.bin_size:
            self._halve()
        column = step // self.bin_size
        for row in rows:
            if len(row) <= column:
                row.extend([0] * (column + 1 - len(row)))
            row[column] += 1
        if step > self.last_step:
            self.last_step = step

    def row(self, key: str) -> list[int]:
        """The row of ``key`` (created empty): the same list for the life of the timeline."""
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = []
        return row

    def _halve(self) -> None:
        for row in self.rows.values():
            row[:] = [sum(row[i : i + 2]) for i in range(0, len(row), 2)]  # in place: rows are cached
        self.bin_size *= 2

    @property
    def columns(self) -> int:
        """How many columns the timeline spans now."""
        return self.last_step // self.bin_size + 1


class TraceStore(Mapping[int, list[Trace]]):
    """Every trace of the run by step (``store[step]`` is the list of traces, in run order).

    Per-key totals (:attr:`stats`) and the :class:`Timeline` cover the whole run. With
    ``max_steps`` set, only the first ``max_steps // 2`` steps and the latest others are kept in
    full, and a step keeps at most ``max_traces_per_step`` traces; :attr:`dropped` counts the
    traces left out, so memory stays bounded on long runs.

    Example:
        >>> from composer_bridge.core.event import Event
        >>> store = TraceStore(max_steps=2)
        >>> for step in range(5):
        ...     store.log_traces({"A/BATCH_END": Trace("A", Event.BATCH_END, None, 0, True)}, step)
        >>> sorted(store), store.dropped, store.stats["A/BATCH_END"].count
        ([0, 4], 3, 5)
    """

    def __init__(self, max_steps: int | None = None, max_traces_per_step: int | None = None) -> None:
        for name, value in (("max_steps", max_steps), ("max_traces_per_step", max_traces_per_step)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 2):
                raise ValueError(f"TraceStore({name}={value!r}): use None (keep everything) or an int >= 2.")
        self.max_steps = max_steps
        self.max_traces_per_step = max_traces_per_step
        self._head: dict[int, list[Trace]] = {}
        self._tail: OrderedDict[int, list[Trace]] = OrderedDict()
        #: trace key → :class:`TraceStats`, over the whole run.
        self.stats: dict[str, TraceStats] = {}
        self.timeline = Timeline()
        #: How many traces were not kept in full (the totals still count them).
        self.dropped = 0
        # id of a PlanTraces -> (it, its keys' stats, its keys' timeline rows): an event's plan that
        # runs every step costs a few attribute writes per key, not dictionary look-ups.
        self._plans: dict[int, tuple[PlanTraces, list[TraceStats], list[list[int]]]] = {}

    # --- recording ---------------------------------------------------------------------------
    def log_traces(self, traces: Traces, step: int | None = None) -> None:
        """Record the traces of one event at ``step`` (``None`` counts as step 0)."""
        if not traces:
            return
        step = int(step or 0)
        kept = self._step_list(step)
        cached = self._plans.get(id(traces)) if type(traces) is PlanTraces else None
        if cached is not None and cached[0] is traces:
            for stats in cached[1]:
                stats.count += 1
                stats.last_step = step
                stats.last_exit_code = None
            self.timeline.add_rows(cached[2], step)
        else:
            all_stats = self.stats
            for key, trace in traces.items():
                stats = all_stats.get(key)
                if stats is None:
                    stats = all_stats[key] = TraceStats(first_step=step)
                stats.count += 1
                stats.last_step = step
                if trace.order is not None:
                    stats.orders.add(trace.order)
                stats.last_exit_code = trace.exit_code
            self.timeline.add_all(traces, step)
            if type(traces) is PlanTraces:  # its traces never change: cache what it updates
                if len(self._plans) >= 4096:
                    self._plans.clear()
                self._plans[id(traces)] = (
                    traces, [all_stats[key] for key in traces], [self.timeline.row(key) for key in traces]
                )
        limit = self.max_traces_per_step
        if limit is None or len(kept) + len(traces) <= limit:
            kept.extend(traces.values())
        else:
            room = max(0, limit - len(kept))
            kept.extend(list(traces.values())[:room])
            self.dropped += len(traces) - room

    def _step_list(self, step: int) -> list[Trace]:
        if step in self._head:
            return self._head[step]
        if step in self._tail:
            return self._tail[step]
        if self.max_steps is None or len(self._head) < self.max_steps // 2:
            kept: list[Trace] = []
            self._head[step] = kept
            return kept
        kept = []
        self._tail[step] = kept
        while len(self._tail) > self.max_steps - self.max_steps // 2:
            _, evicted = self._tail.popitem(last=False)
            self.dropped += len(evicted)
        return kept

    def clear(self) -> None:
        """Forget everything recorded."""
        self._head.clear()
        self._tail.clear()
        self.stats.clear()
        self.timeline = Timeline(self.timeline.max_columns)
        self.dropped = 0
        self._plans.clear()

    # --- reading -----------------------------------------------------------------------------
    def __getitem__(self, step: int) -> list[Trace]:
        if step in self._head:
            return self._head[step]
        return self._tail[step]

    def __iter__(self) -> Iterator[int]:
        yield from self._head
        yield from self._tail

    def __len__(self) -> int:
        return len(self._head) + len(self._tail)

    def keys_at(self, step: int) -> list[str]:
        """The trace keys recorded at ``step``, in run order (repeated when a key ran several times)."""
        return [trace_key(t.name, t.event) for t in self.get(step, []) if t.event is not None]

    def __repr__(self) -> str:
        return f"TraceStore(steps={len(self)}, keys={len(self.stats)}, dropped={self.dropped})"
