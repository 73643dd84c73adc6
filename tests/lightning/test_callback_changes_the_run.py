"""Algorithms change what Lightning trains on: batches, losses, the backward graph, the model itself."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from helpers.support import ComposerModule, L, image_loader, quiet_trainer, tiny_classifier, weights_of

from composer_bridge import Algorithm, AlgorithmEngineCallback, Callback, Event, State
from composer_bridge.core.algorithm import AlgorithmError
from composer_bridge.lightning import BridgeConfigurationError


class At(Algorithm):
    """Runs ``fn(state)`` at one event."""

    def __init__(self, event: Event, fn: Any) -> None:
        self.event = event
        self.fn = fn

    def match(self, event: Event, state: State) -> bool:
        return event == self.event

    def apply(self, event: Event, state: State, logger: Any) -> None:
        self.fn(state)


class LossNeeder(At):
    needs_loss_events = True


class Linear(ComposerModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(3, 1)
        self.received: list[torch.Tensor] = []

    def forward(self, batch: Any) -> torch.Tensor:
        self.received.append(batch[0].detach().clone())
        return self.net(batch[0]).squeeze(-1)

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return torch.nn.functional.mse_loss(outputs, batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def regression_loader(n: int = 8) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 3, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1)), batch_size=n)


def test_batch_replaced_at_after_dataloader_is_what_training_step_receives() -> None:
    def double_inputs(state: State) -> None:
        state.batch_set_item(0, state.batch_get_item(0) * 2)

    model = Linear()
    quiet_trainer(max_steps=1, callbacks=[AlgorithmEngineCallback([At(Event.AFTER_DATALOADER, double_inputs)])]).fit(
        model, regression_loader()
    )
    original = next(iter(regression_loader()))[0]
    assert torch.equal(model.received[0], original * 2)


def one_step_gradient(algorithms: list[Algorithm]) -> torch.Tensor:
    model = Linear()
    grads: list[torch.Tensor] = []
    probe = At(Event.AFTER_TRAIN_BATCH, lambda s: grads.append(s.model.net.weight.grad.clone()))
    quiet_trainer(max_steps=1, callbacks=[AlgorithmEngineCallback([*algorithms, probe])]).fit(model, regression_loader())
    return grads[0]


def test_loss_replaced_before_backward_changes_the_gradient() -> None:
    plain = one_step_gradient([])
    tripled = one_step_gradient([At(Event.BEFORE_BACKWARD, lambda s: setattr(s, "loss", s.loss * 3))])
    torch.testing.assert_close(tripled, plain * 3)
    outputs_zeroed = one_step_gradient([At(Event.AFTER_FORWARD, lambda s: setattr(s, "outputs", s.outputs * 0))])
    assert not torch.allclose(outputs_zeroed, plain)


def test_backwards_create_graph_makes_backward_build_the_graph() -> None:
    seen: list[bool] = []

    class SecondOrder(At):
        backwards_create_graph = True

    probe = SecondOrder(Event.AFTER_BACKWARD, lambda s: seen.append(s.model.net.weight.grad.requires_grad))
    quiet_trainer(max_steps=1, callbacks=[AlgorithmEngineCallback([probe])]).fit(Linear(), regression_loader())
    assert seen == [True]
    seen.clear()
    plain = At(Event.AFTER_BACKWARD, lambda s: seen.append(s.model.net.weight.grad.requires_grad))
    quiet_trainer(max_steps=1, callbacks=[AlgorithmEngineCallback([plain])]).fit(Linear(), regression_loader())
    assert seen == [False]


class WidenHead(Algorithm):
    """Surgery: replaces the classifier's final Linear with a fresh one at INIT."""

    def __init__(self) -> None:
        self.calls = 0

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Any) -> None:
        self.calls += 1
        fc = state.model.module.fc
        state.model.module.fc = torch.nn.Linear(fc.in_features, fc.out_features)
        state.model.module.fc.replaced = True

    @classmethod
    def required_on_load(cls) -> bool:
        return True


def test_surgery_at_init_is_seen_by_the_optimizer_and_init_runs_once_per_model() -> None:
    surgery = WidenHead()
    model = tiny_classifier()
    trainer = quiet_trainer(max_steps=2, limit_val_batches=1, callbacks=[AlgorithmEngineCallback([surgery])])
    trainer.fit(model, image_loader(), image_loader(n=16))
    assert getattr(model.module.fc, "replaced", False)
    optimized = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert {id(p) for p in model.module.fc.parameters()} <= optimized
    trainer.validate(model, image_loader(n=16))
    trainer.fit(model, image_loader())
    assert surgery.calls == 1


def test_plain_module_gets_data_and_backward_events_and_can_change_its_loss() -> None:
    class Plain(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(3, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.net(batch[0]).squeeze(-1), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def run(algorithms: list[Algorithm]) -> torch.Tensor:
        model = Plain()
        quiet_trainer(max_steps=1, callbacks=[AlgorithmEngineCallback(algorithms)]).fit(model, regression_loader())
        return model.net.weight.detach().clone()

    events: list[str] = []

    class Listen(Algorithm):
        def match(self, event: Event, state: State) -> bool:
            return True

        def apply(self, event: Event, state: State, logger: Any) -> None:
            events.append(event.name)

    before = Plain().net.weight.detach().clone()
    plain_step = run([Listen()]) - before
    assert {"AFTER_DATALOADER", "BATCH_START", "BEFORE_BACKWARD", "AFTER_BACKWARD", "BATCH_END"} <= set(events)
    assert "BEFORE_LOSS" not in events
    zero_loss = run([At(Event.BEFORE_BACKWARD, lambda s: setattr(s, "loss", s.loss * 0))]) - before
    assert plain_step.abs().sum() > 0 and zero_loss.abs().sum() == 0


def test_plain_module_without_a_loss_the_bridge_sees_is_refused_by_algorithms_that_need_the_loss_events() -> None:
    class Plain(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = quiet_trainer(max_steps=1, callbacks=[AlgorithmEngineCallback([LossNeeder(Event.BEFORE_LOSS, print)])])
    # Its loss is no cross-entropy on the batch's targets: refused in the first step, before any backward.
    with pytest.raises(BridgeConfigurationError, match=r"LossNeeder acts on the loss .*no call of cross_entropy.*ComposerModule"):
        trainer.fit(Plain(), regression_loader())


class Closing(Callback):
    def __init__(self, log: list[str], name: str, fail_close: bool = False) -> None:
        self.log, self.name, self.fail_close = log, name, fail_close

    def batch_end(self, state: State, logger: Any) -> None:
        self.log.append(f"{self.name}:batch_end")

    def close(self, state: State, logger: Any) -> None:
        self.log.append(f"{self.name}:close")
        if self.fail_close:
            raise RuntimeError("close failed")

    def post_close(self) -> None:
        self.log.append(f"{self.name}:post_close")


def test_engine_callbacks_run_after_algorithms_and_close_at_teardown() -> None:
    log: list[str] = []
    algorithm = At(Event.BATCH_END, lambda s: log.append("algorithm:batch_end"))
    callback = AlgorithmEngineCallback([algorithm], callbacks=[Closing(log, "a"), Closing(log, "b")])
    quiet_trainer(max_steps=1, callbacks=[callback]).fit(tiny_classifier(), image_loader())
    assert log == ["algorithm:batch_end", "a:batch_end", "b:batch_end", "a:close", "b:close", "a:post_close", "b:post_close"]


def test_algorithm_error_names_algorithm_and_event_and_closes_engine_callbacks(tmp_path, caplog) -> None:
    log: list[str] = []

    def boom(state: State) -> None:
        if int(state.timestamp.batch) == 2:
            raise ValueError("bad batch")

    checkpoints = L.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    callback = AlgorithmEngineCallback([At(Event.BEFORE_LOSS, boom)], callbacks=[Closing(log, "a", fail_close=True), Closing(log, "b")])
    trainer = quiet_trainer(max_steps=5, enable_checkpointing=True, callbacks=[callback, checkpoints])
    with caplog.at_level(logging.ERROR), pytest.raises(AlgorithmError, match=r"At failed at Event.BEFORE_LOSS: ValueError: bad batch"):
        trainer.fit(tiny_classifier(), image_loader())
    assert log[-3:] == ["a:close", "b:close", "b:post_close"], "a's failing close must not stop b from closing"
    assert "close failed" in caplog.text
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["epoch=0-step=1.ckpt", "epoch=0-step=2.ckpt"]
    for path in tmp_path.iterdir():
        torch.load(path, weights_only=True)  # complete and loadable


def test_bad_constructor_input_is_named() -> None:
    with pytest.raises(TypeError, match=r"algorithms\[1\] = 'nope'"):
        AlgorithmEngineCallback([WidenHead(), "nope"])
    with pytest.raises(TypeError, match=r"class WidenHead, not an instance"):
        AlgorithmEngineCallback([WidenHead])

    class Once(WidenHead):
        unique = True

    with pytest.raises(ValueError, match="Once appears more than once"):
        AlgorithmEngineCallback([Once(), Once()])
    with pytest.raises(TypeError, match="Lightning callback"):
        AlgorithmEngineCallback(callbacks=[L.callbacks.ModelCheckpoint()])
    with pytest.raises(ValueError, match="algorithm_passes got 3"):
        AlgorithmEngineCallback(algorithm_passes=3)


def test_module_is_left_as_it_was_after_fit() -> None:
    model = tiny_classifier()
    patched = {"training_step", "on_before_batch_transfer", "on_after_batch_transfer", "backward",
               "on_load_checkpoint", "_composer_bridge"}
    assert not patched & set(model.__dict__)
    quiet_trainer(max_steps=1, callbacks=[AlgorithmEngineCallback([])]).fit(model, image_loader())
    assert not patched & set(model.__dict__), "the bridge's instance hooks are removed after fit"
    assert weights_of(model).keys() == weights_of(tiny_classifier()).keys()


def test_bf16_mixed_precision_runs_every_event_and_reports_its_precision() -> None:
    seen: list[tuple[str, torch.dtype]] = []

    def record(state: State) -> None:
        seen.append((state.precision, state.outputs.dtype))

    model = tiny_classifier()
    trainer = quiet_trainer(max_steps=2, precision="bf16-mixed",
                            callbacks=[AlgorithmEngineCallback([At(Event.AFTER_FORWARD, record)])])
    trainer.fit(model, image_loader())
    assert seen == [("bf16-mixed", torch.bfloat16)] * 2
    assert trainer.global_step == 2


def test_explicit_find_unused_parameters_false_is_respected_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    DDPStrategy = L.strategies.DDPStrategy
    from helpers.support import free_port

    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)  # Lightning writes these into os.environ
    monkeypatch.setenv("MASTER_PORT", str(free_port()))

    class Freezer(At):
        find_unused_parameters = True

    strategy = DDPStrategy(find_unused_parameters=False, process_group_backend="gloo")
    trainer = quiet_trainer(max_steps=1, strategy=strategy, callbacks=[AlgorithmEngineCallback([Freezer(Event.INIT, id)])])
    with pytest.warns(UserWarning, match="Freezer may leave parameters without gradients.*find_unused_parameters=False"):
        trainer.fit(tiny_classifier(), image_loader())
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    assert strategy._ddp_kwargs["find_unused_parameters"] is False


@pytest.mark.parametrize("datamodule_overrides_transfer", [False, True])
def test_data_events_fire_with_a_datamodule_whether_or_not_it_has_transfer_hooks(
    datamodule_overrides_transfer: bool,
) -> None:
    import warnings

    seen: list[str] = []

    class Data(L.LightningDataModule):
        def train_dataloader(self) -> Any:
            return image_loader()

    class DataWithHook(Data):
        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            seen.append("datamodule hook")
            return batch

    algorithm = At(Event.AFTER_DATALOADER, lambda s: seen.append("AFTER_DATALOADER"))
    datamodule = DataWithHook() if datamodule_overrides_transfer else Data()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message=".*(num_workers|LeafSpec|val_dataloader|logging interval).*")
        quiet_trainer(max_steps=2, callbacks=[AlgorithmEngineCallback([algorithm])]).fit(tiny_classifier(), datamodule)
    expected = ["datamodule hook", "AFTER_DATALOADER"] if datamodule_overrides_transfer else ["AFTER_DATALOADER"]
    assert seen == expected * 2
    assert "on_after_batch_transfer" not in datamodule.__dict__, "the DataModule is left as it was"
