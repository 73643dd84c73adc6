"""The data events fire, and the user's own batch-transfer hooks still run, in all four combinations.

Lightning calls the DataModule's ``on_after_batch_transfer`` when the DataModule overrides it, else
the LightningModule's. The bridge hooks the object Lightning will call, decided before patching.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from helpers.support import L, image_loader, quiet_trainer, tiny_classifier

from composer_bridge import Algorithm, AlgorithmEngineCallback, Event


class Record(Algorithm):
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def match(self, event: Event, state: Any) -> bool:
        return event in (Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER)

    def apply(self, event: Event, state: Any, logger: Any) -> None:
        self.seen.append(event.name)
        if event == Event.AFTER_DATALOADER:  # what the hooks did before is visible here
            self.seen.append(f"batch*{float(state.batch[0].flatten()[0] / self.first):.0f}")

    first = 1.0


@pytest.mark.parametrize("module_overrides", [False, True], ids=["module plain", "module hooks"])
@pytest.mark.parametrize("datamodule_overrides", [False, True], ids=["datamodule plain", "datamodule hooks"])
def test_data_events_and_the_users_transfer_hooks_in_every_combination(module_overrides: bool, datamodule_overrides: bool) -> None:
    seen: list[str] = []
    loader = image_loader(n=16, batch_size=8)
    Record.first = float(loader.dataset.tensors[0].flatten()[0])

    class Data(L.LightningDataModule):
        def train_dataloader(self) -> Any:
            return loader

    class DataWithHook(Data):
        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            seen.append("datamodule hook")
            return (batch[0] * 2, batch[1])

    base = type(tiny_classifier())

    class ModuleWithHook(base):  # type: ignore[misc, valid-type]
        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            seen.append("module hook")
            return (batch[0] * 3, batch[1])

    model = tiny_classifier()
    if module_overrides:
        model.__class__ = ModuleWithHook
    datamodule = DataWithHook() if datamodule_overrides else Data()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|LeafSpec|val_dataloader|logging interval|overridden).*")
        quiet_trainer(max_steps=1, callbacks=[AlgorithmEngineCallback([Record(seen)])]).fit(model, datamodule)
    # Lightning's rule: the DataModule's hook when it overrides it, else the module's.
    if datamodule_overrides:
        expected = ["BEFORE_DATALOADER", "datamodule hook", "AFTER_DATALOADER", "batch*2"]
    elif module_overrides:
        expected = ["BEFORE_DATALOADER", "module hook", "AFTER_DATALOADER", "batch*3"]
    else:
        expected = ["BEFORE_DATALOADER", "AFTER_DATALOADER", "batch*1"]
    assert seen == expected
    for obj in (model, datamodule):
        assert "on_after_batch_transfer" not in vars(obj) and "on_before_batch_transfer" not in vars(obj), \
            f"{type(obj).__name__} is left as it was"
    assert torch.is_tensor(loader.dataset.tensors[0])
