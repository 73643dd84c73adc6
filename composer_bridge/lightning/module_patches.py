"""Instance-level hooks the bridge installs on the user's LightningModule, and removes afterwards.

Lightning gives callbacks no hook around batch transfer, inside ``training_step`` or before the
model's weights are restored from a checkpoint; those moments are where Composer's
``AFTER_DATALOADER``, ``BEFORE_BACKWARD`` (with a loss an algorithm may replace) and
``BEFORE_LOAD`` live. The bridge therefore sets a few methods on the module *instance* (never its
class) for the length of a run: Lightning looks hooks up on the instance, DDP's wrapper calls
``module.training_step`` through it, and :meth:`ModulePatches.remove` restores the module exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ModulePatches"]

_MISSING = object()


class ModulePatches:
    """Set attributes on one module instance and restore the previous ones later.

    Example:
        >>> m = torch.nn.Linear(1, 1)
        >>> patches = ModulePatches(m)
        >>> patches.set("extra_repr", lambda: "patched")
        >>> m.extra_repr()
        'patched'
        >>> patches.remove()
        >>> m.extra_repr()
        'in_features=1, out_features=1, bias=True'
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self._saved: dict[str, Any] = {}

    def set(self, name: str, value: Callable[..., Any]) -> None:
        """Install ``value`` as the instance attribute ``name``."""
        if name not in self._saved:
            self._saved[name] = self.module.__dict__.get(name, _MISSING)
        self.module.__dict__[name] = value

    def original(self, name: str) -> Callable[..., Any]:
        """The attribute ``name`` as it was before patching (bound method or instance attribute)."""
        saved = self._saved.get(name, _MISSING)
        if saved is not _MISSING:
            return saved
        return getattr(type(self.module), name).__get__(self.module, type(self.module))

    def remove(self) -> None:
        """Restore every patched attribute."""
        for name, saved in self._saved.items():
            if saved is _MISSING:
                self.module.__dict__.pop(name, None)
            else:
                self.module.__dict__[name] = saved
        self._saved.clear()
