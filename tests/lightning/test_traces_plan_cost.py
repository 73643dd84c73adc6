"""plan() shows the orders the run then uses and warns about known conflicts; cost_report() adds up apply time."""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from typing import Any

import pytest
from helpers.support import image_loader, quiet_trainer, tiny_classifier

from composer_bridge import Algorithm, AlgorithmEngineCallback, Event
from composer_bridge.core.passes import DEFAULT_PASSES, sort_to_front
from composer_bridge.training.cost_report import CostRow, cost_report
from composer_bridge.training.plan import make_plan


class Recorder(Algorithm):
    """Runs at ``events`` (names) and counts its own runs per event."""

    def __init__(self, events: tuple[str, ...] = ()) -> None:
        self.events = tuple(events)
        self.calls: Counter[str] = Counter()

    def match(self, event: Event, state) -> bool:
        return event.name in self.events

    def apply(self, event: Event, state, logger) -> None:
        self.calls[event.name] += 1


# Stand-ins named like library algorithms, with the markers those declare: the plan's conflict
# checks go by the capabilities (augments_data, runs_first, interpolates_loss, converts_memory_format,
# averages_weights, required_on_load), never by names.
class MixUp(Recorder):
    augments_data = True


class CutMix(Recorder):
    augments_data = True


class SelectiveBackprop(Recorder):
    runs_first = True


class ChannelsLast(Recorder):
    converts_memory_format = True


class BlurPool(Recorder):
    @classmethod
    def required_on_load(cls) -> bool:
        return True


class EMA(Recorder):
    averages_weights = True


class SWA(Recorder):
    averages_weights = True


class Smoother(Recorder):
    pass


class LateStarter(Recorder):
    """Runs at BATCH_END only in the second half of training."""

    def match(self, event: Event, state) -> bool:
        elapsed = state.get_elapsed_duration()
        return event == Event.BATCH_END and elapsed is not None and elapsed.value >= 0.5

    def apply(self, event: Event, state, logger) -> None:
        super().apply(event, state, logger)
        self.steps = [*getattr(self, "steps", []), int(state.timestamp.batch)]


def _algorithms() -> list[Recorder]:
    return [
        MixUp(("AFTER_DATALOADER", "BEFORE_LOSS")),
        SelectiveBackprop(("AFTER_DATALOADER",)),
        Smoother(("BEFORE_LOSS", "AFTER_LOSS", "BATCH_END", "INIT")),
        ChannelsLast(("INIT",)),
        LateStarter(),
    ]


def _fit(callback: AlgorithmEngineCallback, epochs: int = 2, model: Any = None) -> None:
    trainer = quiet_trainer(max_epochs=epochs, callbacks=[callback])
    trainer.fit(model if model is not None else tiny_classifier(), image_loader(n=32, batch_size=8))  # 4 steps per epoch


def test_plan_lists_the_orders_the_run_then_used(caplog: pytest.LogCaptureFixture) -> None:
    algorithms = _algorithms()
    callback = AlgorithmEngineCallback(algorithms, trace_mode="every_event")
    before = callback.plan()
    assert before.orders[Event.AFTER_DATALOADER] == ["SelectiveBackprop", "MixUp"]
    assert before.orders[Event.BEFORE_LOSS] == ["MixUp", "Smoother"]
    assert before.orders[Event.AFTER_LOSS] == ["Smoother"]
    assert before.orders[Event.INIT] == ["Smoother", "ChannelsLast"]
    assert "BEFORE_LOSS: MixUp, Smoother" in str(before).splitlines()
    with caplog.at_level(logging.DEBUG, logger="composer_bridge"):
        _fit(callback)
    at_fit_start = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Algorithm plan:"))
    # The run knows its length at fit start, so the plan there includes the algorithm that starts half-way.
    assert "BATCH_END: LateStarter, Smoother" in at_fit_start.splitlines()  # *_END events reverse
    assert Event.BATCH_END not in before.orders or "LateStarter" not in before.orders[Event.BATCH_END]
    after = callback.plan()
    assert after.orders[Event.BATCH_END] == ["LateStarter", "Smoother"]

    store = callback.traces
    used: dict[Event, set[str]] = {}
    for step in store:
        for trace in store[step]:
            # Each trace ran at the position the plan gave it, among the algorithms that ran at that event.
            planned = [n for n in after.orders[trace.event] if n in _ran_together(store[step], trace)]
            assert planned[trace.order] == trace.name, (step, trace)
            used.setdefault(trace.event, set()).add(trace.name)
    assert set(used) == set(after.orders)
    assert {e: set(names) for e, names in after.orders.items()} == used
    late_steps = sorted({s for s in store for t in store[s] if t.name == "LateStarter"})
    assert late_steps == algorithms[-1].steps == [4, 5, 6, 7, 8]  # the second half of 8 steps


def _ran_together(step_traces, trace) -> set[str]:
    """Names of the traces of the same run_event as ``trace`` (consecutive traces of one event, orders 0..k)."""
    index = next(i for i, t in enumerate(step_traces) if t is trace)
    start = index - trace.order
    group = [step_traces[start]]
    for t in step_traces[start + 1 :]:
        if t.event != trace.event or t.order != group[-1].order + 1:
            break
        group.append(t)
    return {t.name for t in group}


def test_plan_warns_about_two_algorithms_interpolating_the_loss() -> None:
    assert not make_plan([MixUp(("BEFORE_FORWARD",)), CutMix(("BEFORE_FORWARD",))]).warnings  # markers off

    class MixingMixUp(MixUp):
        interpolates_loss = True

    class MixingCutMix(CutMix):
        interpolates_loss = True

    plan = make_plan([MixingMixUp(("BEFORE_FORWARD",)), MixingCutMix(("BEFORE_FORWARD",))])
    assert len(plan.warnings) == 1 and "MixingMixUp and MixingCutMix all interpolate the loss" in plan.warnings[0]
    assert "WARNING: MixingMixUp and MixingCutMix" in str(plan)
    assert not make_plan([MixingMixUp(("BEFORE_FORWARD",))]).warnings


def test_plan_warns_when_an_augmentation_runs_before_selective_backprop() -> None:
    algorithms = [SelectiveBackprop(("AFTER_DATALOADER",)), MixUp(("AFTER_DATALOADER",))]
    assert not make_plan(algorithms).warnings  # the default passes put SelectiveBackprop first

    def mixup_first(algorithms, event):
        return sort_to_front(algorithms, "MixUp")

    plan = make_plan(algorithms, [*DEFAULT_PASSES, mixup_first])
    assert plan.orders[Event.AFTER_DATALOADER] == ["MixUp", "SelectiveBackprop"]
    assert any("at AFTER_DATALOADER, MixUp runs before SelectiveBackprop" in w for w in plan.warnings)
    # The callback uses its own passes for the plan.
    callback = AlgorithmEngineCallback(algorithms, algorithm_passes=mixup_first)
    assert any("before SelectiveBackprop" in w for w in callback.plan().warnings)
    # An algorithm that does not declare augments_data is not taken for an augmentation.
    class Shuffle(Recorder):
        pass

    def shuffle_first(algorithms, event):
        return sort_to_front(algorithms, "Shuffle")

    plan = make_plan([SelectiveBackprop(("AFTER_DATALOADER",)), Shuffle(("AFTER_DATALOADER",))],
                     [*DEFAULT_PASSES, shuffle_first])
    assert plan.orders[Event.AFTER_DATALOADER] == ["Shuffle", "SelectiveBackprop"] and not plan.warnings


def test_plan_names_each_instance_of_a_repeated_class_by_its_trace_label() -> None:
    first, second = Smoother(("BEFORE_LOSS", "AFTER_LOSS")), Smoother(())
    plan = make_plan([first, second], observed=["Smoother#2/AFTER_LOSS"])
    assert plan.orders == {Event.BEFORE_LOSS: ["Smoother"], Event.AFTER_LOSS: ["Smoother#2", "Smoother"]}


def test_plan_warns_about_surgery_after_channels_last() -> None:
    bad = make_plan([ChannelsLast(("INIT",)), BlurPool(("INIT",))])
    good = make_plan([BlurPool(("INIT",)), ChannelsLast(("INIT",))])
    assert any("BlurPool changes the model after ChannelsLast at INIT" in w for w in bad.warnings)
    assert not good.warnings


def test_plan_warns_about_two_weight_averages_and_reports_pass_warnings_and_unprobeable_match() -> None:
    class Fragile(Recorder):
        def match(self, event, state):
            return state.batch[0] is not None  # no batch outside a running step

    def noisy_pass(algorithms, event):
        if event == Event.EPOCH_END:
            warnings.warn("noisy pass: check me", stacklevel=2)
        return list(algorithms)

    plan = make_plan([EMA(("EPOCH_END",)), SWA(("EPOCH_END",)), Fragile()], [*DEFAULT_PASSES, noisy_pass])
    assert any("EMA and SWA both keep averaged weights" in w for w in plan.warnings)
    assert "at EPOCH_END: noisy pass: check me" in plan.warnings
    assert any("match() raised for Fragile" in n for n in plan.notes)
    assert make_plan([]).orders == {} and "no algorithm" in str(make_plan([]))


def test_cost_report_lists_each_algorithm_that_ran_with_its_calls_and_non_negative_times() -> None:
    algorithms = _algorithms()
    callback = AlgorithmEngineCallback(algorithms)
    _fit(callback, epochs=1)
    report = callback.cost_report()
    rows = {(r.algorithm, r.event): r for r in report.rows}
    for algorithm in algorithms:
        name = type(algorithm).__name__
        for event, calls in algorithm.calls.items():
            assert rows[(name, event)].calls == calls
            assert rows[(name, event)].seconds >= 0 and rows[(name, event)].mean_seconds >= 0
    ran = {type(a).__name__ for a in algorithms if a.calls}
    assert {r.algorithm for r in report.rows} == ran
    assert rows[("Smoother", "(all events)")].calls == sum(algorithms[2].calls.values())
    assert report.train_seconds is not None and report.train_seconds > 0
    text = str(report)
    assert text.splitlines()[0].split() == ["algorithm", "event", "calls", "total", "ms", "mean", "ms", "%", "of", "training"]
    assert all(name in text for name in ran)
    assert report.total_seconds == pytest.approx(sum(r.seconds for r in report.rows if r.event != "(all events)"))


class Evaluator(Recorder):
    pass


def test_cost_calls_add_up_exactly_over_two_fits_with_the_same_callback() -> None:
    """Each fit of one model has its own engine; the callback's cost keeps them all, call for call."""
    algorithms = [*_algorithms(), Evaluator(("EVAL_START",))]
    callback = AlgorithmEngineCallback(algorithms)
    model = tiny_classifier()
    _fit(callback, epochs=2, model=model)
    quiet_trainer(callbacks=[callback]).validate(model, image_loader(n=16, batch_size=8))
    _fit(callback, epochs=1, model=model)
    expected = {
        f"{type(a).__name__}/{event}": calls for a in algorithms for event, calls in a.calls.items()
    }
    assert {key: entry[0] for key, entry in callback.cost.items()} == expected
    assert expected["Smoother/BATCH_END"] == 12 and expected["Evaluator/EVAL_START"] == 1  # 8 + 4 steps; validate


def test_two_instances_of_one_class_keep_their_own_cost_traces_and_report_rows() -> None:
    first, second = Smoother(("BATCH_END",)), Smoother(("BATCH_END", "EPOCH_END"))
    callback = AlgorithmEngineCallback([first, second])
    _fit(callback, epochs=1)
    assert {key: entry[0] for key, entry in callback.cost.items()} == {
        "Smoother/BATCH_END": 4, "Smoother#2/BATCH_END": 4, "Smoother#2/EPOCH_END": 1
    }
    assert callback.traces.stats["Smoother#2/EPOCH_END"].count == 1 and "Smoother/EPOCH_END" not in callback.traces.stats
    report = callback.cost_report()
    assert set(report.by_algorithm()) == {"Smoother", "Smoother#2"}
    assert [(r.algorithm, r.event, r.calls) for r in report.rows if r.algorithm == "Smoother#2"] == [
        ("Smoother#2", "BATCH_END", 4), ("Smoother#2", "EPOCH_END", 1), ("Smoother#2", "(all events)", 5)
    ]
    assert callback.plan().orders[Event.EPOCH_END] == ["Smoother#2"]


def test_cost_report_says_when_measuring_is_off() -> None:
    callback = AlgorithmEngineCallback([Smoother(("BATCH_END",))], measure_cost=False)
    _fit(callback, epochs=1)
    assert callback.cost_report().rows == []
    assert "measure_cost=True" in str(callback.cost_report())


def test_cost_report_table_matches_the_engine_cost_numbers() -> None:
    cost = {"A/BEFORE_LOSS": [4, 0.004], "A/AFTER_LOSS": [4, 0.002], "A/INIT": [1, 0.5], "B/BATCH_END": [3, 0.03]}
    report = cost_report(cost, train_seconds=10.0)
    assert report.rows == [
        CostRow("A", "INIT", 1, 0.5),
        CostRow("A", "BEFORE_LOSS", 4, 0.004),
        CostRow("A", "AFTER_LOSS", 4, 0.002),
        CostRow("A", "(all events)", 9, 0.506),
        CostRow("B", "BATCH_END", 3, 0.03),
    ]
    assert report.by_algorithm() == {"A": pytest.approx(0.506), "B": pytest.approx(0.03)}
    assert "5.06%" in str(report) and "10.000" in str(report)  # A's share; B's mean of 10 ms
    with pytest.raises(ValueError, match=r"cost\['A/INIT'\] = \[1\].*\[calls, seconds\]"):
        cost_report({"A/INIT": [1]})


def test_plan_conflicts_go_by_declared_capabilities_of_the_library_algorithms_not_by_names() -> None:
    from composer_bridge import algorithms

    assert algorithms.ChannelsLast.converts_memory_format
    assert algorithms.EMA.averages_weights and algorithms.SWA.averages_weights
    real = make_plan([algorithms.ChannelsLast(), algorithms.BlurPool(), algorithms.EMA(), algorithms.SWA()])
    assert any("BlurPool changes the model after ChannelsLast at INIT" in w for w in real.warnings)
    assert any("EMA and SWA both keep averaged weights" in w for w in real.warnings)

    # Classes that only borrow the names, without the capabilities, are no conflict.
    named_only = [type(name, (Recorder,), {})(("INIT",)) for name in ("ChannelsLast", "EMA", "SWA")]
    assert not make_plan([named_only[0], BlurPool(("INIT",)), *named_only[1:]]).warnings
