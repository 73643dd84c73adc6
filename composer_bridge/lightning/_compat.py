"""Every place the bridge leans on a detail of Lightning that is not public API, in one module.

Each function here names the assumption it makes; ``tests/lightning/test_compat.py`` checks every
one of them against the installed Lightning, so a release that changes one fails loudly there
instead of silently changing the bridge's behaviour.

Both Lightning packages are served: each function takes the classes it checks from
:mod:`~composer_bridge.lightning.package` (the package of the object at hand, or every loaded one).

Examples:
    >>> import lightning as L
    >>> trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False)
    >>> is_training(trainer)
    False
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from composer_bridge.lightning.package import PACKAGES, classes_in_every_package, package_of

if TYPE_CHECKING:  # type hints only: at run time the classes come from package.py (either package)
    import lightning as L

__all__ = [
    "BATCH_TRANSFER_HOOKS",
    "data_hook_owner",
    "ddp_kwargs",
    "hide_hook",
    "is_training",
    "lightning_weight_averaging",
    "max_time",
    "restores_checkpoint_after_setup",
    "set_strategy_optimizers",
    "show_hook",
    "step_counter",
    "set_strategy_schedulers",
    "wrap_checkpoint_saves",
]

#: The data hooks Lightning runs on the LightningDataModule when it overrides them, else on the module.
BATCH_TRANSFER_HOOKS = ("on_before_batch_transfer", "on_after_batch_transfer")


def hide_hook(callback: L.Callback, name: str) -> None:
    """Hide ``callback.<name>`` from Lightning's hook dispatch.

    Assumption: Lightning's ``_call_callback_hooks`` skips a hook attribute that is not callable
    (``lightning/pytorch/trainer/call.py``: ``if callable(fn)``); an instance attribute ``None``
    shadows the class's method without changing the class.
    """
    setattr(callback, name, None)


def show_hook(callback: L.Callback, name: str) -> None:
    """Undo :func:`hide_hook` (nothing happens if the hook was not hidden)."""
    callback.__dict__.pop(name, None)


def is_training(trainer: L.Trainer) -> bool:
    """``trainer.training`` without its string comparison (read on every micro-batch).

    Assumption: ``trainer.state.stage`` holds a ``RunningStage`` member (public enum, internal field)
    of the Trainer's package; the members of both packages are compared by identity.
    """
    stage = trainer.state.stage
    return stage is _TRAINING[0] or stage is _TRAINING[1]


_TRAINING = tuple(package.RunningStage.TRAINING for package in PACKAGES)


def data_hook_owner(hook: str, module: L.LightningModule, datamodule: L.LightningDataModule | None) -> Any:
    """The object to hook ``hook`` on so that Lightning calls it and the user's own hook still runs.

    Assumption: with a DataModule, Lightning's ``_DataHookSelector.get_instance`` calls the
    DataModule's hook when ``is_overridden(hook, datamodule)``, else the module's (and warns when
    only the module overrides it). So: the DataModule when it overrides the hook, else the module.
    Must be asked *before* the bridge patches either object; the bridge's patch is transparent to
    ``is_overridden`` (see :class:`~composer_bridge.lightning.module_patches.ModulePatches`), so
    Lightning's choice, and its warnings, stay what they were.
    """
    if datamodule is not None and _overrides(hook, datamodule):
        return datamodule
    return module


def _overrides(hook: str, obj: Any) -> bool:
    """``is_overridden`` of the object's own package (each package's refuses the other's objects)."""
    package = package_of(obj)
    if package is None:
        raise TypeError(f"{type(obj).__name__} is neither a lightning.pytorch nor a pytorch_lightning object.")
    return bool(package.is_overridden(hook, obj))


def step_counter(trainer: L.Trainer, automatic_optimization: bool) -> Callable[[], int]:
    """A cheap reader of ``trainer.global_step`` for the loop about to run (read once per micro-batch).

    ``trainer.global_step`` walks several properties per read; this resolves them once. Assumption:
    the fit loop's progress trackers (``optim_progress.optimizer.step.total`` under automatic
    optimization, ``optim_step_progress.total`` under manual) are updated in place for the length
    of a ``fit`` (restored in place from a checkpoint). Resolve it at ``on_train_start``.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    if automatic_optimization:
        tracker = epoch_loop.automatic_optimization.optim_progress.optimizer.step.total
    else:
        tracker = epoch_loop.manual_optimization.optim_step_progress.total
    return lambda: tracker.completed


def ddp_kwargs(strategy: Any) -> dict[str, Any] | None:
    """The keyword arguments a DDP strategy will pass to ``DistributedDataParallel`` (mutable), or ``None``.

    Assumption: ``DDPStrategy`` keeps them in ``_ddp_kwargs`` until it wraps the model, which it
    does after ``Callback.setup``. ``None`` for strategies that are not DDP (single device, FSDP, ...);
    a DDP strategy without them raises, so ``find_unused_parameters`` is never skipped silently.
    """
    kwargs = getattr(strategy, "_ddp_kwargs", None)
    if isinstance(kwargs, dict):
        return kwargs
    if isinstance(strategy, classes_in_every_package("strategies", "DDPStrategy")):
        raise RuntimeError(
            f"composer_bridge cannot read {type(strategy).__name__}'s DDP arguments in this Lightning version, so it "
            "cannot set find_unused_parameters=True for algorithms that leave parameters without gradients. Use "
            "strategy='ddp_find_unused_parameters_true' (or DDPStrategy(find_unused_parameters=True)) and report this."
        )
    return None


def restores_checkpoint_after_setup(strategy: Any) -> bool:
    """Whether the strategy loads checkpoint weights only after wrapping the model (e.g. FSDP, DeepSpeed).

    Assumption: the public-but-undocumented ``Strategy.restore_checkpoint_after_setup`` property.
    """
    return bool(getattr(strategy, "restore_checkpoint_after_setup", False))


def set_strategy_optimizers(trainer: L.Trainer, optimizers: list[Any]) -> None:
    """Make Lightning step ``optimizers`` (e.g. SAM's wrappers) instead of the ones it created.

    Assumption: the strategy's ``optimizers`` setter re-wraps them in ``LightningOptimizer``.
    """
    trainer.strategy.optimizers = list(optimizers)


def max_time(trainer: L.Trainer) -> timedelta | None:
    """The ``Trainer(max_time=...)`` limit, read from the ``Timer`` callback Lightning adds for it.

    Assumption: ``max_time`` becomes a ``callbacks.Timer`` (of the Trainer's package) with a ``_duration``
    in seconds.
    """
    timers = classes_in_every_package("callbacks", "Timer")
    for callback in trainer.callbacks:
        if isinstance(callback, timers):
            seconds = getattr(callback, "_duration", None)
            if seconds is not None:
                return timedelta(seconds=float(seconds))
    return None


def lightning_weight_averaging() -> tuple[type, ...]:
    """Lightning's own weight-averaging callbacks (``StochasticWeightAveraging``, ``WeightAveraging``), both packages'."""
    return classes_in_every_package("callbacks", "StochasticWeightAveraging", "WeightAveraging")


def set_strategy_schedulers(trainer: L.Trainer, schedulers: list[Any]) -> None:
    """Make Lightning step only ``schedulers``, a subset of the ones ``configure_optimizers`` returned.

    Used where an algorithm replaces the user's schedule (WarmupStableDecay, ScheduleFree) and so
    drops their schedulers. Assumption: ``Strategy.lr_scheduler_configs`` is a plain list attribute that
    the fit loop steps (``update_lr_schedulers``) and checkpoints (``lr_schedulers``) from, read after
    ``on_fit_start``. A scheduler that is not among the user's ones is refused (it would need a config
    of its own: interval, frequency, monitor).
    """
    configs = list(trainer.strategy.lr_scheduler_configs)
    known = {id(config.scheduler) for config in configs}
    unknown = [type(s).__name__ for s in schedulers if id(s) not in known]
    if unknown:
        raise ValueError(
            f"composer_bridge can only keep or drop the schedulers configure_optimizers returned; {', '.join(unknown)} "
            "is new. An algorithm that schedules the learning rate sets it on the optimizer instead."
        )
    kept = {id(s) for s in schedulers}
    trainer.strategy.lr_scheduler_configs = [config for config in configs if id(config.scheduler) in kept]


def wrap_checkpoint_saves(trainer: L.Trainer, around: Callable[[], AbstractContextManager[Any]]) -> None:
    """Write every checkpoint of ``trainer`` inside ``around()`` (e.g. with a schedule-free optimizer's averaged weights).

    Assumption: every checkpoint Lightning writes goes through ``Trainer.save_checkpoint``
    (``ModelCheckpoint``, ``OnExceptionCheckpoint``, the SLURM requeue save, the user's own call),
    which reads the weights and optimizer states (``dump_checkpoint``) inside it; an instance
    attribute shadows the method. Calling it again replaces the previous wrapper.
    """
    original = type(trainer).save_checkpoint.__get__(trainer)

    def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        with around():
            return original(*args, **kwargs)

    trainer.save_checkpoint = save_checkpoint  # type: ignore[method-assign]
