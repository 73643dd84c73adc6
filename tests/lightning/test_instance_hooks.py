"""Hooks a user (or a library) sets on the module *instance* run exactly as without the bridge.

Profilers, fine-tuning schedulers and test doubles wrap hooks on instances
(``model.training_step = wrapper``). The bridge patches some of the same hooks for the length of a
run; whatever the user set must still be called, every time Lightning would call it, and the
instance must be left as the user left it.
"""

from __future__ import annotations

import functools
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.support import L, quiet_trainer
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import AlgorithmEngineCallback, Callback

#: every module hook the bridge may patch on a plain module
HOOKS = (
    "training_step", "validation_step", "test_step", "predict_step", "backward",
    "on_before_batch_transfer", "on_after_batch_transfer", "on_load_checkpoint",
)  # fmt: skip


class Plain(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.training_step(batch, batch_idx)

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.training_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(12, 4, generator=g), torch.randint(0, 2, (12,), generator=g)), batch_size=4)


class Recorder(Callback):
    """An engine callback that hears every event and changes nothing: the bridge listens."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def run_event(self, event: Any, state: Any, logger: Any) -> None:
        self.events.append(event.name)


def bridges(kind: str) -> list[L.Callback]:
    if kind == "none":
        return []
    if kind == "idle":
        return [AlgorithmEngineCallback([])]
    return [AlgorithmEngineCallback([], callbacks=[Recorder()])]


def wrap_instance_hooks(model: L.LightningModule, calls: Counter[str]) -> dict[str, Any]:
    """Set a counting wrapper of every hook on the instance, as a profiler would; returns the wrappers."""
    wrappers = {}
    for name in HOOKS:
        inner = getattr(model, name)

        def wrapper(*args: Any, __name: str = name, __inner: Any = inner, **kwargs: Any) -> Any:
            calls[__name] += 1
            return __inner(*args, **kwargs)

        wrappers[name] = model.__dict__[name] = functools.wraps(inner)(wrapper)
    return wrappers


def run_everything(kind: str, tmp_path: Path) -> tuple[Counter[str], Plain, dict[str, Any]]:
    """fit, resume from its checkpoint, validate, test and predict, with instance-level wrappers on every hook."""
    first = Plain()
    trainer = quiet_trainer(max_epochs=1, callbacks=bridges(kind), enable_checkpointing=True, default_root_dir=tmp_path)
    trainer.fit(first, loader(), loader())
    ckpt = trainer.checkpoint_callback.best_model_path

    calls: Counter[str] = Counter()
    model = Plain()
    wrappers = wrap_instance_hooks(model, calls)
    trainer = quiet_trainer(max_epochs=2, callbacks=bridges(kind))
    trainer.fit(model, loader(), loader(), ckpt_path=ckpt)
    trainer.validate(model, loader())
    trainer.test(model, loader())
    trainer.predict(model, loader())
    return calls, model, wrappers


@pytest.mark.parametrize("kind", ["idle", "listening"])
def test_every_instance_hook_is_called_as_often_as_without_the_bridge(kind: str, tmp_path: Path) -> None:
    expected, _, _ = run_everything("none", tmp_path / "none")
    calls, _, _ = run_everything(kind, tmp_path / kind)
    assert set(expected) == set(HOOKS)  # the oracle ran every hook
    assert calls == expected


@pytest.mark.parametrize("kind", ["idle", "listening"])
def test_the_instance_is_left_as_the_user_left_it(kind: str, tmp_path: Path) -> None:
    _, model, wrappers = run_everything(kind, tmp_path)
    assert {name: model.__dict__.get(name) for name in HOOKS} == wrappers
    bare = Plain()
    quiet_trainer(callbacks=bridges(kind)).fit(bare, loader())
    assert not set(HOOKS) & set(vars(bare))  # nothing of ours stays behind


class ReplaceTrainingStep(L.Callback):
    """Replaces the module's training_step on the instance while the run is under way (after the bridge's setup)."""

    def __init__(self) -> None:
        self.calls = 0
        self.wrapper: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        inner = type(pl_module).training_step.__get__(pl_module)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return inner(*args, **kwargs)

        self.wrapper = pl_module.training_step = wrapper


@pytest.mark.parametrize("kind", ["none", "idle", "listening"])
def test_a_hook_the_user_replaces_during_the_run_is_called_and_kept(kind: str) -> None:
    """Documented choice: what the user sets while the bridge's hook is installed wins, and stays after the run."""
    model = Plain()
    replace = ReplaceTrainingStep()
    quiet_trainer(callbacks=[*bridges(kind), replace]).fit(model, loader())
    assert replace.calls == 3
    assert model.__dict__.get("training_step") is replace.wrapper


class WrapTrainingStep(L.Callback):
    """Wraps whatever training_step the instance has at on_train_start (the bridge's, when it listens)."""

    def __init__(self) -> None:
        self.calls = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        inner = pl_module.training_step

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return inner(*args, **kwargs)

        pl_module.training_step = wrapper


def test_a_wrapper_around_the_bridges_hook_still_works_after_the_run() -> None:
    """The bridge's hook left inside a user's wrapper passes straight through once the bridge is gone."""
    model = Plain()
    recorder = Recorder()
    wrap = WrapTrainingStep()
    quiet_trainer(callbacks=[AlgorithmEngineCallback([], callbacks=[recorder]), wrap]).fit(model, loader())
    assert wrap.calls == 3
    heard = len(recorder.events)
    x, y = next(iter(loader()))
    expected = torch.nn.functional.cross_entropy(model.net(x), y)
    assert torch.equal(model.training_step((x, y), 0), expected)
    assert len(recorder.events) == heard  # no event after the run


class IteratorStep(Plain):
    """Lightning passes ``dataloader_iter`` (and no batch_idx) to a training_step whose signature asks for it."""

    def training_step(self, dataloader_iter: Any) -> torch.Tensor:
        batch, _, _ = next(dataloader_iter)
        return super().training_step(batch, 0)


@pytest.mark.parametrize("kind", ["none", "idle", "listening"])
def test_lightning_reads_the_signature_of_the_users_step_through_the_bridges_hook(kind: str) -> None:
    model = IteratorStep()
    trainer = quiet_trainer(max_steps=2, callbacks=bridges(kind))
    trainer.fit(model, loader())
    assert trainer.global_step == 2


# --- the DataModule's batch-transfer hooks -------------------------------------------------------
DATA_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


class Data(L.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return loader()

    def val_dataloader(self) -> DataLoader:
        return loader()


class DataWithHooks(Data):
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch


def record_on_instance(obj: Any, calls: list[str], prefix: str) -> None:
    """Lightning's own test idiom: every hook replaced on the instance by a recording ``functools.partial``."""

    def call(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(f"{prefix}.{name}")
        return fn(*args, **kwargs)

    for name in DATA_HOOKS:
        inner = getattr(obj, name)
        setattr(obj, name, functools.update_wrapper(functools.partial(call, name, inner), inner))


def data_hook_calls(kind: str, datamodule_overrides: bool, module_overrides: bool) -> tuple[list[str], list[str]]:
    """Which object's batch-transfer hooks Lightning calls, in order, and the warnings it gives."""
    calls: list[str] = []
    model: L.LightningModule = Plain()
    if module_overrides:
        model.__class__ = type("PlainWithHooks", (Plain,), {n: DataWithHooks.__dict__[n] for n in DATA_HOOKS if n in DataWithHooks.__dict__})
    data = DataWithHooks() if datamodule_overrides else Data()
    record_on_instance(model, calls, "module")
    record_on_instance(data, calls, "datamodule")
    L.trainer.connectors.data_connector.warning_cache.clear()  # Lightning warns once per message and process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_trainer(limit_train_batches=2, limit_val_batches=1, callbacks=bridges(kind)).fit(model, datamodule=data)
    hook_warnings = sorted({str(w.message) for w in caught if "batch_transfer" in str(w.message)})
    return calls, hook_warnings


@pytest.mark.parametrize("kind", ["idle", "listening"])
@pytest.mark.parametrize("module_overrides", [False, True], ids=["module plain", "module hooks"])
@pytest.mark.parametrize("datamodule_overrides", [False, True], ids=["datamodule plain", "datamodule hooks"])
def test_the_datamodules_and_modules_transfer_hooks_are_called_as_without_the_bridge(
    kind: str, datamodule_overrides: bool, module_overrides: bool
) -> None:
    """Lightning calls the DataModule's hook only where it overrides it; the bridge must not change whose (found by
    Lightning's own hook test: a DataModule recording its hooks on the instance saw 12 extra calls)."""
    expected = data_hook_calls("none", datamodule_overrides, module_overrides)
    assert expected[0]  # the oracle recorded hook calls
    assert data_hook_calls(kind, datamodule_overrides, module_overrides) == expected


def counted(step: Any) -> Any:
    """A decorator as users write them (functools.wraps): the bound method then carries ``__wrapped__``."""

    @functools.wraps(step)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.decorated_calls += 1
        return step(self, *args, **kwargs)

    return wrapper


class DecoratedStepWithoutIndex(Plain):
    """A decorated training_step without batch_idx: Lightning must read ``(batch)`` through the decorator."""

    decorated_calls = 0

    @counted
    def training_step(self, batch: Any) -> torch.Tensor:  # type: ignore[override]
        return super().training_step(batch, 0)


@pytest.mark.parametrize("kind", ["none", "idle", "listening"])
def test_a_decorated_step_is_read_and_called_as_without_the_bridge(kind: str) -> None:
    model = DecoratedStepWithoutIndex()
    quiet_trainer(max_steps=2, callbacks=bridges(kind)).fit(model, loader())
    assert model.decorated_calls == 2
