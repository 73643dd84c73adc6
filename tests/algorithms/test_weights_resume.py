"""EMA, SWA, SAM, GradientClipping and LayerFreezing in a real Trainer: each resumes exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers.support import (
    assert_same_state,
    assert_same_weights,
    image_loader,
    quiet_trainer,
    tiny_classifier,
    weights_of,
)

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms.ema import EMA
from composer_bridge.algorithms.gradient_clipping import GradientClipping
from composer_bridge.algorithms.layer_freezing import LayerFreezing
from composer_bridge.algorithms.sam import SAM
from composer_bridge.algorithms.swa import SWA

CASES = {
    "EMA": lambda: EMA(half_life="2ba", update_interval="1ba"),
    "SWA": lambda: SWA(swa_start="0.3dur", swa_end="0.95dur", update_interval="1ba"),
    "SAM": lambda: SAM(rho=0.05),
    "GradientClipping-norm": lambda: GradientClipping("norm", 0.1),
    "GradientClipping-adaptive": lambda: GradientClipping("adaptive", 0.05),
    "LayerFreezing": lambda: LayerFreezing(freeze_start=0.2, freeze_level=0.6),
}


def run(factory: Any, ckpt: Path | None = None, save_dir: Path | None = None):
    """Three epochs of three steps; with ``save_dir``, a checkpoint at the end of every epoch."""
    model = tiny_classifier()
    callback = AlgorithmEngineCallback([factory()], seed=3)
    extra: list[Any] = []
    if save_dir is not None:
        extra.append(L.pytorch.callbacks.ModelCheckpoint(dirpath=save_dir, save_top_k=-1, every_n_epochs=1))
    t = quiet_trainer(max_epochs=3, limit_train_batches=3, callbacks=[callback, *extra],
                      enable_checkpointing=save_dir is not None)
    t.fit(model, image_loader(n=48, batch_size=16), ckpt_path=ckpt)
    return model, callback, t


@pytest.mark.parametrize("name", sorted(CASES))
def test_resumed_run_matches_the_uninterrupted_run_exactly(name: str, tmp_path: Path) -> None:
    factory = CASES[name]
    full_model, full_cb, full_t = run(factory, save_dir=tmp_path)
    first_epoch = tmp_path / "epoch=0-step=3.ckpt"
    torch.load(first_epoch, weights_only=True)  # the bridge's state is plain data
    model, cb, t = run(factory, ckpt=first_epoch)
    assert_same_weights(weights_of(full_model), weights_of(model))
    assert_same_state(full_cb.algorithms[0].state_dict(), cb.algorithms[0].state_dict())
    assert_same_state(full_t.optimizers[0].state_dict(), t.optimizers[0].state_dict(), "optimizer")
