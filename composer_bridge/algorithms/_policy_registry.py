"""The classes an extension package teaches a surgery (one registry per surgery: ALiBi, QKNorm, GLU), and the user's.

``composer_bridge.hf`` registers Hugging Face classes this way on import; a surgery's default policy is its
own classes plus what was registered (a class registered again replaces its function); the user's
``policy=`` entries go before them (:func:`user_first`).

Examples:
    >>> import torch
    >>> registry = PolicyRegistry("register_demo_policy")
    >>> registry.register(torch.nn.Linear, lambda module: None)
    >>> sorted(cls.__name__ for cls in registry.with_defaults({torch.nn.Conv2d: lambda module: None}))
    ['Conv2d', 'Linear']
    >>> mine = {torch.nn.ReLU: lambda module: None}
    >>> defaults = registry.with_defaults({torch.nn.Conv2d: lambda module: None})
    >>> [cls.__name__ for cls in user_first(mine, defaults, "Demo", "fn(module)")]  # the user's entries first
    ['ReLU', 'Conv2d', 'Linear']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

__all__ = ["PolicyRegistry", "check_policy", "user_first"]


class PolicyRegistry:
    """``{nn.Module subclass: conversion function}`` filled by one ``register_*_policy`` function."""

    def __init__(self, register_name: str) -> None:
        self.register_name = register_name  #: the public function's name, for its error message
        self._registered: dict[type, Callable[..., Any]] = {}

    def register(self, cls: type, fn: Callable[..., Any]) -> None:
        """Add (or replace) ``cls``'s conversion; refuses anything but an ``nn.Module`` subclass and a function."""
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)) or not callable(fn):
            raise TypeError(f"{self.register_name}({cls!r}, {fn!r}): needs an nn.Module subclass and a function.")
        self._registered[cls] = fn

    def with_defaults(self, defaults: dict[type, Callable[..., Any]]) -> dict[type, Callable[..., Any]]:
        """A fresh policy: ``defaults`` and every registered class (registered ones win)."""
        return {**defaults, **self._registered}


def check_policy(policy: object, algorithm: str, mapping: str, signature: str) -> None:
    """Refuse a user's ``policy=`` that is not a mapping of ``nn.Module`` subclasses to functions.

    The errors name ``algorithm``, the ``mapping`` expected (``"attention class: fn(module, eps)"``) and the
    functions' ``signature`` (``"fn(module, eps)"``); ``None`` (no policy) passes.
    """
    if policy is None:
        return
    if not isinstance(policy, Mapping):
        raise TypeError(f"{algorithm}(policy={policy!r}): must be a mapping {{{mapping}}}.")
    for cls, fn in policy.items():
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)) or not callable(fn):
            raise TypeError(
                f"{algorithm} policy entry {cls!r}: {fn!r} must map an nn.Module subclass to a function "
                f"{signature} -> module or None."
            )


def user_first(policy: Mapping[type, Callable[..., Any]] | None, defaults: dict[type, Callable[..., Any]],
               algorithm: str, signature: str, keys: str = "module class") -> dict[type, Callable[..., Any]]:
    """The policy a surgery applies: the user's ``policy`` entries first, then its ``defaults`` (registered ones included).

    First, so that they win over the defaults for their classes and subclasses. ``policy`` is checked
    (:func:`check_policy`, expecting ``{keys: signature}``).
    """
    check_policy(policy, algorithm, f"{keys}: {signature}", signature)
    if policy is None:
        return defaults
    return {**dict(policy), **{k: v for k, v in defaults.items() if k not in policy}}
