"""Intercepting torch's loss calls: the loss functions a plain ``training_step`` calls, seen on its own thread.

A LightningModule computes its loss inside ``training_step``, either through a criterion
submodule (``nn.CrossEntropyLoss``, ``nn.BCEWithLogitsLoss``, ...) or by calling
``torch.nn.functional.cross_entropy`` itself. The criterion modules call the functional form
through the ``torch.nn.functional`` module too, so replacing the few functions below on that
module sees both shapes. :func:`intercept` does so only while a step runs:

- the functions are replaced when the first step on any thread starts and restored when the
  last one ends (a count under a lock, so steps on two threads, e.g. two Trainers, do not undo
  each other), and restored even when the step raises;
- a replaced function hands the call to the step's handler only on the thread that runs the
  step (a ``threading.local``); any other thread, and any call made while the handler itself
  runs (an algorithm computing a loss), gets the original function unchanged.

A name bound with ``from torch.nn.functional import cross_entropy`` before the step is not seen
(it holds the original function); :func:`direct_imports` finds such names so that an error can
say so.

Examples:
    >>> import torch
    >>> import torch.nn.functional as F
    >>> seen = []
    >>> def handler(name, original, input, target, args, kwargs):
    ...     seen.append(name)
    ...     return original(input, target, *args, **kwargs)
    >>> with intercept(handler):
    ...     _ = F.cross_entropy(torch.zeros(2, 3), torch.tensor([0, 1]))
    ...     _ = torch.nn.CrossEntropyLoss()(torch.zeros(2, 3), torch.tensor([0, 1]))
    >>> seen
    ['cross_entropy', 'cross_entropy']
    >>> F.cross_entropy.__module__, F.cross_entropy.__name__
    ('torch.nn.functional', 'cross_entropy')
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch.nn.functional

__all__ = ["INTERCEPTED", "LossHandler", "direct_imports", "intercept", "original"]

#: the functions of ``torch.nn.functional`` a step's handler sees (first two arguments: input, target)
INTERCEPTED: tuple[str, ...] = ("cross_entropy", "binary_cross_entropy_with_logits", "binary_cross_entropy", "nll_loss")

#: ``handler(name, original, input, target, args, kwargs) -> loss``
LossHandler = Callable[[str, Callable[..., Any], Any, Any, tuple[Any, ...], dict[str, Any]], Any]

_ORIGINALS: dict[str, Callable[..., Any]] = {name: getattr(torch.nn.functional, name) for name in INTERCEPTED}
_local = threading.local()
_lock = threading.Lock()
_active_steps = 0


def _dispatcher(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def dispatch(input: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
        handler = getattr(_local, "handler", None)
        if handler is None:
            return original(input, target, *args, **kwargs)
        _local.handler = None  # calls made while the handler runs get the original
        try:
            return handler(name, original, input, target, args, kwargs)
        finally:
            _local.handler = handler

    dispatch.__name__ = original.__name__
    dispatch.__qualname__ = original.__qualname__
    dispatch.__module__ = original.__module__
    dispatch.__doc__ = original.__doc__
    dispatch.__wrapped__ = original  # type: ignore[attr-defined]
    return dispatch


_DISPATCHERS: dict[str, Callable[..., Any]] = {name: _dispatcher(name, fn) for name, fn in _ORIGINALS.items()}


@contextmanager
def intercept(handler: LossHandler) -> Iterator[None]:
    """Route this thread's calls of the :data:`INTERCEPTED` functions to ``handler`` inside the block."""
    global _active_steps
    with _lock:
        if _active_steps == 0:
            for name, dispatch in _DISPATCHERS.items():
                setattr(torch.nn.functional, name, dispatch)
        _active_steps += 1
    previous = getattr(_local, "handler", None)
    _local.handler = handler
    try:
        yield
    finally:
        _local.handler = previous
        with _lock:
            _active_steps -= 1
            if _active_steps == 0:
                for name, original in _ORIGINALS.items():
                    # Another library that replaced the function after us keeps its replacement.
                    if getattr(torch.nn.functional, name) is _DISPATCHERS[name]:
                        setattr(torch.nn.functional, name, original)


def original(name: str) -> Callable[..., Any]:
    """The unpatched ``torch.nn.functional.<name>`` for one of the :data:`INTERCEPTED` names."""
    return _ORIGINALS[name]


def direct_imports(module: ModuleType | None) -> list[str]:
    """Names in ``module``'s globals bound to an intercepted function itself (``from ... import cross_entropy``).

    Examples:
        >>> import types
        >>> user_code = types.ModuleType("user_code")
        >>> user_code.ce = torch.nn.functional.cross_entropy
        >>> direct_imports(user_code)
        ['ce']
    """
    if module is None:
        return []
    originals = {id(fn) for fn in _ORIGINALS.values()}
    return sorted(name for name, value in vars(module).items() if id(value) in originals)
