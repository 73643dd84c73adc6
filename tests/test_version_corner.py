"""One of everything a user does, compact enough to run at every version corner CI tests (.ci/run).

On the oldest and the newest declared torch / Python / Lightning / transformers, beside the
Lightning-facing and algorithm tests: a real ``Trainer.fit`` with an algorithm of every family at
once, logged to W&B (offline), resumed from a checkpoint to the uninterrupted run's exact weights,
and the same algorithms under DDP on 2 processes ending with identical weights on both ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.support import (
    L,
    assert_same_weights,
    image_loader,
    quiet_trainer,
    tiny_classifier,
    wandb_run_records,
)
from helpers.two_processes import saved_by_each_rank

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import (
    EMA,
    SAM,
    BlurPool,
    CutMix,
    CutOut,
    GradientClipping,
    LabelSmoothing,
    ProgressiveResizing,
)

#: one algorithm per family: surgery, loss, batch mixing, augmentation, schedule, weight averaging,
#: gradients, optimizer (the same list is built inside the DDP script below)
FAMILIES = "BlurPool, LabelSmoothing, CutMix, CutOut, ProgressiveResizing, EMA, GradientClipping, SAM"


def every_family() -> list:
    return [BlurPool(min_channels=1), LabelSmoothing(0.1), CutMix(alpha=1.0), CutOut(length=0.25),
            ProgressiveResizing(initial_scale=0.5, delay_fraction=0.0, finetune_fraction=0.25, size_increment=2),
            EMA(), GradientClipping("norm", 1.0), SAM(rho=0.05)]


def test_the_families_are_the_ones_named() -> None:
    assert ", ".join(type(a).__name__ for a in every_family()) == FAMILIES


def _fit(tmp_path: Path, *, logger: object = False, ckpt_path: Path | None = None) -> tuple[torch.nn.Module, AlgorithmEngineCallback]:
    L.seed_everything(0)
    callback = AlgorithmEngineCallback(every_family())
    checkpoints = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_epochs=1, save_top_k=-1)
    model = tiny_classifier()
    trainer = quiet_trainer(max_epochs=2, logger=logger, enable_checkpointing=True, callbacks=[callback, checkpoints])
    trainer.fit(model, image_loader(n=32, batch_size=8), ckpt_path=ckpt_path)  # 4 steps per epoch
    return model, callback


def test_a_fit_with_every_family_logs_to_wandb_and_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    wandb = pytest.importorskip("wandb")
    logger = L.loggers.WandbLogger(project="corner", save_dir=str(tmp_path), offline=True)
    full, callback = _fit(tmp_path / "full", logger=logger)
    run_dir = Path(logger.experiment.dir).parent
    wandb.finish()
    trained = {k: v.detach().clone() for k, v in full.state_dict().items()}
    assert any(type(m).__name__ == "BlurConv2d" for m in full.modules())  # the surgery ran
    fresh = tiny_classifier().state_dict()
    assert any(not torch.equal(v, trained[k]) for k, v in fresh.items() if k in trained and v.shape == trained[k].shape)

    # W&B got the algorithms in its config and their traces in its history
    records = wandb_run_records(next(run_dir.glob("run-*.wandb")))
    config, keys = {}, set()
    for record in records:
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        config.update({item.key: json.loads(item.value_json) for item in updates})
        if kind == "history":
            keys |= {item.key or "/".join(item.nested_key) for item in record.history.item}
    assert set(config["composer_bridge"]["algorithms"]) == set(FAMILIES.split(", "))
    for name in FAMILIES.split(", "):
        assert any(k.startswith(f"algorithm_traces/{name}/") for k in keys), name

    # resumed from the first epoch's checkpoint: the uninterrupted run's weights and EMA average, bit for bit
    (first_epoch,) = (tmp_path / "full" / "ckpt").glob("epoch=0-*.ckpt")
    resumed, resumed_callback = _fit(tmp_path / "resumed", ckpt_path=first_epoch)
    assert_same_weights(trained, {k: v.detach() for k, v in resumed.state_dict().items()})
    ema, resumed_ema = (next(a for a in c.algorithms if isinstance(a, EMA)) for c in (callback, resumed_callback))
    assert_same_weights(ema.ema_weights, resumed_ema.ema_weights)


DDP_SCRIPT = """
import torch
from helpers.support import L, image_loader, quiet_trainer, tiny_classifier
from composer_bridge import AlgorithmEngineCallback
from test_version_corner import every_family

L.seed_everything(0)
model = tiny_classifier()
start = {k: v.detach().clone() for k, v in model.named_parameters()}
trainer = quiet_trainer(strategy="ddp", devices=2, max_epochs=2, callbacks=[AlgorithmEngineCallback(every_family())])
trainer.fit(model, image_loader(n=64, batch_size=8))
torch.save({"start": start, "end": {k: v.detach() for k, v in model.named_parameters()},
            "steps": trainer.global_step}, f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(300)
def test_every_family_under_ddp_on_two_processes_ends_with_identical_weights(tmp_path: Path) -> None:
    ranks = saved_by_each_rank(DDP_SCRIPT, tmp_path)
    assert ranks[0]["steps"] == ranks[1]["steps"] == 8  # 64 samples, 2 ranks, 8 per batch, 2 epochs
    assert_same_weights(ranks[0]["end"], ranks[1]["end"])
    assert any(not torch.equal(ranks[0]["end"][k], v) for k, v in ranks[0]["start"].items() if k in ranks[0]["end"])
