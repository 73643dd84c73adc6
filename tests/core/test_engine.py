"""Behaviour of the Engine: matching, ordering, traces, callbacks, Ignite-style handlers, close()."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from composer_bridge.core import (
    Algorithm,
    AlgorithmError,
    Callback,
    Engine,
    Event,
    Logger,
    LoggerDestination,
    RemovableEventHandle,
    State,
    Timestamp,
    Trace,
)


class Recorder(Algorithm):
    """Runs at the events it is given and records ``(class name, event)`` into a shared list."""

    def __init__(self, log: list, events=tuple(Event), exit_code=None):
        self.log = log
        self.events = set(events)
        self.exit_code = exit_code

    def match(self, event, state):
        return event in self.events

    def apply(self, event, state, logger):
        self.log.append((type(self).__name__, event))
        return self.exit_code


class A(Recorder):
    pass


class B(Recorder):
    pass


class C(Recorder):
    pass


class D(Recorder):
    pass


class Boom(Algorithm):
    def match(self, event, state):
        return True

    def apply(self, event, state, logger):
        raise KeyError("no such thing")


class CallbackRecorder(Callback):
    def __init__(self, log: list, name: str = "callback"):
        self.log = log
        self.name = name

    def run_event(self, event, state, logger):
        self.log.append((self.name, event))


class TraceSink(LoggerDestination):
    def __init__(self):
        self.traces = []

    def log_traces(self, traces, step=None):
        self.traces.append(dict(traces))


def make_engine(*algorithms, callbacks=(), **kwargs) -> Engine:
    return Engine(State(torch.nn.Linear(1, 1), algorithms=list(algorithms), callbacks=list(callbacks)), **kwargs)


# --- matching, ordering, traces -------------------------------------------------------------------
def test_only_matching_algorithms_apply_and_get_traces():
    log = []
    engine = make_engine(A(log, [Event.BEFORE_LOSS]), B(log, [Event.AFTER_LOSS]))
    traces = engine.run_event(Event.BEFORE_LOSS)
    assert log == [("A", Event.BEFORE_LOSS)]
    assert list(traces) == ["A/BEFORE_LOSS"]
    assert engine.run_event(Event.INIT) == {}


def test_default_passes_run_abcd_on_before_events_and_dcba_on_after_events():
    log = []
    engine = make_engine(A(log), B(log), C(log), D(log))
    engine.run_event(Event.BEFORE_LOSS)
    engine.run_event(Event.AFTER_LOSS)
    assert [name for name, _ in log] == list("ABCD") + list("DCBA")


def test_traces_are_keyed_by_class_and_event_in_run_order_with_their_fields():
    log = []
    engine = make_engine(A(log, exit_code=3), B(log))
    traces = engine.run_event("after_forward")  # names work too
    assert list(traces) == ["B/AFTER_FORWARD", "A/AFTER_FORWARD"]
    assert traces["B/AFTER_FORWARD"] == Trace(name="B", event=Event.AFTER_FORWARD, exit_code=None, order=0, run=True)
    assert traces["A/AFTER_FORWARD"] == Trace("A", Event.AFTER_FORWARD, 3, 1, True)


class Code(Recorder):
    """A class used twice in one run, each instance with its own exit code."""


def test_two_instances_of_one_class_keep_their_own_traces_exit_codes_and_cost():
    log, sink = [], TraceSink()
    first, second = Code(log, exit_code=None), Code(log, exit_code=7)
    engine = make_engine(first, second, A(log), logger=Logger([sink]), measure_cost=True)
    traces = engine.run_event(Event.BATCH_START)
    # The first instance keeps the plain class name (the key it always had); later ones are numbered.
    assert traces == {
        "Code/BATCH_START": Trace("Code", Event.BATCH_START, None, 0, True),
        "Code#2/BATCH_START": Trace("Code#2", Event.BATCH_START, 7, 1, True),
        "A/BATCH_START": Trace("A", Event.BATCH_START, None, 2, True),
    }
    assert sink.traces == [traces]
    # On an after-event the order reverses, but each label stays with its instance.
    after = engine.run_event(Event.AFTER_LOSS)
    assert [(key, t.exit_code, t.order) for key, t in after.items()] == [
        ("A/AFTER_LOSS", None, 0), ("Code#2/AFTER_LOSS", 7, 1), ("Code/AFTER_LOSS", None, 2)
    ]
    engine.run_event(Event.BATCH_START)
    assert {key: calls for key, (calls, _) in engine.cost.items()} == {
        "Code/BATCH_START": 2, "Code#2/BATCH_START": 2, "A/BATCH_START": 2,
        "Code/AFTER_LOSS": 1, "Code#2/AFTER_LOSS": 1, "A/AFTER_LOSS": 1,
    }


def test_an_instance_label_follows_the_run_list_not_which_instances_match():
    log = []
    first, second = Code(log, [Event.INIT]), Code(log, [Event.BATCH_START], exit_code=7)
    engine = make_engine(first, second)
    assert engine.run_event(Event.BATCH_START) == {"Code#2/BATCH_START": Trace("Code#2", Event.BATCH_START, 7, 0, True)}
    assert list(engine.run_event(Event.INIT)) == ["Code/INIT"]
    # A label stays with its instance for the engine's life, even when the list changes.
    engine.state.algorithms = [second, Code(log, [Event.BATCH_START])]
    assert list(engine.run_event(Event.BATCH_START)) == ["Code#2/BATCH_START", "Code#3/BATCH_START"]


def test_traces_are_immutable_so_reused_ones_cannot_be_corrupted():
    traces = make_engine(A([])).run_event(Event.BATCH_END)
    with pytest.raises(AttributeError):
        traces["A/BATCH_END"].order = 5  # type: ignore[misc]


def test_traces_go_to_the_logger_destinations():
    sink = TraceSink()
    engine = make_engine(A([]), B([]), logger=Logger([sink]))
    engine.run_event(Event.BATCH_START)
    engine.run_event(Event.INIT)
    assert [list(t) for t in sink.traces] == [["A/BATCH_START", "B/BATCH_START"], ["A/INIT", "B/INIT"]]


def test_no_traces_are_logged_when_nothing_matches():
    sink = TraceSink()
    engine = make_engine(A([], [Event.INIT]), logger=Logger([sink]))
    engine.run_event(Event.FIT_START)
    assert sink.traces == []


def test_algorithm_passes_given_to_the_engine_run_after_the_default_ones():
    log = []

    def b_first(algorithms, event):
        return sorted(algorithms, key=lambda a: type(a).__name__ != "B")

    engine = make_engine(A(log), B(log), C(log), algorithm_passes=b_first)
    engine.run_event(Event.BEFORE_LOSS)
    engine.run_event(Event.AFTER_LOSS)  # reversed by LIFO first, then B moved to the front
    assert [name for name, _ in log] == ["B", "A", "C", "B", "C", "A"]
    assert engine.passes[-1] is b_first


def test_register_pass_at_an_index_and_order_reports_the_result():
    engine = make_engine()
    a, b = A([]), B([])

    def reverse(algorithms, event):
        return list(reversed(algorithms))

    engine.register_pass(reverse, index=0)  # before the LIFO pass: reverse twice on after-events
    assert engine.passes[0] is reverse
    assert engine.order([a, b], Event.BEFORE_LOSS) == [b, a]
    assert engine.order([a, b], "after_loss") == [a, b]


def test_order_is_computed_once_per_event_and_algorithm_set_and_a_new_pass_invalidates_it():
    calls = []

    def counting(algorithms, event):
        calls.append(event)
        return list(algorithms)

    log = []
    engine = make_engine(A(log), B(log), algorithm_passes=counting)
    for _ in range(3):
        engine.run_event(Event.BEFORE_LOSS)
        engine.run_event(Event.AFTER_LOSS)
    assert calls == [Event.BEFORE_LOSS, Event.AFTER_LOSS]

    log.clear()
    engine.register_pass(lambda algorithms, event: list(reversed(algorithms)))
    engine.run_event(Event.BEFORE_LOSS)
    assert [name for name, _ in log] == ["B", "A"]
    assert calls == [Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_LOSS]


def test_a_different_matched_set_gets_its_own_order():
    log = []
    a, b, c = A(log, [Event.BEFORE_LOSS]), B(log), C(log)
    engine = make_engine(a, b, c, algorithm_passes=lambda algs, event: list(reversed(algs)))
    engine.run_event(Event.BEFORE_LOSS)
    engine.run_event(Event.BEFORE_FORWARD)
    assert [name for name, _ in log] == ["C", "B", "A", "C", "B"]


# --- state.algorithms and state.callbacks are read at each event ----------------------------------
def test_algorithms_and_callbacks_are_read_from_state_at_each_event():
    log = []
    engine = make_engine(A(log))
    engine.run_event(Event.BATCH_START)
    engine.state.algorithms.append(B(log))
    engine.state.callbacks = [CallbackRecorder(log)]
    engine.run_event(Event.BATCH_START)
    engine.state.algorithms = []
    engine.state.callbacks = []
    engine.run_event(Event.BATCH_START)
    assert log == [("A", Event.BATCH_START), ("A", Event.BATCH_START), ("B", Event.BATCH_START),
                   ("callback", Event.BATCH_START)]


def test_replacing_an_algorithm_by_an_equal_one_runs_the_new_one():
    log_old, log_new = [], []
    engine = make_engine(A(log_old))
    engine.run_event(Event.BATCH_END)
    engine.state.algorithms = [A(log_new)]
    engine.run_event(Event.BATCH_END)
    assert len(log_old) == 1 and len(log_new) == 1


# --- callbacks and handlers -------------------------------------------------------------------------
def test_callbacks_run_after_algorithms_and_handlers_after_callbacks():
    log = []
    engine = make_engine(A(log), callbacks=[CallbackRecorder(log, "cb1"), CallbackRecorder(log, "cb2")])
    engine.add_event_handler(Event.BATCH_END, lambda state, event: log.append(("handler", event)))
    engine.run_event(Event.BATCH_END)
    assert [name for name, _ in log] == ["A", "cb1", "cb2", "handler"]


def test_engine_callbacks_dispatch_to_the_method_named_after_the_event():
    class Steps(Callback):
        def __init__(self):
            self.steps = 0

        def batch_end(self, state, logger):
            self.steps += 1

    steps = Steps()
    engine = make_engine(callbacks=[steps])
    for event in (Event.BATCH_START, Event.BATCH_END, Event.BATCH_END, Event.EPOCH_END):
        engine.run_event(event)
    assert steps.steps == 2


def test_on_decorator_registers_and_returns_the_handler_with_extra_arguments():
    engine = make_engine()
    seen = []

    @engine.on(Event.EPOCH_END, "tag", scale=2)
    def report(state, event, tag, scale):
        seen.append((event, tag, scale))

    assert callable(report) and report.__name__ == "report"
    engine.run_event(Event.EPOCH_END)
    engine.run_event(Event.EPOCH_START)
    assert seen == [(Event.EPOCH_END, "tag", 2)]


def test_handlers_on_filters_fire_on_the_filtered_counts():
    engine = make_engine()
    fired = []
    engine.on(Event.BATCH_END(every=2))(lambda state, event: fired.append(int(state.timestamp.batch)))
    for step in range(1, 7):
        engine.state.timestamp = Timestamp(batch=step)
        engine.run_event(Event.BATCH_END)
    assert fired == [2, 4, 6]


def test_handlers_on_an_event_list_listen_to_each_and_remove_from_all():
    engine = make_engine()
    seen = []
    handle = engine.add_event_handler(Event.FIT_START | "fit_end" | Event.EVAL_START(once=2),
                                      lambda state, event: seen.append(event.name))
    assert isinstance(handle, RemovableEventHandle)
    for event in (Event.FIT_START, Event.EVAL_START, Event.EVAL_START, Event.FIT_END):
        engine.run_event(event)
    assert seen == ["FIT_START", "EVAL_START", "FIT_END"]
    handle.remove()
    handle.remove()  # twice is harmless
    for event in (Event.FIT_START, Event.EVAL_START, Event.FIT_END):
        engine.run_event(event)
    assert seen == ["FIT_START", "EVAL_START", "FIT_END"]


def test_handle_works_as_a_context_manager():
    engine = make_engine()
    seen = []
    with engine.add_event_handler(Event.INIT, lambda state, event: seen.append(1)):
        engine.run_event(Event.INIT)
    engine.run_event(Event.INIT)
    assert seen == [1]


def test_removing_one_registration_keeps_the_others():
    engine = make_engine()
    seen = []

    def handler(state, event, label):
        seen.append(label)

    first = engine.add_event_handler(Event.INIT, handler, "first")
    engine.add_event_handler(Event.INIT, handler, "second")
    first.remove()
    engine.run_event(Event.INIT)
    assert seen == ["second"]


def test_the_same_filter_registered_twice_counts_independently():
    engine = make_engine()
    seen = []
    every_other = Event.FIT_START(every=2)
    engine.add_event_handler(every_other, lambda state, event: seen.append("a"))
    engine.run_event(Event.FIT_START)
    engine.add_event_handler(every_other, lambda state, event: seen.append("b"))
    engine.run_event(Event.FIT_START)
    engine.run_event(Event.FIT_START)
    assert seen == ["a", "b"]


def test_a_handler_may_remove_itself_while_running_without_skipping_others():
    engine = make_engine()
    seen = []
    handles = {}

    def once(state, event):
        seen.append("once")
        handles["once"].remove()

    handles["once"] = engine.add_event_handler(Event.INIT, once)
    engine.add_event_handler(Event.INIT, lambda state, event: seen.append("always"))
    engine.run_event(Event.INIT)
    engine.run_event(Event.INIT)
    assert seen == ["once", "always", "always"]


def test_has_and_remove_event_handler():
    engine = make_engine()

    def handler(state, event):
        pass

    assert not engine.has_event_handler(handler)
    engine.add_event_handler(Event.BATCH_END | Event.EPOCH_END, handler)
    assert engine.has_event_handler(handler)
    assert engine.has_event_handler(handler, Event.BATCH_END)
    assert engine.has_event_handler(handler, "epoch_end")
    assert not engine.has_event_handler(handler, Event.FIT_END)
    engine.remove_event_handler(handler, Event.BATCH_END)
    assert not engine.has_event_handler(handler, Event.BATCH_END)
    assert engine.has_event_handler(handler, Event.EPOCH_END)
    with pytest.raises(ValueError, match=r"not registered for Event\.BATCH_END"):
        engine.remove_event_handler(handler, Event.BATCH_END)


@pytest.mark.parametrize(
    "handler, args",
    [
        (lambda state: None, ()),
        (lambda: None, ()),
        (lambda state, event, a, b: None, (1,)),
        (lambda state, event: None, (1,)),
    ],
)
def test_handler_with_a_wrong_signature_is_rejected_at_registration(handler, args):
    engine = make_engine()
    with pytest.raises(ValueError, match=r"cannot be called as fn\(state, event"):
        engine.add_event_handler(Event.BATCH_END, handler, *args)
    assert not engine.has_event_handler(handler)


def test_handler_accepting_keyword_arguments_and_varargs_is_accepted():
    engine = make_engine()
    seen = []
    engine.add_event_handler(Event.INIT, lambda *args, **kwargs: seen.append((len(args), kwargs)), flag=True)
    engine.run_event(Event.INIT)
    assert seen == [(2, {"flag": True})]


def test_non_callable_handler_and_bad_events_are_rejected():
    engine = make_engine()
    with pytest.raises(TypeError, match=r"handler must be callable, got 'nope'"):
        engine.add_event_handler(Event.INIT, "nope")
    with pytest.raises(ValueError, match=r"Cannot listen to 3 \(int\)"):
        engine.add_event_handler(3, lambda state, event: None)
    with pytest.raises(ValueError, match=r"Unknown event 'bach_end'.*BATCH_END"):
        engine.on("bach_end")(lambda state, event: None)


# --- errors --------------------------------------------------------------------------------------------
def test_algorithm_error_names_the_algorithm_and_event_and_chains_the_cause():
    sink = TraceSink()
    engine = make_engine(A([]), Boom(), B([]), logger=Logger([sink]))
    with pytest.raises(AlgorithmError) as info:
        engine.run_event(Event.BEFORE_LOSS)
    error = info.value
    assert "Boom failed at Event.BEFORE_LOSS" in str(error)
    assert "KeyError" in str(error) and "no such thing" in str(error)
    assert isinstance(error.__cause__, KeyError)
    assert isinstance(error.algorithm, Boom) and error.event is Event.BEFORE_LOSS
    assert sink.traces == [{"A/BEFORE_LOSS": Trace("A", Event.BEFORE_LOSS, None, 0, True)}]


def test_algorithm_error_names_the_failing_algorithm_when_measuring_cost():
    engine = make_engine(A([]), Boom(), measure_cost=True)
    with pytest.raises(AlgorithmError, match="Boom failed at Event.AFTER_LOSS"):
        engine.run_event(Event.AFTER_LOSS)


def test_engine_needs_a_state():
    with pytest.raises(TypeError, match=r"needs a composer_bridge.State, got Linear"):
        Engine(torch.nn.Linear(1, 1))  # type: ignore[arg-type]


# --- close -----------------------------------------------------------------------------------------------
class Closing(Callback):
    def __init__(self, log, name, fail_close=False, fail_post_close=False):
        self.log, self.name = log, name
        self.fail_close, self.fail_post_close = fail_close, fail_post_close

    def close(self, state, logger):
        self.log.append(("close", self.name))
        if self.fail_close:
            raise OSError(f"{self.name} cannot flush")

    def post_close(self):
        self.log.append(("post_close", self.name))
        if self.fail_post_close:
            raise RuntimeError(f"{self.name} post_close failed")


def test_close_runs_every_close_then_post_close_only_where_close_succeeded(caplog):
    log = []
    callbacks = [Closing(log, "a"), Closing(log, "b", fail_close=True), Closing(log, "c", fail_post_close=True),
                 Closing(log, "d")]
    engine = make_engine(callbacks=callbacks)
    with caplog.at_level(logging.ERROR, logger="composer_bridge.core.engine"):
        engine.close()  # never raises
    assert log == [("close", "a"), ("close", "b"), ("close", "c"), ("close", "d"),
                   ("post_close", "a"), ("post_close", "c"), ("post_close", "d")]
    messages = [r.getMessage() for r in caplog.records]
    assert any("Closing.close()" in m for m in messages)
    assert any("Closing.post_close()" in m for m in messages)
    assert any("b cannot flush" in (r.exc_text or "") for r in caplog.records)
    assert engine.closed


def test_close_twice_does_nothing_and_run_event_after_close_raises():
    log = []
    engine = make_engine(callbacks=[Closing(log, "a")])
    engine.close()
    engine.close()
    assert log == [("close", "a"), ("post_close", "a")]
    with pytest.raises(RuntimeError, match=r"after close\(\).*create a new Engine"):
        engine.run_event(Event.BATCH_END)


# --- markers, cost, independence --------------------------------------------------------------------------
def test_an_event_runs_the_algorithms_then_the_engine_callbacks_then_the_handlers():
    log = []
    engine = make_engine(A(log), callbacks=[CallbackRecorder(log)])
    engine.add_event_handler(Event.AFTER_DATALOADER, lambda state, event: log.append(("handler", event)))
    engine.run_event(Event.AFTER_DATALOADER)
    assert [name for name, _ in log] == ["A", "callback", "handler"]


def test_measure_cost_counts_calls_and_seconds_per_trace_key():
    engine = make_engine(A([]), B([], [Event.BATCH_END]), measure_cost=True)
    for _ in range(3):
        engine.run_event(Event.BATCH_END)
    engine.run_event(Event.BATCH_START)
    assert sorted(engine.cost) == ["A/BATCH_END", "A/BATCH_START", "B/BATCH_END"]
    calls, seconds = engine.cost["A/BATCH_END"]
    assert calls == 3 and 0 <= seconds < 1
    assert engine.cost["A/BATCH_START"][0] == 1
    assert make_engine(A([])).cost == {}  # off by default


class Busy(Algorithm):
    """Takes a known time in apply on a clock the test controls (so a busy machine cannot stretch it)."""

    def __init__(self, clock: list[float], seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds

    def match(self, event, state):
        return event == Event.BATCH_END

    def apply(self, event, state, logger):
        self.clock[0] += self.seconds


def test_measured_cost_stays_an_estimate_of_the_total_after_the_runs_timed_in_full(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])  # the engine's stopwatch reads this clock
    busy = Busy(clock, 0.0002)
    engine = make_engine(busy, measure_cost=True)
    for _ in range(600):  # 64 runs timed in full, then about one in eight, weighted by eight
        engine.run_event(Event.BATCH_END)
    calls, seconds = engine.cost["Busy/BATCH_END"]
    assert calls == 600  # calls are exact
    # The samples are random (one in eight, from the engine's own generator): about 67 of the last
    # 536 runs, so the estimate is off by about 10% (one standard deviation); unweighted samples would
    # give about (64 + 67) / 600 of the total, far outside the bound.
    assert seconds == pytest.approx(600 * 0.0002, rel=0.3)


def test_two_engines_are_independent():
    log = []
    algorithm = A(log)
    first, second = make_engine(algorithm), make_engine(algorithm)
    seen = []
    first.add_event_handler(Event.FIT_START(once=2), lambda state, event: seen.append("first"))
    first.register_pass(lambda algorithms, event: list(algorithms))
    assert len(second.passes) == len(first.passes) - 1
    for _ in range(3):
        second.run_event(Event.FIT_START)
    assert seen == []  # the handler, and its occurrence counter, belong to the first engine only
    first.run_event(Event.FIT_START)
    assert seen == []
    first.run_event(Event.FIT_START)
    assert seen == ["first"]
    first.close()
    second.run_event(Event.FIT_START)  # closing one does not close the other
    assert not second.closed
    assert make_engine().passes == second.passes  # a new engine starts with the defaults only


def test_the_callback_base_class_accepts_every_event_and_keeps_no_state():
    callback = Callback()
    for event in Event:
        callback.run_event(event, None, None)  # a no-op method per event
    assert callback.state_dict() == {}
    callback.load_state_dict({})
    callback.close(None, None)
    callback.post_close()


def test_the_callback_base_class_spells_out_one_method_per_event_for_ides_and_docs():
    import inspect

    # Written in the class body (not installed at import), each with its signature and a docstring.
    event_methods = {name for name in vars(Callback) if name in {e.value for e in Event}}
    assert event_methods == {event.value for event in Event}
    for event in Event:
        method = vars(Callback)[event.value]
        assert list(inspect.signature(method).parameters) == ["self", "state", "logger"]
        assert f"Event.{event.name}" in method.__doc__


class Counted(Algorithm):
    """Counts its own completed apply calls (the independent count), and fails on request."""

    def __init__(self, name: str, fail_on: set[int] = frozenset()) -> None:
        self.name, self.fail_on, self.completed, self.seen = name, fail_on, 0, 0

    def match(self, event, state):
        return True

    def apply(self, event, state, logger):
        self.seen += 1
        if self.seen in self.fail_on:
            raise RuntimeError("boom")
        self.completed += 1


class First(Counted):
    pass


class Second(Counted):
    pass


class Third(Counted):
    pass


def test_measured_calls_equal_the_completed_apply_calls_through_failures_new_passes_and_dicts():
    first, second, third = First("first"), Second("second", fail_on={5, 90}), Third("third")
    engine = make_engine(first, second, third, measure_cost=True)

    def run(times: int) -> None:
        for _ in range(times):
            try:
                engine.run_event(Event.BATCH_END)
            except AlgorithmError:
                pass

    run(70)  # past the runs timed in full, with a failure at the 5th
    engine.register_pass(lambda algorithms, event: list(algorithms))  # forgets the cached plans
    run(50)  # a failure at the 90th
    calls = {key: entry[0] for key, entry in engine.cost.items()}
    assert calls == {"First/BATCH_END": first.completed, "Second/BATCH_END": second.completed,
                     "Third/BATCH_END": third.completed}
    assert second.completed == 118 and sorted([first.completed, third.completed]) == [118, 120]  # one runs before it

    old = engine.cost
    engine.cost = {}  # a new dict: the old one keeps what it had
    run(3)
    assert old["Second/BATCH_END"][0] == 118 and engine.cost["Second/BATCH_END"][0] == 3
    engine.cost.clear()  # a cleared dict starts again from zero
    run(2)
    engine.close()  # closing completes the counts
    assert engine.cost["Third/BATCH_END"][0] == 2
