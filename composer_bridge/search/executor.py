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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from composer_bridge.search.candidates import Candidate

#: How a fit's error starts when the fit raised with candidates (not a worker that died): the candidates'
#: failure on this model. The configuration then drops out of the search with that reason.
RAISED = "raised "

__all__ = ["RAISED", "Executor", "FitOutcome", "FitTask", "InProcessExecutor", "device_count", "execute", "needs_own_launcher"]


@dataclass
class FitTask:
    """Everything one fit needs; picklable when the factories are defined at module level."""

    make_module: Callable[..., Any]
    make_data: Callable[..., Any]
    candidates: list[Candidate]
    steps: int
    seed: int
    monitor: str
    clock: str
    trainer_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class FitOutcome:
    """What one fit measured, or why it failed (``error``; then ``quality`` is NaN)."""

    quality: float
    seconds: float  #: on the search's clock
    cpu_s: float
    wall_s: float
    fit_wall_s: float  #: the whole fit and validation, Lightning's set-up included
    error: str | None = None
    processes: int = 1  #: the Trainer's world size: 2 for a DDP fit on two devices


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


def needs_own_launcher(trainer_kwargs: dict[str, Any]) -> bool:
    """Does a Trainer with these settings start more processes (DDP on several devices or nodes)?

    Examples:
        >>> needs_own_launcher({"strategy": "ddp", "devices": 2}), needs_own_launcher({"devices": 1})
        (True, False)
    """
    strategy = trainer_kwargs.get("strategy", "auto")
    if isinstance(strategy, str) and "spawn" in strategy:
        return False  # Lightning's spawn launchers start the ranks from the fit itself
    return device_count(trainer_kwargs) > 1 or trainer_kwargs.get("num_nodes", 1) > 1


def device_count(trainer_kwargs: dict[str, Any]) -> int:
    """How many devices (processes, for DDP) one fit with these Trainer settings uses on one machine.

    Examples:
        >>> device_count({"devices": 2}), device_count({"devices": [0, 1, 2]}), device_count({"accelerator": "cpu"})
        (2, 3, 1)
    """
    devices = trainer_kwargs.get("devices", "auto")
    accelerator = str(trainer_kwargs.get("accelerator", "auto"))
    if isinstance(devices, bool):
        return 1
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str) and "," in devices:
        return len([d for d in devices.split(",") if d.strip()])
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if devices in ("auto", -1):
        if accelerator == "cpu":
            return 1
        import torch

        return max(1, torch.cuda.device_count())
    return int(devices) if isinstance(devices, int) else 1


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
                                         task.monitor, task.clock, task.trainer_kwargs)
    except Exception as error:
        if not task.candidates:
            raise  # the user's own run fails without any candidate: a bug to fix, not a result
        # with candidates, a fit that raises is those candidates' failure on this model: recorded, and the
        # search goes on without them
        reason = f"{RAISED}{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        return FitOutcome(float("nan"), 0.0, 0.0, 0.0, time.perf_counter() - started, error=reason[:500])
    return FitOutcome(quality, timer.seconds(task.clock), timer.cpu_s, timer.wall_s, time.perf_counter() - started,
                      processes=module.trainer.world_size)


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
