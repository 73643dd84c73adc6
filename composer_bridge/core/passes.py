"""Algorithm passes: pure functions that reorder the algorithms matched at an event.

A pass takes ``(algorithms, event)`` and returns a list holding the same algorithms, possibly
reordered. The engine runs its passes in order and caches the result per event and algorithm
set, so a pass must depend on nothing else.

The default passes find algorithms by the marker attributes they declare on
:class:`~composer_bridge.core.algorithm.Algorithm` (``runs_first``, ``runs_last``,
``interpolates_loss``), so this module never imports the algorithm library, and an algorithm of
yours takes part by setting the marker.

The default passes, in the order they run:

1. :func:`set_filo_order` — on after-events (``AFTER_*``, ``EVAL_AFTER_*``, ``*_END``; see
   :attr:`Event.is_after_event`), reverse (A B C D → D C B A), so algorithms undo their changes
   in the opposite order they made them.
2. :func:`sort_selective_backprop_first` — ``runs_first`` algorithms (SelectiveBackprop) run first on every event. It runs
   *after* the reversal so that it stays first on ``AFTER_DATALOADER`` too (Composer runs the
   reversal last, which leaves it last there, after the augmentations it should precede).
3. :func:`sort_low_precision_norms_last` — ``runs_last`` algorithms (LowPrecisionLayerNorm/GroupNorm) run last.
4. :func:`sort_compile_last` — ``compiles_model`` algorithms (Compile) run after those: they compile what every
   surgery has left.
5. :func:`warn_if_multiple_loss_interpolation` — warns when several algorithms mix the loss.

Examples:
    >>> from composer_bridge.core.event import Event
    >>> class A: pass
    >>> class SelectiveBackprop: pass
    >>> a, sb = A(), SelectiveBackprop()
    >>> [type(x).__name__ for x in sort_to_front([a, sb], "SelectiveBackprop")]
    ['SelectiveBackprop', 'A']
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from composer_bridge.core.algorithm import declares, declaring
from composer_bridge.core.event import Event

if TYPE_CHECKING:
    from composer_bridge.core.algorithm import Algorithm

__all__ = [
    "AlgorithmPass",
    "DEFAULT_PASSES",
    "MultipleLossInterpolationWarning",
    "loss_interpolation_conflict",
    "normalize_passes",
    "set_filo_order",
    "sort_compile_last",
    "sort_low_precision_norms_last",
    "sort_selective_backprop_first",
    "sort_to_back",
    "sort_to_front",
    "warn_if_multiple_loss_interpolation",
]

AlgorithmPass = Callable[[Sequence["Algorithm"], Event], list["Algorithm"]]


class MultipleLossInterpolationWarning(UserWarning):
    """More than one algorithm interpolates the loss at the same event."""


def _is(algorithm: Any, cls: type | str | tuple[type | str, ...]) -> bool:
    targets = cls if isinstance(cls, tuple) else (cls,)
    for target in targets:
        if isinstance(target, str):
            if type(algorithm).__name__ == target:
                return True
        elif isinstance(algorithm, target):
            return True
    return False


def _partition(algorithms: Sequence[Algorithm], chosen: Callable[[Any], bool], to_front: bool) -> list[Algorithm]:
    picked, rest = [], []
    for algorithm in algorithms:
        (picked if chosen(algorithm) else rest).append(algorithm)
    return picked + rest if to_front else rest + picked


def sort_to_front(algorithms: Sequence[Algorithm], cls: type | str | tuple[type | str, ...]) -> list[Algorithm]:
    """Move the instances of ``cls`` (a class, a class name, or a tuple of them) to the front, stably."""
    return _partition(algorithms, lambda a: _is(a, cls), True)


def sort_to_back(algorithms: Sequence[Algorithm], cls: type | str | tuple[type | str, ...]) -> list[Algorithm]:
    """Move the instances of ``cls`` (a class, a class name, or a tuple of them) to the back, stably."""
    return _partition(algorithms, lambda a: _is(a, cls), False)


def set_filo_order(algorithms: Sequence[Algorithm], event: Event) -> list[Algorithm]:
    """Reverse the order on after-events (``AFTER_*``, ``*_END``), so the last to change something undoes first."""
    return list(reversed(algorithms)) if event.is_after_event else list(algorithms)


def _runs_first(algorithm: Any) -> bool:
    return declares(algorithm, "runs_first")


def _runs_last(algorithm: Any) -> bool:
    return declares(algorithm, "runs_last")


def sort_selective_backprop_first(algorithms: Sequence[Algorithm], event: Event) -> list[Algorithm]:
    """Algorithms with ``runs_first = True`` (SelectiveBackprop) run before the others."""
    return _partition(algorithms, _runs_first, True)


def sort_low_precision_norms_last(algorithms: Sequence[Algorithm], event: Event) -> list[Algorithm]:
    """Algorithms with ``runs_last = True`` (LowPrecisionLayerNorm/GroupNorm) run after the others."""
    return _partition(algorithms, _runs_last, False)


def sort_compile_last(algorithms: Sequence[Algorithm], event: Event) -> list[Algorithm]:
    """Algorithms with ``compiles_model = True`` (Compile) run after all others, surgery included."""
    return _partition(algorithms, lambda a: declares(a, "compiles_model"), False)


def loss_interpolation_conflict(algorithms: Sequence[Any], joiner: str = " and ", where: str = "") -> str | None:
    """The sentence naming the algorithms that all interpolate the loss, or ``None`` when at most one does.

    The one definition of this conflict: the default pass below warns with it at each event, and
    ``plan()`` lists it once for the run.

    Examples:
        >>> class Mix:
        ...     interpolates_loss = True
        >>> class MixToo(Mix):
        ...     pass
        >>> loss_interpolation_conflict([Mix(), MixToo()])[:40]
        'Mix and MixToo all interpolate the loss;'
    """
    mixing = [type(a).__name__ for a in declaring(algorithms, "interpolates_loss")]
    if len(mixing) < 2:
        return None
    return (
        f"{joiner.join(mixing)} all interpolate the loss{where}; their mixing compounds and the targets no longer "
        "match the inputs. Keep one of them, or set interpolate_loss=False in all but one."
    )


def warn_if_multiple_loss_interpolation(algorithms: Sequence[Algorithm], event: Event) -> list[Algorithm]:
    """Warn when more than one algorithm interpolates the loss (e.g. MixUp and CutMix together)."""
    conflict = loss_interpolation_conflict(algorithms, ", ", f" at Event.{event.name}")
    if conflict is not None:
        warnings.warn(conflict, MultipleLossInterpolationWarning, stacklevel=2)
    return list(algorithms)


DEFAULT_PASSES: tuple[AlgorithmPass, ...] = (
    set_filo_order,
    sort_selective_backprop_first,
    sort_low_precision_norms_last,
    sort_compile_last,
    warn_if_multiple_loss_interpolation,
)


def normalize_passes(algorithm_passes: Any) -> list[tuple[AlgorithmPass, int]]:
    """Turn a pass, a ``(pass, index)`` pair, or a list of these into ``[(pass, index), ...]``.

    A pair may be a tuple or a two-item list, as Composer accepts: ``[p, 0]`` is one pass at
    index 0, ``[[p, 0], q]`` two passes.

    Examples:
        >>> def p(algorithms, event):
        ...     return list(algorithms)
        >>> normalize_passes([[p, 0], p]) == [(p, 0), (p, -1)]
        True
    """
    if algorithm_passes is None:
        return []
    if callable(algorithm_passes) or _is_pass_with_index(algorithm_passes):
        algorithm_passes = [algorithm_passes]
    if not isinstance(algorithm_passes, (list, tuple)):
        raise ValueError(_bad_pass_message(algorithm_passes))
    normalized = []
    for item in algorithm_passes:
        if callable(item):
            normalized.append((item, -1))
        elif _is_pass_with_index(item):
            normalized.append((item[0], item[1]))
        else:
            raise ValueError(_bad_pass_message(item))
    return normalized


def _is_pass_with_index(item: Any) -> bool:
    return (
        isinstance(item, (tuple, list)) and len(item) == 2 and callable(item[0])
        and isinstance(item[1], int) and not isinstance(item[1], bool)
    )


def _bad_pass_message(item: Any) -> str:
    return (
        f"algorithm_passes got {item!r} ({type(item).__name__}). Accepted: a pass (a callable "
        "(algorithms, event) -> list of algorithms), a (pass, index) pair (tuple or list), or a list of these."
    )
