"""Lightning features users combine with AlgorithmEngineCallback, each in a small real Trainer run.

Every test compares numbers with a reference that is computed apart from the bridge (a run
without it, a hand-written loop, Lightning's own counters, a model loaded with the EMA average),
so a broken feature fails. Semantics asserted throughout:

* ``state.timestamp.batch`` counts optimizer steps and equals ``trainer.global_step`` at ``BATCH_END``;
* traces are stored by step (``callback.traces[step]``) under ``"<Algorithm>/<EVENT>"`` keys;
* EMA's average is swapped in for every evaluation/prediction and out again afterwards.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.support import (
    LIGHTNING_PACKAGE,
    ComposerClassifier,
    L,
    ResumableLoader,
    assert_same_weights,
    image_dataset,
    image_loader,
    quiet_trainer,
    tiny_classifier,
    wandb_run_records,
    weights_of,
)
from torch import nn

from composer_bridge import Algorithm, AlgorithmEngineCallback, Event, State
from composer_bridge.algorithms import EMA, CutOut, LabelSmoothing, MixUp, SqueezeExcite

EarlyStopping, ModelCheckpoint, ModelSummary = L.callbacks.EarlyStopping, L.callbacks.ModelCheckpoint, L.callbacks.ModelSummary
CSVLogger, TensorBoardLogger = L.loggers.CSVLogger, L.loggers.TensorBoardLogger

ROOT = Path(__file__).resolve().parents[2]
HALF_LIFE_2BA = 2.0 ** -0.5  # EMA(half_life="2ba") updating every step


class Probe(Algorithm):
    """Records, at each of ``events``: the event, the bridge's step counter and Lightning's ``global_step``.

    At the events in ``weights_at`` it also keeps a copy of the model's weights.
    """

    def __init__(self, *events: str, weights_at: tuple[str, ...] = ()) -> None:
        self.events = set(events) | set(weights_at)
        self.weights_at = set(weights_at)
        self.seen: list[tuple[str, int, int]] = []
        self.weights: dict[str, list[dict[str, torch.Tensor]]] = {name: [] for name in weights_at}
        self.output_dtypes: list[torch.dtype] = []

    def match(self, event: Event, state: State) -> bool:
        return event.name in self.events

    def apply(self, event: Event, state: State, logger: Any) -> None:
        self.seen.append((event.name, int(state.timestamp.batch), int(state.trainer.global_step)))
        if event.name in self.weights_at:
            self.weights[event.name].append(weights_of(state.model))
        if event == Event.AFTER_FORWARD:
            self.output_dtypes.append(state.outputs.dtype)

    def count(self, event: str) -> int:
        return sum(1 for name, _, _ in self.seen if name == event)

    def steps(self, event: str) -> list[tuple[int, int]]:
        """(timestamp.batch, global_step) at each run of ``event``."""
        return [(batch, step) for name, batch, step in self.seen if name == event]


def cpu_trainer(**overrides: Any) -> L.Trainer:
    """A quiet Trainer on the CPU in float32 even when the suite runs on a GPU: the references here are CPU runs."""
    return quiet_trainer(**{"accelerator": "cpu", "precision": "32-true", **overrides})


def mlp_classifier(lr: float = 0.1) -> ComposerClassifier:
    """No BatchNorm: a step's gradient does not depend on how the batch is split into micro-batches."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 4))
    return ComposerClassifier(net, num_classes=4, optimizer=lambda p: torch.optim.SGD(p, lr=lr))


def ema_reference(snapshots: list[dict[str, torch.Tensor]], smoothing: float) -> dict[str, torch.Tensor]:
    """The average EMA should hold after updates at these weights: the first copies, then ``s*avg + (1-s)*w``."""
    average = {key: value.clone() for key, value in snapshots[0].items()}
    for weights in snapshots[1:]:
        for key, value in weights.items():
            average[key] = average[key] * smoothing + value * (1 - smoothing) if value.is_floating_point() else value
    return average


def assert_close_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    for key in a:
        assert torch.allclose(a[key].float(), b[key].float(), rtol=0, atol=atol), (
            f"{key}: max |diff| = {(a[key].float() - b[key].float()).abs().max()}")


def with_weights(weights: dict[str, torch.Tensor]) -> ComposerClassifier:
    """A fresh tiny_classifier holding ``weights`` (and no bridge)."""
    model = tiny_classifier()
    model.load_state_dict(weights)
    return model


# ----------------------------------------------------------------------------------------------
# gradient accumulation
# ----------------------------------------------------------------------------------------------
def test_accumulation_counts_optimizer_steps_and_smooths_every_micro_batch() -> None:
    probe = Probe("BEFORE_LOSS", "AFTER_BACKWARD", "BATCH_END")
    callback = AlgorithmEngineCallback([LabelSmoothing(0.1), probe])
    model = mlp_classifier()
    trainer = cpu_trainer(max_epochs=2, accumulate_grad_batches=2, callbacks=[callback])
    trainer.fit(model, image_loader(n=64, batch_size=8))  # 8 micro-batches, 4 optimizer steps per epoch
    assert trainer.global_step == 8
    assert probe.steps("BATCH_END") == [(step, step) for step in range(1, 9)]
    assert probe.count("BEFORE_LOSS") == probe.count("AFTER_BACKWARD") == 16
    assert callback.traces.stats["LabelSmoothing/BEFORE_LOSS"].count == 16
    # Reference: one 16-example batch per step, no accumulation: the same mean gradient at every step.
    reference = mlp_classifier()
    cpu_trainer(max_epochs=2, callbacks=[AlgorithmEngineCallback([LabelSmoothing(0.1)])]).fit(
        reference, image_loader(n=64, batch_size=16))
    assert_close_weights(weights_of(model), weights_of(reference))
    unsmoothed = mlp_classifier()
    cpu_trainer(max_epochs=2).fit(unsmoothed, image_loader(n=64, batch_size=16))
    assert not torch.allclose(weights_of(unsmoothed)["module.3.weight"], weights_of(model)["module.3.weight"], atol=1e-4)


class MixingLog(Algorithm):
    """After each micro-batch's backward, what MixUp drew for it (its mixing weight and partner indices)."""

    def __init__(self, mixup: MixUp) -> None:
        self.mixup = mixup
        self.draws: list[tuple[float, torch.Tensor]] = []

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_BACKWARD

    def apply(self, event: Event, state: State, logger: Any) -> None:
        assert self.mixup.indices is not None
        self.draws.append((float(self.mixup.mixing), self.mixup.indices.clone()))


def test_mixup_under_accumulation_equals_a_hand_written_loop_with_its_draws() -> None:
    mixup = MixUp(alpha=1.0)
    log = MixingLog(mixup)
    model = mlp_classifier()
    trainer = cpu_trainer(max_epochs=2, accumulate_grad_batches=2,
                            callbacks=[AlgorithmEngineCallback([mixup, log], seed=3)])
    loader = image_loader(n=64, batch_size=8)
    trainer.fit(model, loader)
    assert len(log.draws) == 16, "MixUp draws once per micro-batch"
    assert len({mixing for mixing, _ in log.draws}) == 16
    # The same training by hand: mix each micro-batch with its draw, mix the one-hot targets, average 2 micro-batches.
    reference = mlp_classifier()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    draws = iter(log.draws)
    for _ in range(2):
        for index, (x, y) in enumerate(loader):
            mixing, partner = next(draws)
            mixed = (1 - mixing) * x + mixing * x[partner]
            targets = (1 - mixing) * F.one_hot(y, 4).float() + mixing * F.one_hot(y[partner], 4).float()
            (F.cross_entropy(reference.module(mixed), targets) / 2).backward()
            if index % 2 == 1:
                optimizer.step()
                optimizer.zero_grad()
    assert_close_weights(weights_of(model), weights_of(reference))
    # And a second identical Trainer draws the same: bit-identical weights.
    again = mlp_classifier()
    cpu_trainer(max_epochs=2, accumulate_grad_batches=2,
                  callbacks=[AlgorithmEngineCallback([MixUp(alpha=1.0)], seed=3)]).fit(again, loader)
    assert_same_weights(weights_of(model), weights_of(again))


# ----------------------------------------------------------------------------------------------
# precision, short runs, limits
# ----------------------------------------------------------------------------------------------
def test_bf16_mixed_on_cpu_trains_and_ema_averages_the_float32_weights() -> None:
    probe = Probe("AFTER_FORWARD", weights_at=("BATCH_END",))
    ema = EMA(half_life="2ba")
    model = tiny_classifier()
    start = weights_of(model)
    trainer = cpu_trainer(max_epochs=1, precision="bf16-mixed", callbacks=[AlgorithmEngineCallback([ema, probe])])
    trainer.fit(model, image_loader(n=64, batch_size=16))
    assert probe.output_dtypes == [torch.bfloat16] * 4, "the forward ran under bf16 autocast"
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    average = ema.ema_weights
    assert average is not None and ema.num_updates == 4
    assert {key: value.dtype for key, value in average.items()} == {key: value.dtype for key, value in start.items()}
    assert_close_weights(average, ema_reference(probe.weights["BATCH_END"], HALF_LIFE_2BA))
    final = weights_of(model)
    assert_same_weights(final, probe.weights["BATCH_END"][-1])  # training weights in the model after fit
    assert not torch.equal(average["module.fc.weight"], final["module.fc.weight"])


def test_fast_dev_run_takes_one_step_validates_one_batch_and_writes_nothing(tmp_path: Path) -> None:
    probe = Probe("BATCH_END", "EVAL_BATCH_END", "FIT_END")
    ema = EMA(half_life="2ba")
    callback = AlgorithmEngineCallback([LabelSmoothing(0.1), ema, probe])
    # Default logger and checkpointing: fast_dev_run turns both off.
    trainer = L.Trainer(fast_dev_run=True, default_root_dir=tmp_path, accelerator="cpu", devices=1,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    trainer.fit(tiny_classifier(), image_loader(), image_loader(n=32))
    assert trainer.global_step == 1 and callback.state.timestamp.batch == 1
    assert probe.steps("BATCH_END") == [(1, 1)]
    assert probe.count("EVAL_BATCH_END") == 1 and probe.count("FIT_END") == 1
    assert ema.num_updates == 1
    assert sorted(callback.traces) == [0, 1]
    assert list(tmp_path.iterdir()) == []


def test_limits_and_val_check_interval_keep_the_trace_steps_on_global_step() -> None:
    probe = Probe("BATCH_END", "EVAL_START", "EVAL_BATCH_END", "EPOCH_END")
    callback = AlgorithmEngineCallback([LabelSmoothing(0.1), probe], trace_mode="every_event")
    trainer = cpu_trainer(max_epochs=2, limit_train_batches=5, limit_val_batches=2, val_check_interval=2,
                            callbacks=[callback])
    trainer.fit(tiny_classifier(), image_loader(n=128, batch_size=16), image_loader(n=64, batch_size=16))
    assert trainer.global_step == 10
    assert probe.steps("BATCH_END") == [(step, step) for step in range(1, 11)]
    # val_check_interval counts batches within each 5-batch epoch: after its 2nd and 4th batch.
    assert probe.steps("EVAL_START") == [(2, 2), (4, 4), (7, 7), (9, 9)]
    assert probe.count("EVAL_BATCH_END") == 8
    assert probe.steps("EPOCH_END") == [(5, 5), (10, 10)]

    def steps_with(event: Event) -> list[int]:
        return sorted(step for step, traces in callback.traces.items()
                      if any(t.name == "Probe" and t.event == event for t in traces))

    assert steps_with(Event.EVAL_START) == [2, 4, 7, 9]
    assert steps_with(Event.BATCH_END) == list(range(1, 11))
    assert steps_with(Event.EPOCH_END) == [5, 10]
    assert callback.traces.stats["LabelSmoothing/BEFORE_LOSS"].count == 10


def test_how_often_validation_runs_never_changes_the_training_draws() -> None:
    """Random algorithms draw the same augmentations whatever the sanity check, limits and interval of validation."""
    final = []
    for validation in ({"limit_val_batches": 0},
                       {"limit_val_batches": 2, "val_check_interval": 2, "num_sanity_val_steps": 2}):
        model = tiny_classifier()
        callback = AlgorithmEngineCallback([MixUp(alpha=0.5), CutOut(length=0.25)], seed=1)
        cpu_trainer(max_epochs=2, limit_train_batches=5, callbacks=[callback], **validation).fit(
            model, image_loader(n=128, batch_size=16), image_loader(n=64, batch_size=16))
        final.append(weights_of(model))
    assert_same_weights(*final)


def test_max_time_stops_the_run_and_every_counter_agrees() -> None:
    probe = Probe("BATCH_END", "FIT_END")
    ema = EMA(half_life="4ba")
    callback = AlgorithmEngineCallback([ema, probe])
    trainer = cpu_trainer(max_epochs=None, max_time=timedelta(seconds=1), callbacks=[callback])
    started = time.monotonic()
    trainer.fit(tiny_classifier(), image_loader(n=64, batch_size=16))
    assert time.monotonic() - started < 60
    steps = trainer.global_step
    assert steps > 0 and callback.state.max_duration is None
    assert probe.steps("BATCH_END") == [(step, step) for step in range(1, steps + 1)]
    assert callback.state.timestamp.batch == steps and ema.num_updates == steps
    assert callback.traces.stats["Probe/BATCH_END"].count == steps
    assert callback.traces.stats["Probe/BATCH_END"].last_step == steps
    assert probe.count("FIT_END") == 1


def test_early_stopping_ends_the_run_and_fit_end_fires_once() -> None:
    probe = Probe("BATCH_END", "EPOCH_END", "FIT_END")
    ema = EMA(half_life="2ba")
    stopper = EarlyStopping(monitor="val/loss", stopping_threshold=1e6)  # met at the first validation
    callback = AlgorithmEngineCallback([ema, probe])
    trainer = cpu_trainer(max_epochs=10, callbacks=[callback, stopper])
    trainer.fit(tiny_classifier(), image_loader(n=64, batch_size=16), image_loader(n=32))
    assert stopper.stopped_epoch == 0 and trainer.global_step == 4
    state = callback.state
    assert (state.timestamp.epoch, state.timestamp.batch) == (1, 4)
    assert probe.steps("BATCH_END") == [(step, step) for step in range(1, 5)]
    assert probe.steps("EPOCH_END") == [(4, 4)]
    assert probe.count("FIT_END") == 1
    assert ema.num_updates == 4


# ----------------------------------------------------------------------------------------------
# checkpoints
# ----------------------------------------------------------------------------------------------
def test_model_checkpoint_every_n_steps_top_k_resumes_exactly_with_validation_on(tmp_path: Path) -> None:
    data = image_dataset(n=64)  # 4 batches of 16: steps 1-4, 5-8, 9-12

    def fit(ckpt: Path | None) -> tuple[Any, EMA, AlgorithmEngineCallback, L.Trainer]:
        ema = EMA(half_life="2ba")
        callback = AlgorithmEngineCallback([LabelSmoothing(0.1), ema])
        saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=2, monitor="step", mode="max",
                                filename="{step}")
        trainer = cpu_trainer(max_epochs=3, num_sanity_val_steps=1, limit_val_batches=1, callbacks=[callback, saver],
                                enable_checkpointing=True)
        model = tiny_classifier()
        trainer.fit(model, ResumableLoader(data, 16), image_loader(n=32), ckpt_path=ckpt)
        return model, ema, callback, trainer

    full_model, full_ema, full_callback, _ = fit(None)
    # Saved at steps 3, 6, 9 and 12; top 2 by step kept.
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["step=12.ckpt", "step=9.ckpt"]
    saved = torch.load(tmp_path / "step=9.ckpt", weights_only=True)
    assert saved["callbacks"]["AlgorithmEngineCallback"]["timestamp"]["batch"] == 9
    model, ema, callback, trainer = fit(tmp_path / "step=9.ckpt")  # mid-epoch 3, after two validations
    assert trainer.global_step == 12 and callback.state.timestamp.batch == 12
    assert_same_weights(weights_of(full_model), weights_of(model))
    assert_same_weights(full_ema.ema_weights, ema.ema_weights)
    assert ema.num_updates == full_ema.num_updates == 12
    for name in ("epoch", "batch", "sample", "batch_in_epoch"):
        assert getattr(callback.state.timestamp, name) == getattr(full_callback.state.timestamp, name), name


# ----------------------------------------------------------------------------------------------
# evaluation with EMA
# ----------------------------------------------------------------------------------------------
def test_several_val_loaders_each_evaluate_the_ema_average() -> None:
    probe = Probe("EVAL_BATCH_END", weights_at=("EVAL_BATCH_START", "BATCH_END"))
    ema = EMA(half_life="2ba")
    callback = AlgorithmEngineCallback([ema, probe])
    model = tiny_classifier()
    val_loaders = [image_loader(n=32, seed=1), image_loader(n=48, seed=2)]  # 2 and 3 batches
    trainer = cpu_trainer(max_epochs=1, callbacks=[callback])
    trainer.fit(model, image_loader(n=64), val_loaders)
    assert probe.count("EVAL_BATCH_END") == 5
    average = ema.ema_weights
    assert average is not None
    assert len(probe.weights["EVAL_BATCH_START"]) == 5
    for seen in probe.weights["EVAL_BATCH_START"]:
        assert_same_weights(seen, average)
    assert_same_weights(weights_of(model), probe.weights["BATCH_END"][-1])  # swapped out after validation
    assert not torch.equal(average["module.fc.weight"], weights_of(model)["module.fc.weight"])
    # Each loader's metrics are those of a plain model holding the average.
    plain = cpu_trainer().validate(with_weights(average), val_loaders)
    for index, metrics in enumerate(plain):
        key = f"val/loss/dataloader_idx_{index}"
        assert trainer.callback_metrics[key].item() == pytest.approx(metrics[key], rel=1e-6), key


def test_validate_test_and_predict_after_fit_use_the_average_and_restore_the_training_weights() -> None:
    ema = EMA(half_life="2ba")
    model = tiny_classifier()
    trainer = cpu_trainer(max_epochs=1, callbacks=[AlgorithmEngineCallback([ema])])
    trainer.fit(model, image_loader(n=64))
    training, average = weights_of(model), ema.ema_weights
    assert average is not None and not torch.equal(average["module.fc.weight"], training["module.fc.weight"])
    data = image_loader(n=32, seed=3)
    validated = trainer.validate(model, data)
    assert_same_weights(weights_of(model), training)
    tested = trainer.test(model, data)
    assert_same_weights(weights_of(model), training)
    predicted = torch.cat(trainer.predict(model, data))
    assert_same_weights(weights_of(model), training)
    assert_same_weights(ema.ema_weights, average)  # evaluation does not move the average

    plain = cpu_trainer()
    reference = with_weights(average)
    assert validated[0]["val/loss"] == pytest.approx(plain.validate(reference, data)[0]["val/loss"], rel=1e-6)
    assert tested[0]["test/acc"] == plain.test(reference, data)[0]["test/acc"]
    assert tested[0]["test/loss"] == pytest.approx(plain.test(reference, data)[0]["test/loss"], rel=1e-6)
    assert torch.equal(predicted, torch.cat(plain.predict(reference, data)))
    assert not torch.allclose(predicted, torch.cat(plain.predict(with_weights(training), data)))


# ----------------------------------------------------------------------------------------------
# schedulers, fitting again
# ----------------------------------------------------------------------------------------------
class LearningRates(L.Callback):
    def __init__(self) -> None:
        self.values: list[float] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self.values.append(trainer.optimizers[0].param_groups[0]["lr"])


def test_lr_schedulers_step_exactly_as_without_the_bridge() -> None:
    schedulers: dict[str, Callable[[torch.optim.Optimizer], Any]] = {
        "StepLR": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
        "OneCycleLR": lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=4),
    }
    sequences: dict[tuple[str, bool], list[float]] = {}
    for name, factory in schedulers.items():
        for bridged in (True, False):
            torch.manual_seed(0)
            model = ComposerClassifier(nn.Sequential(nn.Flatten(), nn.Linear(64, 4)), num_classes=4,
                                       optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), scheduler=factory)
            rates = LearningRates()
            bridge = [AlgorithmEngineCallback([LabelSmoothing(0.1), EMA(half_life="2ba")])] if bridged else []
            trainer = cpu_trainer(max_epochs=2, accumulate_grad_batches=2, callbacks=[rates, *bridge])
            trainer.fit(model, image_loader(n=32, batch_size=8))  # 2 optimizer steps per epoch
            sequences[(name, bridged)] = rates.values
            if bridged:
                assert bridge[0].state.schedulers == [trainer.lr_scheduler_configs[0].scheduler]
        assert sequences[(name, True)] == sequences[(name, False)], name
    # Read once per micro-batch; the scheduler steps once per optimizer step.
    assert sequences[("StepLR", True)] == pytest.approx([0.05, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.025])
    one_cycle = sequences[("OneCycleLR", True)]
    assert one_cycle[0::2] == one_cycle[1::2] and len(set(one_cycle)) == 4


def test_fit_twice_with_more_epochs_continues_the_timestamp_and_the_average() -> None:
    probe = Probe("INIT", "FIT_START", "BATCH_END", weights_at=("BATCH_END",))
    ema = EMA(half_life="2ba")
    callback = AlgorithmEngineCallback([ema, probe])
    trainer = cpu_trainer(max_epochs=1, callbacks=[callback])
    model = tiny_classifier()
    trainer.fit(model, image_loader(n=64))
    assert (callback.state.timestamp.epoch, callback.state.timestamp.batch) == (1, 4)
    trainer.fit_loop.max_epochs = 2
    trainer.fit(model, image_loader(n=64))
    assert trainer.global_step == 8 and trainer.current_epoch == 2
    timestamp = callback.state.timestamp
    assert (timestamp.iteration, timestamp.epoch, timestamp.batch, timestamp.sample) == (2, 2, 8, 128)
    assert probe.steps("BATCH_END") == [(step, step) for step in range(1, 9)]
    assert probe.count("INIT") == 1 and probe.count("FIT_START") == 2
    assert ema.num_updates == 8
    assert_close_weights(ema.ema_weights, ema_reference(probe.weights["BATCH_END"], HALF_LIFE_2BA))
    assert callback.traces.stats["Probe/BATCH_END"].count == 8


# ----------------------------------------------------------------------------------------------
# loggers
# ----------------------------------------------------------------------------------------------
def _csv_metrics(path: Path) -> dict[str, dict[int, float]]:
    metrics: dict[str, dict[int, float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            for column, value in row.items():
                if value not in ("", None) and column not in ("step", "epoch"):
                    metrics.setdefault(column, {})[int(row["step"])] = float(value)
    return metrics


def _tensorboard_metrics(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def _wandb_metrics(save_dir: Path) -> dict[str, dict[int, float]]:
    """History metrics of the offline run, by Lightning step, once wandb has written the run's exit record."""
    (run_file,) = save_dir.glob("wandb/offline-run-*/run-*.wandb")
    records = wandb_run_records(run_file)
    metrics: dict[str, dict[int, float]] = {}
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        step = row.get("trainer/global_step", row.get("_step"))
        for key, value in row.items():
            if isinstance(value, (int, float)):
                metrics.setdefault(key, {})[int(step)] = float(value)
    return metrics


def test_trace_keys_and_counts_reach_the_csv_tensorboard_and_wandb_files(tmp_path: Path) -> None:
    wandb_logger_cls = pytest.importorskip(f"{L.__name__}.loggers").WandbLogger
    pytest.importorskip("wandb")
    import wandb

    csv_logger = CSVLogger(tmp_path, name="csv")
    tb_logger = TensorBoardLogger(tmp_path, name="tb")
    wandb_logger = wandb_logger_cls(project="compat", save_dir=str(tmp_path), offline=True)
    callback = AlgorithmEngineCallback([LabelSmoothing(0.1), EMA(half_life="2ba")])
    trainer = cpu_trainer(max_epochs=2, logger=[csv_logger, tb_logger, wandb_logger], callbacks=[callback])
    try:
        trainer.fit(tiny_classifier(), image_loader(n=64))  # 8 steps
    finally:
        wandb.finish()
    keys = set(callback.traces.stats)
    assert {"LabelSmoothing/BEFORE_LOSS", "EMA/BATCH_END", "EMA/FIT_START"} <= keys
    files = {
        "csv": _csv_metrics(Path(csv_logger.log_dir) / "metrics.csv"),
        "tensorboard": _tensorboard_metrics(Path(tb_logger.log_dir)),
        "wandb": _wandb_metrics(tmp_path),
    }
    for where, metrics in files.items():
        # Each key once, at its first step (summary mode), with value 1; then its total count at the last step.
        for key in keys:
            stats = callback.traces.stats[key]
            assert metrics.get(f"algorithm_traces/{key}") == {stats.first_step: 1.0}, (where, key)
            assert metrics.get(f"algorithm_trace_counts/{key}") == {8: float(stats.count)}, (where, key)
        assert {k for k in metrics if k.startswith("algorithm_trace")} == (
            {f"algorithm_traces/{k}" for k in keys} | {f"algorithm_trace_counts/{k}" for k in keys}), where
    assert callback.traces.stats["LabelSmoothing/BEFORE_LOSS"].count == 8


# ----------------------------------------------------------------------------------------------
# LightningCLI, ModelSummary, profiler
# ----------------------------------------------------------------------------------------------
def _cli_example() -> Any:
    spec = importlib.util.spec_from_file_location("lightning_compat_cli_example", ROOT / "examples" / "cli.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(LIGHTNING_PACKAGE != "lightning", reason="examples/cli.py is written for lightning; "
                    "tests/lightning/test_both_packages.py runs pytorch_lightning's LightningCLI")
def test_lightning_cli_with_the_callback_from_arguments_trains_like_the_same_run_built_in_python(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setattr(sys, "argv", ["cli.py"])  # the arguments below are the whole command line
    monkeypatch.chdir(tmp_path)  # LightningCLI writes its config.yaml to the working directory
    example = _cli_example()
    callbacks = json.dumps([{
        "class_path": "composer_bridge.AlgorithmEngineCallback",
        "init_args": {
            "algorithms": [
                {"class_path": "composer_bridge.algorithms.LabelSmoothing", "init_args": {"smoothing": 0.2}},
                {"class_path": "composer_bridge.algorithms.MixUp", "init_args": {"alpha": 0.3}},
            ],
            "seed": 5,
            "trace_mode": "every_event",
        },
    }])
    cli = example.main([
        "--model.widths=[8]", "--model.blocks_per_stage=1", "--data.batch_size=32",
        "--trainer.max_steps=3", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
        "--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu", "--trainer.devices=1",
        f"--trainer.callbacks={callbacks}",
    ], run=False)
    (bridge,) = [c for c in cli.trainer.callbacks if isinstance(c, AlgorithmEngineCallback)]
    assert bridge.algorithms == [LabelSmoothing(smoothing=0.2), MixUp(alpha=0.3)] and bridge.seed == 5
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 3 and bridge.state.timestamp.batch == 3
    # Both run inside each step, before it ends: while the step counter reads 0, 1 and 2.
    assert sorted(bridge.traces) == [0, 1, 2]
    assert bridge.traces.stats["MixUp/BEFORE_FORWARD"].count == bridge.traces.stats["LabelSmoothing/BEFORE_LOSS"].count == 3

    L.seed_everything(0)  # what LightningCLI(seed_everything_default=0) does before building the model
    model = example.DigitsClassifier(widths=(8,), blocks_per_stage=1)
    python_bridge = AlgorithmEngineCallback([LabelSmoothing(0.2), MixUp(alpha=0.3)], seed=5)
    cpu_trainer(max_steps=3, limit_val_batches=1, callbacks=[python_bridge]).fit(
        model, datamodule=example.DigitsDataModule(batch_size=32))
    assert_same_weights(weights_of(cli.model), weights_of(model))


class SummaryTotals(ModelSummary):
    """Lightning's ModelSummary, keeping the parameter totals it reports."""

    reported: list[int] = []

    @staticmethod
    def summarize(summary_data: Any, total_parameters: int, *args: Any, **kwargs: Any) -> None:
        SummaryTotals.reported.append(total_parameters)


def test_model_summary_reports_the_model_after_surgery_and_the_profiler_times_the_bridge(tmp_path: Path) -> None:
    SimpleProfiler = L.profilers.SimpleProfiler

    SummaryTotals.reported = []
    callback = AlgorithmEngineCallback([SqueezeExcite(latent_channels=4, min_channels=8)])
    profiler = SimpleProfiler(dirpath=tmp_path, filename="profile")
    trainer = cpu_trainer(max_steps=3, enable_model_summary=True, profiler=profiler,
                            callbacks=[callback, SummaryTotals(max_depth=2)])
    model = tiny_classifier()
    before = sum(p.numel() for p in model.parameters())
    trainer.fit(model, image_loader())
    after = sum(p.numel() for p in model.parameters())
    assert after > before, "SqueezeExcite added its layers at INIT"
    assert SummaryTotals.reported == [after]
    durations = profiler.recorded_durations
    assert len(durations[f"[Callback]{callback.state_key}.on_train_batch_end"]) == 3
    assert len(durations[f"[Callback]{callback.state_key}.setup"]) == 1
    assert callback.traces.stats["SqueezeExcite/INIT"].count == 1
