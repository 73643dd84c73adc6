"""Every Lightning assumption in ``composer_bridge/lightning/_compat.py``, checked against the installed Lightning.

If a Lightning release changes one of these, the failure here names the assumption; the bridge's
behaviour would otherwise change silently (hooks dispatched again, data hooks skipped, DDP not told
about unused parameters, ...). Also: the hook→event table in code is the one the docs show.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
import torch
from helpers.support import REPO, L, image_loader, quiet_trainer, tiny_classifier

from composer_bridge.lightning import _compat
from composer_bridge.lightning.hook_map import HOOK_EVENTS


def test_lightning_skips_a_callback_hook_hidden_by_hide_hook() -> None:
    calls = {"hidden": 0, "shown": 0}

    class Counting(L.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            calls["hidden"] += 1

        def on_train_batch_end(self, *args: Any) -> None:
            calls["shown"] += 1

    callback = Counting()
    _compat.hide_hook(callback, "on_train_batch_start")
    quiet_trainer(max_steps=2, callbacks=[callback]).fit(tiny_classifier(), image_loader(n=32))
    assert calls == {"hidden": 0, "shown": 2}, "Lightning no longer skips non-callable hooks"
    _compat.show_hook(callback, "on_train_batch_start")
    assert callable(callback.on_train_batch_start)


def test_is_training_reads_lightnings_running_stage() -> None:
    seen: list[bool] = []

    class Look(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            seen.append(_compat.is_training(trainer))

        def on_validation_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            seen.append(_compat.is_training(trainer))

    quiet_trainer(max_steps=1, limit_val_batches=1, callbacks=[Look()]).fit(
        tiny_classifier(), image_loader(n=16), image_loader(n=16))
    assert seen == [True, False]


@pytest.mark.parametrize("module_overrides", [False, True])
@pytest.mark.parametrize("datamodule_overrides", [False, True])
def test_data_hook_owner_is_the_object_lightning_calls(module_overrides: bool, datamodule_overrides: bool) -> None:
    """Lightning's own selector agrees with data_hook_owner wherever the user's hook exists."""
    _DataHookSelector = L.trainer.connectors.data_connector._DataHookSelector

    class Module(L.LightningModule):
        pass

    class Data(L.LightningDataModule):
        pass

    def hook(self: Any, batch: Any, dataloader_idx: int) -> Any:
        return batch

    if module_overrides:
        Module.on_after_batch_transfer = hook  # type: ignore[method-assign]
    if datamodule_overrides:
        Data.on_after_batch_transfer = hook  # type: ignore[method-assign]
    module, data = Module(), Data()
    owner = _compat.data_hook_owner("on_after_batch_transfer", module, data)
    L.trainer.connectors.data_connector.warning_cache.clear()  # Lightning warns once per message and process
    with pytest.warns(UserWarning) if module_overrides else _nothing():
        lightning_owner = _DataHookSelector(module, data).get_instance("on_after_batch_transfer")
    assert owner is lightning_owner


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_ddp_kwargs_are_the_dict_ddp_will_be_built_with() -> None:
    DDPStrategy = L.strategies.DDPStrategy

    strategy = DDPStrategy(find_unused_parameters=False)
    kwargs = _compat.ddp_kwargs(strategy)
    assert kwargs == {"find_unused_parameters": False}
    kwargs["find_unused_parameters"] = True
    assert _compat.ddp_kwargs(strategy) == {"find_unused_parameters": True}, "must be the strategy's own dict"
    assert _compat.ddp_kwargs(L.strategies.SingleDeviceStrategy("cpu")) is None
    del strategy._ddp_kwargs  # a Lightning release without it: refused loudly, never skipped
    with pytest.raises(RuntimeError, match="find_unused_parameters"):
        _compat.ddp_kwargs(strategy)


def test_restores_checkpoint_after_setup_is_known_for_strategies() -> None:
    DDPStrategy, FSDPStrategy = L.strategies.DDPStrategy, L.strategies.FSDPStrategy

    assert _compat.restores_checkpoint_after_setup(DDPStrategy()) is False
    assert _compat.restores_checkpoint_after_setup(FSDPStrategy()) is True


def test_max_time_is_read_from_the_timer_lightning_adds() -> None:
    trainer = quiet_trainer(max_epochs=None, max_time={"minutes": 2})
    assert _compat.max_time(trainer) == timedelta(minutes=2)
    assert _compat.max_time(quiet_trainer()) is None


def test_set_strategy_optimizers_makes_lightning_step_the_given_optimizers() -> None:
    stepped: list[str] = []

    class Wrapper(torch.optim.SGD):
        def step(self, closure: Any = None) -> Any:
            stepped.append("wrapper")
            return super().step(closure)

    class Swap(L.Callback):
        def on_fit_start(self, trainer: L.Trainer, pl_module: Any) -> None:
            _compat.set_strategy_optimizers(trainer, [Wrapper(pl_module.parameters(), lr=0.01)])

    quiet_trainer(max_steps=2, callbacks=[Swap()]).fit(tiny_classifier(), image_loader(n=32))
    assert stepped == ["wrapper", "wrapper"]


@pytest.mark.parametrize("automatic", [True, False])
def test_step_counter_reads_global_step_at_every_batch_end(automatic: bool) -> None:
    pairs: list[tuple[int, int]] = []

    class Manual(type(tiny_classifier())):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 4)), num_classes=4)
            self.automatic_optimization = automatic

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if automatic:
                return super().training_step(batch, batch_idx)
            opt = self.optimizers()
            self.manual_backward(self.loss(self(batch), batch))
            opt.step()
            opt.step()  # two steps per batch: global_step moves by 2
            opt.zero_grad()
            return None

    class Compare(L.Callback):
        def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
            self.read = _compat.step_counter(trainer, automatic)

        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            pairs.append((self.read(), trainer.global_step))

    quiet_trainer(max_epochs=1, callbacks=[Compare()]).fit(Manual(), image_loader(n=48))
    assert len(pairs) == 3 and all(a == b for a, b in pairs), pairs
    assert pairs[-1][1] == (3 if automatic else 6)


def test_lightning_weight_averaging_names_lightnings_callbacks() -> None:
    names = {cls.__name__ for cls in _compat.lightning_weight_averaging()}
    assert "StochasticWeightAveraging" in names


def test_the_docs_show_the_hook_table_of_the_code() -> None:
    """docs/how-it-works.md's event-mapping table names, for every hook, exactly the events the code fires."""
    text = (REPO / "docs" / "how-it-works.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    documented: dict[str, tuple[str, ...]] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) < 2:
            continue
        hook = re.findall(r"`([a-z_]+(?:\[[a-z]+\])?)`", cells[0])
        events = re.findall(r"`([A-Z_]+)`", cells[1])
        if hook and events:
            documented[hook[0]] = tuple(events)
    code = {hook: tuple(e.name for e in events) for hook, events in HOOK_EVENTS.items()}
    assert documented == code
