"""The engine's markers in Lightning's own profilers: a row and a range per algorithm and event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.support import LIGHTNING_PACKAGE, L, image_loader, quiet_trainer, run_ddp_script, tiny_classifier

from composer_bridge import Algorithm, AlgorithmEngineCallback, Event, State
from composer_bridge.algorithms import EMA, LabelSmoothing
from composer_bridge.lightning.hook_map import HOOK_EVENTS
from composer_bridge.lightning.profiling import markers_for

STEP_EVENTS = (Event.AFTER_DATALOADER, Event.BATCH_START, Event.AFTER_LOSS, Event.AFTER_BACKWARD,
               Event.AFTER_TRAIN_BATCH, Event.BATCH_END)


class Touch(Algorithm):
    """Runs at one event of each kind of Lightning point: a data hook, a callback hook, the training step."""

    def match(self, event: Event, state: State) -> bool:
        return event in STEP_EVENTS

    def apply(self, event: Event, state: State, logger: Any) -> None:
        return None


def algorithms() -> list[Algorithm]:
    return [Touch(), LabelSmoothing(0.1), EMA(half_life="2ba")]


def expected_markers(bridge: AlgorithmEngineCallback, events: tuple[Event, ...] | None = None) -> dict[str, int]:
    """``algorithm/<label>/event/<event>`` → how often it ran, from the bridge's own trace totals."""
    expected = {}
    for key, stats in bridge.traces.stats.items():
        label, event_name = key.split("/")
        event = Event(event_name)
        if events is None or event in events:
            expected[f"algorithm/{label}/event/{event.value}"] = stats.count
    return expected


def test_the_default_profiler_gets_no_markers_and_the_run_no_profiler() -> None:
    bridge = AlgorithmEngineCallback([Touch()])
    quiet_trainer(max_steps=2, callbacks=[bridge]).fit(tiny_classifier(), image_loader(n=32))
    assert bridge.engine.profiler is None  # PassThroughProfiler: nothing installed
    assert markers_for(quiet_trainer(profiler="simple")) is not None


def test_simple_profiler_reports_a_row_per_algorithm_and_event(tmp_path: Path) -> None:
    profiler = L.profilers.SimpleProfiler(dirpath=tmp_path, filename="report")
    bridge = AlgorithmEngineCallback(algorithms())
    trainer = quiet_trainer(max_epochs=2, profiler=profiler, callbacks=[bridge])
    trainer.fit(tiny_classifier(), image_loader(n=48, batch_size=16))  # 3 batches per epoch
    expected = expected_markers(bridge)
    assert {name for name in expected if "/event/after_loss" in name} == {
        "algorithm/Touch/event/after_loss", "algorithm/LabelSmoothing/event/after_loss"}
    recorded = {name: len(durations) for name, durations in profiler.recorded_durations.items()
                if name.startswith("algorithm/")}
    assert recorded == expected  # every algorithm at every event it ran, as often as it ran
    (report,) = tmp_path.glob("*report*.txt")
    text = report.read_text()
    for name in expected:
        assert name in text
    # the dataloader span: one per batch, plus the wait that each epoch's end closes (no batch came)
    assert len(profiler.recorded_durations["event/dataloader"]) == 2 * (3 + 1)
    assert len(profiler.recorded_durations["event/forward"]) == 6  # ComposerModule's forward, per micro-batch


def test_advanced_profiler_reports_the_algorithms_too(tmp_path: Path) -> None:
    profiler = L.profilers.AdvancedProfiler(dirpath=tmp_path, filename="report")
    bridge = AlgorithmEngineCallback([Touch()])
    quiet_trainer(max_steps=2, profiler=profiler, callbacks=[bridge]).fit(tiny_classifier(), image_loader(n=32))
    (report,) = tmp_path.glob("*report*.txt")
    text = report.read_text()
    for name in expected_markers(bridge):
        assert f"Profile stats for: {name}" in text


# Which Lightning range holds the events of each hook the bridge fires them from.
def _lightning_range(hook: str, module: str) -> str:
    if hook in ("on_before_batch_transfer", "on_after_batch_transfer"):
        return f"[LightningModule]{module}.{hook}"
    if hook.startswith("training_step"):
        return "[Strategy]SingleDeviceStrategy.training_step"
    return f"[Callback]AlgorithmEngineCallback.{hook}"


HOOK_OF = {event: hook for hook, events in HOOK_EVENTS.items() if "[marker]" not in hook for event in events
           if hook != "training_step[plain]"}


def _ranges(trace: dict) -> list[tuple[str, float, float]]:
    return [(e["name"].removeprefix("[pl][profile]"), e["ts"], e["ts"] + e["dur"])
            for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("name", "").startswith("[pl][profile]")]


def test_pytorch_profiler_trace_holds_each_algorithm_inside_the_bridges_hook(tmp_path: Path) -> None:
    profiler = L.profilers.PyTorchProfiler(
        dirpath=tmp_path, filename="trace", export_to_chrome=True,
        schedule=torch.profiler.schedule(wait=0, warmup=0, active=100))
    bridge = AlgorithmEngineCallback(algorithms())
    module = tiny_classifier()
    quiet_trainer(max_steps=4, profiler=profiler, callbacks=[bridge]).fit(module, image_loader(n=64))
    (path,) = tmp_path.glob("*.json")
    ranges = _ranges(json.loads(path.read_text()))
    names = {name for name, _, _ in ranges}
    expected = expected_markers(bridge, STEP_EVENTS)
    assert set(expected) <= names, sorted(set(expected) - names)
    for name, start, end in ranges:
        if not name.startswith("algorithm/"):
            continue
        event = Event(name.rsplit("/", 1)[1])
        holder = _lightning_range(HOOK_OF[event], type(module).__name__)
        assert any(other == holder and s <= start and end <= e for other, s, e in ranges), (name, holder)


@pytest.mark.timeout(300)
def test_two_ddp_processes_write_one_trace_each_with_the_algorithms(tmp_path: Path) -> None:
    script = """
import json, torch
from helpers.support import L, image_loader, quiet_trainer, tiny_classifier
from composer_bridge import AlgorithmEngineCallback, Algorithm, Event

class Touch(Algorithm):
    def match(self, event, state):
        return event in (Event.AFTER_DATALOADER, Event.BATCH_END)
    def apply(self, event, state, logger):
        return None

profiler = L.profilers.PyTorchProfiler(dirpath="traces", filename="trace", export_to_chrome=True,
                                       schedule=torch.profiler.schedule(wait=0, warmup=0, active=100))
trainer = quiet_trainer(strategy="ddp", devices=2, max_steps=3, profiler=profiler,
                        callbacks=[AlgorithmEngineCallback([Touch()])])
trainer.fit(tiny_classifier(), image_loader(n=64, batch_size=8))
"""
    result = run_ddp_script(script, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    traces = sorted((tmp_path / "traces").glob("*.json"))
    assert len(traces) == 2, [p.name for p in traces]  # one per rank, named by Lightning
    assert {p.name.split("-")[2] for p in traces} == {"0", "1"}, [p.name for p in traces]  # fit-trace-<rank>-...
    for path in traces:
        names = {name for name, _, _ in _ranges(json.loads(path.read_text()))}
        assert {"algorithm/Touch/event/after_dataloader", "algorithm/Touch/event/batch_end"} <= names, path.name


def test_the_trainers_package_is_the_one_tested() -> None:
    assert L.__name__.split(".")[0] == LIGHTNING_PACKAGE.split(".")[0]
