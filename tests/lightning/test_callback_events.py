"""Which events fire when, and how often, in a real lightning.Trainer."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from helpers.support import L, image_loader, quiet_trainer, tiny_classifier

from composer_bridge import Algorithm, AlgorithmEngineCallback, Event, State
from composer_bridge.core.time import TimeUnit


class Recorder(Algorithm):
    """Records every event with the step counter and micro-batch index at that moment."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int]] = []
        self.sanity: list[bool] = []

    def match(self, event: Event, state: State) -> bool:
        return True

    def apply(self, event: Event, state: State, logger: Any) -> None:
        self.seen.append((event.name, int(state.timestamp.batch), state.microbatch_index))
        if event.is_eval:
            self.sanity.append(state.sanity_checking)

    def counts(self) -> Counter:
        return Counter(name for name, _, _ in self.seen)

    def names(self) -> list[str]:
        return [name for name, _, _ in self.seen]


@pytest.mark.parametrize("accumulate", [1, 3])
def test_step_events_fire_once_per_optimizer_step_and_data_events_per_micro_batch(accumulate: int) -> None:
    recorder = Recorder()
    micro_batches, epochs = 6, 2
    trainer = quiet_trainer(max_epochs=epochs, limit_train_batches=micro_batches, accumulate_grad_batches=accumulate,
                            callbacks=[AlgorithmEngineCallback([recorder])])
    trainer.fit(tiny_classifier(), image_loader(n=96))
    counts = recorder.counts()
    steps = epochs * micro_batches // accumulate
    for event in ("BATCH_START", "BEFORE_TRAIN_BATCH", "AFTER_TRAIN_BATCH", "BATCH_END", "BATCH_CHECKPOINT"):
        assert counts[event] == steps, event
    for event in ("BEFORE_DATALOADER", "AFTER_DATALOADER", "BEFORE_FORWARD", "AFTER_FORWARD", "BEFORE_LOSS",
                  "AFTER_LOSS", "BEFORE_BACKWARD", "AFTER_BACKWARD"):
        assert counts[event] == epochs * micro_batches, event
    for event in ("EPOCH_START", "EPOCH_END", "EPOCH_CHECKPOINT"):
        assert counts[event] == epochs
    for event in ("INIT", "FIT_START", "FIT_END", "ITERATION_START", "ITERATION_END"):
        assert counts[event] == 1, event
    assert trainer.callbacks[0].state.timestamp.batch == steps
    assert trainer.global_step == steps
    # micro-batches of a step are numbered 0..k-1, and BATCH_START comes with the first one only
    micro = [m for name, _, m in recorder.seen if name == "BEFORE_FORWARD"]
    assert micro == list(range(accumulate)) * steps


def test_events_of_one_step_come_in_composers_order() -> None:
    recorder = Recorder()
    trainer = quiet_trainer(max_steps=2, accumulate_grad_batches=2, callbacks=[AlgorithmEngineCallback([recorder])])
    trainer.fit(tiny_classifier(), image_loader())
    names = recorder.names()
    first_step = names[names.index("EPOCH_START") + 1 : names.index("BATCH_CHECKPOINT") + 1]
    micro = ["BEFORE_FORWARD", "AFTER_FORWARD", "BEFORE_LOSS", "AFTER_LOSS", "BEFORE_BACKWARD", "AFTER_BACKWARD"]
    assert first_step == [
        "BEFORE_DATALOADER", "AFTER_DATALOADER", "BATCH_START", "BEFORE_TRAIN_BATCH", *micro,
        "BEFORE_DATALOADER", "AFTER_DATALOADER", *micro,
        "AFTER_TRAIN_BATCH", "BATCH_END", "BATCH_CHECKPOINT",
    ]
    assert names[:3] == ["INIT", "FIT_START", "ITERATION_START"]
    assert names[-3:] == ["ITERATION_END", "ITERATION_CHECKPOINT", "FIT_END"]
    # BATCH_END sees the incremented step counter, BATCH_START the one before
    assert [b for n, b, _ in recorder.seen if n == "BATCH_START"] == [0, 1]
    assert [b for n, b, _ in recorder.seen if n == "BATCH_END"] == [1, 2]


def test_sanity_check_fires_eval_events_and_says_so() -> None:
    recorder = Recorder()
    trainer = quiet_trainer(max_steps=1, num_sanity_val_steps=1, limit_val_batches=1, val_check_interval=1,
                            callbacks=[AlgorithmEngineCallback([recorder])])
    trainer.fit(tiny_classifier(), image_loader(), image_loader(n=16))
    names = recorder.names()
    assert names[names.index("FIT_START") + 1] == "EVAL_BEFORE_ALL"
    eval_runs = [s for s in recorder.sanity]
    assert eval_runs[0] is True and eval_runs[-1] is False


def test_validate_test_and_predict_fire_their_events() -> None:
    recorder = Recorder()
    callback = AlgorithmEngineCallback([recorder])
    trainer = quiet_trainer(limit_val_batches=2, limit_test_batches=2, limit_predict_batches=2, callbacks=[callback])
    model = tiny_classifier()
    trainer.validate(model, image_loader())
    assert recorder.names() == [
        "INIT", "EVAL_STANDALONE_START", "EVAL_START",
        *["EVAL_BATCH_START", "EVAL_BEFORE_FORWARD", "EVAL_AFTER_FORWARD", "EVAL_BATCH_END"] * 2,
        "EVAL_END", "EVAL_STANDALONE_END",
    ]
    recorder.seen.clear()
    trainer.test(model, image_loader())
    assert "INIT" not in recorder.names(), "INIT is idempotent across runs on the same model"
    assert recorder.counts()["EVAL_BATCH_END"] == 2
    recorder.seen.clear()
    predictions = trainer.predict(model, image_loader())
    assert len(predictions) == 2
    assert recorder.names() == [
        "PREDICT_START",
        *["PREDICT_BATCH_START", "PREDICT_BEFORE_FORWARD", "PREDICT_AFTER_FORWARD", "PREDICT_BATCH_END"] * 2,
        "PREDICT_END",
    ]


class StateProbe(Algorithm):
    def __init__(self) -> None:
        self.snapshot: dict[str, Any] = {}

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.FIT_START, Event.BATCH_END)

    def apply(self, event: Event, state: State, logger: Any) -> None:
        if event == Event.FIT_START:
            self.snapshot.update(
                model=state.model, optimizers=list(state.optimizers), precision=state.precision,
                device=state.device, seed=state.seed, trainer=state.trainer, max_duration=state.max_duration,
                schedulers=list(state.schedulers), dataloader_len=state.dataloader_len,
            )
        elif int(state.timestamp.batch) == 2:
            self.snapshot["elapsed"] = state.get_elapsed_duration().value
            self.snapshot["samples"] = int(state.timestamp.sample)
            state.stop_training()


def test_state_mirrors_the_trainer_and_stop_training_stops_it() -> None:
    probe = StateProbe()
    L.seed_everything(123)
    trainer = quiet_trainer(max_steps=8, callbacks=[AlgorithmEngineCallback([probe])])
    model = tiny_classifier()
    trainer.fit(model, image_loader(n=64, batch_size=8))
    snap = probe.snapshot
    assert snap["model"] is model
    assert snap["optimizers"] == trainer.optimizers and snap["optimizers"]
    assert snap["precision"] == "32-true"
    assert snap["device"] == torch.device("cpu")
    assert snap["seed"] == 123
    assert snap["trainer"] is trainer
    assert snap["max_duration"].value == 8 and snap["max_duration"].unit == TimeUnit.BATCH
    assert snap["elapsed"] == pytest.approx(2 / 8)
    assert snap["samples"] == 16
    assert trainer.global_step == 2, "stop_training() at step 2 stops the Trainer after that step"


def test_max_duration_in_epochs_and_elapsed_fraction_within_an_epoch() -> None:
    seen: list[float] = []

    class Elapsed(Algorithm):
        def match(self, event: Event, state: State) -> bool:
            return event == Event.BATCH_END

        def apply(self, event: Event, state: State, logger: Any) -> None:
            seen.append(state.get_elapsed_duration().value)

    trainer = quiet_trainer(max_epochs=2, limit_train_batches=4, callbacks=[AlgorithmEngineCallback([Elapsed()])])
    trainer.fit(tiny_classifier(), image_loader())
    assert seen == pytest.approx([i / 8 for i in range(1, 9)])
