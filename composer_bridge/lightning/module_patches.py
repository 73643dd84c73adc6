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

    A hook the user set on the instance (``model.training_step = wrapper``) is what
    :meth:`original` returns, so the bridge's hook calls it, exactly as Lightning would have.
    :meth:`remove` puts back what was there before (or nothing). A hook the user replaced *while*
    the patch was installed is the user's latest word: it stays, and the bridge's is simply dropped.

    Examples:
        >>> m = torch.nn.Linear(1, 1)
        >>> m.extra_repr = lambda: "the user's"
        >>> patches = ModulePatches(m)
        >>> users = patches.original("extra_repr")
        >>> patches.set("extra_repr", lambda: "patched around " + users())
        >>> m.extra_repr()
        "patched around the user's"
        >>> patches.remove()
        >>> m.extra_repr()
        "the user's"
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self._saved: dict[str, Any] = {}
        self._installed: dict[str, Any] = {}

    def set(self, name: str, value: Callable[..., Any]) -> None:
        """Install ``value`` as the instance attribute ``name``.

        What is installed calls ``value`` while the patch is in place and, once removed, what was
        there before: a user's wrapper that captured the bridge's hook during the run (and so
        outlives :meth:`remove`) keeps working without the bridge. Lightning sees the original
        through it: its signature, and whether it overrides the class's hook (so Lightning picks
        the same object's hook and gives the same warnings as without the bridge).
        """
        original = self.original(name)
        if name not in self._saved:
            self._saved[name] = self.module.__dict__.get(name, _MISSING)
        installed = self._installed

        def hook(*args: Any, **kwargs: Any) -> Any:
            return (value if name in installed else original)(*args, **kwargs)

        # Lightning reads a hook's signature (does training_step take batch_idx, dataloader_iter?) and
        # asks is_overridden; both unwrap __wrapped__ one level only, so the hook carries the original's
        # own __wrapped__ where it has one (a user's functools.wraps decorator or partial, whose
        # __wrapped__ a bound method passes on): both then see exactly what they would see unpatched.
        hook.__wrapped__ = getattr(original, "__wrapped__", original)  # type: ignore[attr-defined]
        self.module.__dict__[name] = hook
        installed[name] = hook

    def original(self, name: str) -> Callable[..., Any]:
        """The attribute ``name`` as Lightning would call it without the patch.

        The instance's own attribute when the user set one, else the class's method bound to the instance.
        """
        value = self._saved[name] if name in self._saved else self.module.__dict__.get(name, _MISSING)
        if value is not _MISSING:
            return value
        return getattr(type(self.module), name).__get__(self.module, type(self.module))

    def remove(self) -> None:
        """Restore every patched attribute the user has not replaced since."""
        for name, saved in self._saved.items():
            if self.module.__dict__.get(name, _MISSING) is not self._installed[name]:
                continue  # replaced while installed: the user's latest hook stays
            if saved is _MISSING:
                self.module.__dict__.pop(name, None)
            else:
                self.module.__dict__[name] = saved
        self._saved.clear()
        self._installed.clear()  # the hooks installed so far now pass through, whoever still holds them
        self._installed = {}
