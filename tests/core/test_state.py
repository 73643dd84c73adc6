"""Behaviour of State: batch access, elapsed duration, stop requests, randomness, algorithm checks."""

from __future__ import annotations

import collections
import dataclasses
import datetime

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from composer_bridge.core import Algorithm, State, Time, Timestamp, TimeUnit

Batch = collections.namedtuple("Batch", "inputs targets")


@dataclasses.dataclass
class ObjectBatch:
    inputs: torch.Tensor
    targets: torch.Tensor


class NoOp(Algorithm):
    def match(self, event, state):
        return False

    def apply(self, event, state, logger):
        return None


def make_state(**kwargs) -> State:
    return State(torch.nn.Linear(2, 1), **kwargs)


# --- construction --------------------------------------------------------------------------------
def test_only_the_model_is_required_and_everything_else_starts_empty():
    state = make_state()
    assert state.optimizers == [] and state.schedulers == [] and state.algorithms == [] and state.callbacks == []
    assert state.batch is None and state.outputs is None and state.loss is None
    assert state.timestamp == Timestamp() and state.eval_timestamp == Timestamp()
    assert state.max_duration is None and state.get_elapsed_duration() is None
    assert state.device == torch.device("cpu") and state.precision == "32-true"
    assert state.rank == 0 and state.world_size == 1 and state.extra == {}
    assert not state.stop_requested


def test_a_single_optimizer_or_algorithm_is_wrapped_in_a_list():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    algorithm = NoOp()
    state = State(model, optimizers=optimizer, algorithms=algorithm)
    assert state.optimizers == [optimizer] and state.algorithms == [algorithm]


def test_max_duration_is_parsed_into_a_time():
    assert make_state(max_duration="10ep").max_duration == Time(10, TimeUnit.EPOCH)
    assert make_state(max_duration=3).max_duration == Time(3, TimeUnit.EPOCH)
    assert make_state(max_duration="2_000ba").max_duration == Time(2000, TimeUnit.BATCH)


def test_max_duration_in_dur_is_rejected_with_the_fix():
    with pytest.raises(ValueError, match=r"max_duration='0.5dur'.*e\.g\. '10ep'"):
        make_state(max_duration="0.5dur")


# --- algorithms are checked ------------------------------------------------------------------------
def test_a_non_algorithm_is_a_type_error_naming_its_index():
    with pytest.raises(TypeError, match=r"algorithms\[1\] = 'MixUp' \(str\) is not an Algorithm"):
        make_state(algorithms=[NoOp(), "MixUp"])


def test_an_algorithm_class_instead_of_an_instance_says_how_to_fix_it():
    with pytest.raises(TypeError, match=r"algorithms\[0\] is the class NoOp, not an instance: write NoOp\(\)"):
        make_state(algorithms=[NoOp])


def test_assigning_algorithms_later_is_checked_too():
    state = make_state()
    with pytest.raises(TypeError, match=r"algorithms\[0\]"):
        state.algorithms = [object()]
    with pytest.raises(TypeError, match=r"must be a list of Algorithm instances, got set"):
        state.algorithms = {NoOp()}
    assert state.algorithms == []


# --- batch access ---------------------------------------------------------------------------------------
def test_tuple_batches_are_rebuilt_not_mutated():
    x, y = torch.zeros(3, 2), torch.zeros(3)
    original = (x, y)
    state = make_state()
    state.batch = original
    new_y = torch.ones(3)
    state.batch_set_item(1, new_y)
    assert type(state.batch) is tuple and state.batch[1] is new_y and state.batch[0] is x
    assert original[1] is y  # the caller's tuple is untouched
    assert state.batch_get_item(1) is new_y
    assert state.batch_get_item(-2) is x


def test_named_tuple_batches_by_index_or_field_name_stay_named_tuples():
    state = make_state()
    original = Batch(torch.zeros(2), torch.zeros(2))
    state.batch = original
    state.batch_set_item(1, torch.ones(2))
    assert isinstance(state.batch, Batch) and state.batch.targets.sum() == 2
    state.batch_set_item("inputs", torch.full((2,), 3.0))
    assert isinstance(state.batch, Batch) and state.batch.inputs.sum() == 6
    assert state.batch_get_item("targets") is state.batch.targets
    assert original.targets.sum() == 0 and original.inputs.sum() == 0


def test_list_and_dict_batches_are_changed_in_place():
    state = make_state()
    items = [1, 2]
    state.batch = items
    state.batch_set_item(0, 10)
    assert state.batch is items and items == [10, 2] and state.batch_get_item(0) == 10
    mapping = {"input": 1, "target": 2}
    state.batch = mapping
    state.batch_set_item("target", 20)
    assert state.batch is mapping and mapping == {"input": 1, "target": 20}
    assert state.batch_get_item("input") == 1


def test_object_batches_by_attribute_name():
    state = make_state()
    state.batch = ObjectBatch(torch.zeros(1), torch.zeros(1))
    state.batch_set_item("targets", torch.ones(1))
    assert state.batch_get_item("targets").item() == 1.0


def test_getter_setter_pairs_reach_anything():
    state = make_state()
    state.batch = {"pair": (1, 2)}
    key = (lambda b: b["pair"][1], lambda b, v: {"pair": (b["pair"][0], v)})
    assert state.batch_get_item(key) == 2
    state.batch_set_item(key, 5)
    assert state.batch == {"pair": (1, 5)}

    in_place = (lambda b: b["pair"], lambda b, v: b.update(pair=v))  # a setter returning None
    state.batch_set_item(in_place, (7, 8))
    assert state.batch == {"pair": (7, 8)}


@pytest.mark.parametrize(
    "batch, key, fragment",
    [
        ((1, 2), 2, "in a tuple of length 2"),
        ([1, 2], 5, "in a list of length 2"),
        ({"input": 1}, "target", "in a dict with keys ['input']"),
        ({"input": 1}, 0, "in a dict with keys ['input']"),
        (Batch(1, 2), "labels", "in a Batch of length 2"),
    ],
)
def test_a_missing_item_is_a_clear_key_error(batch, key, fragment):
    state = make_state()
    state.batch = batch
    for action in (lambda: state.batch_get_item(key), lambda: state.batch_set_item(key, 0)):
        with pytest.raises(KeyError) as info:
            action()
        message = str(info.value)
        assert repr(key) in message and fragment in message
        assert "input_key/target_key" in message


# --- elapsed duration ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "max_duration, timestamp, expected",
    [
        ("10ep", Timestamp(epoch=5), 0.5),
        ("100ba", Timestamp(batch=25), 0.25),
        ("1000sp", Timestamp(sample=100), 0.1),
        ("400tok", Timestamp(token=100), 0.25),
        ("4iter", Timestamp(iteration=1), 0.25),
        ("100ba", Timestamp(batch=250), 1.0),  # never more than the whole run
        ("60sec", Timestamp(total_wct=datetime.timedelta(seconds=15)), 0.25),
    ],
)
def test_elapsed_duration_is_the_fraction_of_max_duration_done(max_duration, timestamp, expected):
    state = make_state(max_duration=max_duration)
    state.timestamp = timestamp
    elapsed = state.get_elapsed_duration()
    assert elapsed.unit == TimeUnit.DURATION
    assert elapsed.value == pytest.approx(expected)


def test_elapsed_duration_in_epochs_counts_steps_when_the_epoch_length_is_known():
    state = make_state(max_duration="2ep", dataloader_len=10)
    state.timestamp = Timestamp(epoch=0, batch=5)
    assert state.get_elapsed_duration().value == pytest.approx(0.25)


def test_elapsed_duration_of_a_zero_length_run_is_complete():
    state = make_state(max_duration="0ba")
    assert state.get_elapsed_duration().value == 1.0


# --- stop --------------------------------------------------------------------------------------------------
def test_stop_training_records_the_request():
    state = make_state()
    state.stop_training()
    assert state.stop_requested


# --- randomness ----------------------------------------------------------------------------------------------
def draw(state: State, key: str = "MixUp") -> torch.Tensor:
    return torch.rand(4, generator=state.generator(key))


def at(state: State, **position) -> State:
    state.timestamp = Timestamp(epoch=position.get("epoch", 0), batch=position.get("batch", 0))
    state.microbatch_index = position.get("microbatch", 0)
    state.eval_timestamp = Timestamp(batch=position.get("eval_batch", 0))
    state.evaluating = position.get("evaluating", False)
    return state


def test_generator_draws_are_a_pure_function_of_seed_key_and_position():
    first = draw(at(make_state(seed=3), epoch=1, batch=7, microbatch=1))
    again = draw(at(make_state(seed=3), epoch=1, batch=7, microbatch=1))
    assert torch.equal(first, again)


def test_generator_returns_to_the_same_draws_when_the_position_comes_back():
    state = make_state(seed=3)
    at(state, batch=2)
    first = draw(state)
    at(state, batch=3)
    draw(state)
    at(state, batch=2)  # e.g. a run resumed at step 2
    assert torch.equal(draw(state), first)


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 4},
        {"rank": 1},
        {"key": "CutMix"},
        {"epoch": 1},
        {"batch": 1},
        {"microbatch": 1},
        {"evaluating": True},
    ],
)
def test_generator_draws_differ_per_seed_rank_key_and_position(change):
    base = draw(at(make_state(seed=3)))
    state = make_state(seed=change.get("seed", 3), rank=change.get("rank", 0))
    position = {k: v for k, v in change.items() if k not in ("seed", "rank", "key")}
    changed = draw(at(state, **position), change.get("key", "MixUp"))
    assert not torch.equal(base, changed)


def test_evaluation_draws_follow_the_eval_batch_and_training_draws_ignore_it():
    assert not torch.equal(
        draw(at(make_state(seed=3), evaluating=True, eval_batch=0)),
        draw(at(make_state(seed=3), evaluating=True, eval_batch=1)),
    )
    # However many evaluation batches ran before, a training step draws the same.
    assert torch.equal(draw(at(make_state(seed=3), batch=5)), draw(at(make_state(seed=3), batch=5, eval_batch=7)))


def test_generators_of_different_keys_are_independent_streams():
    alone = make_state(seed=1)
    mixed = make_state(seed=1)
    draw(mixed, "CutMix")  # another algorithm drawing first changes nothing for MixUp
    assert torch.equal(draw(alone, "MixUp"), draw(mixed, "MixUp"))


def test_repeated_calls_within_one_position_continue_the_stream():
    state = make_state(seed=5)
    first, second = draw(state), draw(state)
    assert not torch.equal(first, second)
    reference = torch.Generator().manual_seed(0)  # what one generator drawing twice gives
    reference.set_state(make_state(seed=5).generator("MixUp").get_state())
    assert torch.equal(torch.rand(4, generator=reference), first)
    assert torch.equal(torch.rand(4, generator=reference), second)


def test_generator_lives_on_the_requested_device():
    assert make_state().generator("X").device == torch.device("cpu")
    assert make_state().generator("X", "cpu").device == torch.device("cpu")


@given(
    st.lists(
        st.one_of(st.tuples(st.integers(0, 64), st.floats(0, 5)), st.just("read"), st.just("epoch")), max_size=20
    )
)
def test_count_batch_gives_the_timestamp_of_one_to_next_batch_per_step(steps):
    """Counting batches and reading the timestamp in any order gives what to_next_batch gives step by step."""
    state = State(torch.nn.Linear(1, 1))
    expected = Timestamp()
    for step in steps:
        if step == "read":
            assert state.timestamp.batch == expected.batch and state.timestamp.sample == expected.sample
        elif step == "epoch":
            state.timestamp = state.timestamp.to_next_epoch()
            expected = expected.to_next_epoch()
        else:
            samples, seconds = step
            state.count_batch(samples, seconds)
            expected = expected.to_next_batch(samples=samples, duration=seconds)
    got, want = state.timestamp.state_dict(), expected.state_dict()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-12), key


def test_assigning_the_timestamp_replaces_batches_counted_but_not_yet_read():
    state = State(torch.nn.Linear(1, 1))
    state.count_batch(8, 0.5)
    state.timestamp = Timestamp(batch=100)  # e.g. restored from a checkpoint: it is the whole progress
    state.count_batch(4, 0.25)
    assert (int(state.timestamp.batch), int(state.timestamp.sample)) == (101, 4)


@pytest.mark.parametrize(
    ("samples", "seconds", "error", "message"),
    [(-1, 0.1, ValueError, r"samples=-1.*int >= 0"), (2.0, 0.1, ValueError, r"samples=2.0"),
     (3, "0.1", TypeError, r"seconds='0.1'.*number"), (3, True, TypeError, r"seconds=True")],
)
def test_count_batch_names_a_bad_value(samples, seconds, error, message):
    state = State(torch.nn.Linear(1, 1))
    with pytest.raises(error, match=message):
        state.count_batch(samples, seconds)
    assert state.timestamp == Timestamp()  # nothing was counted


def test_a_device_without_torch_generators_gets_a_cpu_generator():
    """XLA (like the meta device here) has no torch.Generator: draws come from the CPU, still positional."""
    state = State(torch.nn.Linear(1, 1), seed=3)
    generator = state.generator("MixUp", "meta")
    assert generator.device.type == "cpu"
    first = torch.rand(3, generator=generator)
    assert torch.equal(first, torch.rand(3, generator=State(torch.nn.Linear(1, 1), seed=3).generator("MixUp", "meta")))
