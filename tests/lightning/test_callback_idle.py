"""A bridge with nothing to run stays out of the way (no module hook, no clock read) yet counts steps; listeners are heard."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from helpers.support import L, PlainLinear, image_loader, quiet_trainer, tiny_classifier
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import Algorithm, AlgorithmEngineCallback, Callback, Event, State
from composer_bridge.core.engine import Engine


class Plain(PlainLinear):
    def __init__(self) -> None:
        super().__init__(lr=0.1)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        time.sleep(0.05)  # evaluation that takes visible time


def loader(n: int = 20, batch_size: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)), batch_size=batch_size)


class Record(Algorithm):
    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.AFTER_DATALOADER, Event.BEFORE_BACKWARD, Event.BATCH_END)

    def apply(self, event: Event, state: State, logger: Any) -> None:
        self.seen.append((event.name, int(state.timestamp.batch)))


class Hooks(L.Callback):
    """Reads what the module looks like while the bridge runs (after the bridge's own setup)."""

    def __init__(self) -> None:
        self.instance_hooks: set[str] = set()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.instance_hooks |= {name for name in vars(pl_module) if name.startswith(("on_", "training_step", "backward"))}


def test_an_empty_bridge_hooks_nothing_into_the_module_but_counts_batches_samples_and_epochs() -> None:
    bridge, hooks = AlgorithmEngineCallback([]), Hooks()
    trainer = quiet_trainer(max_epochs=2, accumulate_grad_batches=2, callbacks=[bridge, hooks])
    trainer.fit(Plain(), loader(n=20, batch_size=4))  # 5 micro-batches per epoch: 3 optimizer steps
    assert hooks.instance_hooks == {"on_load_checkpoint"}  # only the checkpoint guard
    timestamp = bridge.state.timestamp
    assert (int(timestamp.epoch), int(timestamp.batch), int(timestamp.sample)) == (2, trainer.global_step, 40)
    assert int(timestamp.batch) == 6


def test_a_handler_added_during_the_run_hears_every_per_step_event_from_the_next_step_on() -> None:
    bridge = AlgorithmEngineCallback([])
    heard: list[tuple[str, int]] = []

    class AddLater(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
            if trainer.global_step == 2 and not heard:
                bridge.engine.add_event_handler(
                    Event.AFTER_DATALOADER | Event.BEFORE_BACKWARD | Event.AFTER_TRAIN_BATCH | Event.BATCH_END,
                    lambda state, event: heard.append((event.name, int(state.timestamp.batch))),
                )

    # The bridge comes first among the callbacks: the handler arrives after its end-of-step check.
    quiet_trainer(max_steps=4, callbacks=[bridge, AddLater()]).fit(Plain(), loader())
    per_step = ["AFTER_DATALOADER", "BEFORE_BACKWARD", "AFTER_TRAIN_BATCH", "BATCH_END"]
    assert [name for name, _ in heard] == per_step * 2  # all of steps 3 and 4
    assert [step for name, step in heard if name == "BATCH_END"] == [3, 4]


def test_an_algorithm_added_in_the_middle_of_an_epoch_is_heard_from_the_next_step_on() -> None:
    """The idle bridge's end-of-step check notices a new algorithm (no epoch or evaluation start in between)."""
    bridge, recorder = AlgorithmEngineCallback([]), Record()

    class AddLater(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
            if trainer.global_step == 2 and not bridge.state.algorithms:
                bridge.state.algorithms = [recorder]

    # This callback comes before the bridge: the algorithm is there for the bridge's check at step 2's end.
    quiet_trainer(max_steps=4, callbacks=[AddLater(), bridge]).fit(Plain(), loader(n=20, batch_size=4))
    assert recorder.seen == [("AFTER_DATALOADER", 2), ("BEFORE_BACKWARD", 2), ("BATCH_END", 3),
                             ("AFTER_DATALOADER", 3), ("BEFORE_BACKWARD", 3), ("BATCH_END", 4)]


def test_algorithms_re_created_from_a_checkpoint_get_the_module_events(tmp_path: Any) -> None:
    """A run that starts with no algorithms but gains one from its checkpoint installs the hooks it needs."""
    from composer_bridge.algorithms import BlurPool

    first = AlgorithmEngineCallback([BlurPool(replace_convs=True, replace_maxpools=False, blur_first=True)])
    trainer = quiet_trainer(max_epochs=1, callbacks=[first], default_root_dir=tmp_path)
    trainer.fit(tiny_classifier(), image_loader(n=16, batch_size=8))
    path = tmp_path / "run.ckpt"
    trainer.save_checkpoint(path)

    recorder = Record()
    second = AlgorithmEngineCallback([], add_missing_on_load=True)

    class AddRecorder(L.Callback):
        def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            second.state.algorithms = [*second.state.algorithms, recorder]

    with pytest.warns(UserWarning, match="Re-created BlurPool"):
        quiet_trainer(max_epochs=2, callbacks=[second, AddRecorder()]).fit(
            tiny_classifier(), image_loader(n=16, batch_size=8), ckpt_path=path
        )
    names = [name for name, _ in recorder.seen]
    assert names == ["AFTER_DATALOADER", "BEFORE_BACKWARD", "BATCH_END"] * 2  # the two steps of epoch 2


class Listen(Callback):
    """An engine callback that changes nothing: the bridge listens (and so keeps the wall-clock)."""

    def run_event(self, event: Event, state: State, logger: Any) -> None:
        pass


def test_batch_wall_clock_leaves_out_evaluation_and_adds_up_to_the_training_time() -> None:
    bridge = AlgorithmEngineCallback([], callbacks=[Listen()])
    trainer = quiet_trainer(max_epochs=1, callbacks=[bridge], val_check_interval=2, limit_val_batches=2)
    started = time.perf_counter()
    trainer.fit(Plain(), loader(n=16), loader(n=8))
    elapsed = time.perf_counter() - started
    timestamp = bridge.state.timestamp
    evaluation = 2 * 2 * 0.05  # two validations of two 50 ms batches
    assert timestamp.total_wct.total_seconds() < elapsed - evaluation + 0.01
    assert timestamp.total_wct.total_seconds() > 0


@pytest.mark.parametrize("bridged", [False, True])
def test_an_idle_bridge_reads_the_wall_clock_as_often_as_lightning_alone(bridged: bool, monkeypatch: Any) -> None:
    """Tests (Lightning's ThroughputMonitor's among them) feed time.perf_counter a fixed list: an idle bridge takes none."""
    reads = {"n": 0}
    perf_counter = time.perf_counter

    def counting() -> float:
        reads["n"] += 1
        return perf_counter()

    def fit(callbacks: list[Any]) -> int:
        reads["n"] = 0
        monkeypatch.setattr(time, "perf_counter", counting)
        try:
            quiet_trainer(max_epochs=2, callbacks=callbacks, val_check_interval=2, limit_val_batches=2).fit(
                Plain(), loader(n=16), loader(n=8)
            )
        finally:
            monkeypatch.setattr(time, "perf_counter", perf_counter)
        return reads["n"]

    alone = fit([])
    bridge = AlgorithmEngineCallback([])
    assert fit([bridge] if bridged else []) == alone
    if bridged:
        assert bridge.state.timestamp.batch.value == 8
        assert bridge.state.timestamp.total_wct.total_seconds() == 0  # documented: an idle bridge keeps no wall-clock


def test_engine_has_listeners_follows_algorithms_callbacks_handlers_and_passes() -> None:
    state = State(torch.nn.Linear(1, 1))
    engine = Engine(state)
    assert not engine.has_listeners()
    handle = engine.add_event_handler(Event.BATCH_END, lambda state, event: None)
    assert engine.has_listeners()
    handle.remove()
    assert not engine.has_listeners()
    # Both ways of removing: a handler on two events is heard until it is gone from both.
    def handler(state: State, event: Event) -> None:
        return None

    engine.add_event_handler(Event.BATCH_END, handler)
    engine.add_event_handler(Event.EPOCH_END, handler)
    engine.remove_event_handler(handler, Event.BATCH_END)
    assert engine.has_listeners()
    engine.remove_event_handler(handler, Event.EPOCH_END)
    assert not engine.has_listeners()
    state.algorithms = [Record()]
    assert engine.has_listeners()
    # A registered pass is asked at every event, as in Composer, even with no algorithm to order.
    seen = []
    passing = Engine(State(torch.nn.Linear(1, 1)))
    passing.register_pass(lambda algorithms, event: seen.append(event) or list(algorithms))
    assert passing.has_listeners()
    passing.run_event(Event.BATCH_END)
    assert seen == [Event.BATCH_END]


PER_STEP_HOOKS = (
    "on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_train_batch_end",
)


def test_lightning_gives_an_idle_bridge_one_hook_per_step_and_every_event_hook_once_something_listens(
    tmp_path: Any,
) -> None:
    """Read from Lightning's own profiler: which of the bridge's hooks did the Trainer call, how often."""
    SimpleProfiler = L.profilers.SimpleProfiler

    bridge = AlgorithmEngineCallback([])

    class AddLater(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
            if trainer.global_step == 2:
                bridge.engine.add_event_handler(Event.BATCH_START, lambda state, event: None)

    profiler = SimpleProfiler(dirpath=tmp_path, filename="profile")
    quiet_trainer(max_steps=5, callbacks=[bridge, AddLater()], profiler=profiler).fit(Plain(), loader())
    calls = {hook: len(profiler.recorded_durations.get(f"[Callback]{bridge.state_key}.{hook}", [])) for hook in PER_STEP_HOOKS}
    assert calls == {
        "on_train_batch_start": 3, "on_after_backward": 3,  # steps 3-5: the bridge listens from step 3 on
        "on_before_zero_grad": 0, "on_before_backward": 0,  # the bridge never needs these
        "on_before_optimizer_step": 3,  # fires AFTER_TRAIN_BATCH: only while listening
        "on_train_batch_end": 5,  # its step bookkeeping
    }
    assert int(bridge.state.timestamp.batch) == 5 and int(bridge.state.timestamp.sample) == 20


def test_a_subclass_keeps_every_per_step_hook_it_overrides() -> None:
    calls: dict[str, int] = dict.fromkeys(PER_STEP_HOOKS, 0)

    class MyBridge(AlgorithmEngineCallback):
        def on_train_batch_start(self, *args: Any) -> None:
            calls["on_train_batch_start"] += 1
            super().on_train_batch_start(*args)

        def on_before_zero_grad(self, *args: Any) -> None:
            calls["on_before_zero_grad"] += 1

        def on_before_backward(self, *args: Any) -> None:
            calls["on_before_backward"] += 1

        def on_after_backward(self, *args: Any) -> None:
            calls["on_after_backward"] += 1
            super().on_after_backward(*args)

    bridge = MyBridge([])
    quiet_trainer(max_steps=4, callbacks=[bridge]).fit(Plain(), loader())
    assert {hook: n for hook, n in calls.items() if n} == {
        "on_train_batch_start": 4, "on_before_zero_grad": 4, "on_before_backward": 4, "on_after_backward": 4,
    }
    assert int(bridge.state.timestamp.batch) == 4


def test_a_handler_added_in_the_middle_of_an_accumulated_step_hears_the_rest_of_it_in_order() -> None:
    """Listening starts during step 2's first micro-batch: no BATCH_START for step 2, nothing counted twice or lost."""
    bridge = AlgorithmEngineCallback([])
    heard: list[tuple[str, int, int]] = []

    class AddInside(Plain):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if batch_idx == 2:  # micro-batches 2 and 3 make optimizer step 2
                bridge.engine.add_event_handler(
                    Event.BATCH_START | Event.AFTER_DATALOADER | Event.AFTER_TRAIN_BATCH | Event.BATCH_END,
                    lambda state, event: heard.append((event.name, int(state.timestamp.batch), state.microbatch_index)),
                )
            return super().training_step(batch, batch_idx)

    trainer = quiet_trainer(max_steps=3, accumulate_grad_batches=2, callbacks=[bridge])
    trainer.fit(AddInside(), loader(n=40, batch_size=4))
    assert heard == [
        ("AFTER_DATALOADER", 1, 1), ("AFTER_TRAIN_BATCH", 1, 1), ("BATCH_END", 2, 0),  # the rest of step 2
        ("AFTER_DATALOADER", 2, 0), ("BATCH_START", 2, 0), ("AFTER_DATALOADER", 2, 1),  # all of step 3 (as Composer)
        ("AFTER_TRAIN_BATCH", 2, 1), ("BATCH_END", 3, 0),
    ]
    assert (int(bridge.state.timestamp.batch), int(bridge.state.timestamp.sample)) == (3, 3 * 2 * 4)
