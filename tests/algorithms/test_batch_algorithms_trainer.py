"""The batch and loss algorithms in a real lightning.Trainer: what training saw, resumption, and DDP.

Each algorithm runs through ``AlgorithmEngineCallback`` with a ``ComposerClassifier`` on tiny
unshuffled data. A recording algorithm placed after it captures the inputs and targets at
``BEFORE_LOSS`` (after every data, forward and loss-target change), and a per-algorithm check
compares them with the raw batch that step drew from the loader.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers.support import (
    assert_same_weights,
    image_dataset,
    image_loader,
    quiet_trainer,
    tiny_classifier,
    weights_of,
)
from helpers.two_processes import saved_by_each_rank
from torch.utils.data import DataLoader, Dataset

from composer_bridge import Algorithm, AlgorithmEngineCallback, Event, State
from composer_bridge.algorithms import (
    ColOut,
    CutMix,
    CutOut,
    LabelSmoothing,
    MixUp,
    ProgressiveResizing,
    SelectiveBackprop,
)

CLASSES, BATCH = 4, 8
MAX_STEPS = 2  # in the "what training saw" runs: 4 loader batches, 2 per optimizer step


def build(name: str, input_key: Any = 0, target_key: Any = 1) -> Algorithm:
    keys = {"input_key": input_key, "target_key": target_key}
    return {
        "LabelSmoothing": lambda: LabelSmoothing(0.2, target_key=target_key),
        "MixUp": lambda: MixUp(alpha=1.0, **keys),
        "CutMix": lambda: CutMix(alpha=1.0, **keys),
        "CutOut": lambda: CutOut(num_holes=1, length=0.5, input_key=input_key),
        "ColOut": lambda: ColOut(p_row=0.25, p_col=0.25, **keys),
        "ProgressiveResizing": lambda: ProgressiveResizing(initial_scale=0.5, delay_fraction=0.0,
                                                           finetune_fraction=0.0, **keys),
        "SelectiveBackprop": lambda: SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0, **keys),
    }[name]()


NAMES = ["LabelSmoothing", "MixUp", "CutMix", "CutOut", "ColOut", "ProgressiveResizing", "SelectiveBackprop"]


class Recorder(Algorithm):
    """Keeps (step, micro-batch, inputs, targets) as the loss sees them."""

    def __init__(self, input_key: Any = 0, target_key: Any = 1) -> None:
        self.input_key = input_key
        self.target_key = target_key
        self.seen: list[tuple[int, int, torch.Tensor, torch.Tensor]] = []

    def match(self, event: Event, state: State) -> bool:
        return event == Event.BEFORE_LOSS

    def apply(self, event: Event, state: State, logger: Any) -> None:
        self.seen.append((int(state.timestamp.batch), state.microbatch_index,
                          state.batch_get_item(self.input_key).detach().clone(),
                          state.batch_get_item(self.target_key).detach().clone()))


class DictImages(Dataset):
    def __init__(self, n: int) -> None:
        self.data = image_dataset(n, classes=CLASSES)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.data[i]
        return {"image": x, "label": y}


def check_label_smoothing(x, y, raw_x, raw_y, step):
    assert torch.equal(x, raw_x)
    torch.testing.assert_close(y, 0.8 * F.one_hot(raw_y, CLASSES).float() + 0.2 / CLASSES)


def check_soft_mix(x, y, raw_x, raw_y, step):
    assert x.shape == raw_x.shape and not torch.equal(x, raw_x)
    assert y.dtype.is_floating_point and y.shape == (BATCH, CLASSES)
    torch.testing.assert_close(y.sum(1), torch.ones(BATCH))


def check_cutout(x, y, raw_x, raw_y, step):
    holes = x != raw_x
    assert holes.any() and (x[holes] == 0).all() and torch.equal(y, raw_y)


def check_colout(x, y, raw_x, raw_y, step):
    assert x.shape == (BATCH, 1, 6, 6) and torch.equal(y, raw_y)


def check_progressive_resizing(x, y, raw_x, raw_y, step):
    scale = 0.5 + 0.5 * step / MAX_STEPS  # ramps over the whole run (no delay, no fine-tuning)
    width = max(1, round(8 * scale / 4)) * 4
    assert x.shape == (BATCH, 1, width, width) and torch.equal(y, raw_y)


def check_selective_backprop(x, y, raw_x, raw_y, step):
    assert x.shape == (BATCH // 2, *raw_x.shape[1:])
    for i in range(x.shape[0]):  # every kept example is a raw example, with its own target
        j = next(j for j in range(BATCH) if torch.equal(raw_x[j], x[i]))
        assert y[i] == raw_y[j]


CHECKS: dict[str, Callable[..., None]] = {
    "LabelSmoothing": check_label_smoothing, "MixUp": check_soft_mix, "CutMix": check_soft_mix,
    "CutOut": check_cutout, "ColOut": check_colout, "ProgressiveResizing": check_progressive_resizing,
    "SelectiveBackprop": check_selective_backprop,
}


@pytest.mark.parametrize("batches, precision", [("tuple", "32-true"), ("dict", "bf16-mixed")])
@pytest.mark.parametrize("name", NAMES)
def test_training_sees_what_the_algorithm_made_of_each_micro_batch(name: str, batches: str, precision: str) -> None:
    keys = ("image", "label") if batches == "dict" else (0, 1)
    model = tiny_classifier(classes=CLASSES)
    model.input_key, model.target_key = keys
    recorder = Recorder(*keys)
    callback = AlgorithmEngineCallback([build(name, *keys), recorder], seed=11)
    data = DataLoader(DictImages(64), batch_size=BATCH) if batches == "dict" else image_loader(64, BATCH, classes=CLASSES)
    trainer = quiet_trainer(max_steps=MAX_STEPS, limit_train_batches=4, accumulate_grad_batches=2,
                            precision=precision, callbacks=[callback])
    before = weights_of(model)
    trainer.fit(model, data)
    raw = image_dataset(64, classes=CLASSES)
    assert [(step, micro) for step, micro, _, _ in recorder.seen] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for step, micro, x, y in recorder.seen:
        start = (2 * step + micro) * BATCH
        CHECKS[name](x, y, raw.tensors[0][start:start + BATCH], raw.tensors[1][start:start + BATCH], step)
    after = weights_of(model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(v.float()).all() for v in after.values())


class SaveAfterFirstEpoch(L.Callback):
    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 0:
            trainer.save_checkpoint(self.path)


def fit_six_steps(name: str, ckpt_path: Path | None = None, save_to: Path | None = None) -> dict[str, torch.Tensor]:
    model = tiny_classifier(classes=CLASSES)
    callbacks: list[L.Callback] = [AlgorithmEngineCallback([build(name)], seed=5)]
    if save_to is not None:
        callbacks.append(SaveAfterFirstEpoch(save_to))
    # max_epochs, not max_steps: Lightning 2.6 resumes a checkpoint written at on_train_epoch_end inside the
    # finished epoch when max_steps is set. The checkpoint is written by the uninterrupted run itself, so
    # both runs have the same max_duration (and so the same schedules).
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=3, callbacks=callbacks)
    trainer.fit(model, image_loader(48, 16, classes=CLASSES), ckpt_path=ckpt_path)
    assert trainer.global_step == 6
    return weights_of(model)


@pytest.mark.parametrize("name", NAMES)
def test_a_run_resumed_from_a_checkpoint_ends_with_the_weights_of_the_uninterrupted_run(name: str,
                                                                                      tmp_path: Path) -> None:
    checkpoint = tmp_path / "epoch0.ckpt"
    uninterrupted = fit_six_steps(name, save_to=checkpoint)
    resumed = fit_six_steps(name, ckpt_path=checkpoint)
    assert_same_weights(uninterrupted, resumed)


DDP_SCRIPT = """
import torch
from helpers.support import image_loader, quiet_trainer, tiny_classifier
from composer_bridge import AlgorithmEngineCallback, Algorithm, Event
from composer_bridge.algorithms import MixUp, ProgressiveResizing, SelectiveBackprop

class Shapes(Algorithm):
    def __init__(self):
        self.shapes = []
    def match(self, event, state):
        return event == Event.BEFORE_LOSS
    def apply(self, event, state, logger):
        self.shapes.append(list(state.batch_get_item(0).shape))

shapes = Shapes()
algorithms = [SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0), MixUp(alpha=1.0),
              ProgressiveResizing(initial_scale=0.5, delay_fraction=1.0, finetune_fraction=0.0), shapes]
trainer = quiet_trainer(strategy="ddp", devices=2, max_steps=3, callbacks=[AlgorithmEngineCallback(algorithms, seed=3)])
model = tiny_classifier(classes=4)
trainer.fit(model, image_loader(n=96, batch_size=16, classes=4))
# parameters only: DDP broadcasts BatchNorm buffers from rank 0 at each forward, the last local update differs.
torch.save({"weights": {k: v.detach() for k, v in model.named_parameters()}, "shapes": shapes.shapes},
           f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(300)
def test_ddp_ranks_prune_mix_and_resize_and_end_with_identical_weights(tmp_path: Path) -> None:
    ranks = saved_by_each_rank(DDP_SCRIPT, tmp_path)
    for out in ranks:
        assert out["shapes"] == [[8, 1, 4, 4]] * 3  # half of each 16-example batch, at half the size
    for key, value in ranks[0]["weights"].items():
        assert torch.equal(value, ranks[1]["weights"][key]), key
