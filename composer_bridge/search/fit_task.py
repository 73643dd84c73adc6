"""What one fit of the search is, and what it measured: the task an executor runs and its outcome.

A leaf of the search's modules (the executors, the child-process fit and the fit itself all import it, it
imports none of them).

Examples:
    >>> FitOutcome(0.9, 1.0, 1.0, 1.2, 2.0).error is None
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from composer_bridge.search.candidates import Candidate
from composer_bridge.search.curve_rule import CurvePoint, CurveRule

__all__ = ["RAISED", "FitOutcome", "FitTask", "curve_fields", "device_count", "needs_own_launcher"]

#: How a fit's error starts when the fit raised with candidates (not a worker that died): the candidates'
#: failure on this model. The configuration then drops out of the search with that reason.
RAISED = "raised "



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
    #: validate as it trains and stop by this rule (the prescription search); ``None``: validate once at the end
    curve: CurveRule | None = None


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
    points: list[CurvePoint] | None = None  #: the validations along the run (a fit with a ``curve`` rule)
    stopped: str | None = None  #: why such a run stopped before its end (``None``: it trained to the end)


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


def curve_fields(timer: Any) -> dict[str, Any]:
    """The outcome's ``points`` and ``stopped`` from a fit's timer (empty for a fit validated once at the end)."""
    points = getattr(timer, "points", None)
    return {} if points is None else {"points": [list(p) for p in points], "stopped": timer.stopped}
