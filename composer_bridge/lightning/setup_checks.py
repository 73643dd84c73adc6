"""What the bridge checks at ``setup``, before anything trains: capabilities the algorithms declare.

Algorithms never look at Lightning. They declare what they need and what they change with the
capabilities of :class:`~composer_bridge.core.algorithm.Algorithm` (documented there), and these
checks compare the declarations with the module and Trainer at hand:

- ``needs_loss_events``: the forward/loss events: a ``ComposerModule``, or a plain module whose
  ``training_step`` calls a loss the bridge can see (:mod:`~composer_bridge.lightning.plain_loss`);
- ``needs_run_length``: ``max_epochs`` or ``max_steps`` (not only ``max_time``);
- ``needs_optimizer_closure``: automatic optimization, no fp16 gradient scaler, no accumulation;
- ``averages_weights``: refused beside Lightning's ``StochasticWeightAveraging``/``WeightAveraging``;
- ``clips_gradients``: refused beside ``Trainer(gradient_clip_val=...)``;
- ``freezes_layers``: a warning beside Lightning's ``BaseFinetuning`` callbacks;
- ``non_contiguous_weights``: refused under FSDP2 (``ModelParallelStrategy``), whose
  ``fully_shard`` cannot shard non-contiguous weights. FSDP2 itself is refused on CPU processes
  with a torch older than :data:`~composer_bridge.core.torch_versions.FSDP2_ON_CPU` (2.7).

Before these, :func:`check_one_package`: the module and DataModule come from the Trainer's
Lightning package (``lightning.pytorch`` or ``pytorch_lightning``).

A check that fails raises :class:`BridgeConfigurationError` naming the algorithm, what is wrong
and the fix; a combination that works but may surprise is returned as a warning sentence, which
``callback.plan()`` lists.

Examples:
    >>> import lightning as L
    >>> from composer_bridge.algorithms import GradientClipping
    >>> trainer = L.Trainer(gradient_clip_val=1.0, logger=False, enable_checkpointing=False,
    ...                     enable_progress_bar=False)
    >>> try:
    ...     check_trainer([GradientClipping("norm", 1.0)], trainer)
    ... except BridgeConfigurationError as error:
    ...     print(str(error)[:60])
    GradientClipping and the Trainer's gradient_clip_val=1.0 bot
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from composer_bridge.core import torch_versions
from composer_bridge.core.algorithm import declaring
from composer_bridge.lightning import _compat
from composer_bridge.lightning.errors import BridgeConfigurationError
from composer_bridge.lightning.package import LightningPackage, classes_in_every_package, package_of
from composer_bridge.lightning.plain_loss import check_plain_module

if TYPE_CHECKING:
    import lightning as L

__all__ = ["BridgeConfigurationError", "check_module", "check_one_package", "check_trainer"]


def _names(algorithms: Sequence[Any], capability: str) -> list[str]:
    return [type(a).__name__ for a in declaring(algorithms, capability)]


def _verb(names: list[str]) -> str:
    return ", ".join(names) + (" needs" if len(names) == 1 else " need")


def check_module(algorithms: Sequence[Any], module: L.LightningModule, is_composer_module: bool) -> None:
    """Refuse loss algorithms on a plain module where what it shows at setup cannot be made exact.

    A plain module's loss is found inside its ``training_step`` (see
    :mod:`~composer_bridge.lightning.plain_loss`); what only the first step shows is refused there.
    """
    if not is_composer_module:
        check_plain_module(algorithms, module)


def check_trainer(algorithms: Sequence[Any], trainer: L.Trainer, automatic_optimization: bool = True) -> list[str]:
    """Refuse what cannot work with this Trainer; return warnings for what works but may surprise."""
    warnings: list[str] = []
    _check_run_length(algorithms, trainer)
    _check_closure(algorithms, trainer, automatic_optimization)
    averaging = _names(algorithms, "averages_weights")
    theirs = [type(c).__name__ for c in trainer.callbacks if isinstance(c, _compat.lightning_weight_averaging())]
    if averaging and theirs:
        raise BridgeConfigurationError(
            f"{', '.join(averaging)} and Lightning's {', '.join(theirs)} would both average the weights and swap the "
            "average into the model, each undoing the other. Fix: keep one — remove "
            f"{', '.join(theirs)} from Trainer(callbacks=[...]) or {', '.join(averaging)} from the bridge's algorithms."
        )
    clipping = _names(algorithms, "clips_gradients")
    clip_val = getattr(trainer, "gradient_clip_val", None)
    if clipping and clip_val:
        raise BridgeConfigurationError(
            f"{', '.join(clipping)} and the Trainer's gradient_clip_val={clip_val} both clip the gradients (Lightning "
            "clips again after the algorithm, with its own threshold). Fix: keep one — drop gradient_clip_val from "
            f"the Trainer or {', '.join(clipping)} from the algorithms."
        )
    _check_sharding(algorithms, trainer)
    freezing = _names(algorithms, "freezes_layers")
    finetuning = [type(c).__name__ for c in trainer.callbacks if _is_finetuning(c)]
    if freezing and finetuning:
        warnings.append(
            f"{', '.join(freezing)} and Lightning's {', '.join(finetuning)} both set requires_grad on the model's "
            "parameters; the later one wins for a parameter both touch."
        )
    return warnings


def _check_sharding(algorithms: Sequence[Any], trainer: L.Trainer) -> None:
    layout = _names(algorithms, "non_contiguous_weights")
    strategy = type(trainer.strategy).__name__
    if layout and strategy == "ModelParallelStrategy":
        raise BridgeConfigurationError(
            f"{', '.join(layout)} makes the convolution weights channels-last (non-contiguous) at setup, and {strategy}'s "
            "FSDP2 (fully_shard in configure_model) cannot shard non-contiguous parameters (torch: 'FSDP does not "
            f"support non-contiguous parameters yet'). Fix: remove {', '.join(layout)} from the algorithms under "
            f"{strategy}, or train with DDP."
        )
    if strategy == "ModelParallelStrategy" and trainer.strategy.root_device.type == "cpu" \
            and not torch_versions.fsdp2_runs_on_cpu():
        need = ".".join(map(str, torch_versions.FSDP2_ON_CPU))
        raise BridgeConfigurationError(
            f"{strategy}'s FSDP2 (fully_shard) trains on CPU processes from torch {need} on; this is torch "
            f"{torch.__version__}, whose FSDP2 fails at the first forward ('Stream' object has no attribute "
            f"'record_event'). Fix: install torch>={need}, train on GPUs, or use strategy='ddp' on the CPU."
        )


def _check_run_length(algorithms: Sequence[Any], trainer: L.Trainer) -> None:
    needy = _names(algorithms, "needs_run_length")
    if not needy:
        return
    max_steps = trainer.max_steps
    max_epochs = trainer.max_epochs
    if (max_steps is not None and max_steps > 0) or (max_epochs is not None and max_epochs > 0):
        return
    limit = _compat.max_time(trainer)
    why = (
        f"the Trainer stops on max_time={limit} only, a wall-clock limit the schedule cannot be placed on"
        if limit is not None
        else "the Trainer has neither max_epochs nor max_steps"
    )
    raise BridgeConfigurationError(
        f"{_verb(needy)} the run's length (a schedule given as a fraction of the run), but {why}. Fix: set "
        "Trainer(max_steps=...) or Trainer(max_epochs=...) (max_time can stay as a safety limit), or give the "
        "schedule in steps or epochs ('500ba', '3ep') instead of a fraction."
    )


def _check_closure(algorithms: Sequence[Any], trainer: L.Trainer, automatic_optimization: bool) -> None:
    needy = _names(algorithms, "needs_optimizer_closure")
    if not needy:
        return
    what = _verb(needy)
    precision = str(trainer.precision)
    if precision in ("16-mixed", "16"):
        raise BridgeConfigurationError(
            f"{what} Lightning to evaluate the loss through the optimizer's closure twice per step, which "
            f"precision={precision!r} prevents: fp16 AMP's gradient scaler evaluates the closure once and then steps "
            "without it. Fix: use precision='bf16-mixed' (no scaler) or '32-true'."
        )
    if trainer.accumulate_grad_batches > 1:
        raise BridgeConfigurationError(
            f"{what} Lightning's optimizer closure, which with accumulate_grad_batches={trainer.accumulate_grad_batches} "
            "re-evaluates only the last micro-batch, so the second gradient would miss the others. Fix: use a larger "
            "batch size (or more devices) instead of accumulation."
        )
    if not automatic_optimization:
        raise BridgeConfigurationError(
            f"{what} Lightning's automatic optimization (it wraps the optimizers the Trainer steps), but this module "
            "sets automatic_optimization=False. Fix: call SAMOptimizer(optimizer).step(closure) in your "
            "training_step instead, or use automatic optimization."
        )


def _is_finetuning(callback: Any) -> bool:
    return isinstance(callback, classes_in_every_package("callbacks", "BaseFinetuning"))


def check_one_package(trainer: Any, module: Any) -> LightningPackage:
    """The run's Lightning package (the Trainer's); refuse a module or DataModule of the other package.

    Lightning's own ``fit`` refuses a module of the other package first (``TypeError: `model` must be a
    `LightningModule```) and fails on such a DataModule (``ValueError: Expected a parent``); this check
    names both packages for whatever reaches the bridge. Callbacks and loggers of the other package
    are accepted, as Lightning accepts them.

    Examples:
        >>> import lightning as L, pytorch_lightning as pl
        >>> trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False)
        >>> check_one_package(trainer, pl.LightningModule()).name
        'pytorch_lightning'
        >>> try:
        ...     check_one_package(trainer, L.LightningModule())
        ... except BridgeConfigurationError as error:
        ...     print(str(error)[:77])
        The Trainer is a pytorch_lightning.Trainer but the model (LightningModule) is
    """
    package = package_of(trainer)
    if package is None:
        raise BridgeConfigurationError(
            f"AlgorithmEngineCallback needs a lightning.Trainer or a pytorch_lightning.Trainer, got {type(trainer).__name__}."
        )
    for role, obj in (("model", module), ("DataModule", getattr(trainer, "datamodule", None))):
        other = package_of(obj) if obj is not None else None
        if other is not None and other is not package:
            raise BridgeConfigurationError(
                f"The Trainer is a {package.name}.Trainer but the {role} ({type(obj).__name__}) is a {other.name} "
                f"object: the two Lightning packages have separate classes and cannot be mixed in one run. Fix: "
                f"use one package throughout — with `{package.spelling}`, subclass {package.name}.LightningModule / "
                f"LightningDataModule (composer_bridge's modules for it: "
                f"{'composer_bridge.pl' if package.name == 'pytorch_lightning' else 'composer_bridge'}.ComposerModule, "
                f"ComposerClassifier, HuggingFaceModel), or create the Trainer with `{other.spelling}`."
            )
    return package
