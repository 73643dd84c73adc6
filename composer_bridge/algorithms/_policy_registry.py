"""The classes an extension package teaches a surgery: one registry per surgery (ALiBi, QKNorm, GLU).

``composer_bridge.hf`` registers Hugging Face classes this way on import; a surgery's default policy is its
own classes plus what was registered (a class registered again replaces its function).

Examples:
    >>> import torch
    >>> registry = PolicyRegistry("register_demo_policy")
    >>> registry.register(torch.nn.Linear, lambda module: None)
    >>> sorted(cls.__name__ for cls in registry.with_defaults({torch.nn.Conv2d: lambda module: None}))
    ['Conv2d', 'Linear']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

__all__ = ["PolicyRegistry"]


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
