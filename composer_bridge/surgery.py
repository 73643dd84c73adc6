"""Model surgery for your own algorithms: swap modules by class or predicate, optimizers kept in step.

The helpers the library's surgery algorithms (BlurPool, SqueezeExcite, Factorize, ...) are built
on, as a public module. A *policy* maps a module class (or a predicate ``module -> bool``) to a
function ``(module, index) -> replacement or None``; ``index`` counts the modules that key has
matched so far. Replacements keep the replaced module's device, dtype and train/eval mode, shared
modules stay shared, and the walk never goes inside a replacement.

Coming from Composer: ``composer.utils.module_surgery.replace_module_classes(model, policies,
optimizers)`` is :func:`replace_module_classes` here (same policy shape, returns ``{old: new}``)
and ``count_module_instances`` is :func:`count_module_instances`. Composer's
``recurse_on_replacements=True`` and ``indices=`` have no counterpart: a replacement is never
walked into, and a policy that wants only some instances returns ``None`` for the others (it
receives their ``index``). :func:`replace_modules` gives the full record of what changed.

Examples:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2), nn.ReLU())
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> swapped = replace_module_classes(model, {nn.ReLU: lambda m, i: nn.GELU()}, optimizers=opt)
    >>> len(swapped), count_module_instances(model, nn.GELU), count_module_instances(model, nn.ReLU)
    (2, 2, 0)
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from composer_bridge.algorithms._surgery import (
    NoEffectWarning,
    Optimizers,
    PolicyKey,
    Replacement,
    ReplacementFunction,
    SurgeryAlgorithm,
    replace_modules,
)

__all__ = [
    "NoEffectWarning",
    "Optimizers",
    "PolicyKey",
    "Replacement",
    "ReplacementFunction",
    "SurgeryAlgorithm",
    "count_module_instances",
    "replace_module_classes",
    "replace_modules",
]


def replace_module_classes(
    module: nn.Module, policies: Mapping[PolicyKey, ReplacementFunction], optimizers: Optimizers = None
) -> dict[nn.Module, nn.Module]:
    """Apply ``policies`` to ``module`` in place; return ``{replaced module: its replacement}``.

    Modules a policy changed in place (returned unchanged) are not in the result. Pass
    ``optimizers`` when they already exist: replaced parameters leave their param groups and the
    new trainable ones join the group of the parameters they replace.

    Examples:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
        >>> [type(new).__name__ for new in replace_module_classes(model, {nn.Tanh: lambda m, i: nn.ReLU()}).values()]
        ['ReLU']
    """
    return {r.old: r.new for r in replace_modules(module, policies, optimizers=optimizers) if not r.in_place}


def count_module_instances(module: nn.Module, module_class: type | tuple[type, ...]) -> int:
    """How many modules of ``module_class`` ``module`` holds, itself included, each counted once.

    Examples:
        >>> from torch import nn
        >>> count_module_instances(nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2))), nn.Linear)
        2
    """
    if not isinstance(module_class, (type, tuple)):
        raise TypeError(
            f"count_module_instances(module_class={module_class!r}): expected a module class or a tuple of them, "
            f"e.g. torch.nn.Linear."
        )
    return sum(isinstance(child, module_class) for child in module.modules())
