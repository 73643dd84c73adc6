"""Where traces go: Lightning loggers (at a rate you choose), a text log, and an in-memory store.

Every :meth:`Engine.run_event <composer_bridge.core.engine.Engine.run_event>` returns the traces of
the algorithms that ran; the engine logger hands them to :class:`TraceDestination`, which

- records them in a :class:`TraceStore` (``callback.traces``; every rank, bounded in memory),
- logs ``algorithm_traces/<AlgorithmClass>/<EVENT_NAME> = 1`` at the current optimizer step to
  every Lightning logger of the Trainer (rank zero only), at the rate of the trace mode:

  - ``"summary"`` (default): each key once, the first time it runs; at fit end the totals
    ``algorithm_trace_counts/<AlgorithmClass>/<EVENT_NAME>``. A few points per key, whatever the
    length of the run;
  - ``"every_event"``: each key at every step where it ran (once per step, however many
    micro-batches or evaluation batches ran it);
  - an int ``n``: each key at most once every ``n`` steps (its first run always logged);

- writes the text trace ``[STEP=3][LayerFreezing/EPOCH_END=1]`` to the Python logger
  ``composer_bridge.traces`` at DEBUG, and to ``trace_file`` when one is given (rank zero only).

Example:
    >>> from composer_bridge.core.event import Event
    >>> from composer_bridge.core.trace import Trace
    >>> store = TraceStore()
    >>> store.log_traces({"LayerFreezing/EPOCH_END": Trace("LayerFreezing", Event.EPOCH_END, None, 0, True)}, step=3)
    >>> format_trace(3, "LayerFreezing/EPOCH_END", store[3][0])
    '[STEP=3][LayerFreezing/EPOCH_END=1]'
    >>> store.stats["LayerFreezing/EPOCH_END"].count
    1
"""

from __future__ import annotations

import io
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from composer_bridge.core.logger import LoggerDestination
from composer_bridge.core.trace import PlanTraces, Trace, Traces, trace_key

__all__ = [
    "COUNT_PREFIX",
    "METRIC_PREFIX",
    "TRACE_LOGGER_NAME",
    "Timeline",
    "TraceDestination",
    "TraceMode",
    "TraceReporting",
    "TraceStats",
    "TraceStore",
    "check_trace_mode",
    "format_trace",
]

#: Prefix of the per-step trace metrics: ``algorithm_traces/<AlgorithmClass>/<EVENT_NAME>``.
METRIC_PREFIX = "algorithm_traces/"
#: Prefix of the totals logged at fit end: ``algorithm_trace_counts/<AlgorithmClass>/<EVENT_NAME>``.
COUNT_PREFIX = "algorithm_trace_counts/"
#: The Python logger the text trace goes to (at DEBUG).
TRACE_LOGGER_NAME = "composer_bridge.traces"

TraceMode = Literal["summary", "every_event"] | int

_trace_log = logging.getLogger(TRACE_LOGGER_NAME)
log = logging.getLogger(__name__)

#: In summary mode the store keeps this many steps in full (half the first, half the latest).
SUMMARY_MAX_STEPS = 2000
#: In summary mode a step keeps at most this many traces (long evaluations at one step).
SUMMARY_MAX_TRACES_PER_STEP = 2000


def check_trace_mode(mode: Any) -> TraceMode:
    """Validate a trace mode: ``"summary"``, ``"every_event"`` or a positive int ``n`` (every n steps).

    Example:
        >>> check_trace_mode(50)
        50
    """
    if isinstance(mode, str) and mode in ("summary", "every_event"):
        return mode  # type: ignore[return-value]
    if isinstance(mode, int) and not isinstance(mode, bool) and mode >= 1:
        return mode
    raise ValueError(
        f"trace_mode={mode!r} is not a trace mode. Use 'summary' (each trace key logged once, plus totals at "
        "fit end; the default), 'every_event' (every step where an algorithm ran), or a positive int n "
        "(each key at most once every n steps), e.g. trace_mode=100."
    )


def format_trace(step: int, key: str, trace: Trace) -> str:
    """One line of the text trace: ``[STEP=<step>][<Algorithm>/<EVENT>=<1 if it ran else 0>]``.

    Example:
        >>> from composer_bridge.core.event import Event
        >>> format_trace(0, "BlurPool/INIT", Trace("BlurPool", Event.INIT, None, 0, True))
        '[STEP=0][BlurPool/INIT=1]'
    """
    return f"[STEP={step}][{key}={int(bool(trace.run))}]"


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


class _TraceMetrics:
    """Decides which trace keys go to the Lightning loggers at which step, and batches them per step."""

    def __init__(self, mode: TraceMode) -> None:
        self.mode = mode
        self._last_logged: dict[str, int] = {}
        self._pending: dict[str, float] = {}
        self._pending_step: int | None = None
        self._sink: Any = None
        # Summary mode: the PlanTraces whose keys have all been logged once (id -> it); skipped after.
        self._logged_plans: dict[int, PlanTraces] = {}

    def add(self, step: int, traces: Traces, sink: Any) -> None:
        if self._pending and (step != self._pending_step or sink is not self._sink):
            self.flush()
        self._sink = sink
        self._pending_step = step
        mode = self.mode
        is_plan = mode == "summary" and type(traces) is PlanTraces
        if is_plan and self._logged_plans.get(id(traces)) is traces:
            return
        for key in traces:
            last = self._last_logged.get(key)
            if last is None:
                wanted = True
            elif mode == "summary":
                wanted = False
            elif mode == "every_event":
                wanted = last != step
            else:
                wanted = step - last >= mode or step < last
            if wanted:
                self._last_logged[key] = step
                self._pending[METRIC_PREFIX + key] = 1
        if is_plan:
            if len(self._logged_plans) >= 4096:
                self._logged_plans.clear()
            self._logged_plans[id(traces)] = traces  # type: ignore[assignment]

    def flush(self) -> None:
        if self._pending and self._sink is not None:
            pending, self._pending = self._pending, {}
            self._sink.log_metrics(pending, self._pending_step)
        self._pending = {}


class _TextTraces:
    """The text trace: Python logging at DEBUG, and a file when asked."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        self._file: io.TextIOBase | None = None
        self._opened_before = False

    def write(self, step: int, traces: Traces) -> None:
        to_log = _trace_log.isEnabledFor(logging.DEBUG)
        if not to_log and self.path is None:
            return
        lines = [format_trace(step, key, trace) for key, trace in traces.items()]
        if to_log:
            for line in lines:
                _trace_log.debug(line)
        if self.path is not None:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # A new callback starts a fresh file; a later fit/validate with it appends.
                self._file = open(self.path, "a" if self._opened_before else "w", encoding="utf-8")  # noqa: SIM115
                self._opened_before = True
            self._file.write("\n".join(lines) + "\n")

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TraceDestination(LoggerDestination):
    """The engine-logger destination that feeds a :class:`TraceReporting` for one Trainer.

    ``current_step`` gives the step for traces logged before the first batch (``INIT``,
    ``FIT_START``), when the engine logger has no step yet.
    """

    def __init__(self, reporting: TraceReporting, trainer: Any, current_step: Callable[[], int]) -> None:
        from composer_bridge.lightning.loggers import LightningLoggers

        self.reporting = reporting
        self.trainer = trainer
        self.current_step = current_step
        self.sink = LightningLoggers(trainer)
        # The rank and the loggers do not change during a run: read them once, not at every event.
        self._global_zero = bool(getattr(trainer, "is_global_zero", True))
        self._has_loggers = bool(getattr(trainer, "loggers", None))

    def log_traces(self, traces: Traces, step: int | None = None) -> None:
        if not traces:
            return
        step = int(step) if step is not None else int(self.current_step())
        reporting = self.reporting
        reporting.store.log_traces(traces, step)
        if not self._global_zero:
            return
        reporting.text.write(step, traces)
        if self._has_loggers:
            reporting.metrics.add(step, traces, self.sink)


class TraceReporting:
    """The trace outputs of one :class:`~composer_bridge.AlgorithmEngineCallback`.

    Args:
        mode: ``"summary"``, ``"every_event"`` or ``n`` (see the module docstring).
        trace_file: also write the text trace to this file (rank zero only).

    Example:
        >>> reporting = TraceReporting("every_event")
        >>> reporting.store.max_steps is None
        True
    """

    def __init__(self, mode: TraceMode = "summary", trace_file: str | os.PathLike[str] | None = None) -> None:
        self.mode = check_trace_mode(mode)
        if trace_file is not None and not isinstance(trace_file, (str, os.PathLike)):
            raise TypeError(f"trace_file={trace_file!r} must be a path (str or pathlib.Path) or None.")
        bounded = self.mode == "summary"
        self.store = TraceStore(
            max_steps=SUMMARY_MAX_STEPS if bounded else None,
            max_traces_per_step=SUMMARY_MAX_TRACES_PER_STEP if bounded else None,
        )
        self.metrics = _TraceMetrics(self.mode)
        self.text = _TextTraces(trace_file)

    def destination(self, trainer: Any, current_step: Callable[[], int]) -> TraceDestination:
        """A destination for the engine logger, writing to ``trainer``'s loggers."""
        return TraceDestination(self, trainer, current_step)

    def flush(self) -> None:
        """Send the batched trace metrics to the loggers and flush the trace file."""
        self.metrics.flush()
        self.text.flush()

    def log_counts(self, trainer: Any, step: int) -> None:
        """Log ``algorithm_trace_counts/<key>`` = times run, at ``step``, to every Lightning logger (rank zero)."""
        if not getattr(trainer, "is_global_zero", True) or not trainer.loggers or not self.store.stats:
            return
        from composer_bridge.lightning.loggers import LightningLoggers

        counts = {COUNT_PREFIX + key: stats.count for key, stats in self.store.stats.items()}
        LightningLoggers(trainer).log_metrics(counts, step)

    def fit_start(self, trainer: Any, plan_text: Callable[[], str], run_config: Callable[[], dict[str, Any]]) -> None:
        """At fit start: the plan to the DEBUG log; the run config to W&B (rank zero)."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug("Algorithm plan:\n%s", plan_text())
        if getattr(trainer, "is_global_zero", True):
            from composer_bridge.lightning.wandb_report import log_wandb_config

            log_wandb_config(trainer, run_config)

    def fit_end(self, trainer: Any, step: int, cost: Mapping[str, list[float]], failed: bool = False) -> None:
        """At fit end (or on an exception): flush, log the totals, write the W&B report (rank zero)."""
        self.flush()
        if not getattr(trainer, "is_global_zero", True):
            return
        try:
            self.log_counts(trainer, step)
            from composer_bridge.lightning.wandb_report import log_wandb_report

            log_wandb_report(trainer, self.store, cost, step, failed=failed)
        except Exception:
            if not failed:
                raise
            # Reporting must not hide the exception that ended the run.
            log.exception("Could not write the algorithm trace report after the run failed.")

    def close(self) -> None:
        """Flush and close the trace file (a later fit reopens it in append mode)."""
        self.metrics.flush()
        self.text.close()
