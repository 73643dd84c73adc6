"""The Weights & Biases report: run config, a per-algorithm summary table and a timeline image.

When the Trainer has a ``WandbLogger``, :class:`~composer_bridge.AlgorithmEngineCallback` (on rank
zero only)

- at fit start records, under the run config key ``composer_bridge``, the algorithms with their
  hyper-parameters, the passes in the order they run, and the order the algorithms run in at each
  event (see :func:`wandb_run_config`);
- at fit end, and when the run fails, logs ``algorithm_report/summary`` (a ``wandb.Table`` with
  one row per algorithm and event: times run, first and last step, total and mean wall time in
  ``apply``), ``algorithm_report/timeline`` (a ``wandb.Image`` of :func:`render_timeline`) and,
  in the run summary, ``algorithm_cost/<Algorithm>/apply_seconds``.

``wandb`` and ``matplotlib`` are imported only when a report is written, so the package works
without them installed.

Examples:
    >>> from composer_bridge.core.event import Event
    >>> from composer_bridge.core.trace import Trace
    >>> from composer_bridge.lightning.traces import TraceStore
    >>> store = TraceStore()
    >>> store.log_traces({"A/BATCH_END": Trace("A", Event.BATCH_END, None, 0, True)}, step=1)
    >>> summary_rows(store, {"A/BATCH_END": [1, 0.002]})
    [['A', 'BATCH_END', 1, 1, 1, 0.002, 2.0]]
    >>> render_timeline(store)[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
    True
"""

from __future__ import annotations

import io
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.event import Event
from composer_bridge.core.passes import AlgorithmPass
from composer_bridge.core.trace import algorithm_labels
from composer_bridge.core.trace_store import TraceStore

__all__ = [
    "CONFIG_KEY",
    "SUMMARY_COLUMNS",
    "SUMMARY_KEY",
    "TIMELINE_KEY",
    "log_wandb_config",
    "log_wandb_report",
    "render_timeline",
    "summary_rows",
    "wandb_loggers",
    "wandb_run_config",
]

#: Run-config key holding the algorithms, passes and orders.
CONFIG_KEY = "composer_bridge"
#: History key of the summary table.
SUMMARY_KEY = "algorithm_report/summary"
#: History key of the timeline image.
TIMELINE_KEY = "algorithm_report/timeline"
#: The columns of the summary table.
SUMMARY_COLUMNS = [
    "algorithm", "event", "times_run", "first_step", "last_step", "total_apply_seconds", "mean_apply_ms",
]

_EVENT_POSITION = {event.name: i for i, event in enumerate(Event)}


def wandb_loggers(trainer: Any) -> list[Any]:
    """The Trainer's ``WandbLogger`` instances, of either Lightning package (importing them does not import ``wandb``)."""
    from composer_bridge.lightning.package import classes_in_every_package

    wandb_logger = classes_in_every_package("loggers", "WandbLogger")
    return [logger for logger in getattr(trainer, "loggers", []) if isinstance(logger, wandb_logger)]


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return repr(value)


def _pass_name(algorithm_pass: AlgorithmPass) -> str:
    return getattr(algorithm_pass, "__qualname__", None) or getattr(algorithm_pass, "__name__", None) or repr(algorithm_pass)


def wandb_run_config(
    algorithms: Sequence[Algorithm], passes: Sequence[AlgorithmPass], orders: Mapping[Event, Sequence[str]]
) -> dict[str, Any]:
    """The run config: ``{"algorithms": {name: hparams}, "passes": [...], "algorithm_order": {EVENT: [...]}}``.

    Hyper-parameters that are not plain data are recorded as their ``repr``; each algorithm is
    named by its trace label (a second instance of a class is ``Name#2``, as in its trace keys).

    Examples:
        >>> from composer_bridge.core.passes import DEFAULT_PASSES
        >>> wandb_run_config([], DEFAULT_PASSES, {})["passes"][0]
        'set_filo_order'
    """
    named: dict[str, Any] = {}
    for algorithm, label in zip(algorithms, algorithm_labels(algorithms), strict=True):
        hparams = algorithm.hparams() if hasattr(algorithm, "hparams") else {}
        named[label] = _json_safe(hparams)
    return {
        "algorithms": named,
        "passes": [_pass_name(p) for p in passes],
        "algorithm_order": {Event(event).name: list(names) for event, names in orders.items()},
    }


def log_wandb_config(trainer: Any, run_config: Callable[[], dict[str, Any]]) -> None:
    """Record ``run_config()`` under :data:`CONFIG_KEY` in every W&B run of the Trainer (call on rank zero)."""
    loggers = wandb_loggers(trainer)
    if not loggers:
        return
    config = run_config()
    for logger in loggers:
        logger.experiment.config.update({CONFIG_KEY: config}, allow_val_change=True)


def _sorted_keys(keys: Any) -> list[str]:
    def position(key: str) -> tuple[str, int, str]:
        algorithm, _, event = key.rpartition("/")
        return algorithm, _EVENT_POSITION.get(event, len(_EVENT_POSITION)), event

    return sorted(keys, key=position)


def summary_rows(store: TraceStore, cost: Mapping[str, Sequence[float]]) -> list[list[Any]]:
    """One row per algorithm and event, in :data:`SUMMARY_COLUMNS` order.

    ``times_run`` and the steps come from the trace store; the wall times from the engine's
    cost table (``None`` where cost measurement was off).
    """
    rows = []
    for key in _sorted_keys(set(store.stats) | set(cost)):
        algorithm, _, event = key.rpartition("/")
        stats = store.stats.get(key)
        spent = cost.get(key)
        calls = stats.count if stats is not None else int(spent[0]) if spent is not None else 0
        total = float(spent[1]) if spent is not None else None
        mean_ms = total / spent[0] * 1e3 if spent is not None and spent[0] else None
        rows.append([
            algorithm, event, calls,
            stats.first_step if stats is not None else None,
            stats.last_step if stats is not None else None,
            total, mean_ms,
        ])
    return rows


def render_timeline(store: TraceStore, title: str = "Which algorithm ran at which step") -> bytes:
    """A PNG image: one row per ``Algorithm/EVENT``, one column per step (or per bin of steps).

    Uses matplotlib's Agg canvas directly (no ``pyplot``, no global figure state).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    timeline = store.timeline
    keys = _sorted_keys(timeline.rows)
    columns = max(1, timeline.columns)
    matrix = [[1.0 if i < len(timeline.rows[k]) and timeline.rows[k][i] else 0.0 for i in range(columns)] for k in keys]
    if not matrix:
        matrix = [[0.0] * columns]
    height = 1.2 + 0.28 * max(1, len(keys))
    figure = Figure(figsize=(10, height), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    span = columns * timeline.bin_size
    axes.imshow(
        matrix, aspect="auto", interpolation="nearest", cmap="Blues", vmin=0, vmax=1,
        extent=(-0.5, span - 0.5, len(matrix) - 0.5, -0.5),
    )
    for row in range(1, len(matrix)):
        axes.axhline(row - 0.5, color="white", linewidth=1)
    axes.set_yticks(range(len(keys)))
    axes.set_yticklabels(keys, fontsize=8)
    unit = "step" if timeline.bin_size == 1 else f"step (columns of {timeline.bin_size} steps)"
    axes.set_xlabel(unit)
    axes.set_title(title, fontsize=10)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def log_wandb_report(
    trainer: Any, store: TraceStore, cost: Mapping[str, Sequence[float]], step: int, failed: bool = False
) -> None:
    """Log the summary table, the timeline image and the cost totals to every W&B run (call on rank zero).

    The runs belong to the user's ``WandbLogger``: they are written to, never finished. After a
    failed fit Lightning leaves the run open for the user's own error handling, and so does this.
    """
    _log_report(wandb_loggers(trainer), store, cost, step, failed)


def _log_report(loggers: list[Any], store: TraceStore, cost: Mapping[str, Sequence[float]], step: int, failed: bool) -> None:
    if not loggers or not (store.stats or cost):
        return
    import wandb

    rows = summary_rows(store, cost)
    per_algorithm: dict[str, float] = {}
    for key, (_, seconds) in cost.items():
        algorithm = key.rpartition("/")[0]
        per_algorithm[algorithm] = per_algorithm.get(algorithm, 0.0) + float(seconds)
    caption = f"algorithm traces up to step {step}" + (" (the run failed here)" if failed else "")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "algorithm_timeline.png"
        path.write_bytes(render_timeline(store))
        for logger in loggers:
            run = logger.experiment
            run.log({
                SUMMARY_KEY: wandb.Table(columns=list(SUMMARY_COLUMNS), data=[list(r) for r in rows]),
                TIMELINE_KEY: wandb.Image(str(path), caption=caption),
                "trainer/global_step": step,
            })
            summary = {f"algorithm_cost/{name}/apply_seconds": seconds for name, seconds in per_algorithm.items()}
            if failed:
                summary["algorithm_report/failed_at_step"] = step
            if summary:
                run.summary.update(summary)

