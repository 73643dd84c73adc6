"""composer_bridge for ``import pytorch_lightning as pl``: the same classes on ``pytorch_lightning``.

``pl.Trainer`` accepts only ``pytorch_lightning.LightningModule`` models, and
``composer_bridge.ComposerModule`` is a ``lightning.pytorch.LightningModule``. This package holds
the same modules built on ``pytorch_lightning.LightningModule`` (the code is shared: each is its
mixin from ``composer_bridge.lightning.module`` or ``composer_bridge.hf.module`` on the other
base class). :class:`AlgorithmEngineCallback` is the very same class as
``composer_bridge.AlgorithmEngineCallback``: it is a ``Callback`` of both packages.

Examples:
    >>> import pytorch_lightning as pl
    >>> import torch
    >>> from composer_bridge.pl import AlgorithmEngineCallback, ComposerClassifier
    >>> from composer_bridge.algorithms import LabelSmoothing
    >>> model = ComposerClassifier(torch.nn.Linear(4, 3), num_classes=3)
    >>> isinstance(model, pl.LightningModule)
    True
    >>> trainer = pl.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
    ...                      callbacks=[AlgorithmEngineCallback([LabelSmoothing(0.1)])])

``HuggingFaceModel`` (needs ``transformers``) is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from composer_bridge.lightning.callback import AlgorithmEngineCallback, BridgeConfigurationError
from composer_bridge.lightning.module import ComposerClassifierMixin, ComposerModuleMixin, soft_cross_entropy
from composer_bridge.lightning.package import IMPORTED_BEFORE, PYTORCH_LIGHTNING

if TYPE_CHECKING:
    from composer_bridge.pl._hf import HuggingFaceModel

if not IMPORTED_BEFORE:
    # composer_bridge came first and imported both packages: this flavour means pytorch_lightning, whose
    # rank-zero messages and deprecation warnings then stay its own (as if it had been imported last)
    PYTORCH_LIGHTNING.take_rank_zero_settings()

__all__ = [
    "AlgorithmEngineCallback",
    "BridgeConfigurationError",
    "ComposerClassifier",
    "ComposerModule",
    "HuggingFaceModel",
    "soft_cross_entropy",
]


class ComposerModule(ComposerModuleMixin, PYTORCH_LIGHTNING.LightningModule):  # type: ignore[misc]
    """``composer_bridge.ComposerModule`` as a ``pytorch_lightning.LightningModule`` (for ``pl.Trainer``).

    Implement ``forward(batch)``, ``loss(outputs, batch)`` and ``configure_optimizers``; see
    :class:`~composer_bridge.lightning.module.ComposerModuleMixin`.

    Examples:
        >>> import torch
        >>> class Regression(ComposerModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = torch.nn.Linear(3, 1)
        ...     def forward(self, batch):
        ...         return self.net(batch[0])
        ...     def loss(self, outputs, batch):
        ...         return torch.nn.functional.mse_loss(outputs, batch[1])
        >>> import pytorch_lightning as pl
        >>> isinstance(Regression(), pl.LightningModule)
        True
    """


class ComposerClassifier(ComposerClassifierMixin, ComposerModule):
    """``composer_bridge.ComposerClassifier`` as a ``pytorch_lightning.LightningModule`` (same arguments).

    Examples:
        >>> import torch
        >>> ComposerClassifier(torch.nn.Linear(4, 3), num_classes=3).num_classes
        3
    """


def __getattr__(name: str) -> Any:
    if name == "HuggingFaceModel":  # needs transformers: imported on first use
        from composer_bridge.pl._hf import HuggingFaceModel

        return HuggingFaceModel
    raise AttributeError(f"module 'composer_bridge.pl' has no attribute {name!r}")
