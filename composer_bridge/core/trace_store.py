"""The in-memory trace store: every trace of a run by step, per-key totals and a bounded timeline.

Nothing here knows Lightning: any loop that runs an :class:`~composer_bridge.core.engine.Engine` can
record its traces in a :class:`TraceStore` (it is a logger destination: it has ``log_traces``).
The Lightning bridge keeps one per callback (``callback.traces``).

Examples:
    >>> from composer_bridge.core.event import Event
    >>> from composer_bridge.core.trace import Trace
    >>> store = TraceStore()
    >>> store.log_traces({"LayerFreezing/EPOCH_END": Trace("LayerFreezing", Event.EPOCH_END, None, 0, True)}, step=3)
    >>> store.keys_at(3), store.stats["LayerFreezing/EPOCH_END"].count
    (['LayerFreezing/EPOCH_END'], 1)
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from composer_bridge.core.trace import MAX_CACHED_PLANS, PlanTraces, Trace, Traces, trace_key

__all__ = ["Timeline", "TraceStats", "TraceStore"]


@dataclass
class TraceStats:
    """What one trace key did over the run: how often, first and last step, positions it ran at."""

    count: int = 0
    first_step: int = 0
    last_step: int = 0
    orders: set[int] = field(default_factory=set)
    last_exit_code: int | None = None
    # which recorded event set last_step/last_exit_code (counts folded in later must not undo them)
    _last_event: int = field(default=0, repr=False, compare=False)


#: the kinds of step (plans in order) the store keeps a tally for, and waits to see again
_STEP_KINDS = 8


def _same_plans(a: list[PlanTraces], b: list[PlanTraces]) -> bool:
    """Whether two steps ran the same cached plans (the same objects), in the same order."""
    return len(a) == len(b) and all(map(operator.is_, a, b))


class _GroupRow(list):  # type: ignore[type-arg]  # a list of int counts
    """A timeline group's counts from column ``start`` on (index ``i`` is column ``start + i``).

    A group counts only the columns from the step it was made (or last folded) on, so folding it
    into its keys' rows touches those columns only, not every column since the run began.
    """

    __slots__ = ("start",)

    def __init__(self, start: int) -> None:
        super().__init__()
        self.start = start


def _count(row: list[int], column: int) -> None:
    """One more run in ``column`` of a timeline row (the row grows to reach it)."""
    if len(row) <= column:
        row.extend([0] * (column + 1 - len(row)))
    row[column] += 1


def _halve_row(row: list[int]) -> None:
    """Sum a row's neighbouring columns in pairs, in place (groups hold the rows)."""
    if row:
        if len(row) % 2:
            row.append(0)
        row[:] = map(operator.add, row[0::2], row[1::2])


class _StepTraces:
    """The traces of one step: the events' trace dicts (or a cut list, past the per-step limit)."""

    __slots__ = ("chunks", "size")

    def __init__(self) -> None:
        self.chunks: list[Traces | list[Trace]] = []
        self.size = 0

    def flat(self) -> list[Trace]:
        traces: list[Trace] = []
        for chunk in self.chunks:
            traces.extend(chunk.values() if isinstance(chunk, dict) else chunk)
        return traces


class _PlanTally:
    """The runs of one cached plan's traces not yet added to its keys' :class:`TraceStats`."""

    __slots__ = ("traces", "stats", "row", "pending", "last_step", "last_event")

    def __init__(self, traces: PlanTraces, stats: list[TraceStats], row: _GroupRow) -> None:
        self.traces = traces
        self.stats = stats
        self.row = row  # its keys' group row in the timeline
        self.pending = 0
        self.last_step = 0
        self.last_event = 0

    def fold(self) -> None:
        pending, self.pending = self.pending, 0
        for stats in self.stats:
            stats.count += pending
            if self.last_event > stats._last_event:  # this plan ran the key last
                stats.last_step = self.last_step
                stats.last_exit_code = None
                stats._last_event = self.last_event


class _StepTally:
    """A step's events that repeat the previous step's plans, in the same order: counted once per step.

    A training loop fires the same events with the same algorithms step after step; such a step costs
    one count here, and one timeline increment for all its keys, instead of one per event. The runs are
    added to each plan's :class:`_PlanTally` when the totals are read (:meth:`fold`).
    """

    __slots__ = ("plans", "tallies", "row", "size", "pending", "last_step", "last_event")

    def __init__(self, plans: list[PlanTraces], tallies: list[_PlanTally], row: _GroupRow, size: int) -> None:
        self.plans = plans  # the step's PlanTraces, in run order
        self.tallies = tallies  # their tallies, in the same order
        self.row = row  # the timeline row of all the step's keys (a key twice if its plan ran twice)
        self.size = size  # the step's traces, all plans together
        self.pending = 0
        self.last_step = 0
        self.last_event = 0  # the event number of the step's last event in its latest repeat

    def fold(self) -> None:
        pending, self.pending = self.pending, 0
        if not pending:
            return
        last = len(self.tallies) - 1
        for i, tally in enumerate(self.tallies):
            tally.pending += pending
            event = self.last_event - (last - i)
            if event > tally.last_event:
                tally.last_event, tally.last_step = event, self.last_step


class Timeline:
    """Which trace keys ran in which steps, in bounded memory.

    Steps are counted in columns of ``bin_size`` steps; when a step falls beyond
    ``max_columns * bin_size``, neighbouring columns merge and ``bin_size`` doubles, so a
    20,000-step run takes no more memory than a 2,000-step one.

    Examples:
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
        self._rows: dict[str, list[int]] = {}
        # (the rows of a group's keys, the group's own row): keys that always run together (one
        # cached plan of the engine) are counted once per event in the group's row, and added to
        # their own rows when the rows are read.
        self._groups: list[tuple[list[list[int]], _GroupRow]] = []
        self.last_step = 0

    @property
    def rows(self) -> dict[str, list[int]]:
        """Trace key → runs per column (column ``i`` covers steps ``[i * bin_size, (i + 1) * bin_size)``)."""
        self._fold()
        return self._rows

    def add(self, key: str, step: int) -> None:
        """Count one run of ``key`` at ``step``."""
        self.add_all((key,), step)

    def add_all(self, keys: Iterable[str], step: int) -> None:
        """Count one run of each of ``keys`` at ``step`` (the traces of one event)."""
        column = self.column(step)
        rows = self._rows
        for key in keys:
            row = rows.get(key)
            if row is None:
                row = rows[key] = []
            _count(row, column)

    def group(self, keys: Iterable[str]) -> _GroupRow:
        """A row counting runs of ``keys`` together; pass it to :meth:`add_group` (one count per event).

        The row starts at the latest column: a group made late in a run costs nothing for the columns
        before it, when it is counted or folded into its keys' rows.
        """
        members = []
        for key in keys:
            row = self._rows.get(key)
            if row is None:
                row = self._rows[key] = []
            members.append(row)
        group_row = _GroupRow(self.last_step // self.bin_size)
        self._groups.append((members, group_row))
        return group_row

    def retire_group(self, group_row: _GroupRow) -> None:
        """Add one :meth:`group`'s counts to its keys' rows and forget it (the others stay)."""
        for i in range(len(self._groups) - 1, -1, -1):  # the newest first: a group retired soon after it was made
            if self._groups[i][1] is group_row:
                members, _ = self._groups.pop(i)
                self._fold_one(members, group_row)
                return

    def add_group(self, group_row: _GroupRow, column: int) -> None:
        """Count one run of each key of a :meth:`group` in ``column`` (from :meth:`column`): a loop that
        records many events at one step finds the column once."""
        index = column - group_row.start
        if index < 0:  # an earlier step than the group's first: its row reaches back
            group_row[:0] = [0] * -index
            group_row.start, index = column, 0
        _count(group_row, index)

    def column(self, step: int) -> int:
        """The column ``step`` falls in, after making room for it (columns merge when it lies beyond
        the last one, which changes the columns of earlier steps)."""
        step = int(step) if step > 0 else 0
        while step >= self.max_columns * self.bin_size:
            self._halve()
        if step > self.last_step:
            self.last_step = step
        return step // self.bin_size

    def drop_groups(self) -> None:
        """Add the groups' counts to their keys' rows and forget the groups."""
        self._fold()
        self._groups.clear()

    def _fold(self) -> None:
        for members, group_row in self._groups:
            self._fold_one(members, group_row)

    def _fold_one(self, members: list[list[int]], group_row: _GroupRow) -> None:
        if group_row:
            start = group_row.start
            end = start + len(group_row)
            for row in members:
                if len(row) < end:
                    row.extend([0] * (end - len(row)))
                row[start:end] = map(operator.add, row[start:end], group_row)  # element-wise, in C
            group_row.clear()
        group_row.start = self.last_step // self.bin_size  # its next counts come from here on

    def _halve(self) -> None:
        # Halving is linear, so the groups' rows are halved as they are (folding them first would
        # touch every key's row): the keys' rows get the halved counts when they are read.
        for row in self._rows.values():
            _halve_row(row)
        for _, group_row in self._groups:
            if group_row.start % 2:  # the pairs start at an even column
                group_row.insert(0, 0)
            group_row.start //= 2
            _halve_row(group_row)
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

    Examples:
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
        # step -> the traces of its events, one entry per event (the engine's own dict: an event costs
        # one reference here, not one per trace), flattened when the step is read
        self._head: dict[int, _StepTraces] = {}
        self._tail: OrderedDict[int, _StepTraces] = OrderedDict()
        self._stats: dict[str, TraceStats] = {}
        self._timeline = Timeline()
        self._dropped = 0
        # The engine's cached trace dicts of the step in flight, recorded when the step changes or
        # anything is read: a step's events are then recorded in one go, not each from a cold start.
        self._pending: list[PlanTraces] = []
        self._pending_step = 0
        # id of a PlanTraces -> its tally: an event's plan that runs every step costs one count and
        # one timeline increment, whatever its number of keys; the keys' totals are brought up to
        # date when they are read (``stats``).
        self._plans: dict[int, _PlanTally] = {}
        self._events = 0  # events recorded: orders the tallies' and the keys' latest runs
        # Steps of the same plans in the same order are counted in one go (see _StepTally): the tally of the
        # step drained last, and those of the last few kinds of step, by their plans' ids (an algorithm that
        # runs every few steps makes two or three kinds of step take turns). A kind seen once waits in
        # _seen_steps: a tally is made when it comes again.
        self._step_tally: _StepTally | None = None
        self._step_tallies: dict[tuple[int, ...], _StepTally] = {}
        self._seen_steps: dict[tuple[int, ...], list[PlanTraces]] = {}

    @property
    def stats(self) -> dict[str, TraceStats]:
        """Trace key → :class:`TraceStats`, over the whole run."""
        self._drain()
        for step_tally in self._step_tallies.values():
            step_tally.fold()
        for tally in self._plans.values():
            if tally.pending:
                tally.fold()
        return self._stats

    @property
    def timeline(self) -> Timeline:
        """Which keys ran in which steps (a :class:`Timeline`), over the whole run."""
        self._drain()
        return self._timeline

    @property
    def dropped(self) -> int:
        """How many traces were not kept in full (the totals still count them)."""
        self._drain()
        return self._dropped

    # --- recording ---------------------------------------------------------------------------
    def log_traces(self, traces: Traces, step: int | None = None) -> None:
        """Record the traces of one event at ``step`` (``None`` counts as step 0)."""
        if not traces:
            return
        step = step if type(step) is int else int(step or 0)
        if type(traces) is PlanTraces:  # the engine's: it never changes, so it may wait for the step's end
            if step != self._pending_step:
                self._drain()
                self._pending_step = step
            self._pending.append(traces)
            return
        self._drain()  # anything else is recorded now, after what came before it
        self._record(traces, step, self._step_list(step), self._timeline.column(step))

    def _drain(self) -> None:
        """Record the pending events of one step, finding its list and timeline column once."""
        if self._pending:
            pending, self._pending = self._pending, []
            step = self._pending_step
            kept, column = self._step_list(step), self._timeline.column(step)
            repeat = self._step_tally
            if repeat is None or not _same_plans(pending, repeat.plans):
                repeat = self._known_step(pending)  # (only when the step's plans changed)
            limit = self.max_traces_per_step
            if repeat is not None and (limit is None or kept.size + repeat.size <= limit):
                self._step_tally = repeat
                self._events += len(pending)
                repeat.pending += 1
                repeat.last_step, repeat.last_event = step, self._events
                self._timeline.add_group(repeat.row, column)
                kept.chunks.extend(pending)
                kept.size += repeat.size
                return
            for traces in pending:
                self._record(traces, step, kept, column)
            self._remember_step(pending)

    def _known_step(self, pending: list[PlanTraces]) -> _StepTally | None:
        """The tally of an earlier kind of step with exactly these plans, if one is kept."""
        tally = self._step_tallies.get(tuple(map(id, pending)))
        return tally if tally is not None and _same_plans(pending, tally.plans) else None

    def _remember_step(self, pending: list[PlanTraces]) -> None:
        """After a step recorded event by event: from its second run on, a step of the same plans is counted in one
        go (a step seen once may never come again: no timeline group is made for it)."""
        self._step_tally = None
        key = tuple(map(id, pending))
        if key in self._step_tallies:
            return  # a known kind of step, cut to the per-step limit this time
        seen = self._seen_steps.pop(key, None)
        if seen is None or not _same_plans(seen, pending):
            self._seen_steps[key] = pending  # (holding the plans keeps their ids from being reused)
            if len(self._seen_steps) > _STEP_KINDS:
                del self._seen_steps[next(iter(self._seen_steps))]
            return
        size, limit = sum(map(len, pending)), self.max_traces_per_step
        if limit is not None and size > limit:
            return  # its steps are cut to the limit, trace by trace
        tallies = [self._plans.get(id(traces)) for traces in pending]
        if not all(tally is not None and tally.traces is traces for tally, traces in zip(tallies, pending, strict=True)):
            return
        if len(self._step_tallies) >= _STEP_KINDS:  # the oldest kind's runs go to its plans, its group goes
            oldest = self._step_tallies.pop(next(iter(self._step_tallies)))
            oldest.fold()
            self._timeline.retire_group(oldest.row)
        row = self._timeline.group(key for traces in pending for key in traces)
        self._step_tally = self._step_tallies[key] = _StepTally(pending, tallies, row, size)  # type: ignore[arg-type]

    def _record(self, traces: Traces, step: int, kept: _StepTraces, column: int) -> None:
        timeline = self._timeline
        self._events += 1
        tally = self._plans.get(id(traces)) if type(traces) is PlanTraces else None
        if tally is not None and tally.traces is traces:
            tally.pending += 1
            tally.last_step = step
            tally.last_event = self._events
            timeline.add_group(tally.row, column)
        else:
            all_stats = self._stats
            for key, trace in traces.items():
                stats = all_stats.get(key)
                if stats is None:
                    stats = all_stats[key] = TraceStats(first_step=step)
                stats.count += 1
                stats.last_step = step
                if trace.order is not None:
                    stats.orders.add(trace.order)
                stats.last_exit_code = trace.exit_code
                stats._last_event = self._events
            timeline.add_all(traces, step)
            if type(traces) is PlanTraces:  # its traces never change: count its next runs as one
                if len(self._plans) >= MAX_CACHED_PLANS:
                    self._forget_plans()
                self._plans[id(traces)] = _PlanTally(traces, [all_stats[key] for key in traces], timeline.group(traces))
        limit = self.max_traces_per_step
        if limit is None or kept.size + len(traces) <= limit:
            # the engine's cached dict is never changed, so a reference is enough; any other is copied
            kept.chunks.append(traces if type(traces) is PlanTraces else list(traces.values()))
            kept.size += len(traces)
        else:
            room = max(0, limit - kept.size)
            if room:
                kept.chunks.append(list(traces.values())[:room])
                kept.size += room
            self._dropped += len(traces) - room

    def _step_list(self, step: int) -> _StepTraces:
        if step in self._head:
            return self._head[step]
        if step in self._tail:
            return self._tail[step]
        kept = _StepTraces()
        if self.max_steps is None or len(self._head) < self.max_steps // 2:
            self._head[step] = kept
            return kept
        self._tail[step] = kept
        while len(self._tail) > self.max_steps - self.max_steps // 2:
            _, evicted = self._tail.popitem(last=False)
            self._dropped += evicted.size
        return kept

    def _forget_plans(self) -> None:
        for step_tally in self._step_tallies.values():
            step_tally.fold()  # (their timeline groups go with the others below)
        self._step_tally = None
        self._step_tallies.clear()
        self._seen_steps.clear()
        for tally in self._plans.values():
            tally.fold()
        self._timeline.drop_groups()
        self._plans.clear()

    def clear(self) -> None:
        """Forget everything recorded."""
        self._pending = []
        self._head.clear()
        self._tail.clear()
        self._stats.clear()
        self._timeline = Timeline(self._timeline.max_columns)
        self._dropped = 0
        self._plans.clear()
        self._step_tally = None
        self._step_tallies.clear()
        self._seen_steps.clear()

    # --- reading -----------------------------------------------------------------------------
    def __getitem__(self, step: int) -> list[Trace]:
        """The traces of ``step``, in run order (a new list)."""
        self._drain()
        kept = self._head[step] if step in self._head else self._tail[step]
        return kept.flat()

    def __iter__(self) -> Iterator[int]:
        self._drain()
        yield from self._head
        yield from self._tail

    def __len__(self) -> int:
        self._drain()
        return len(self._head) + len(self._tail)

    def keys_at(self, step: int) -> list[str]:
        """The trace keys recorded at ``step``, in run order (repeated when a key ran several times)."""
        return [trace_key(t.name, t.event) for t in self.get(step, []) if t.event is not None]

    def __repr__(self) -> str:
        return f"TraceStore(steps={len(self)}, keys={len(self.stats)}, dropped={self.dropped})"
