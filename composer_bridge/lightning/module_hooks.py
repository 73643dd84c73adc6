"""The hooks the bridge installs on the user's LightningModule (and DataModule) for the length of a run.

Lightning gives callbacks no hook around batch transfer, inside ``training_step`` or before the
model's weights are restored; Composer's ``AFTER_DATALOADER``, ``BEFORE_BACKWARD`` and
``BEFORE_LOAD`` live there. :class:`ModuleHooks` sets a few methods on the module *instance*
(never its class) through :class:`~composer_bridge.lightning.module_patches.ModulePatches` and
removes them at teardown, leaving the objects exactly as they were.

The batch-transfer hooks go on the object whose hook Lightning will actually call: the
DataModule when it overrides the hook, else the LightningModule — decided per hook *before*
anything is patched (an instance attribute would make any hook look overridden).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from composer_bridge.core.algorithm import declaring
from composer_bridge.core.event import Event
from composer_bridge.lightning import _compat
from composer_bridge.lightning.hook_map import HOOK_EVENTS
from composer_bridge.lightning.module import ComposerModuleMixin
from composer_bridge.lightning.module_patches import ModulePatches
from composer_bridge.lightning.package import package_of
from composer_bridge.lightning.plain_loss import PlainLossStep

if TYPE_CHECKING:
    import lightning as L

    from composer_bridge.lightning.steps import ModuleSteps

__all__ = ["ModuleHooks"]

#: plain modules: the step methods whose forward pass the bridge brackets with their events
_EVAL_STEPS = ("validation_step", "test_step", "predict_step")


class ModuleHooks:
    """Install and remove the bridge's instance-level hooks on one module (and its DataModule).

    ``run`` is the run in progress, through its module-facing step API
    (:class:`~composer_bridge.lightning.steps.ModuleSteps`): the hooks call its ``fire_event``,
    ``before_checkpoint_load`` and ``after_batch_transfer`` and read its ``listening`` and ``state``.

    Examples:
        >>> import torch
        >>> from composer_bridge import ComposerClassifier
        >>> module = ComposerClassifier(torch.nn.Linear(2, 2), num_classes=2)
        >>> from composer_bridge.lightning.steps import ModuleSteps
        >>> hooks = ModuleHooks(module, ModuleSteps())  # nothing listens: only the checkpoint hook is installed
        >>> "on_load_checkpoint" in vars(module)
        True
        >>> hooks.remove()
        >>> "on_load_checkpoint" in vars(module)
        False
    """

    def __init__(self, module: L.LightningModule, run: ModuleSteps) -> None:
        self.module = module
        self._run = run
        self._patches = ModulePatches(module)
        self._data_patches: list[ModulePatches] = []
        self.events_installed = False
        self._plain_loss: PlainLossStep | None = None
        on_load = self._patches.original("on_load_checkpoint")

        def on_load_checkpoint(checkpoint: dict[str, Any]) -> Any:
            run.before_checkpoint_load(checkpoint)
            return on_load(checkpoint)

        self._patches.set("on_load_checkpoint", on_load_checkpoint)

    # ------------------------------------------------------------------------------------------
    def install_events(self, trainer: L.Trainer) -> None:
        """Install the per-step event hooks (the first time anything listens)."""
        if self.events_installed:
            return
        self.events_installed = True
        self._install_data_hooks(trainer)
        self._install_backward()
        if not isinstance(self.module, ComposerModuleMixin):
            self._install_plain_steps()

    def _install_data_hooks(self, trainer: L.Trainer) -> None:
        run = self._run
        datamodule = trainer.datamodule
        owners = {hook: _compat.data_hook_owner(hook, self.module, datamodule) for hook in _compat.BATCH_TRANSFER_HOOKS}
        patches = {id(self.module): self._patches}
        for owner in owners.values():
            if id(owner) not in patches:
                patches[id(owner)] = ModulePatches(owner)
                self._data_patches.append(patches[id(owner)])
        before_patches = patches[id(owners["on_before_batch_transfer"])]
        after_patches = patches[id(owners["on_after_batch_transfer"])]
        before_transfer = before_patches.original("on_before_batch_transfer")
        after_transfer = after_patches.original("on_after_batch_transfer")

        (before_dataloader,) = HOOK_EVENTS["on_before_batch_transfer"]

        def on_before_batch_transfer(batch: Any, dataloader_idx: int) -> Any:
            if run.listening and _compat.is_training(trainer):
                run.fire_event(before_dataloader)
            return before_transfer(batch, dataloader_idx)

        def on_after_batch_transfer(batch: Any, dataloader_idx: int) -> Any:
            batch = after_transfer(batch, dataloader_idx)
            if not _compat.is_training(trainer):
                return batch
            return run.after_batch_transfer(batch)

        before_patches.set("on_before_batch_transfer", on_before_batch_transfer)
        after_patches.set("on_after_batch_transfer", on_after_batch_transfer)

    def _install_backward(self) -> None:
        run = self._run
        backward = self._patches.original("backward")

        def backward_hook(loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            state = run.state
            if state is not None:
                # read at every step: a plain attribute loop, not declaring() (which checks the
                # capability's name first); every algorithm in a State is an Algorithm, with the attribute
                for algorithm in state.algorithms:
                    if algorithm.backwards_create_graph:
                        kwargs.setdefault("create_graph", True)
                        break
            return backward(loss, *args, **kwargs)

        self._patches.set("backward", backward_hook)

    def _install_plain_steps(self) -> None:
        """A plain module gets BEFORE_BACKWARD after its training_step (all loss events when an algorithm
        needs them, see :mod:`~composer_bridge.lightning.plain_loss`), and eval/predict forward events."""
        run = self._run
        training_step = self._patches.original("training_step")
        if run.state is not None and declaring(run.state.algorithms, "needs_loss_events"):
            self._plain_loss = plain = PlainLossStep(self.module, run, training_step)
            self._patches.set("training_step", plain.step)
        else:
            self._patches.set("training_step", _before_backward(training_step, run))
        is_overridden = package_of(self.module).is_overridden  # the module's package: either refuses the other's
        for name in _EVAL_STEPS:
            if is_overridden(name, self.module):
                before, after = HOOK_EVENTS[name]
                self._patches.set(name, _bracket(self._patches.original(name), run, before, after))

    def loss_record(self) -> dict[str, Any] | None:
        """The loss a plain module's ``training_step`` was seen to compute (see :meth:`PlainLossStep.record`)."""
        return self._plain_loss.record() if self._plain_loss is not None else None

    def load_loss_record(self, checkpoint: dict[str, Any]) -> None:
        """Take the loss record of ``checkpoint`` (see :meth:`PlainLossStep.load_from`), if a plain loss step runs."""
        if self._plain_loss is not None:
            self._plain_loss.load_from(checkpoint)

    def remove(self) -> None:
        """Restore every patched object exactly."""
        for patches in self._data_patches:
            patches.remove()
        self._data_patches = []
        self._patches.remove()
        if self._plain_loss is not None:
            self._plain_loss.close()
            self._plain_loss = None
        self.events_installed = False


def _before_backward(training_step: Callable[..., Any], run: ModuleSteps) -> Callable[..., Any]:
    (before_backward,) = HOOK_EVENTS["training_step[plain]"]

    def wrapped_training_step(*args: Any, **kwargs: Any) -> Any:
        output = training_step(*args, **kwargs)
        loss = output.get("loss") if isinstance(output, dict) else output
        state = run.state
        if not isinstance(loss, torch.Tensor) or state is None:
            return output
        state.outputs, state.loss = output, loss
        run.fire_event(before_backward)
        if state.loss is loss:
            return output
        if isinstance(output, dict):
            return {**output, "loss": state.loss}
        return state.loss

    return wrapped_training_step


def _bracket(step: Callable[..., Any], run: ModuleSteps, before: Event, after: Event) -> Callable[..., Any]:
    def wrapped(batch: Any, *args: Any, **kwargs: Any) -> Any:
        state = run.state
        state.batch = batch
        run.fire_event(before)
        state.outputs = step(state.batch, *args, **kwargs)
        run.fire_event(after)
        return state.outputs

    return wrapped
