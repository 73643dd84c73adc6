"""The recipe search on a plain module written the usual way, with ``lightning`` and with ``pytorch_lightning``.

The search builds each fit's Trainer from the module's own package: the same module class on either
package gives the same table (the steps clock and the seeds make every fit deterministic).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning
import pytest
import pytorch_lightning
import torch
from helpers import search_support as task

from composer_bridge.search import SearchInputError, search_recipe


def plain_module_class(package: Any) -> type:
    class PlainClassifier(package.LightningModule):
        """What users write: a network, cross_entropy in training_step, accuracy logged in validation_step."""

        def __init__(self) -> None:
            super().__init__()
            self.net = task.tiny_network()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val/acc", (self.net(x).argmax(1) == y).float().mean())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1.0, momentum=0.9)

    return PlainClassifier


def _table(result: Any) -> list[tuple]:
    return [(f.phase, tuple(f.config), f.seed, f.steps, f.quality) for f in result.fits]


def test_a_plain_module_of_either_package_is_searched_with_its_own_trainer(tmp_path: Path) -> None:
    kwargs = task.search_kwargs(candidates=["LabelSmoothing", "MixUp"], run_lengths=[2, 4], confirm_seeds=[10])
    tables = {}
    for package in (lightning.pytorch, pytorch_lightning):
        module_class = plain_module_class(package)
        result = search_recipe(module_class, task.make_data, state_dir=tmp_path / package.__name__, **kwargs, method="greedy")
        tables[package.__name__] = _table(result)
    assert tables["lightning.pytorch"]  # fits ran
    assert len({f[4] for f in tables["lightning.pytorch"]}) > 1  # the candidates changed the results
    assert tables["pytorch_lightning"] == tables["lightning.pytorch"]


def test_something_that_is_not_a_lightning_module_is_refused_naming_both_packages() -> None:
    with pytest.raises(SearchInputError, match=r"Sequential.*LightningModule.*pytorch_lightning"):
        search_recipe(task.tiny_network, task.make_data, **task.search_kwargs(), method="greedy")
