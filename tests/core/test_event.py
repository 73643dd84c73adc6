"""Behaviour of Event, its Ignite-style filters and event lists that users and the bridge rely on."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_bridge.core.event import Event, EventFilter, EventList, event_counter
from composer_bridge.core.state import State
from composer_bridge.core.time import Timestamp

# Composer 0.32.1's events, in its order (composer.core.Event).
COMPOSER_EVENTS = [
    "INIT", "BEFORE_LOAD", "AFTER_LOAD", "FIT_START", "ITERATION_START", "EPOCH_START",
    "BEFORE_DATALOADER", "AFTER_DATALOADER", "BATCH_START", "BEFORE_TRAIN_BATCH", "BEFORE_FORWARD",
    "AFTER_FORWARD", "BEFORE_LOSS", "AFTER_LOSS", "BEFORE_BACKWARD", "AFTER_BACKWARD",
    "AFTER_TRAIN_BATCH", "BATCH_END", "BATCH_CHECKPOINT", "EPOCH_END", "EPOCH_CHECKPOINT",
    "ITERATION_END", "ITERATION_CHECKPOINT", "FIT_END", "EVAL_BEFORE_ALL", "EVAL_START",
    "EVAL_BATCH_START", "EVAL_BEFORE_FORWARD", "EVAL_AFTER_FORWARD", "EVAL_BATCH_END", "EVAL_END",
    "EVAL_AFTER_ALL", "EVAL_STANDALONE_START", "EVAL_STANDALONE_END", "PREDICT_START",
    "PREDICT_BATCH_START", "PREDICT_BEFORE_FORWARD", "PREDICT_AFTER_FORWARD", "PREDICT_BATCH_END",
    "PREDICT_END",
]

# Composer's before/after sets (composer/core/event.py, _BEFORE_EVENTS and _AFTER_EVENTS).
COMPOSER_BEFORE = {
    "BEFORE_LOAD", "FIT_START", "ITERATION_START", "EPOCH_START", "BEFORE_DATALOADER", "BATCH_START",
    "BEFORE_TRAIN_BATCH", "BEFORE_FORWARD", "BEFORE_LOSS", "BEFORE_BACKWARD", "EVAL_BEFORE_ALL",
    "EVAL_START", "EVAL_BATCH_START", "EVAL_BEFORE_FORWARD", "PREDICT_START", "PREDICT_BATCH_START",
    "PREDICT_BEFORE_FORWARD", "EVAL_STANDALONE_START",
}
COMPOSER_AFTER = {
    "AFTER_LOAD", "ITERATION_END", "EPOCH_END", "BATCH_END", "AFTER_DATALOADER", "AFTER_TRAIN_BATCH",
    "AFTER_FORWARD", "AFTER_LOSS", "AFTER_BACKWARD", "EVAL_AFTER_ALL", "EVAL_END", "EVAL_BATCH_END",
    "EVAL_AFTER_FORWARD", "FIT_END", "PREDICT_END", "PREDICT_BATCH_END", "PREDICT_AFTER_FORWARD",
    "EVAL_STANDALONE_END",
}

STEP_EVENTS_BEFORE_INCREMENT = [
    Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_TRAIN_BATCH,
    Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS,
    Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH,
]


def make_state() -> State:
    return State(torch.nn.Linear(1, 1))


# --- members, values, look-up ------------------------------------------------------------------
def test_event_has_composers_forty_members_in_composers_order():
    assert [e.name for e in Event] == COMPOSER_EVENTS
    assert len(Event) == 40


def test_event_value_is_the_lowercase_name_and_events_are_strings():
    for event in Event:
        assert event.value == event.name.lower()
        assert isinstance(event, str)
        assert event == event.name.lower()
        assert str(event) == event.name.lower()


@pytest.mark.parametrize("spelling", ["before_loss", "BEFORE_LOSS", "Before_Loss", " before_loss "])
def test_event_is_looked_up_by_name_or_value_in_any_case(spelling):
    assert Event(spelling) is Event.BEFORE_LOSS


def test_event_is_looked_up_by_member_and_by_subscript():
    assert Event(Event.FIT_END) is Event.FIT_END
    assert Event["FIT_END"] is Event.FIT_END


def test_events_are_usable_as_dict_keys_interchangeably_with_their_values():
    table = {Event.BATCH_END: 1}
    assert table["batch_end"] == 1
    assert hash(Event.BATCH_END) == hash("batch_end")


def test_unknown_event_name_raises_value_error_listing_close_matches():
    with pytest.raises(ValueError) as info:
        Event("batch_ned")
    message = str(info.value)
    assert "'batch_ned'" in message
    assert "BATCH_END" in message
    assert "Did you mean" in message


def test_unknown_event_with_no_close_match_still_says_what_is_accepted():
    with pytest.raises(ValueError, match=r"Unknown event 'zzz'.*BATCH_END"):
        Event("zzz")


def test_event_lookup_from_a_non_string_names_the_value_and_type():
    with pytest.raises(ValueError, match=r"from 3 of type int.*Event\.BATCH_END"):
        Event(3)


# --- before/after pairs, eval, predict ----------------------------------------------------------
def test_before_and_after_events_are_composers():
    assert {e.name for e in Event if e.is_before_event} == COMPOSER_BEFORE
    assert {e.name for e in Event if e.is_after_event} == COMPOSER_AFTER


@pytest.mark.parametrize(
    "event, canonical",
    [
        (Event.BEFORE_LOSS, "loss"),
        (Event.AFTER_LOSS, "loss"),
        (Event.BEFORE_TRAIN_BATCH, "train_batch"),
        (Event.EPOCH_START, "epoch"),
        (Event.EPOCH_END, "epoch"),
        (Event.EVAL_BEFORE_ALL, "eval_all"),
        (Event.EVAL_AFTER_ALL, "eval_all"),
        (Event.EVAL_STANDALONE_END, "eval_standalone"),
        (Event.INIT, "init"),
        (Event.BATCH_CHECKPOINT, "batch_checkpoint"),
    ],
)
def test_canonical_name_is_shared_by_both_halves_of_a_pair(event, canonical):
    assert event.canonical_name == canonical


def test_every_before_event_has_an_after_event_with_the_same_canonical_name():
    # AFTER_TRAIN_BATCH pairs with BEFORE_TRAIN_BATCH, EPOCH_END with EPOCH_START, ...
    after_names = {e.canonical_name for e in Event if e.is_after_event}
    assert all(e.canonical_name in after_names for e in Event if e.is_before_event)


def test_is_eval_and_is_predict_select_the_eval_and_predict_events():
    assert {e.name for e in Event if e.is_eval} == {n for n in COMPOSER_EVENTS if n.startswith("EVAL_")}
    assert {e.name for e in Event if e.is_predict} == {n for n in COMPOSER_EVENTS if n.startswith("PREDICT_")}
    assert not Event.BATCH_END.is_eval and not Event.BATCH_END.is_predict


# --- counters ------------------------------------------------------------------------------------
@pytest.mark.parametrize("event", STEP_EVENTS_BEFORE_INCREMENT)
def test_step_events_before_the_optimizer_step_count_the_step_they_belong_to(event):
    state = make_state()
    state.timestamp = Timestamp(batch=4)  # 4 steps done: these events belong to step 5
    assert event_counter(event, state) == 5


@pytest.mark.parametrize("event", [Event.BATCH_END, Event.BATCH_CHECKPOINT])
def test_step_events_after_the_optimizer_step_count_the_step_just_done(event):
    state = make_state()
    state.timestamp = Timestamp(batch=5)  # the loop advanced timestamp.batch before BATCH_END
    assert event_counter(event, state) == 5


def test_epoch_events_count_epochs_from_one():
    state = make_state()
    state.timestamp = Timestamp(epoch=2)
    assert event_counter(Event.EPOCH_START, state) == 3  # the third epoch starts
    state.timestamp = Timestamp(epoch=3)  # the loop advanced timestamp.epoch before EPOCH_END
    assert event_counter(Event.EPOCH_END, state) == 3
    assert event_counter(Event.EPOCH_CHECKPOINT, state) == 3


def test_iteration_events_count_iterations_from_one():
    state = make_state()
    state.timestamp = Timestamp(iteration=1)
    assert event_counter(Event.ITERATION_START, state) == 2
    assert event_counter(Event.ITERATION_END, state) == 1
    assert event_counter(Event.ITERATION_CHECKPOINT, state) == 1


@pytest.mark.parametrize(
    "event, offset",
    [
        (Event.EVAL_BATCH_START, 1), (Event.EVAL_BEFORE_FORWARD, 1), (Event.EVAL_AFTER_FORWARD, 1),
        (Event.EVAL_BATCH_END, 0), (Event.PREDICT_BATCH_START, 1), (Event.PREDICT_BEFORE_FORWARD, 1),
        (Event.PREDICT_AFTER_FORWARD, 1), (Event.PREDICT_BATCH_END, 0),
    ],
)
def test_eval_and_predict_batch_events_count_batches_of_the_current_evaluation(event, offset):
    state = make_state()
    state.timestamp = Timestamp(batch=100)  # training progress is not what they count
    state.eval_timestamp = Timestamp(batch=2)
    assert event_counter(event, state) == 2 + offset


@pytest.mark.parametrize(
    "event",
    [Event.INIT, Event.FIT_START, Event.FIT_END, Event.EVAL_START, Event.EVAL_END, Event.AFTER_LOAD,
     Event.PREDICT_START, Event.EVAL_STANDALONE_START],
)
def test_other_events_count_their_occurrences(event):
    assert event_counter(event, make_state()) is None


# --- filters -------------------------------------------------------------------------------------
def fire_at_steps(event_filter: EventFilter, steps: range) -> list[int]:
    """Drive the timestamp as the loop does and return the steps at which the BATCH_END filter fires."""
    state = make_state()
    fired = []
    for step in steps:
        state.timestamp = Timestamp(batch=step)
        if event_filter(state):
            fired.append(step)
    return fired


def test_calling_an_event_builds_a_filter_on_it():
    f = Event.BATCH_END(every=10)
    assert isinstance(f, EventFilter)
    assert f.event is Event.BATCH_END
    assert repr(f) == "Event.BATCH_END(every=10)"


def test_every_fires_on_multiples_of_n():
    assert fire_at_steps(Event.BATCH_END(every=3), range(1, 11)) == [3, 6, 9]


def test_once_fires_at_that_count_only():
    assert fire_at_steps(Event.BATCH_END(once=4), range(1, 11)) == [4]


@pytest.mark.parametrize("once", [{2, 5}, [2, 5], (5, 2), frozenset({2, 5})])
def test_once_accepts_a_collection_of_counts(once):
    assert fire_at_steps(Event.BATCH_END(once=once), range(1, 11)) == [2, 5]


def test_before_and_after_bound_the_counter_exclusively():
    assert fire_at_steps(Event.BATCH_END(after=3), range(1, 7)) == [4, 5, 6]
    assert fire_at_steps(Event.BATCH_END(before=3), range(1, 7)) == [1, 2]
    assert fire_at_steps(Event.BATCH_END(after=2, before=6), range(1, 9)) == [3, 4, 5]


def test_every_combines_with_before_and_after():
    assert fire_at_steps(Event.BATCH_END(every=2, after=2, before=9), range(1, 12)) == [4, 6, 8]


def test_event_filter_callable_decides_and_gets_state_and_event():
    seen = []

    def late(state, event):
        seen.append(event)
        return int(state.timestamp.batch) > 7

    assert fire_at_steps(Event.BATCH_END(event_filter=late), range(1, 10)) == [8, 9]
    assert set(seen) == {Event.BATCH_END}
    assert fire_at_steps(Event.BATCH_END(late), range(7, 9)) == [8]  # positional, as Ignite allows


def test_filters_on_events_without_a_counter_count_occurrences():
    state = make_state()
    f = Event.FIT_START(once=2)
    assert [f(state) for _ in range(4)] == [False, True, False, False]
    g = Event.EVAL_START(every=2)
    assert [g(state) for _ in range(6)] == [False, True, False, True, False, True]


def test_filters_on_before_increment_events_count_the_step_they_belong_to():
    state = make_state()
    f = Event.BATCH_START(once=1)
    state.timestamp = Timestamp(batch=0)  # first step: nothing done yet
    assert f(state)
    state.timestamp = Timestamp(batch=1)
    assert not f(state)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({}, "needs one of every=, once="),
        ({"every": 0}, "every=0"),
        ({"every": -2}, "every=-2"),
        ({"every": 2.5}, "every=2.5"),
        ({"every": True}, "every=True"),
        ({"before": -1}, "before=-1"),
        ({"after": "3"}, "after='3'"),
        ({"once": 0}, "once=0"),
        ({"once": []}, "once=[]"),
        ({"once": [1, "2"]}, "once=[1, '2']"),
        ({"once": 1.5}, "once=1.5"),
        ({"every": 2, "once": 3}, "every and once cannot be combined"),
        ({"once": 3, "before": 5}, "cannot be combined"),
        ({"event_filter": lambda s, e: True, "every": 2}, "cannot be combined"),
        ({"event_filter": 3}, "event_filter=3"),
        ({"event_filter": lambda state: True}, "cannot be called as fn(state, event)"),
    ],
)
def test_bad_filter_arguments_raise_value_error_naming_them(kwargs, fragment):
    with pytest.raises(ValueError) as info:
        Event.BATCH_END(**kwargs)
    assert fragment in str(info.value)
    assert "BATCH_END" in str(info.value)


# --- | lists -------------------------------------------------------------------------------------
def test_or_joins_events_and_filters_into_a_list_in_order():
    joined = Event.FIT_START | Event.BATCH_END(every=2) | Event.FIT_END
    assert isinstance(joined, EventList)
    items = list(joined)
    assert items[0] is Event.FIT_START and items[2] is Event.FIT_END
    assert isinstance(items[1], EventFilter) and items[1].every == 2
    assert len(joined) == 3


def test_or_accepts_event_names_on_either_side():
    assert list(Event.BATCH_END | "epoch_end") == [Event.BATCH_END, Event.EPOCH_END]
    assert list("epoch_end" | Event.BATCH_END) == [Event.EPOCH_END, Event.BATCH_END]
    assert repr("fit_start" | Event.FIT_END) == "Event.FIT_START | Event.FIT_END"


def test_or_with_something_else_raises_value_error_naming_it():
    with pytest.raises(ValueError, match=r"Cannot join 3 of type int"):
        Event.BATCH_END | 3
    with pytest.raises(ValueError, match=r"Cannot join None"):
        Event.BATCH_END(every=2) | None


# --- properties ------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    every=st.integers(1, 12),
    after=st.one_of(st.none(), st.integers(0, 40)),
    before=st.one_of(st.none(), st.integers(0, 40)),
    event=st.sampled_from([Event.BATCH_END, Event.BATCH_START, Event.AFTER_LOSS, Event.EPOCH_END]),
)
def test_every_before_after_filters_fire_exactly_where_their_definition_says(every, after, before, event):
    state = make_state()
    f = event(every=every, after=after, before=before)
    unit = "epoch" if event is Event.EPOCH_END else "batch"
    before_increment = event in STEP_EVENTS_BEFORE_INCREMENT
    for count in range(1, 50):
        done = count - 1 if before_increment else count  # what the loop has completed at the event
        state.timestamp = Timestamp(**{unit: done})
        expected = (
            count % every == 0
            and (after is None or count > after)
            and (before is None or count < before)
        )
        assert f(state) == expected, count


@settings(max_examples=60, deadline=None)
@given(
    once=st.one_of(st.integers(1, 30), st.sets(st.integers(1, 30), min_size=1, max_size=5)),
    event=st.sampled_from([Event.BATCH_END, Event.EVAL_BATCH_START, Event.FIT_START]),
)
def test_once_filters_fire_exactly_at_their_counts(once, event):
    state = make_state()
    f = event(once=once)
    wanted = {once} if isinstance(once, int) else once
    fired = set()
    for count in range(1, 35):
        if event is Event.BATCH_END:
            state.timestamp = Timestamp(batch=count)
        elif event is Event.EVAL_BATCH_START:
            state.eval_timestamp = Timestamp(batch=count - 1)
        if f(state):  # FIT_START: the filter counts its own calls
            fired.add(count)
    assert fired == wanted
