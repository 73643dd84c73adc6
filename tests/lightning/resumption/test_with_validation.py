"""A resumed run ends with exactly the weights of the uninterrupted run, *with validation on*.

Training draws (MixUp's mixing, CutOut's boxes, ...) must not depend on how many evaluation
batches ran before them: the sanity check, ``val_check_interval``, ``limit_val_batches``,
``check_val_every_n_epoch``, and a resumed process that has not validated yet all change that count.
The seed stored in the checkpoint is used when the resumed run gives none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.support import (
    L,
    ResumableLoader,
    assert_same_state,
    image_loader,
    quiet_trainer,
    tiny_classifier,
    weights_of,
)

import composer_bridge.algorithms as library
from composer_bridge import AlgorithmEngineCallback


def random_algorithms() -> list[Any]:
    """Every algorithm of the library that draws random numbers while training, on the vision model."""
    algorithms = [
        library.CutOut(length=0.25),
        library.MixUp(alpha=0.2),
        library.ColOut(p_row=0.2, p_col=0.2),
        library.ProgressiveResizing(mode="crop", initial_scale=0.5, delay_fraction=0.0, finetune_fraction=0.2),
        library.SelectiveBackprop(start=0.0, end=1.0, keep=0.5),
    ]
    for name in ("RandAugment", "AugMix"):  # the on-device augmentations, where this version has them
        if hasattr(library, name):
            algorithms.append(getattr(library, name)())
    return algorithms


#: validation schedules a user may run with; each changes how many eval batches precede a training draw
VALIDATION = {
    "default (sanity check, every epoch)": dict(num_sanity_val_steps=2),
    "mid-epoch val_check_interval, 1 val batch": dict(val_check_interval=2, limit_val_batches=1),
    "every 2nd epoch": dict(check_val_every_n_epoch=2, num_sanity_val_steps=1),
}


def fit(algorithms: list[Any], validation: dict[str, Any], tmp_path: Path, ckpt: Path | None = None,
        save: dict[str, Any] | None = None, seed: int | None = 11) -> tuple[Any, AlgorithmEngineCallback]:
    model = tiny_classifier()
    callback = AlgorithmEngineCallback(algorithms, seed=seed)
    extra = [L.callbacks.ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, **save)] if save else []
    trainer = quiet_trainer(max_epochs=3, callbacks=[callback, *extra], enable_checkpointing=bool(save),
                            **{"num_sanity_val_steps": 0, **validation})
    data = image_loader(n=48, batch_size=16).dataset
    trainer.fit(model, ResumableLoader(data, 16), image_loader(n=32, batch_size=16), ckpt_path=ckpt)
    return model, callback


def assert_same_run(full: tuple[Any, AlgorithmEngineCallback], resumed: tuple[Any, AlgorithmEngineCallback]) -> None:
    a, b = weights_of(full[0]), weights_of(resumed[0])
    for key in a:
        assert torch.equal(a[key], b[key]), f"weights differ at {key}: max |diff| {(a[key] - b[key]).abs().max()}"
    for x, y in zip(full[1].algorithms, resumed[1].algorithms, strict=True):
        assert_same_state(x.state_dict(), y.state_dict(), type(x).__name__)
    assert full[1].state.timestamp.batch == resumed[1].state.timestamp.batch


@pytest.mark.parametrize("validation", list(VALIDATION), ids=list(VALIDATION))
def test_resuming_from_an_epoch_end_checkpoint_is_exact_with_validation_on(validation: str, tmp_path: Path) -> None:
    settings = VALIDATION[validation]
    full = fit(random_algorithms(), settings, tmp_path, save={"every_n_epochs": 1})
    # The first checkpoint: at the end of epoch 0, or at the first validation (step 2) where validation
    # runs mid-epoch (ModelCheckpoint saves after validation).
    first = min(tmp_path.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    assert_same_run(full, fit(random_algorithms(), settings, tmp_path, ckpt=first))


def test_resuming_mid_epoch_is_exact_with_mid_epoch_validation(tmp_path: Path) -> None:
    settings = VALIDATION["mid-epoch val_check_interval, 1 val batch"]
    full = fit(random_algorithms(), settings, tmp_path, save={"every_n_train_steps": 4})
    mid = tmp_path / "epoch=1-step=4.ckpt"
    assert mid.exists(), sorted(p.name for p in tmp_path.iterdir())
    assert_same_run(full, fit(random_algorithms(), settings, tmp_path, ckpt=mid))


def test_a_resumed_run_without_a_seed_uses_the_seed_in_the_checkpoint(tmp_path: Path) -> None:
    settings = VALIDATION["default (sanity check, every epoch)"]
    full = fit(random_algorithms(), settings, tmp_path, save={"every_n_epochs": 1}, seed=12345)
    torch.manual_seed(999)  # the resumed process would otherwise default to another seed
    resumed = fit(random_algorithms(), settings, tmp_path, ckpt=tmp_path / "epoch=0-step=3.ckpt", seed=None)
    assert resumed[1].state.seed == 12345
    assert_same_run(full, resumed)
