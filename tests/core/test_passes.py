"""Behaviour of the algorithm passes: the default ordering rules and user passes given to the Engine."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_bridge.core import Algorithm, Engine, Event, State
from composer_bridge.passes import (
    DEFAULT_PASSES,
    MultipleLossInterpolationWarning,
    set_filo_order,
    sort_low_precision_norms_last,
    sort_selective_backprop_first,
    sort_to_back,
    sort_to_front,
    warn_if_multiple_loss_interpolation,
)


class NoOp(Algorithm):
    def match(self, event, state):
        return True

    def apply(self, event, state, logger):
        return None


def algorithm_class(name: str, **attributes) -> type[Algorithm]:
    return type(name, (NoOp,), attributes)


A, B, C, D = (algorithm_class(n) for n in "ABCD")
# Stand-ins declaring the markers the library's classes declare (checked below).
SelectiveBackprop = algorithm_class("SelectiveBackprop", runs_first=True)
LowPrecisionLayerNorm = algorithm_class("LowPrecisionLayerNorm", runs_last=True)
LowPrecisionGroupNorm = algorithm_class("LowPrecisionGroupNorm", runs_last=True)
MixUp = algorithm_class("MixUp", interpolates_loss=True)
CutMix = algorithm_class("CutMix", interpolates_loss=True)
First = algorithm_class("First", runs_first=True)
Last = algorithm_class("Last", runs_last=True)

POOL = [A, B, C, D, SelectiveBackprop, LowPrecisionLayerNorm, LowPrecisionGroupNorm, MixUp, CutMix, First, Last]


def names(algorithms) -> list[str]:
    return [type(a).__name__ for a in algorithms]


def run_order(engine: Engine, event: Event) -> list[str]:
    return names(engine.order(engine.state.algorithms, event))


def make_engine(*classes, **kwargs) -> Engine:
    return Engine(State(torch.nn.Linear(1, 1), algorithms=[cls() for cls in classes]), **kwargs)


# --- sort_to_front / sort_to_back -----------------------------------------------------------------
@pytest.mark.parametrize("target", [C, "C", (C,), ("D", C)])
def test_sort_to_front_moves_instances_of_a_class_or_name_to_the_front_stably(target):
    algorithms = [A(), C(), B(), C(), D()]
    result = sort_to_front(algorithms, target)
    expected = ["C", "C", "A", "B", "D"] if target != ("D", C) else ["C", "C", "D", "A", "B"]
    assert names(result) == expected
    assert result[0] is algorithms[1] and result[1] is algorithms[3]


@pytest.mark.parametrize("target", [A, "A"])
def test_sort_to_back_moves_instances_to_the_back_stably(target):
    algorithms = [A(), B(), A(), C()]
    result = sort_to_back(algorithms, target)
    assert names(result) == ["B", "C", "A", "A"]
    assert result[2] is algorithms[0] and result[3] is algorithms[2]


def test_sort_to_front_by_class_includes_subclasses():
    class SubA(A):
        pass

    assert names(sort_to_front([B(), SubA()], A)) == ["SubA", "B"]
    assert names(sort_to_front([B(), SubA()], "A")) == ["B", "SubA"]  # a name matches that class only


def test_sort_helpers_return_new_lists_and_leave_the_input_alone():
    algorithms = [A(), B()]
    result = sort_to_back(algorithms, "A")
    assert names(algorithms) == ["A", "B"] and result is not algorithms


# --- LIFO ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("event", list(Event), ids=lambda e: e.name)
def test_default_passes_run_abcd_except_dcba_on_every_after_event(event):
    engine = make_engine(A, B, C, D)
    expected = list("DCBA") if event.is_after_event else list("ABCD")
    assert run_order(engine, event) == expected


def test_lifo_pairs_each_before_event_with_its_after_event():
    engine = make_engine(A, B, C, D)
    for before in (e for e in Event if e.is_before_event):
        after = next(e for e in Event if e.is_after_event and e.canonical_name == before.canonical_name)
        assert run_order(engine, after) == list(reversed(run_order(engine, before))), before


def test_set_filo_order_reverses_only_on_after_events():
    algorithms = [A(), B()]
    assert names(set_filo_order(algorithms, Event.BATCH_END)) == ["B", "A"]
    assert names(set_filo_order(algorithms, Event.AFTER_DATALOADER)) == ["B", "A"]
    assert names(set_filo_order(algorithms, Event.BATCH_START)) == ["A", "B"]
    assert names(set_filo_order(algorithms, Event.BATCH_CHECKPOINT)) == ["A", "B"]


# --- SelectiveBackprop first, low-precision norms last ----------------------------------------------
@pytest.mark.parametrize("event", list(Event), ids=lambda e: e.name)
def test_selective_backprop_runs_first_and_low_precision_norms_last_on_every_event(event):
    engine = make_engine(LowPrecisionLayerNorm, A, SelectiveBackprop, LowPrecisionGroupNorm, B)
    order = run_order(engine, event)
    assert order[0] == "SelectiveBackprop"
    assert set(order[-2:]) == {"LowPrecisionLayerNorm", "LowPrecisionGroupNorm"}


def test_selective_backprop_precedes_augmentations_on_after_dataloader():
    # Composer's pass order leaves SelectiveBackprop last here; it must rank the raw batch first.
    engine = make_engine(SelectiveBackprop, MixUp, A)
    assert run_order(engine, Event.AFTER_DATALOADER) == ["SelectiveBackprop", "A", "MixUp"]


def test_marker_attributes_sort_like_the_named_algorithms():
    engine = make_engine(Last, A, First, B)
    assert run_order(engine, Event.BEFORE_LOSS) == ["First", "A", "B", "Last"]
    assert run_order(engine, Event.AFTER_LOSS) == ["First", "B", "A", "Last"]
    assert names(sort_selective_backprop_first([A(), First()], Event.INIT)) == ["First", "A"]
    assert names(sort_low_precision_norms_last([Last(), A()], Event.INIT)) == ["A", "Last"]


def test_the_default_passes_go_by_markers_which_the_library_algorithms_declare():
    from composer_bridge import algorithms

    assert algorithms.SelectiveBackprop.runs_first
    assert algorithms.LowPrecisionLayerNorm.runs_last and algorithms.LowPrecisionGroupNorm.runs_last
    assert algorithms.MixUp(interpolate_loss=True).interpolates_loss
    assert algorithms.CutMix(interpolate_loss=True).interpolates_loss
    # A class that only borrows the name, without the marker, is not moved.
    named_only = algorithm_class("SelectiveBackprop")
    assert names(sort_selective_backprop_first([A(), named_only()], Event.INIT)) == ["A", "SelectiveBackprop"]


# --- loss interpolation warning ---------------------------------------------------------------------
def test_more_than_one_loss_interpolating_algorithm_warns_naming_them():
    with pytest.warns(MultipleLossInterpolationWarning, match=r"MixUp, CutMix .*Event\.BEFORE_LOSS"):
        result = warn_if_multiple_loss_interpolation([MixUp(), A(), CutMix()], Event.BEFORE_LOSS)
    assert names(result) == ["MixUp", "A", "CutMix"]


def test_one_loss_interpolating_algorithm_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_multiple_loss_interpolation([MixUp(), A()], Event.BEFORE_LOSS)
        make_engine(MixUp, A).run_event(Event.BEFORE_LOSS)


def test_engine_warns_when_several_matched_algorithms_interpolate_the_loss():
    engine = make_engine(MixUp, CutMix)
    with pytest.warns(MultipleLossInterpolationWarning):
        engine.run_event(Event.BEFORE_LOSS)


# --- algorithm_passes: accepted forms ------------------------------------------------------------------
def move_b_first(algorithms, event):
    return sort_to_front(algorithms, "B")


def move_c_first(algorithms, event):
    return sort_to_front(algorithms, "C")


DEFAULTS = "defaults"


@pytest.mark.parametrize(
    "given, expected",
    [
        (move_b_first, [DEFAULTS, move_b_first]),
        ((move_b_first, 0), [move_b_first, DEFAULTS]),
        ([move_b_first, move_c_first], [DEFAULTS, move_b_first, move_c_first]),
        ((move_b_first, move_c_first), [DEFAULTS, move_b_first, move_c_first]),
        ([(move_b_first, 0), move_c_first], [move_b_first, DEFAULTS, move_c_first]),
        # Lists as pairs, as Composer accepts them: [pass, index] is one pass at an index.
        ([move_b_first, 0], [move_b_first, DEFAULTS]),
        ([[move_b_first, 0], [move_c_first, 1]], [move_b_first, move_c_first, DEFAULTS]),
        ([[move_b_first, -1], move_c_first], [DEFAULTS, move_b_first, move_c_first]),
        (None, [DEFAULTS]),
        ([], [DEFAULTS]),
    ],
)
def test_algorithm_passes_accepts_a_pass_a_pass_with_index_or_a_list_of_these(given, expected):
    expanded = [p for item in expected for p in (DEFAULT_PASSES if item == DEFAULTS else [item])]
    assert make_engine(algorithm_passes=given).passes == expanded


def test_user_passes_change_the_order_the_engine_runs():
    engine = make_engine(A, B, C, algorithm_passes=[move_b_first, move_c_first])
    assert run_order(engine, Event.BEFORE_LOSS) == ["C", "B", "A"]


@pytest.mark.parametrize(
    "bad",
    ["sort_to_front", 3, [3], [move_b_first, "x"], (move_b_first, "0"), (move_b_first, True), {move_b_first: 0}],
    ids=repr,
)
def test_algorithm_passes_rejects_anything_else_saying_what_is_accepted(bad):
    with pytest.raises(ValueError) as info:
        make_engine(algorithm_passes=bad)
    message = str(info.value)
    assert "algorithm_passes got" in message
    assert "a (pass, index) pair (tuple or list), or a list of these" in message


def test_user_passes_see_every_event_even_when_no_algorithm_matched():
    seen = []

    def record(algorithms, event):
        seen.append((event, names(algorithms)))
        return list(algorithms)

    engine = Engine(State(torch.nn.Linear(1, 1)), algorithm_passes=record)  # no algorithm at all
    assert engine.run_event(Event.FIT_START) == {}
    assert seen == [(Event.FIT_START, [])]
    engine.state.algorithms = [algorithm_class("OnlyAtInit", match=lambda self, event, state: event == Event.INIT)()]
    engine.run_event(Event.BATCH_END)  # OnlyAtInit does not match: the pass still sees the event
    engine.run_event(Event.INIT)
    assert seen[1:] == [(Event.BATCH_END, []), (Event.INIT, ["OnlyAtInit"])]
    engine.run_event(Event.BATCH_END)  # passes are pure: asked once per event and matched set, then cached
    assert len(seen) == 3


@pytest.mark.parametrize("bad", [[move_b_first], "x", None])
def test_register_pass_takes_exactly_one_pass(bad):
    engine = make_engine()
    with pytest.raises(ValueError, match=r"register_pass\(.*expected one pass"):
        engine.register_pass(bad)
    with pytest.raises(ValueError, match=r"int index"):
        engine.register_pass(move_b_first, index="0")
    assert engine.passes == list(DEFAULT_PASSES)


# --- a pass that breaks the rules ----------------------------------------------------------------------
def test_a_pass_returning_a_non_list_is_a_clear_type_error():
    def as_tuple(algorithms, event):
        return tuple(algorithms)

    engine = make_engine(A, B, algorithm_passes=as_tuple)
    with pytest.raises(TypeError, match=r"as_tuple returned tuple .*must return a list"):
        engine.run_event(Event.INIT)


@pytest.mark.parametrize(
    "broken",
    [
        lambda algorithms, event: algorithms[:1],  # drops one
        lambda algorithms, event: algorithms + algorithms[:1],  # duplicates one
        lambda algorithms, event: [algorithms[0], algorithms[0]],  # same length, not a permutation
        lambda algorithms, event: [*algorithms[:-1], C()],  # adds a stranger
    ],
)
def test_a_pass_returning_a_non_permutation_is_a_clear_value_error(broken):
    engine = make_engine(A, B, algorithm_passes=broken)
    with pytest.raises(ValueError, match=r"must not add, drop or duplicate"):
        engine.run_event(Event.INIT)


# --- properties -----------------------------------------------------------------------------------------
algorithm_lists = st.lists(st.sampled_from(POOL), max_size=8).map(lambda classes: [cls() for cls in classes])
events = st.sampled_from(list(Event))


@settings(max_examples=150, deadline=None)
@given(algorithms=algorithm_lists, event=events)
def test_every_default_pass_and_the_engine_return_a_permutation_of_their_input(algorithms, event):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MultipleLossInterpolationWarning)
        for algorithm_pass in DEFAULT_PASSES:
            result = algorithm_pass(list(algorithms), event)
            assert isinstance(result, list)
            assert sorted(map(id, result)) == sorted(map(id, algorithms))
        for cls in (A, "SelectiveBackprop", (B, "C")):
            for helper in (sort_to_front, sort_to_back):
                assert sorted(map(id, helper(algorithms, cls))) == sorted(map(id, algorithms))
        ordered = Engine(State(torch.nn.Linear(1, 1))).order(algorithms, event)
        assert sorted(map(id, ordered)) == sorted(map(id, algorithms))


@settings(max_examples=100, deadline=None)
@given(classes=st.lists(st.sampled_from([A, B, C, D, MixUp]), min_size=1, max_size=6, unique=True))
def test_lifo_holds_for_every_after_event(classes):
    engine = make_engine(*classes)
    plain = [cls.__name__ for cls in classes]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MultipleLossInterpolationWarning)
        for event in Event:
            expected = list(reversed(plain)) if event.is_after_event else plain
            assert run_order(engine, event) == expected, event
