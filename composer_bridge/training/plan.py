"""The plan: for each event, the order the algorithms will run in, and warnings about known conflicts.

:func:`make_plan` finds which algorithms take part in each event by asking their ``match`` —
with copies of the run's state set to several points of the run (start, 10 %, 25 %, 50 %,
75 %, 90 %, last step), since many algorithms only start part-way through — plus the events at
which they were seen running so far. The order is what the engine's passes make of the
algorithms taking part in the event, in your list's order. (The engine orders, at each event,
only those that match at that moment; the default passes keep their relative order, so this is
the order you will see in the traces.)

Known conflicts it warns about, found by the capabilities the algorithms declare (see
:class:`~composer_bridge.core.algorithm.Algorithm`), never by class name:

- several algorithms interpolate the loss (``interpolates_loss``: MixUp and CutMix; the sentence
  is :func:`~composer_bridge.core.passes.loss_interpolation_conflict`'s);
- a data augmentation (``augments_data``) runs before a ``runs_first`` algorithm (SelectiveBackprop,
  which should rank the clean examples) at an event;
- a model-surgery algorithm runs after one that ``converts_memory_format`` (ChannelsLast) at
  ``INIT`` (the layers it creates keep the default memory format);
- two algorithms that ``averages_weights`` (EMA and SWA) both keep averaged weights;
- a pass warned while ordering.

Examples:
    >>> from composer_bridge.core.algorithm import Algorithm
    >>> from composer_bridge.core.event import Event
    >>> class Smooth(Algorithm):
    ...     def match(self, event, state):
    ...         return event in (Event.BEFORE_LOSS, Event.AFTER_LOSS)
    ...     def apply(self, event, state, logger):
    ...         pass
    >>> class Clip(Smooth):
    ...     pass
    >>> print(make_plan([Smooth(), Clip()]))
    BEFORE_LOSS: Smooth, Clip
    AFTER_LOSS: Clip, Smooth
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from composer_bridge.core.algorithm import declares, declaring
from composer_bridge.core.event import Event
from composer_bridge.core.passes import (
    DEFAULT_PASSES,
    MultipleLossInterpolationWarning,
    loss_interpolation_conflict,
)
from composer_bridge.core.time import TimeUnit
from composer_bridge.core.trace import algorithm_labels

__all__ = ["Plan", "make_plan"]

_PROBE_FRACTIONS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


@dataclass
class Plan:
    """The order of the algorithms at each event where any runs, and the warnings found.

    ``print(plan)`` shows one line per event (``EVENT: First, Second``), then the warnings.
    """

    #: event → algorithm labels (class names; ``Name#2`` for a second instance of a class), in run
    #: order (only events where some algorithm takes part).
    orders: dict[Event, list[str]] = field(default_factory=dict)
    #: Known conflicts and pass warnings, as sentences.
    warnings: list[str] = field(default_factory=list)
    #: Notes on what could not be probed.
    notes: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The plan as text (what ``str(plan)`` returns)."""
        if not self.orders:
            lines = ["(no algorithm matches any event)"]
        else:
            lines = [f"{event.name}: {', '.join(names)}" for event, names in self.orders.items()]
        lines += [f"WARNING: {w}" for w in self.warnings]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text


def _probe_states(state: Any) -> list[Any]:
    """Copies of ``state`` at several points of the run (just ``state`` if its length is unknown)."""
    if state is None:
        return []
    probes = [state]
    duration = getattr(state, "max_duration", None)
    if duration is None or duration.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH):
        return probes
    total = int(duration.value)
    per_epoch = state.dataloader_len or 0
    for fraction in _PROBE_FRACTIONS:
        point = min(max(total - 1, 0), int(fraction * total))
        if duration.unit == TimeUnit.EPOCH:
            epoch, batch, in_epoch = point, point * per_epoch, 0
        else:
            epoch = point // per_epoch if per_epoch else 0
            batch, in_epoch = point, point % per_epoch if per_epoch else point
        probe = copy.copy(state)
        probe.timestamp = state.timestamp.copy(epoch=epoch, batch=batch, batch_in_epoch=in_epoch)
        probes.append(probe)
    return probes


def _takes_part(algorithm: Any, event: Event, probes: Sequence[Any], failed: set[str]) -> bool:
    for probe in probes:
        try:
            if algorithm.match(event, probe):
                return True
        except Exception:
            failed.add(type(algorithm).__name__)
    return False


def _run_passes(passes: Sequence[Any], algorithms: list[Any], event: Event, pass_warnings: list[str]) -> list[Any]:
    ordered = list(algorithms)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for algorithm_pass in passes:
            ordered = list(algorithm_pass(ordered, event))
    for warning in caught:
        # The loss-interpolation warning is reported once, by the conflict check below.
        if not issubclass(warning.category, MultipleLossInterpolationWarning):
            pass_warnings.append(f"at {event.name}: {warning.message}")
    return ordered


def _conflicts(algorithms: Sequence[Any], orders: Mapping[Event, list[Any]]) -> list[str]:
    found = []
    mixing = loss_interpolation_conflict(algorithms)
    if mixing is not None:
        found.append(mixing)
    for event, ordered in orders.items():
        # An algorithm that must run first (SelectiveBackprop: it ranks the clean examples) after an augmentation.
        for position, first in enumerate(ordered):
            if not declares(first, "runs_first"):
                continue
            before = [type(a).__name__ for a in declaring(ordered[:position], "augments_data")]
            if before:
                name = type(first).__name__
                found.append(
                    f"at {event.name}, {', '.join(before)} run{'s' if len(before) == 1 else ''} before "
                    f"{name}, which then sees augmented examples instead of the clean ones. Remove the "
                    f"pass that moves them ahead of it, or list {name} first."
                )
    init = orders.get(Event.INIT, [])
    for position, converter in enumerate(init):
        if not declares(converter, "converts_memory_format"):
            continue
        after = [a for a in init[position + 1 :] if _is_surgery(a)]
        if after:
            names = ", ".join(type(a).__name__ for a in after)
            first = type(converter).__name__
            found.append(
                f"{names} change{'s' if len(after) == 1 else ''} the model after {first} at INIT: the layers "
                f"created then stay in the default memory format. List {first} after the surgery algorithms."
            )
    averaging = [type(a).__name__ for a in declaring(algorithms, "averages_weights")]
    if len(averaging) > 1:
        found.append(
            f"{' and '.join(averaging)} both keep averaged weights and each swaps its own into the model; keep one."
        )
    return found


def _is_surgery(algorithm: Any) -> bool:
    try:
        return bool(type(algorithm).required_on_load())
    except Exception:
        return False


def make_plan(
    algorithms: Sequence[Any],
    passes: Sequence[Any] = DEFAULT_PASSES,
    state: Any = None,
    observed: Iterable[str] = (),
) -> Plan:
    """The :class:`Plan` for ``algorithms`` ordered by ``passes``.

    Args:
        algorithms: the run's algorithms, in the order you gave them.
        passes: the passes in the order they run (``engine.passes``).
        state: the run's :class:`~composer_bridge.State`, to probe ``match``; without one,
            ``match`` is asked with a bare state (no model, batch or duration).
        observed: trace keys (``"<label>/EVENT"``) seen so far; those algorithms take part in
            those events whatever ``match`` says now.
    """
    algorithms = list(algorithms)
    label_of = {id(a): label for a, label in zip(algorithms, algorithm_labels(algorithms), strict=True)}
    if state is None:
        import torch

        from composer_bridge.core.state import State

        state = State(torch.nn.Module(), algorithms=algorithms)
    probes = _probe_states(state)
    seen: dict[str, set[str]] = {}
    for key in observed:
        name, _, event_name = key.rpartition("/")
        seen.setdefault(event_name, set()).add(name)
    failed: set[str] = set()
    pass_warnings: list[str] = []
    orders: dict[Event, list[Any]] = {}
    for event in Event:
        seen_here = seen.get(event.name, set())
        taking_part = [
            a for a in algorithms if label_of[id(a)] in seen_here or _takes_part(a, event, probes, failed)
        ]
        if taking_part:
            orders[event] = _run_passes(passes, taking_part, event, pass_warnings)
    plan = Plan(
        orders={event: [label_of.get(id(a), type(a).__name__) for a in ordered] for event, ordered in orders.items()},
        warnings=_conflicts(algorithms, orders) + list(dict.fromkeys(pass_warnings)),
    )
    if failed:
        plan.notes.append(
            f"match() raised for {', '.join(sorted(failed))} on a state away from a running step; the events "
            "where it raised are left out unless the algorithm was seen running there."
        )
    return plan
