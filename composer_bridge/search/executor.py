"""Where the search's fits run: the seam between the search's decisions and its training.

A fit is a pure function of a :class:`FitTask` (module and data factories, candidates, run
length, seed, Trainer settings) to a :class:`FitOutcome`. The search hands tasks to an
executor and decides from outcomes only, so *where* a fit ran cannot change a decision.

* :class:`InProcessExecutor` (the default): one fit at a time, in this process, in the order
  submitted. A fit whose Trainer runs several processes (``strategy="ddp"``, ``devices=2``) runs
  in a child process whose script is the fit itself (:mod:`composer_bridge.search.fit_process`),
  so Lightning's launcher re-runs that fit, not the user's whole script, as the other ranks.
* :class:`composer_bridge.search.ray_executor.RayExecutor`: every fit a Ray task with its own
  resources, as many side by side as the cluster holds.

Examples:
    >>> executor = InProcessExecutor()
    >>> executor.pending()
    0
"""

from __future__ import annotations

import time
from typing import Protocol

from composer_bridge.search.fit_task import (
    RAISED,
    FitOutcome,
    FitTask,
    curve_fields,
    device_count,
    needs_own_launcher,
)

__all__ = ["RAISED", "Executor", "FitOutcome", "FitTask", "InProcessExecutor", "device_count", "execute", "needs_own_launcher"]


class Executor(Protocol):
    """Runs fits: ``submit`` queues one, ``next_done`` blocks until one of them has finished.

    ``concurrent`` is ``True`` when submitted fits run side by side: the search then submits every
    fit that does not depend on another before it waits.
    """

    concurrent: bool
    #: ``True``: a worker that would otherwise wait may train a fit before the search knows it needs it
    speculate: bool

    def slots(self) -> int:
        """How many fits can train at once."""

    def start(self, sample: FitTask) -> None:
        """Check that fits like ``sample`` can run here (before any training); start resources."""

    def submit(self, task: FitTask) -> int:
        """Queue ``task``; return its ticket."""

    def next_done(self) -> tuple[int, FitOutcome]:
        """Block until a queued fit has finished; return its ticket and outcome."""

    def pending(self) -> int:
        """How many queued fits have not been returned by :meth:`next_done` yet."""

    def close(self) -> None:
        """Cancel what is still queued and release resources."""


def execute(task: FitTask) -> FitOutcome:
    """Run one fit here (or, for a multi-process Trainer, in a child process with its own launcher)."""
    if needs_own_launcher(task.trainer_kwargs):
        from composer_bridge.search.fit_process import run_in_child

        return run_in_child(task)
    from composer_bridge.search.trial import run_fit

    started = time.perf_counter()
    try:
        algorithms = [c.build(task.steps) for c in task.candidates]
        quality, timer, module = run_fit(task.make_module, task.make_data, algorithms, task.steps, task.seed,
                                         task.monitor, task.clock, task.trainer_kwargs, curve=task.curve)
    except Exception as error:
        if not task.candidates:
            raise  # the user's own run fails without any candidate: a bug to fix, not a result
        # with candidates, a fit that raises is those candidates' failure on this model: recorded, and the
        # search goes on without them
        reason = f"{RAISED}{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        return FitOutcome(float("nan"), 0.0, 0.0, 0.0, time.perf_counter() - started, error=reason[:500])
    return FitOutcome(quality, timer.seconds(task.clock), timer.cpu_s, timer.wall_s, time.perf_counter() - started,
                      processes=module.trainer.world_size, **curve_fields(timer))


class InProcessExecutor:
    """One fit at a time, in this process, in the order submitted (the search's default).

    Examples:
        >>> from composer_bridge.search import search_recipe  # doctest: +SKIP
        >>> search_recipe(make_module, make_data, max_fits=40, executor=InProcessExecutor())  # doctest: +SKIP
    """

    concurrent = False  #: fits run one at a time: the search asks for each when it needs it
    speculate = False

    def slots(self) -> int:
        return 1

    def __init__(self) -> None:
        self._queue: list[tuple[int, FitTask]] = []
        self._tickets = 0

    def start(self, sample: FitTask) -> None:
        if needs_own_launcher(sample.trainer_kwargs):
            from composer_bridge.search.fit_process import check_shippable

            check_shippable(sample, "a child process")

    def submit(self, task: FitTask) -> int:
        self._tickets += 1
        self._queue.append((self._tickets, task))
        return self._tickets

    def next_done(self) -> tuple[int, FitOutcome]:
        ticket, task = self._queue.pop(0)
        return ticket, execute(task)

    def pending(self) -> int:
        return len(self._queue)

    def close(self) -> None:
        self._queue.clear()
