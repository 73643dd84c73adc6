"""Which Lightning package a run uses, and that package's utilities: the one place that imports one by name.

Lightning ships twice: ``lightning.pytorch`` (``import lightning as L``) and ``pytorch_lightning``
(``import pytorch_lightning as pl``). They have the same API but separate classes: a
``pytorch_lightning.LightningModule`` is not a ``lightning.pytorch.LightningModule``, a
``pytorch_lightning.Trainer`` reports its stage with its own ``RunningStage`` members, and each
package's ``is_overridden`` refuses the other's objects. ``lightning`` depends on
``pytorch_lightning``, so both are installed wherever the bridge is.

The adapter therefore never asks "is this Lightning?" of a fixed package: it learns the package
from the objects the user gives it (:func:`package_of`: the Trainer, the module, the DataModule)
and takes every utility it needs from that :class:`LightningPackage` (``is_overridden``,
``TrainerFn``, ``RunningStage``, ``callbacks.Timer``, ``strategies.DDPStrategy``,
``loggers.WandbLogger``, ...). Nothing else in ``composer_bridge`` imports a Lightning package by
name at run time (``tests/lightning/test_both_packages.py`` checks the sources).

Importing both packages has one side effect that must not reach the user: each sets, when
imported, the logger of Lightning's rank-zero messages and the class of its deprecation warnings
(shared through ``lightning_utilities``). This module puts them back to the package the user
imported (see :meth:`LightningPackage.take_rank_zero_settings`).

Examples:
    >>> import pytorch_lightning as pl
    >>> trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False)
    >>> package = package_of(trainer)
    >>> package.name
    'pytorch_lightning'
    >>> package.TrainerFn.FITTING.value
    'fit'
"""

from __future__ import annotations

import importlib
import logging
import sys
from functools import cached_property
from types import ModuleType
from typing import Any

__all__ = [
    "CALLBACK_BASES",
    "LIGHTNING",
    "PACKAGES",
    "PYTORCH_LIGHTNING",
    "LightningPackage",
    "classes_in_every_package",
    "package_of",
]


class LightningPackage:
    """One of the two Lightning packages, its classes and utilities imported on first use.

    Examples:
        >>> LIGHTNING.name, LIGHTNING.spelling
        ('lightning.pytorch', 'import lightning as L')
        >>> LIGHTNING.callbacks.ModelCheckpoint.__module__
        'lightning.pytorch.callbacks.model_checkpoint'
    """

    def __init__(self, name: str, spelling: str) -> None:
        self.name = name
        #: how a user imports it, for messages
        self.spelling = spelling

    def __repr__(self) -> str:
        return f"LightningPackage({self.name!r})"

    def _import(self, submodule: str = "") -> ModuleType:
        return importlib.import_module(f"{self.name}.{submodule}" if submodule else self.name)

    @property
    def loaded(self) -> bool:
        """Whether the package has been imported (its objects can exist only then)."""
        return self.name in sys.modules

    # --- the classes a user hands the bridge ----------------------------------------------------
    @cached_property
    def module(self) -> ModuleType:
        """The package itself (``lightning.pytorch`` or ``pytorch_lightning``)."""
        return self._import()

    @cached_property
    def Trainer(self) -> type:  # noqa: N802 - the package's class name
        return self.module.Trainer

    @cached_property
    def LightningModule(self) -> type:  # noqa: N802
        return self.module.LightningModule

    @cached_property
    def LightningDataModule(self) -> type:  # noqa: N802
        return self.module.LightningDataModule

    @cached_property
    def Callback(self) -> type:  # noqa: N802
        return self.module.Callback

    # --- utilities ------------------------------------------------------------------------------
    @cached_property
    def is_overridden(self) -> Any:
        """``utilities.model_helpers.is_overridden`` of this package (it accepts only this package's objects)."""
        return self._import("utilities.model_helpers").is_overridden

    @cached_property
    def TrainerFn(self) -> Any:  # noqa: N802
        return self._import("trainer.states").TrainerFn

    @cached_property
    def RunningStage(self) -> Any:  # noqa: N802
        return self._import("trainer.states").RunningStage

    @cached_property
    def callbacks(self) -> ModuleType:
        """``callbacks``: ``Timer``, ``BaseFinetuning``, ``ModelCheckpoint``, ``StochasticWeightAveraging``, ..."""
        return self._import("callbacks")

    @cached_property
    def strategies(self) -> ModuleType:
        return self._import("strategies")

    @cached_property
    def profilers(self) -> ModuleType:
        """``profilers``: ``PassThroughProfiler``, ``SimpleProfiler``, ``AdvancedProfiler``, ``PyTorchProfiler``."""
        return self._import("profilers")

    @cached_property
    def loggers(self) -> ModuleType:
        """``loggers``: ``CSVLogger``, ``WandbLogger``, ... (importing them does not import ``wandb``)."""
        return self._import("loggers")

    @cached_property
    def cli(self) -> ModuleType:
        """``cli``: ``LightningCLI`` (needs ``jsonargparse``)."""
        return self._import("cli")

    def take_rank_zero_settings(self) -> None:
        """Point the rank-zero settings the two packages share at this package's own.

        Assumption: both packages, when imported, set two module attributes of
        ``lightning_utilities.core.rank_zero``: ``log`` (the logger their ``rank_zero_info``/``debug``
        messages go to, ``<package>.utilities.rank_zero``) and ``rank_zero_deprecation_category`` (their
        ``LightningDeprecationWarning``). The package imported last wins; this sets them as
        importing this package last would.
        """
        from lightning_utilities.core import rank_zero as shared

        own = self._import("utilities.rank_zero")
        shared.log = logging.getLogger(own.__name__)
        shared.rank_zero_deprecation_category = own.LightningDeprecationWarning

    def owns(self, obj: Any) -> bool:
        """Whether ``obj`` is this package's Trainer, LightningModule, LightningDataModule or Callback."""
        if not self.loaded:  # never imported: none of its objects exist (and importing it costs seconds)
            return False
        return isinstance(obj, (self.Trainer, self.LightningModule, self.LightningDataModule, self.Callback))


LIGHTNING = LightningPackage("lightning.pytorch", "import lightning as L")
PYTORCH_LIGHTNING = LightningPackage("pytorch_lightning", "import pytorch_lightning as pl")
PACKAGES = (LIGHTNING, PYTORCH_LIGHTNING)

#: The packages the user had imported before composer_bridge imported both (read by composer_bridge.pl).
IMPORTED_BEFORE: tuple[LightningPackage, ...] = tuple(package for package in PACKAGES if package.loaded)

#: The bases of :class:`~composer_bridge.AlgorithmEngineCallback`: it is a ``Callback`` of both
#: packages, so either Trainer (and ``LightningCLI``'s ``callbacks: list[Callback]``) accepts it.
CALLBACK_BASES: tuple[type, ...] = (LIGHTNING.Callback, PYTORCH_LIGHTNING.Callback)

# Importing both took over the rank-zero settings the packages share (see take_rank_zero_settings):
# they go back to the package the user had imported (the last one, if both: nothing was imported
# then); with neither imported yet, to lightning's (composer_bridge.pl switches to pytorch_lightning's).
if len(IMPORTED_BEFORE) == 1:
    IMPORTED_BEFORE[0].take_rank_zero_settings()
elif not IMPORTED_BEFORE:
    LIGHTNING.take_rank_zero_settings()


def package_of(obj: Any) -> LightningPackage | None:
    """The package whose Trainer, LightningModule, LightningDataModule or Callback ``obj`` is; else ``None``.

    An object of both (the bridge's own callback) belongs to ``lightning.pytorch``, listed first.

    Examples:
        >>> import lightning as L
        >>> package_of(L.LightningModule()).name
        'lightning.pytorch'
        >>> package_of(object()) is None
        True
    """
    for package in PACKAGES:
        if package.owns(obj):
            return package
    return None


def classes_in_every_package(submodule: str, *names: str) -> tuple[type, ...]:
    """The classes ``names`` of ``submodule`` in each loaded package (names a package lacks are skipped).

    For ``isinstance`` checks on callbacks, loggers and strategies the user chose: Lightning accepts
    a callback or logger of the other package in its Trainer (``pl.Trainer(logger=L.loggers.CSVLogger(...))``
    trains), so the bridge recognises both.

    Examples:
        >>> [c.__module__ for c in classes_in_every_package("callbacks", "Timer")]
        ['lightning.pytorch.callbacks.timer', 'pytorch_lightning.callbacks.timer']
    """
    found: list[type] = []
    for package in PACKAGES:
        if package.loaded:
            namespace = getattr(package, submodule)
            found.extend(getattr(namespace, name) for name in names if hasattr(namespace, name))
    return tuple(found)
