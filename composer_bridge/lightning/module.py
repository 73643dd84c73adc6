"""LightningModules in Composer's convention: ``forward(batch)`` and ``loss(outputs, batch)`` apart.

Keeping the forward pass and the loss apart is what lets algorithms act *between* them
(LabelSmoothing changes the targets at ``BEFORE_LOSS``, MixUp mixes the loss, SelectiveBackprop
re-runs the forward without gradients). The :class:`AlgorithmEngineCallback` drives these
modules' steps and fires every event; without the callback they train as ordinary
LightningModules.

Each class is written once, as a mixin holding all its code (:class:`ComposerModuleMixin`,
:class:`ComposerClassifierMixin`), and made a LightningModule of each Lightning package from it:
``composer_bridge.ComposerModule`` is a ``lightning.pytorch.LightningModule``;
``composer_bridge.pl.ComposerModule`` is a ``pytorch_lightning.LightningModule`` (``pl.Trainer``
accepts only those). ``isinstance(module, ComposerModuleMixin)`` holds for both.

Examples:
    >>> import torch
    >>> model = ComposerClassifier(torch.nn.Linear(4, 3), num_classes=3)
    >>> x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    >>> outputs = model((x, y))
    >>> outputs.shape
    torch.Size([8, 3])
    >>> model.loss(outputs, (x, y)).ndim
    0
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
import torchmetrics

from composer_bridge.core.batch import BatchKey, get_batch_item
from composer_bridge.lightning.package import LIGHTNING

if TYPE_CHECKING:
    from composer_bridge.lightning.steps import ModuleSteps

__all__ = [
    "ComposerClassifier",
    "ComposerClassifierMixin",
    "ComposerModule",
    "ComposerModuleMixin",
    "soft_cross_entropy",
]


class ComposerModuleMixin:
    """Composer's ``forward(batch)`` / ``loss(outputs, batch)`` split and the steps that drive it.

    The code of :class:`ComposerModule` for both Lightning packages; mixed in before the
    package's ``LightningModule`` (whose ``log`` and ``__call__`` it uses). Subclass
    ``ComposerModule`` (``composer_bridge`` or ``composer_bridge.pl``), not this.
    """

    log: Any  # the LightningModule's, from the package class this is mixed into

    def forward(self, batch: Any) -> Any:  # noqa: D401 - Composer's convention
        """Compute the outputs for a whole batch (inputs and targets together)."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward(batch).")

    def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
        """Compute the loss from ``outputs`` and the batch (whose targets algorithms may have changed)."""
        raise NotImplementedError(f"{type(self).__name__} must implement loss(outputs, batch).")

    def eval_forward(self, batch: Any) -> Any:
        """The forward pass used for validation, test and prediction (``forward`` by default)."""
        return self(batch)

    # --- metrics hooks ------------------------------------------------------------------------
    def update_train_metrics(self, outputs: Any, batch: Any, loss: torch.Tensor) -> None:
        """Called after every training micro-batch; logs ``train/loss`` by default."""
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=_batch_size(batch))

    def update_eval_metrics(self, outputs: Any, batch: Any, prefix: str) -> None:
        """Called after every validation/test batch with ``prefix`` ``"val"`` or ``"test"``."""
        self.log(f"{prefix}/loss", self.loss(outputs, batch).detach(), prog_bar=True, batch_size=_batch_size(batch))

    # --- steps (the run in progress supplies event-firing versions while it is attached) ------
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        run = _run_of(self)
        if run is not None:
            batch, outputs, loss = run.train_step(self, batch)
        else:
            outputs = self(batch)
            loss = self.loss(outputs, batch)
        self.update_train_metrics(outputs, batch, loss)
        return loss

    def _evaluate(self, batch: Any, prefix: str) -> Any:
        run = _run_of(self)
        outputs = run.eval_forward(self, batch) if run is not None else self.eval_forward(batch)
        self.update_eval_metrics(outputs, batch, prefix)
        return outputs

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return self._evaluate(batch, "val")

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return self._evaluate(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        run = _run_of(self)
        return run.predict_forward(self, batch) if run is not None else self.eval_forward(batch)


class ComposerModule(ComposerModuleMixin, LIGHTNING.LightningModule):  # type: ignore[misc]
    """A ``lightning.pytorch.LightningModule`` with Composer's ``forward(batch)`` / ``loss(outputs, batch)`` split.

    Subclasses implement :meth:`forward` and :meth:`loss` (and ``configure_optimizers``); this
    class supplies ``training_step``, ``validation_step``, ``test_step`` and ``predict_step``.
    Override :meth:`update_train_metrics` / :meth:`update_eval_metrics` to log more.
    With ``import pytorch_lightning as pl``, subclass ``composer_bridge.pl.ComposerModule`` (the
    same code on ``pl.LightningModule``).

    Examples:
        >>> class Regression(ComposerModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(3, 1)
        ...     def forward(self, batch):
        ...         return self.net(batch[0])
        ...     def loss(self, outputs, batch):
        ...         return F.mse_loss(outputs, batch[1])
        >>> x, y = torch.randn(4, 3), torch.randn(4, 1)
        >>> Regression().loss(Regression()((x, y)), (x, y)).ndim
        0
    """


def _run_of(module: torch.nn.Module) -> ModuleSteps | None:
    ref: Callable[[], ModuleSteps | None] | None = module.__dict__.get("_composer_bridge")
    return ref() if ref is not None else None


def attach_run(module: torch.nn.Module, run: ModuleSteps) -> None:
    """Let ``module``'s steps call the run's step API (:class:`~composer_bridge.lightning.steps.ModuleSteps`).

    Held weakly: copies of the module stay small, and a run the callback dropped leaves the module
    training as a plain LightningModule.
    """
    module.__dict__["_composer_bridge"] = weakref.ref(run)


def detach_run(module: torch.nn.Module) -> None:
    """Undo :func:`attach_run`."""
    module.__dict__.pop("_composer_bridge", None)


def _batch_size(batch: Any) -> int | None:
    first = batch
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    # Runs per micro-batch: shape[0] costs a third of len(tensor), which goes through Python.
    return first.shape[0] if isinstance(first, torch.Tensor) and first.ndim else None


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy that accepts class indices or per-class probabilities (soft targets).

    Soft targets are what LabelSmoothing, MixUp and CutMix produce. For image-shaped logits
    ``(N, C, H, W)`` the class dimension is 1, as in :func:`torch.nn.functional.cross_entropy`.

    Examples:
        >>> logits = torch.tensor([[2.0, 0.0]])
        >>> hard = soft_cross_entropy(logits, torch.tensor([0]))
        >>> soft = soft_cross_entropy(logits, torch.tensor([[1.0, 0.0]]))
        >>> torch.allclose(hard, soft)
        True
    """
    if targets.dtype.is_floating_point and targets.shape == logits.shape:
        return F.cross_entropy(logits, targets.to(logits.dtype), reduction=reduction)
    return F.cross_entropy(logits, targets.long(), reduction=reduction)


class ComposerClassifierMixin(ComposerModuleMixin):
    """Wrap a plain ``nn.Module`` classifier: ``batch = (inputs, targets)``, cross-entropy loss, accuracy.

    The code of :class:`ComposerClassifier` for both Lightning packages (see :class:`ComposerModuleMixin`).

    Targets may be class indices or probabilities (after MixUp, CutMix, LabelSmoothing).
    Logs ``train/loss``, ``train/acc``, ``val/loss``, ``val/acc`` (and ``test/*``) through
    torchmetrics.

    Args:
        module: the network, mapping inputs to logits.
        num_classes: number of classes.
        optimizer: a factory ``params -> Optimizer`` (default: SGD, lr 0.1, momentum 0.9).
        scheduler: optional factory ``optimizer -> LR scheduler`` (stepped every optimizer step).
        input_key: where the inputs live in a batch (an index or a dict key).
        target_key: where the targets live in a batch (an index or a dict key).

    Examples:
        >>> net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
        >>> model = ComposerClassifier(net, num_classes=10)
        >>> model.module is net
        True
    """

    def __init__(
        self,
        module: torch.nn.Module,
        num_classes: int,
        optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
        scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        input_key: BatchKey = 0,
        target_key: BatchKey = 1,
    ) -> None:
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"ComposerClassifier(module=...) needs an nn.Module, got {type(module).__name__}.")
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"ComposerClassifier(num_classes={num_classes!r}): needs an int >= 2.")
        self.module = module
        self.num_classes = num_classes
        self.input_key = input_key
        self.target_key = target_key
        self._optimizer_factory = optimizer
        self._scheduler_factory = scheduler
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)
        self.test_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)

    def forward(self, batch: Any) -> torch.Tensor:
        inputs = get_batch_item(batch, self.input_key) if isinstance(batch, (tuple, list, dict)) else batch
        return self.module(inputs)

    def loss(self, outputs: torch.Tensor, batch: Any, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy against hard or soft targets; ``reduction="none"`` gives one loss per example."""
        return soft_cross_entropy(outputs, get_batch_item(batch, self.target_key), reduction=reduction)

    def _hard_targets(self, batch: Any) -> torch.Tensor:
        targets = get_batch_item(batch, self.target_key)
        return targets.argmax(dim=1) if targets.dtype.is_floating_point and targets.ndim > 1 else targets

    def update_train_metrics(self, outputs: Any, batch: Any, loss: torch.Tensor) -> None:
        size = _batch_size(batch)
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=size)
        self.train_acc(outputs.detach().float(), self._hard_targets(batch))
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, batch_size=size)

    def update_eval_metrics(self, outputs: Any, batch: Any, prefix: str) -> None:
        size = _batch_size(batch)
        metric = self.val_acc if prefix == "val" else self.test_acc
        self.log(f"{prefix}/loss", self.loss(outputs, batch).detach(), prog_bar=True, batch_size=size)
        metric(outputs.detach().float(), self._hard_targets(batch))
        self.log(f"{prefix}/acc", metric, prog_bar=True, batch_size=size)

    def configure_optimizers(self) -> Any:
        params = [p for p in self.parameters() if p.requires_grad]
        if self._optimizer_factory is not None:
            optimizer = self._optimizer_factory(params)
        else:
            optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        if self._scheduler_factory is None:
            return optimizer
        scheduler = self._scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class ComposerClassifier(ComposerClassifierMixin, ComposerModule):
    """A classifier as a ``lightning.pytorch.LightningModule``: see :class:`ComposerClassifierMixin` for the arguments.

    ``composer_bridge.pl.ComposerClassifier`` is the same class on ``pytorch_lightning.LightningModule``.

    Examples:
        >>> model = ComposerClassifier(torch.nn.Linear(4, 3), num_classes=3)
        >>> model.num_classes
        3
    """
