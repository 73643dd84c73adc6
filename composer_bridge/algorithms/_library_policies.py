"""Surgery policies for other libraries' classes, brought in when a model holds one of those classes.

:mod:`composer_bridge.hf` teaches ``Alibi`` and ``GatedLinearUnits`` Hugging Face's classes by
registering policies when it is imported, and the algorithms never import ``transformers``
themselves (it stays an optional dependency). So that ``apply_alibi(gpt2)`` works without that
import, the surgeries with registered policies first call :func:`load_library_policies`: when one
of the model's modules is an instance of a class defined in a library of :data:`LIBRARY_POLICIES`
(told by the module name of the class or of any of its bases, so your subclass of a Hugging Face
class counts), the package that registers that library's policies is imported. A model holding no
such class imports nothing.

Examples:
    >>> import sys
    >>> from torch import nn
    >>> libraries_of(nn.Sequential(nn.Linear(2, 2)))
    {'torch'}
    >>> load_library_policies(nn.Sequential(nn.Linear(2, 2)))  # no Hugging Face class: nothing imported
    []
"""

from __future__ import annotations

import importlib
import sys

from torch import nn

__all__ = ["LIBRARY_POLICIES", "libraries_of", "load_library_policies", "unloaded_policies_hint"]

#: ``{library's top-level package: composer_bridge package that registers policies for its classes}``.
LIBRARY_POLICIES: dict[str, str] = {"transformers": "composer_bridge.hf"}


def libraries_of(model: nn.Module) -> set[str]:
    """The top-level packages that define the classes of ``model``'s modules and their bases."""
    classes = {type(module) for module in model.modules()}
    return {base.__module__.partition(".")[0] for cls in classes for base in cls.__mro__} - {"builtins"}


def load_library_policies(model: nn.Module) -> list[str]:
    """Import the packages registering policies for the libraries ``model``'s classes come from.

    Returns the names of those packages (already imported ones included), so a caller can say
    which policies were in play. An import error is raised as it is: the model's own library is
    installed, so a failure there is a real incompatibility to report, not a reason to change
    nothing silently.
    """
    packages = sorted(LIBRARY_POLICIES[library] for library in libraries_of(model) & LIBRARY_POLICIES.keys())
    for package in packages:
        importlib.import_module(package)
    return packages


def unloaded_policies_hint() -> str:
    """A sentence naming the policy packages not imported yet (empty when all are), for no-effect warnings."""
    missing = [f"{package} ({library})" for library, package in LIBRARY_POLICIES.items() if package not in sys.modules]
    if not missing:
        return ""
    return (
        f" Classes of other libraries are known once their package is imported: {', '.join(missing)}; "
        "this happens by itself for a model holding that library's classes."
    )
