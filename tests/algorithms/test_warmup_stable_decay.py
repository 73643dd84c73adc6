"""WarmupStableDecay: the learning rate of every optimizer step of a real Trainer run, against a formula written here."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.support import (
    ComposerClassifier,
    L,
    assert_same_weights,
    image_loader,
    quiet_trainer,
    tiny_classifier,
    weights_of,
)

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import WarmupStableDecay
from composer_bridge.functional import wsd_multiplier
from composer_bridge.models import ResNetCNN


def hand_lr(peak: float, step: int, total: int, warmup: int, decay: int, shape: str, final: float = 0.0) -> float:
    """The schedule the method card states, written out independently."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if step < total - decay:
        return peak
    p = (step - (total - decay)) / decay
    return peak * (final + (1 - final) * ((1 - p) if shape == "linear" else (1 - math.sqrt(p))))


class LRRecorder(L.Callback):
    """The learning rate each optimizer step is taken with (every parameter group)."""

    def __init__(self) -> None:
        self.lrs: list[list[float]] = []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.lrs.append([group["lr"] for group in optimizer.param_groups])


def classifier(lr: float = 0.05, scheduler: Any = None) -> ComposerClassifier:
    torch.manual_seed(0)
    net = ResNetCNN(num_classes=4, in_channels=1, widths=(8, 16), blocks_per_stage=1)
    return ComposerClassifier(net, num_classes=4, optimizer=lambda p: torch.optim.SGD(p, lr=lr, momentum=0.9), scheduler=scheduler)


@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
def test_the_lr_of_every_step_follows_the_formula_over_max_steps(shape: str) -> None:
    recorder = LRRecorder()
    algorithm = WarmupStableDecay(warmup="3ba", decay=0.4, shape=shape, final_lr_ratio=0.1)
    callback = AlgorithmEngineCallback([algorithm])
    trainer = quiet_trainer(max_steps=10, max_epochs=-1, callbacks=[callback, recorder])
    trainer.fit(classifier(lr=0.05), image_loader(n=48, batch_size=16))
    expected = [hand_lr(0.05, s, 10, 3, 4, shape, 0.1) for s in range(10)]
    assert [lr[0] for lr in recorder.lrs] == pytest.approx(expected, rel=1e-12, abs=0)
    assert algorithm.steps(callback.state) == (10, 3, 4)
    # traced at every step, and in the cost report
    names = {t.name for step in callback.traces for t in callback.traces[step]}
    assert "WarmupStableDecay" in names
    rows = {(r.algorithm, r.event): r.calls for r in callback.cost_report().rows}
    assert rows[("WarmupStableDecay", "BATCH_START")] == 10


def test_the_run_length_is_epochs_times_optimizer_steps_with_accumulation() -> None:
    recorder = LRRecorder()
    callback = AlgorithmEngineCallback([WarmupStableDecay(warmup=0.25, decay=0.5, shape="linear")])
    # 5 batches of 8 per epoch, 2 per step: 3 steps an epoch (Lightning steps on the last, odd one), 4 epochs: 12 steps
    trainer = quiet_trainer(max_epochs=4, accumulate_grad_batches=2, callbacks=[callback, recorder])
    trainer.fit(classifier(lr=0.1), image_loader(n=40, batch_size=8))
    assert len(recorder.lrs) == 12
    expected = [hand_lr(0.1, s, 12, 3, 6, "linear") for s in range(12)]
    assert [lr[0] for lr in recorder.lrs] == pytest.approx(expected, rel=1e-12, abs=0)


def test_the_users_own_scheduler_is_replaced_and_a_warning_names_it() -> None:
    recorder = LRRecorder()
    callback = AlgorithmEngineCallback([WarmupStableDecay(warmup=0.0, decay=0.5, shape="linear")])
    model = classifier(lr=0.05, scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5))
    trainer = quiet_trainer(max_steps=6, max_epochs=-1, callbacks=[callback, recorder])
    with pytest.warns(UserWarning, match=r"replaces the learning-rate schedule.*StepLR"):
        trainer.fit(model, image_loader(n=48, batch_size=16))
    assert trainer.lr_scheduler_configs == []
    assert [lr[0] for lr in recorder.lrs] == pytest.approx([hand_lr(0.05, s, 6, 0, 3, "linear") for s in range(6)])


def test_the_peak_is_the_lr_the_optimizer_was_built_with_for_each_group() -> None:
    recorder = LRRecorder()

    def two_groups(params: Any) -> torch.optim.Optimizer:
        params = list(params)
        return torch.optim.SGD([{"params": params[:2], "lr": 0.2}, {"params": params[2:]}], lr=0.05)

    torch.manual_seed(0)
    model = ComposerClassifier(ResNetCNN(num_classes=4, in_channels=1, widths=(8, 16), blocks_per_stage=1), num_classes=4,
                    optimizer=two_groups)
    callback = AlgorithmEngineCallback([WarmupStableDecay(warmup="2ba", decay="2ba")])
    quiet_trainer(max_steps=6, max_epochs=-1, callbacks=[callback, recorder]).fit(model, image_loader(n=48))
    for peak, column in ((0.2, 0), (0.05, 1)):
        assert [lr[column] for lr in recorder.lrs] == pytest.approx([hand_lr(peak, s, 6, 2, 2, "1-sqrt") for s in range(6)])


def test_a_resumed_run_matches_the_uninterrupted_one_exactly(tmp_path: Path) -> None:
    def run(ckpt: Path | None = None, save: bool = False) -> tuple[Any, LRRecorder]:
        recorder = LRRecorder()
        callbacks: list[Any] = [AlgorithmEngineCallback([WarmupStableDecay(warmup=0.2, decay=0.4)], seed=1), recorder]
        if save:
            callbacks.append(L.callbacks.ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1))
        model = classifier(lr=0.05)
        quiet_trainer(max_epochs=3, limit_train_batches=3, callbacks=callbacks, enable_checkpointing=save).fit(
            model, image_loader(n=48, batch_size=16), ckpt_path=ckpt)
        return model, recorder

    full, full_lrs = run(save=True)
    resumed, resumed_lrs = run(ckpt=tmp_path / "epoch=0-step=3.ckpt")
    assert resumed_lrs.lrs == full_lrs.lrs[3:]
    assert_same_weights(weights_of(full), weights_of(resumed))


def test_refusals_name_the_value_and_the_fix() -> None:
    with pytest.raises(ValueError, match="shape='cosine'"):
        WarmupStableDecay(shape="cosine")
    with pytest.raises(ValueError, match="exceed the run"):
        WarmupStableDecay(warmup=0.6, decay=0.5)
    with pytest.raises(ValueError, match="final_lr_ratio"):
        WarmupStableDecay(final_lr_ratio=2)
    callback = AlgorithmEngineCallback([WarmupStableDecay(warmup="8ba", decay="8ba")])
    with pytest.raises(Exception, match="do not fit in this run of 4 steps"):
        quiet_trainer(max_steps=4, max_epochs=-1, callbacks=[callback]).fit(tiny_classifier(), image_loader(n=32))


def test_two_schedule_owners_are_refused_naming_both() -> None:
    class MySchedule(WarmupStableDecay):
        unique = False

    callback = AlgorithmEngineCallback([WarmupStableDecay(), MySchedule()])
    with pytest.raises(Exception, match="WarmupStableDecay and MySchedule both replace the learning-rate schedule"):
        quiet_trainer(max_steps=2, max_epochs=-1, callbacks=[callback]).fit(tiny_classifier(), image_loader(n=32))


def test_the_functional_form_matches_the_formula() -> None:
    for shape in ("linear", "1-sqrt"):
        got = [wsd_multiplier(s, 20, 4, 6, shape, 0.05) for s in range(20)]
        assert got == pytest.approx([hand_lr(1.0, s, 20, 4, 6, shape, 0.05) for s in range(20)], rel=1e-12)
    assert wsd_multiplier(25, 20, 4, 6, "linear", 0.05) == 0.05


DDP_SCRIPT = """
import torch
from helpers.support import image_loader, quiet_trainer
from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import WarmupStableDecay
from algorithms.test_warmup_stable_decay import LRRecorder, classifier

recorder = LRRecorder()
trainer = quiet_trainer(strategy="ddp", devices=2, max_epochs=2, accumulate_grad_batches=2,
                        callbacks=[AlgorithmEngineCallback([WarmupStableDecay(warmup=0.25, decay=0.5)]), recorder])
trainer.fit(classifier(lr=0.1), image_loader(n=64, batch_size=8))  # 4 batches per rank and epoch: 2 steps
torch.save(recorder.lrs, f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(300)
def test_ddp_two_processes_take_the_same_schedule_counted_from_their_share_of_the_data(tmp_path: Path) -> None:
    from helpers.two_processes import saved_by_each_rank

    ranks = saved_by_each_rank(DDP_SCRIPT, tmp_path)
    expected = [hand_lr(0.1, s, 4, 1, 2, "1-sqrt") for s in range(4)]
    assert ranks[0] == ranks[1] and [lr[0] for lr in ranks[0]] == pytest.approx(expected, rel=1e-12)
