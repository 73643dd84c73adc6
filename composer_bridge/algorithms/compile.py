"""Compile: ``torch.compile`` on the model after every surgery, in place, so checkpoints keep their keys.

Lightning leaves compiling to the user, who compiles before the callback's surgery can run (and a
compiled model hides its modules from it). This algorithm compiles at ``Event.INIT`` after every
other algorithm (the default passes run ``compiles_model`` algorithms last, after the ``runs_last``
norms), so the compiled graph holds what BlurPool, ChannelsLast, QKNorm, ALiBi and the rest left.

What is compiled: each submodule your ``LightningModule`` holds directly (``self.net``, ``self.model``;
the items of a ``ModuleList``/``ModuleDict``), with ``nn.Module.compile``, in place: parameter names,
``state_dict`` keys and checkpoints are those of the uncompiled model. A submodule compiled already is
left alone, so set-up running twice compiles once. A module that holds no submodule with parameters
is refused at set-up, naming the fix.

Examples:
    >>> import torch
    >>> holder = torch.nn.Module()
    >>> holder.net = torch.nn.Linear(2, 2)
    >>> compile_submodules(holder, backend="eager")
    ['net']
    >>> compile_submodules(holder, backend="eager")  # compiled already
    []
"""

from __future__ import annotations

from typing import Any

import torch

from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.state import State

__all__ = ["Compile", "compile_submodules", "compile_targets"]


def _is_compiled(module: torch.nn.Module) -> bool:
    return getattr(module, "_compiled_call_impl", None) is not None


def compile_targets(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The submodules :class:`Compile` compiles: each direct child with parameters (a container's items)."""
    targets: list[tuple[str, torch.nn.Module]] = []
    for name, child in model.named_children():
        if not any(True for _ in child.parameters()):
            continue
        if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            targets += [(f"{name}.{key}", item) for key, item in child.named_children()
                        if any(True for _ in item.parameters())]
        else:
            targets.append((name, child))
    return targets


def compile_submodules(model: torch.nn.Module, **compile_kwargs: Any) -> list[str]:
    """Compile :func:`compile_targets` of ``model`` in place; return the names compiled now."""
    done = []
    for name, module in compile_targets(model):
        if not _is_compiled(module):
            module.compile(**compile_kwargs)
            done.append(name)
    return done


class Compile(Algorithm):
    """``torch.compile`` the model's submodules in place at ``Event.INIT``, after every surgery.

    Args:
        backend: ``torch.compile``'s backend. Default ``"inductor"``; ``"eager"`` or ``"aot_eager"``
            check a model compiles without generating code.
        mode: ``torch.compile``'s mode (``None``, ``"default"``, ``"reduce-overhead"``, ``"max-autotune"``).
        fullgraph: refuse graph breaks. Default ``False``.
        dynamic: ``torch.compile``'s ``dynamic`` (``None``: decided by torch).

    Examples:
        >>> Compile(backend="eager")
        Compile(backend='eager', mode=None, fullgraph=False, dynamic=None)
    """

    unique = True
    compiles_model = True

    def __init__(self, backend: str = "inductor", mode: str | None = None, fullgraph: bool = False,
                 dynamic: bool | None = None) -> None:
        if not isinstance(backend, str) or not backend:
            raise ValueError(f"Compile(backend={backend!r}): expected a torch.compile backend name, e.g. 'inductor'.")
        modes = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
        if mode not in modes:
            raise ValueError(f"Compile(mode={mode!r}): expected one of {modes}.")
        for name, value in (("fullgraph", fullgraph),):
            if not isinstance(value, bool):
                raise ValueError(f"Compile({name}={value!r}): must be True or False.")
        self.backend, self.mode, self.fullgraph, self.dynamic = backend, mode, fullgraph, dynamic
        self.compiled: list[str] = []

    def finds_nothing_in(self, model: torch.nn.Module) -> str | None:
        if compile_targets(model):
            return None
        return (f"Compile finds no submodule to compile in {type(model).__name__}: it compiles the submodules your "
                "LightningModule holds (self.net = ...), and this one holds its parameters directly")

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        reason = self.finds_nothing_in(state.model)
        if reason is not None:
            raise ValueError(f"{reason}. Put the network in a submodule, or remove Compile.")
        kwargs = {"backend": self.backend, "mode": self.mode, "fullgraph": self.fullgraph, "dynamic": self.dynamic}
        self.compiled = compile_submodules(state.model, **kwargs)
        logger.log_hyperparameters({"Compile/compiled": len(self.compiled)})
