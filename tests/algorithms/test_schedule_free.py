"""ScheduleFree: the optimizer's mode at every hook, and what validation, checkpoints and the model after fit hold."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import (
    ComposerClassifier,
    L,
    assert_same_state,
    assert_same_weights,
    image_loader,
    quiet_trainer,
    weights_of,
)

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import EMA, SAM, Muon, ScheduleFree, WarmupStableDecay
from composer_bridge.core import torch_versions
from composer_bridge.models import ResNetCNN

schedulefree = pytest.importorskip("schedulefree")

LR = 0.01


def linear() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 4))


class UserModule(L.LightningModule):
    """A schedule-free AdamW, no optimizer.train()/eval() anywhere; records the mode each hook sees."""

    def __init__(self, optimizer: str = "schedulefree", scheduler: bool = False) -> None:
        super().__init__()
        self.net = linear()
        self.kind, self.with_scheduler = optimizer, scheduler
        self.modes: list[tuple[str, bool]] = []

    def _mode(self, hook: str) -> None:
        self.modes.append((hook, bool(self.opt.param_groups[0]["train_mode"])))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self._mode("train")
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._mode("validation")
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._mode("test")

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        self._mode("predict")
        return self.net(batch[0])

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._mode("checkpoint")

    def configure_optimizers(self) -> Any:
        if self.kind == "schedulefree":
            self.opt = schedulefree.AdamWScheduleFree(self.parameters(), lr=LR, weight_decay=0.01)
        else:
            self.opt = torch.optim.AdamW(self.parameters(), lr=LR, weight_decay=0.01)
        if not self.with_scheduler:
            return self.opt
        return {"optimizer": self.opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(self.opt, 1)}


def hand_loop(steps: int, saves: tuple[int, ...] = ()) -> tuple[torch.nn.Module, float]:
    """The authors' usage by hand: train() to step, eval() to evaluate or save (after the steps in ``saves``);
    returns x and the validation loss there."""
    net = linear()
    optimizer = schedulefree.AdamWScheduleFree(net.parameters(), lr=LR, weight_decay=0.01)
    for step, (x, y) in enumerate(list(image_loader(n=64, batch_size=16))[:steps], start=1):
        optimizer.train()
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
        if step in saves:
            optimizer.eval()
    optimizer.eval()
    with torch.no_grad():
        x, y = next(iter(image_loader(n=16, batch_size=16)))
        return net, float(F.cross_entropy(net(x), y))


def test_modes_at_every_hook_and_checkpoints_hold_the_averaged_weights(tmp_path: Path) -> None:
    model = UserModule()
    checkpoint = L.callbacks.ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=1, filename="best")
    callback = AlgorithmEngineCallback([ScheduleFree()])
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=4, num_sanity_val_steps=1,
                            callbacks=[callback, checkpoint], enable_checkpointing=True)
    trainer.fit(model, image_loader(n=64, batch_size=16), image_loader(n=16, batch_size=16))
    assert model.modes == [("validation", False)] + [("train", True)] * 4 + [("validation", False), ("checkpoint", False)]
    reference, val_loss = hand_loop(4)
    saved = torch.load(tmp_path / "best.ckpt", weights_only=True)
    assert_same_weights({f"net.{k}": v for k, v in weights_of(reference).items()}, saved["state_dict"])
    assert float(checkpoint.best_model_score) == pytest.approx(val_loss, rel=1e-6)  # the monitor saw x
    assert_same_weights(weights_of(reference), weights_of(model.net))  # the model after fit holds x
    trainer.test(model, image_loader(n=16, batch_size=16), verbose=False)
    trainer.predict(model, image_loader(n=16, batch_size=16))
    assert model.modes[-2:] == [("test", False), ("predict", False)]
    traced = {t.event.name for s in callback.traces for t in callback.traces[s] if t.name == "ScheduleFree"}
    assert {"FIT_START", "BATCH_START", "EVAL_START", "FIT_END"} <= traced


def test_a_checkpoint_saved_mid_epoch_holds_x_and_training_goes_on_at_y(tmp_path: Path) -> None:
    model = UserModule()
    checkpoint = L.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer = quiet_trainer(max_steps=4, max_epochs=-1, callbacks=[AlgorithmEngineCallback([ScheduleFree()]), checkpoint],
                            enable_checkpointing=True)
    trainer.fit(model, image_loader(n=64, batch_size=16))
    assert model.modes == [("train", True)] * 2 + [("checkpoint", False)] + [("train", True)] * 2 + [("checkpoint", False)]
    saved = torch.load(tmp_path / "epoch=0-step=2.ckpt", weights_only=True)["state_dict"]
    assert_same_weights({f"net.{k}": v for k, v in weights_of(hand_loop(2)[0]).items()}, saved)
    assert_same_weights(weights_of(hand_loop(4)[0]), weights_of(model.net))  # the save did not nudge training


def bn_classifier(batchnorm_batches: int) -> tuple[Any, AlgorithmEngineCallback]:
    torch.manual_seed(0)
    net = ResNetCNN(num_classes=4, in_channels=1, widths=(8, 16), blocks_per_stage=1)
    model = ComposerClassifier(net, num_classes=4, optimizer=lambda p: schedulefree.AdamWScheduleFree(p, lr=LR))
    return model, AlgorithmEngineCallback([ScheduleFree(batchnorm_batches=batchnorm_batches)], seed=1)


def test_batchnorm_statistics_are_recomputed_at_x_from_the_last_training_batches() -> None:
    model, callback = bn_classifier(batchnorm_batches=2)
    quiet_trainer(max_steps=4, max_epochs=-1, callbacks=[callback]).fit(model, image_loader(n=64, batch_size=16))
    # by hand: the weights after fit are x; a plain average of the BatchNorm statistics over the last 2 batches
    expected = copy.deepcopy(model)
    norms = [m for m in expected.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    expected.train()
    with torch.no_grad():
        for batch in list(image_loader(n=64, batch_size=16))[2:4]:
            expected(batch)
    assert_same_weights(weights_of(expected), weights_of(model))


def test_a_resumed_run_matches_the_uninterrupted_one_exactly(tmp_path: Path) -> None:
    def run(ckpt: Path | None = None, save: bool = False) -> tuple[Any, Any, Any]:
        model, callback = bn_classifier(batchnorm_batches=2)
        callbacks: list[Any] = [callback]
        if save:
            callbacks.append(L.callbacks.ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1))
        trainer = quiet_trainer(max_epochs=3, limit_train_batches=3, callbacks=callbacks, enable_checkpointing=save)
        trainer.fit(model, image_loader(n=48, batch_size=16), image_loader(n=16, batch_size=16), ckpt_path=ckpt)
        return model, trainer, callback

    full, full_trainer, full_callback = run(save=True)
    resumed, resumed_trainer, resumed_callback = run(ckpt=tmp_path / "epoch=0-step=3.ckpt")
    assert_same_weights(weights_of(full), weights_of(resumed))
    assert_same_state(full_trainer.optimizers[0].state_dict(), resumed_trainer.optimizers[0].state_dict(), "optimizer")
    assert_same_state(full_callback.algorithms[0].state_dict(), resumed_callback.algorithms[0].state_dict())


def test_replace_builds_the_schedule_free_adamw_drops_the_scheduler_and_says_so() -> None:
    model = UserModule(optimizer="adamw", scheduler=True)
    trainer = quiet_trainer(max_steps=4, max_epochs=-1, callbacks=[AlgorithmEngineCallback([ScheduleFree(replace=True)])])
    model._mode = lambda hook: None  # type: ignore[method-assign]  # its own optimizer is not the one that trains
    with pytest.warns(UserWarning, match=r"AdamWScheduleFree in place of .*drops its LR scheduler\(s\) \(StepLR\)"):
        trainer.fit(model, image_loader(n=64, batch_size=16))
    optimizer = trainer.optimizers[0]
    assert type(optimizer).__name__ == "AdamWScheduleFree" and trainer.lr_scheduler_configs == []
    assert optimizer.param_groups[0]["lr"] == LR and optimizer.param_groups[0]["weight_decay"] == 0.01
    assert_same_weights(weights_of(hand_loop(4)[0]), weights_of(model.net))


def test_replace_takes_the_learning_rate_the_user_built_not_the_warm_up_s_first_step() -> None:
    """A warm-up scheduler has already scaled ``lr`` for its first step when the optimizer is handed over; the
    counterpart must train at the built rate (here a 1/20 warm-up would leave it at LR / 20 for the whole run)."""

    class WarmupModule(UserModule):
        def configure_optimizers(self) -> Any:
            self.opt = torch.optim.AdamW(self.parameters(), lr=LR, weight_decay=0.01)
            warmup = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda step: min(1.0, (step + 1) / 20))
            return {"optimizer": self.opt, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}

    model = WarmupModule(optimizer="adamw")
    model._mode = lambda hook: None  # type: ignore[method-assign]
    trainer = quiet_trainer(max_steps=2, max_epochs=-1, callbacks=[AlgorithmEngineCallback([ScheduleFree(replace=True)])])
    with pytest.warns(UserWarning, match="drops its LR scheduler"):
        trainer.fit(model, image_loader(n=32, batch_size=16))
    assert trainer.optimizers[0].param_groups[0]["lr"] == LR


def refused(algorithms: list[Any], match: str, model: Any = None) -> None:
    callback = AlgorithmEngineCallback(algorithms)
    with pytest.raises(Exception, match=match):
        quiet_trainer(max_steps=1, max_epochs=-1, callbacks=[callback]).fit(model or UserModule(), image_loader(n=32))


def test_refusals_name_the_conflict_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    refused([ScheduleFree()], r"needs a schedule-free optimizer; configure_optimizers returned AdamW.*replace=True",
            UserModule(optimizer="adamw"))
    refused([ScheduleFree()], r"returns an LR scheduler \(StepLR\) with a schedule-free optimizer",
            UserModule(scheduler=True))
    refused([ScheduleFree(), WarmupStableDecay()], "ScheduleFree and WarmupStableDecay both replace the learning-rate")
    # where torch has no Muon (before 2.9), Muon refuses first, naming the version
    refused([Muon(), ScheduleFree()], "Muon and ScheduleFree both take over the optimizer"
            if torch_versions.at_least(torch_versions.MUON) else r"Muon \(torch.optim.Muon\) needs torch>=2.9")
    refused([ScheduleFree(), EMA()], "ScheduleFree and EMA cannot run together")
    refused([ScheduleFree(), SAM()], "ScheduleFree and SAM cannot run together")
    with pytest.raises(ValueError, match="warmup_steps"):
        ScheduleFree(warmup_steps=10)
    model = UserModule()
    monkeypatch.setitem(sys.modules, "schedulefree", None)
    refused([ScheduleFree()], r"not installed: pip install 'composer_bridge\[schedulefree\]'", model)


def test_without_the_algorithm_a_schedule_free_optimizer_refuses_to_step() -> None:
    """Why the algorithm exists: Lightning never calls optimizer.train()."""
    with pytest.raises(Exception, match="not in train mode"):
        quiet_trainer(max_steps=1, max_epochs=-1).fit(UserModule(), image_loader(n=32))



def test_the_counterpart_of_sgd_keeps_each_groups_hyperparameters_and_refuses_what_has_none() -> None:
    from composer_bridge.functional import schedule_free_counterpart

    net = linear()
    sgd = torch.optim.SGD([{"params": [net[1].weight], "lr": 0.5}, {"params": [net[1].bias], "weight_decay": 0.1}],
                          lr=0.2, momentum=0.8)
    built = schedule_free_counterpart(sgd, warmup_steps=7)
    assert type(built) is schedulefree.SGDScheduleFree
    assert [(g["lr"], g["momentum"], g["weight_decay"], g["warmup_steps"]) for g in built.param_groups] == [
        (0.5, 0.8, 0, 7), (0.2, 0.8, 0.1, 7)]
    assert [g["params"] for g in built.param_groups] == [[net[1].weight], [net[1].bias]]
    with pytest.raises(ValueError, match="momentum in"):
        schedule_free_counterpart(torch.optim.SGD(net.parameters(), lr=0.1))
    with pytest.raises(ValueError, match=r"nesterov=True\) has no schedule-free counterpart"):
        schedule_free_counterpart(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True))
    with pytest.raises(ValueError, match="this is Adam"):
        schedule_free_counterpart(torch.optim.Adam(net.parameters()))


def test_the_closure_forms_need_no_switching_and_are_left_alone() -> None:
    class ClosureModule(UserModule):
        def configure_optimizers(self) -> Any:
            return schedulefree.AdamWScheduleFreeClosure(self.parameters(), lr=LR)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return F.cross_entropy(self.net(batch[0]), batch[1])

    model = ClosureModule()
    before = weights_of(model.net)
    quiet_trainer(max_steps=2, max_epochs=-1, callbacks=[AlgorithmEngineCallback([ScheduleFree()])]).fit(
        model, image_loader(n=32))
    assert not torch.equal(before["1.weight"], model.net[1].weight)  # it trained


DDP_SCRIPT = """
import os, torch
from helpers.support import L, ResumableLoader, image_dataset, quiet_trainer
from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import ScheduleFree
from algorithms.test_schedule_free import UserModule

model = UserModule()
rank = int(os.environ.get("LOCAL_RANK", 0))
checkpoint = L.callbacks.ModelCheckpoint(dirpath=".", every_n_train_steps=2, save_top_k=-1)
trainer = quiet_trainer(strategy="ddp", devices=2, max_steps=4, max_epochs=-1, use_distributed_sampler=False,
                        callbacks=[AlgorithmEngineCallback([ScheduleFree()]), checkpoint], enable_checkpointing=True)
trainer.fit(model, ResumableLoader(image_dataset(n=64), batch_size=8, rank=rank, world_size=2))
torch.save({"weights": {k: v.detach() for k, v in model.named_parameters()}, "modes": model.modes},
           f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(300)
def test_ddp_two_processes_switch_modes_on_every_rank_and_save_x(tmp_path: Path) -> None:
    from helpers.two_processes import saved_by_each_rank

    ranks = saved_by_each_rank(DDP_SCRIPT, tmp_path)
    assert_same_weights(ranks[0]["weights"], ranks[1]["weights"])
    expected = [("train", True)] * 2 + [("checkpoint", False)] + [("train", True)] * 2 + [("checkpoint", False)]
    assert ranks[0]["modes"] == ranks[1]["modes"] == expected
    saved = torch.load(tmp_path / "epoch=0-step=4.ckpt", weights_only=True)["state_dict"]
    assert_same_weights(ranks[0]["weights"], saved)  # the model after fit (x) is what the last checkpoint holds
