"""The engine's profiler markers (Composer's names), outside any Trainer."""

from __future__ import annotations

import pytest
import torch

from composer_bridge.core import Algorithm, Callback, Engine, Event, State
from composer_bridge.core.profiler import CostProfiler, RecordingMarker


class Recorder:
    """A profiler of its own: records every start and finish, and refuses a marker used out of pairs."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.asked: list[str] = []

    def marker(self, name: str) -> RecordingMarker:
        self.asked.append(name)
        return StrictMarker(name, self.seen)


class StrictMarker(RecordingMarker):
    __slots__ = ("open",)

    def __init__(self, name: str, seen: list[tuple[str, str]]) -> None:
        super().__init__(name, seen)
        self.open = False

    def start(self) -> None:
        assert not self.open, f"{self.name} started twice"
        self.open = True
        super().start()

    def finish(self) -> None:
        assert self.open, f"{self.name} finished without a start"
        self.open = False
        super().finish()


class At(Algorithm):
    def __init__(self, *events: Event) -> None:
        self.events = events

    def match(self, event, state):
        return event in self.events

    def apply(self, event, state, logger):
        return None


class Noting(Callback):
    def __init__(self) -> None:
        self.events: list[Event] = []

    def run_event(self, event, state, logger):
        self.events.append(event)


def engine_with(*algorithms: Algorithm, callbacks=(), **kwargs) -> Engine:
    return Engine(State(torch.nn.Linear(1, 1), algorithms=list(algorithms), callbacks=list(callbacks)), **kwargs)


def test_an_engine_outside_lightning_records_composers_markers_in_its_own_profiler():
    first, second = At(Event.BEFORE_FORWARD, Event.AFTER_FORWARD), At(Event.AFTER_FORWARD)
    profiler = Recorder()
    engine = engine_with(first, second, callbacks=[Noting()], profiler=profiler)
    engine.run_event(Event.BEFORE_FORWARD)
    engine.run_event(Event.AFTER_FORWARD)
    engine.run_event(Event.BATCH_CHECKPOINT)  # no pair: no span
    assert profiler.seen == [
        ("start", "algorithm/At/event/before_forward"), ("finish", "algorithm/At/event/before_forward"),
        ("start", "callback/Noting/event/before_forward"), ("finish", "callback/Noting/event/before_forward"),
        ("start", "event/forward"),  # the span opens where the before-event's run ends ...
        ("finish", "event/forward"),  # ... and closes where the after-event's starts
        # the after-event runs the algorithms in reverse (the default passes): a second At is At#2
        ("start", "algorithm/At#2/event/after_forward"), ("finish", "algorithm/At#2/event/after_forward"),
        ("start", "algorithm/At/event/after_forward"), ("finish", "algorithm/At/event/after_forward"),
        ("start", "callback/Noting/event/after_forward"), ("finish", "callback/Noting/event/after_forward"),
        ("start", "callback/Noting/event/batch_checkpoint"), ("finish", "callback/Noting/event/batch_checkpoint"),
    ]
    for _ in range(3):
        engine.run_event(Event.AFTER_FORWARD)
    assert len(profiler.asked) == len(set(profiler.asked)), "each marker is asked for once and kept"


def test_run_marker_only_event_closes_a_span_whose_after_event_never_comes():
    profiler = Recorder()
    engine = engine_with(At(Event.AFTER_DATALOADER), profiler=profiler)
    engine.run_event(Event.BEFORE_DATALOADER)  # the wait for a batch begins; none comes (the epoch ended)
    engine.run_marker_only_event(Event.AFTER_DATALOADER)
    assert profiler.seen == [("start", "event/dataloader"), ("finish", "event/dataloader")]
    engine.run_marker_only_event(Event.AFTER_DATALOADER)  # nothing open: nothing to close
    engine.run_marker_only_event(Event.BEFORE_DATALOADER)  # a marker-only before-event opens it ...
    engine.run_event(Event.BEFORE_DATALOADER)  # ... and the event's own run keeps that start
    engine.run_event(Event.AFTER_DATALOADER)
    assert profiler.seen[2:] == [("start", "event/dataloader"), ("finish", "event/dataloader"),
                                 ("start", "algorithm/At/event/after_dataloader"),
                                 ("finish", "algorithm/At/event/after_dataloader")]
    engine.run_marker_only_event("batch_end")  # by name, and an after-event with nothing open


def test_close_finishes_the_open_spans_and_a_failing_apply_finishes_its_marker():
    class Boom(At):
        def apply(self, event, state, logger):
            raise ValueError("boom")

    profiler = Recorder()
    engine = engine_with(Boom(Event.AFTER_LOSS), profiler=profiler, measure_cost=True)
    engine.run_event(Event.BEFORE_LOSS)
    with pytest.raises(Exception, match="boom"):
        engine.run_event(Event.AFTER_LOSS)
    assert profiler.seen[-1] == ("finish", "algorithm/Boom/event/after_loss")
    engine.run_event(Event.BEFORE_LOSS)
    engine.close()
    assert profiler.seen[-1] == ("finish", "event/loss")


def test_without_a_profiler_nothing_is_marked_and_a_profiler_can_be_set_later():
    engine = engine_with(At(Event.BATCH_END))
    engine.run_event(Event.BATCH_END)
    profiler = Recorder()
    engine.profiler = profiler
    engine.run_event(Event.BATCH_END)
    assert profiler.seen == [("start", "algorithm/At/event/batch_end"), ("finish", "algorithm/At/event/batch_end")]
    with pytest.raises(TypeError, match="marker"):
        engine.profiler = object()  # type: ignore[assignment]


def test_the_cost_report_and_the_profiler_time_the_same_applies():
    profiler = Recorder()
    engine = engine_with(At(Event.BATCH_END), profiler=profiler, measure_cost=True)
    for _ in range(3):
        engine.run_event(Event.BATCH_END)
    assert engine.cost["At/BATCH_END"][0] == 3
    assert profiler.seen.count(("start", "algorithm/At/event/batch_end")) == 3
    cost: dict[str, list[float]] = {}
    with CostProfiler(cost).marker("algorithm/At/event/batch_end"):
        pass
    assert cost["At/BATCH_END"][1] >= 0
    with pytest.raises(ValueError, match="algorithms only"):
        CostProfiler(cost).marker("event/forward")
