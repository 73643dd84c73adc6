"""Where traces go: Lightning loggers (at a rate you choose), a text log, and an in-memory store.

Every :meth:`Engine.run_event <composer_bridge.core.engine.Engine.run_event>` returns the traces of
the algorithms that ran; the engine logger hands them to :class:`TraceDestination`, which

- records them in a :class:`~composer_bridge.core.trace_store.TraceStore` (``callback.traces``;
  every rank, bounded in memory; the store itself lives in :mod:`composer_bridge.core.trace_store`
  and is re-exported here),
- logs ``algorithm_traces/<label>/<EVENT_NAME> = 1`` (the label is the algorithm's class name,
  ``Name#2`` for a second instance of a class) at the current optimizer step to
  every Lightning logger of the Trainer (rank zero only), at the rate of the trace mode:

  - ``"summary"`` (default): each key once, the first time it runs; at fit end the totals
    ``algorithm_trace_counts/<label>/<EVENT_NAME>``. A few points per key, whatever the
    length of the run;
  - ``"every_event"``: each key at every step where it ran (once per step, however many
    micro-batches or evaluation batches ran it);
  - an int ``n``: each key at most once every ``n`` steps (its first run always logged);

- writes the text trace ``[STEP=3][LayerFreezing/EPOCH_END=1]`` to the Python logger
  ``composer_bridge.traces`` at DEBUG, and to ``trace_file`` when one is given (rank zero only).

Examples:
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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from composer_bridge.core.logger import LoggerDestination
from composer_bridge.core.trace import MAX_CACHED_PLANS, PlanTraces, Trace, Traces
from composer_bridge.core.trace_store import Timeline, TraceStats, TraceStore

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

#: Prefix of the per-step trace metrics: ``algorithm_traces/<label>/<EVENT_NAME>``.
METRIC_PREFIX = "algorithm_traces/"
#: Prefix of the totals logged at fit end: ``algorithm_trace_counts/<label>/<EVENT_NAME>``.
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

    Examples:
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

    Examples:
        >>> from composer_bridge.core.event import Event
        >>> format_trace(0, "BlurPool/INIT", Trace("BlurPool", Event.INIT, None, 0, True))
        '[STEP=0][BlurPool/INIT=1]'
    """
    return f"[STEP={step}][{key}={int(bool(trace.run))}]"


class _TraceMetrics:
    """Decides which trace keys go to the Lightning loggers at which step, and batches them per step."""

    def __init__(self, mode: TraceMode) -> None:
        self.mode = mode
        self.summary = mode == "summary"
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
            if len(self._logged_plans) >= MAX_CACHED_PLANS:
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

    def wanted(self) -> bool:
        """Whether anything reads the text trace now: a trace file, or the DEBUG log."""
        return self.path is not None or _trace_log.isEnabledFor(logging.DEBUG)

    def write(self, step: int, traces: Traces) -> None:
        """Write the traces of one event (callers ask :meth:`wanted` first)."""
        to_log = _trace_log.isEnabledFor(logging.DEBUG)
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
    """The bridge's one engine-logger destination: traces to a :class:`TraceReporting`, metrics and
    hyper-parameters to the Trainer's Lightning loggers (through :class:`LightningLoggers`).

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
        self._text_step: int | None = None
        self._text_wanted = False

    def log_traces(self, traces: Traces, step: int | None = None) -> None:
        if not traces:
            return
        step = int(step) if step is not None else int(self.current_step())
        reporting = self.reporting
        reporting.store.log_traces(traces, step)
        if not self._global_zero:
            return
        if step != self._text_step:  # whether a file or the DEBUG log wants the text trace: once per step
            self._text_step = step
            self._text_wanted = reporting.text.wanted()
        if self._text_wanted:
            reporting.text.write(step, traces)
        if self._has_loggers:
            metrics = reporting.metrics
            # In summary mode a plan whose keys were all logged once adds nothing: skipped here, without a call
            # per event (with nothing pending, add() would only return).
            if not (metrics.summary and not metrics._pending and type(traces) is PlanTraces
                    and metrics._logged_plans.get(id(traces)) is traces):
                metrics.add(step, traces, self.sink)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Algorithms' numbers, to every Lightning logger (rank zero)."""
        self.sink.log_metrics(metrics, step)

    def log_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        """Algorithms' configuration (e.g. surgery counts), to every Lightning logger's ``log_hyperparams``."""
        self.sink.log_hyperparameters(hyperparameters)


class TraceReporting:
    """The trace outputs of one :class:`~composer_bridge.AlgorithmEngineCallback`.

    Args:
        mode: ``"summary"``, ``"every_event"`` or ``n`` (see the module docstring).
        trace_file: also write the text trace to this file (rank zero only).

    Examples:
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
