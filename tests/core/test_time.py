"""Behaviour of Time, TimeUnit and Timestamp that users and the rest of the bridge rely on."""

from __future__ import annotations

import datetime
import io
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from composer_bridge.core.time import (
    FractionalTimeError,
    Time,
    TimeInputError,
    Timestamp,
    TimeUnit,
    TimeUnitMismatchError,
    ensure_time,
)

INTEGER_UNITS = [TimeUnit.EPOCH, TimeUnit.ITERATION, TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN]
FLOAT_UNITS = [TimeUnit.DURATION, TimeUnit.SECOND]


# --- TimeUnit ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, member",
    [
        ("ep", TimeUnit.EPOCH),
        ("iter", TimeUnit.ITERATION),
        ("ba", TimeUnit.BATCH),
        ("sp", TimeUnit.SAMPLE),
        ("tok", TimeUnit.TOKEN),
        ("dur", TimeUnit.DURATION),
        ("sec", TimeUnit.SECOND),
    ],
)
def test_time_unit_is_looked_up_by_its_suffix(value, member):
    assert TimeUnit(value) is member
    assert member == value
    assert str(member) == value


def test_time_unit_accepts_member_names_in_any_case():
    assert TimeUnit("EPOCH") is TimeUnit.EPOCH
    assert TimeUnit("Ba") is TimeUnit.BATCH


def test_unknown_unit_lists_the_known_ones():
    with pytest.raises(ValueError, match="'ep'.*'sec'"):
        Time(1, "fortnight")


# --- construction -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "constructor, unit",
    [
        (Time.from_epoch, TimeUnit.EPOCH),
        (Time.from_iteration, TimeUnit.ITERATION),
        (Time.from_batch, TimeUnit.BATCH),
        (Time.from_sample, TimeUnit.SAMPLE),
        (Time.from_token, TimeUnit.TOKEN),
        (Time.from_duration, TimeUnit.DURATION),
        (Time.from_second, TimeUnit.SECOND),
    ],
)
def test_named_constructors_set_the_unit(constructor, unit):
    t = constructor(3)
    assert t.unit is unit
    assert t.value == 3
    assert t == Time(3, unit.value)


@pytest.mark.parametrize("unit", INTEGER_UNITS)
def test_integer_units_reject_fractions_and_suggest_alternatives(unit):
    with pytest.raises(ValueError) as info:
        Time(1.5, unit)
    message = str(info.value)
    assert "1.5" in message
    assert "whole number" in message
    assert "dur" in message


@pytest.mark.parametrize("unit", INTEGER_UNITS)
def test_integer_units_accept_integral_floats_as_ints(unit):
    t = Time(2.0, unit)
    assert t.value == 2 and isinstance(t.value, int)


@pytest.mark.parametrize("unit", FLOAT_UNITS)
def test_duration_and_seconds_take_floats(unit):
    assert Time(0.25, unit).value == 0.25


@pytest.mark.parametrize("unit", list(TimeUnit))
def test_negative_values_are_rejected(unit):
    with pytest.raises(ValueError, match="negative"):
        Time(-1, unit)


def test_non_numbers_are_rejected():
    with pytest.raises(TypeError):
        Time("3", "ep")
    with pytest.raises(TypeError):
        Time(True, "ep")
    with pytest.raises(ValueError, match="finite"):
        Time(float("nan"), "dur")


def test_zero_dimensional_tensors_are_accepted():
    assert Time(torch.tensor(4), "ba") == Time(4, "ba")


# --- time strings -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("10ep", Time(10, TimeUnit.EPOCH)),
        ("3iter", Time(3, TimeUnit.ITERATION)),
        ("500ba", Time(500, TimeUnit.BATCH)),
        ("512sp", Time(512, TimeUnit.SAMPLE)),
        ("1000tok", Time(1000, TimeUnit.TOKEN)),
        ("0.5dur", Time(0.5, TimeUnit.DURATION)),
        ("1dur", Time(1, TimeUnit.DURATION)),
        ("90sec", Time(90, TimeUnit.SECOND)),
        ("2.5sec", Time(2.5, TimeUnit.SECOND)),
        ("0ep", Time(0, TimeUnit.EPOCH)),
    ],
)
def test_every_unit_parses(text, expected):
    t = Time.from_timestring(text)
    assert t == expected
    assert t.unit is expected.unit


@pytest.mark.parametrize(
    "text, value", [("2_000ba", 2000), ("1_000_000tok", 1_000_000), ("0.000_1dur", 0.0001)]
)
def test_underscores_group_digits(text, value):
    assert Time.from_timestring(text).value == value


@pytest.mark.parametrize(
    "text, seconds",
    [("1h20m", 4800), ("1h20m30s", 4830), ("90s", 90), ("2m", 120), ("1h", 3600), ("1m30s", 90)],
)
def test_hours_minutes_seconds_are_seconds(text, seconds):
    t = Time.from_timestring(text)
    assert t.unit is TimeUnit.SECOND
    assert t == Time(seconds, "sec")


def test_whitespace_is_stripped():
    assert Time.from_timestring("  10ep\n") == Time(10, "ep")


@pytest.mark.parametrize(
    "text",
    ["", "   ", "ep", "10", "10xyz", "1.5ep", "garbage", "-1ep", "1__0ba", "_ep", "10 ep", "1h20", "10ms"],
)
def test_bad_strings_name_themselves_in_the_error(text):
    with pytest.raises(ValueError) as info:
        Time.from_timestring(text)
    assert repr(text) in str(info.value)


def test_bad_string_error_lists_accepted_forms():
    with pytest.raises(ValueError) as info:
        Time.from_timestring("10xyz")
    message = str(info.value)
    for unit in TimeUnit:
        assert f"'{unit.value}'" in message
    assert "1h20m" in message


def test_fractional_whole_unit_string_suggests_alternatives():
    with pytest.raises(ValueError, match=r"'1\.5ep'.*whole numbers.*dur"):
        Time.from_timestring("1.5ep")


def test_str_repr_and_timestring():
    t = Time(10, TimeUnit.EPOCH)
    assert str(t) == "10ep" == t.to_timestring()
    assert repr(t) == "Time(10, TimeUnit.EPOCH)"
    assert eval(repr(t)) == t
    assert eval(repr(Time(0.5, "dur"))) == Time(0.5, "dur")


# --- from_input / ensure_time ---------------------------------------------------------------------
def test_from_input_accepts_times_strings_and_numbers_with_a_default_unit():
    t = Time(3, "ep")
    assert Time.from_input(t) is t
    assert Time.from_input("5ba") == Time(5, "ba")
    assert Time.from_input(7, TimeUnit.SAMPLE) == Time(7, "sp")
    assert Time.from_input(0.5, "dur") == Time(0.5, "dur")
    assert ensure_time("2ep", "ba") == Time(2, "ep")
    assert ensure_time(4, "ba") == Time(4, "ba")


def test_from_input_needs_a_unit_for_bare_numbers():
    with pytest.raises(TypeError, match="default_unit"):
        Time.from_input(3)


@pytest.mark.parametrize("bad", [None, [1], {"ep": 1}, object()])
def test_from_input_rejects_other_types_clearly(bad):
    with pytest.raises(TypeError, match="time string"):
        Time.from_input(bad, "ep")


# --- arithmetic and comparison -----------------------------------------------------------------
def test_arithmetic_within_one_unit():
    a, b = Time(10, "ep"), Time(4, "ep")
    assert a + b == Time(14, "ep")
    assert a - b == Time(6, "ep")
    assert a + 1 == Time(11, "ep") == 1 + a
    assert a * 2 == Time(20, "ep") == 2 * a
    assert a / 2 == Time(5, "ep")
    assert Time(3, "ep") * 0.5 == Time(1, "ep")  # whole units round toward zero
    assert a / Time(20, "ep") == 0.5
    assert isinstance(a / b, float)
    assert Time(1000, "ba") * Time(0.25, "dur") == Time(250, "ba")
    assert Time(0.5, "dur") + "0.25dur" == Time(0.75, "dur")
    assert sum([Time(1, "sp"), Time(2, "sp")]) == Time(3, "sp")


def test_arithmetic_may_pass_through_negative_values_as_in_composer():
    one, two, three = Time(1, "ep"), Time(2, "ep"), Time(3, "ep")
    assert one - two == -one == Time(0, "ep") - 1
    assert (one - two).value == -1 and (one - two).unit == TimeUnit.EPOCH
    assert one - two + three == two  # a negative middle result, a valid end result
    remaining = Time(100, "ba") - Time(130, "ba")  # e.g. max_duration - elapsed, past the end
    assert remaining < 0 and abs(remaining) == Time(30, "ba") and str(remaining) == "-30ba"
    assert -Time(0.25, "dur") * 2 == Time(0, "dur") - 0.5
    assert +one is one
    with pytest.raises(ValueError, match="negative"):  # a Time you construct is still a non-negative amount
        Time(-1, "ep")


def test_remainder_within_one_unit():
    assert Time(7, "ba") % Time(3, "ba") == Time(1, "ba")
    assert Time(3, "ep") % Time(3, "ep") == Time(0, "ep")
    assert Time(7, "ba") % 4 == Time(3, "ba")


def test_comparisons_within_one_unit():
    assert Time(3, "ep") < Time(4, "ep") <= Time(4, "ep")
    assert Time(5, "ba") > Time(4, "ba") >= Time(4, "ba")
    assert Time(3, "ep") == "3ep"
    assert Time(3, "ep") != "4ep"
    assert Time(3, "ep") < "4ep"
    assert Time(3, "ep") == 3
    assert Time(3, "ep") > 2.5
    assert Time(3, "ep") > -1
    assert Time(3, "ep") != "not a time"
    assert max(Time(1, "ba"), Time(9, "ba"), Time(5, "ba")) == Time(9, "ba")


@pytest.mark.parametrize(
    "operation",
    [
        lambda a, b: a + b,
        lambda a, b: a - b,
        lambda a, b: a < b,
        lambda a, b: a <= b,
        lambda a, b: a > b,
        lambda a, b: a >= b,
        lambda a, b: a / b,
        lambda a, b: a % b,
    ],
)
def test_mixing_units_names_both(operation):
    with pytest.raises(ValueError) as info:
        operation(Time(3, "ep"), Time(3, "ba"))
    message = str(info.value)
    assert "'ep'" in message and "'ba'" in message
    # Composer raises RuntimeError here: code written for it catches ours too.
    with pytest.raises(RuntimeError):
        operation(Time(3, "ep"), Time(3, "ba"))
    assert isinstance(info.value, TimeUnitMismatchError)


@pytest.mark.parametrize("bad", [None, [123], 1])
def test_from_input_errors_are_also_composers_runtime_error(bad):
    with pytest.raises(TimeInputError) as info:
        Time.from_input(bad)
    assert isinstance(info.value, TypeError) and isinstance(info.value, RuntimeError)


@pytest.mark.parametrize("text", ["1.1iter", "1.5ep", "2.1ba", "3.2sp", "3.4tok"])
def test_fractions_of_whole_units_are_also_composers_type_error(text):
    with pytest.raises(TypeError, match="whole numbers"):
        Time.from_timestring(text)
    with pytest.raises(ValueError, match="whole number"):
        Time(float(text[:3]), text[3:])
    with pytest.raises(FractionalTimeError):
        Time(float(text[:3]), text[3:])


def test_times_of_different_units_are_unequal_rather_than_an_error():
    assert Time(3, "ep") != Time(3, "ba")
    assert len({Time(3, "ep"), Time(3, "ba"), Time(3, "ep")}) == 2


def test_multiplying_by_a_non_duration_time_is_an_error():
    with pytest.raises(ValueError, match="dur"):
        Time(3, "ep") * Time(2, "ba")
    with pytest.raises(RuntimeError, match="dur"):  # Composer's type for it
        Time(3, "ep") * Time(2, "ba")


def test_hashable_and_usable_as_dict_keys():
    schedule = {Time(1, "ep"): "warm", Time(10, "ep"): "decay"}
    assert schedule[Time.from_timestring("10ep")] == "decay"
    assert hash(Time(2, "ba")) == hash(Time(2, "ba"))


def test_number_conversions():
    assert int(Time(3, "ep")) == 3
    assert float(Time(0.5, "dur")) == 0.5
    assert [0, 1, 2, 3][Time(2, "ba")] == 2
    assert list(range(Time(3, "ep"))) == [0, 1, 2]
    with pytest.raises(TypeError):
        [0, 1][Time(0.5, "dur")]


def test_pickles():
    t = Time(7, "tok")
    assert pickle.loads(pickle.dumps(t)) == t


# --- properties ---------------------------------------------------------------------------------
@st.composite
def times(draw):
    unit = draw(st.sampled_from(INTEGER_UNITS + FLOAT_UNITS))
    if unit.is_integer:
        return Time(draw(st.integers(min_value=0, max_value=10**15)), unit)
    value = draw(
        st.one_of(
            st.floats(min_value=0, allow_nan=False, allow_infinity=False),
            st.integers(min_value=0, max_value=10**15),
        )
    )
    return Time(value, unit)


@given(times())
def test_timestring_round_trips(t):
    parsed = Time.from_timestring(str(t))
    assert parsed == t
    assert parsed.unit is t.unit


@given(st.sampled_from(INTEGER_UNITS), st.integers(0, 10**12), st.integers(0, 10**12))
def test_adding_then_subtracting_is_identity_for_whole_units(unit, a, b):
    ta, tb = Time(a, unit), Time(b, unit)
    assert (ta + tb) - tb == ta


@given(
    st.sampled_from(FLOAT_UNITS),
    st.integers(0, 2**40).map(lambda n: n / 2**10),
    st.integers(0, 2**40).map(lambda n: n / 2**10),
)
def test_adding_then_subtracting_is_identity_for_exact_floats(unit, a, b):
    # Multiples of 1/1024 below 2**30 are exact in binary floating point, so no rounding slack.
    ta, tb = Time(a, unit), Time(b, unit)
    assert (ta + tb) - tb == ta


# --- Timestamp ----------------------------------------------------------------------------------
def test_timestamp_defaults_to_zero():
    ts = Timestamp()
    for unit in INTEGER_UNITS:
        assert ts.get(unit) == Time(0, unit)
    assert ts.total_wct == datetime.timedelta(0)
    assert ts.batch_wct == datetime.timedelta(0)


def test_timestamp_keyword_construction_exposes_times():
    ts = Timestamp(
        iteration=1,
        epoch=2,
        batch=30,
        sample=960,
        token=9600,
        epoch_in_iteration=1,
        batch_in_epoch=5,
        sample_in_epoch=160,
        token_in_epoch=1600,
        total_wct=datetime.timedelta(seconds=12),
        iteration_wct=datetime.timedelta(seconds=6),
        epoch_wct=datetime.timedelta(seconds=3),
        batch_wct=datetime.timedelta(seconds=0.5),
    )
    assert ts.iteration == Time(1, "iter")
    assert ts.epoch == Time(2, "ep")
    assert ts.batch == Time(30, "ba")
    assert ts.sample == Time(960, "sp")
    assert ts.token == Time(9600, "tok")
    assert ts.epoch_in_iteration == Time(1, "ep")
    assert ts.batch_in_epoch == Time(5, "ba")
    assert ts.sample_in_epoch == Time(160, "sp")
    assert ts.token_in_epoch == Time(1600, "tok")
    assert ts.total_wct == datetime.timedelta(seconds=12)
    assert ts.batch_wct == datetime.timedelta(milliseconds=500)
    assert Timestamp(epoch=Time(2, "ep")) == Timestamp(epoch=2)


def test_timestamp_rejects_counts_in_the_wrong_unit():
    with pytest.raises(ValueError, match="'ep'"):
        Timestamp(epoch=Time(2, "ba"))


def test_timestamp_get():
    ts = Timestamp(
        epoch=2, batch=30, sample=960, token=5, iteration=1, total_wct=datetime.timedelta(seconds=9)
    )
    assert ts.get("ep") == Time(2, "ep")
    assert ts.get(TimeUnit.BATCH) == Time(30, "ba")
    assert ts.get("sp") == Time(960, "sp")
    assert ts.get("tok") == Time(5, "tok")
    assert ts.get("iter") == Time(1, "iter")
    assert ts.get("sec") == Time(9.0, "sec")
    with pytest.raises(ValueError, match="max_duration"):
        ts.get(TimeUnit.DURATION)


def test_to_next_batch_counts_the_batch_and_its_data():
    ts = Timestamp(epoch=1, batch=10, batch_in_epoch=2, sample=320, sample_in_epoch=64, token=7)
    nxt = ts.to_next_batch(samples=32, tokens=100, duration=datetime.timedelta(seconds=2))
    assert nxt.batch == Time(11, "ba")
    assert nxt.batch_in_epoch == Time(3, "ba")
    assert nxt.sample == Time(352, "sp")
    assert nxt.sample_in_epoch == Time(96, "sp")
    assert nxt.token == Time(107, "tok")
    assert nxt.token_in_epoch == Time(100, "tok")
    assert nxt.epoch == Time(1, "ep")
    assert (
        nxt.total_wct == nxt.epoch_wct == nxt.iteration_wct == nxt.batch_wct == datetime.timedelta(seconds=2)
    )
    assert ts.batch == Time(10, "ba"), "the original Timestamp is unchanged"


def test_to_next_epoch_resets_per_epoch_counts():
    ts = Timestamp().to_next_batch(samples=8, tokens=80, duration=datetime.timedelta(seconds=1))
    ts = ts.to_next_batch(samples=8, tokens=80, duration=datetime.timedelta(seconds=1))
    nxt = ts.to_next_epoch()
    assert nxt.epoch == Time(1, "ep")
    assert nxt.epoch_in_iteration == Time(1, "ep")
    assert nxt.batch == Time(2, "ba") and nxt.sample == Time(16, "sp") and nxt.token == Time(160, "tok")
    assert nxt.batch_in_epoch == Time(0, "ba")
    assert nxt.sample_in_epoch == Time(0, "sp")
    assert nxt.token_in_epoch == Time(0, "tok")
    assert nxt.epoch_wct == datetime.timedelta(0)
    assert nxt.total_wct == datetime.timedelta(seconds=2)


def test_to_next_iteration_resets_epochs_in_iteration():
    ts = Timestamp().to_next_batch(samples=4).to_next_epoch().to_next_epoch()
    nxt = ts.to_next_iteration()
    assert nxt.iteration == Time(1, "iter")
    assert nxt.epoch == Time(2, "ep")
    assert nxt.epoch_in_iteration == Time(0, "ep")
    assert nxt.batch == Time(1, "ba")


def test_token_in_iteration_counts_tokens_across_epochs_until_the_next_iteration():
    ts = Timestamp().to_next_batch(samples=2, tokens=20)
    assert ts.token_in_iteration == Time(20, "tok")
    ts = ts.to_next_epoch().to_next_batch(samples=2, tokens=5)
    assert (ts.token_in_iteration, ts.token_in_epoch, ts.token) == (Time(25, "tok"), Time(5, "tok"), Time(25, "tok"))
    assert ts.to_next_batches(3, tokens=6).token_in_iteration == Time(31, "tok")
    nxt = ts.to_next_iteration()
    assert nxt.token_in_iteration == Time(0, "tok") and nxt.token == Time(25, "tok")
    # It round-trips through state_dict; a checkpoint written before the field existed loads as 0.
    restored = Timestamp()
    restored.load_state_dict(ts.state_dict())
    assert restored == ts
    old = {k: v for k, v in ts.state_dict().items() if k != "token_in_iteration"}
    restored.load_state_dict(old)
    assert restored.token_in_iteration == Time(0, "tok") and restored.token == Time(25, "tok")


def test_closing_an_epoch_or_iteration_may_add_wall_clock_time():
    ts = Timestamp().to_next_batch(duration=datetime.timedelta(seconds=5))
    ts = ts.to_next_epoch(duration=datetime.timedelta(seconds=5))  # e.g. evaluation at the epoch's end
    assert (ts.total_wct, ts.iteration_wct, ts.epoch_wct) == (
        datetime.timedelta(seconds=10), datetime.timedelta(seconds=10), datetime.timedelta(0)
    )
    ts = ts.to_next_iteration(duration=2.0)
    assert (ts.total_wct, ts.iteration_wct) == (datetime.timedelta(seconds=12), datetime.timedelta(0))
    assert Timestamp().to_next_epoch().total_wct == datetime.timedelta(0)


def test_a_timestamp_compares_with_a_time_by_its_count_in_that_unit():
    ts = Timestamp(epoch=3, batch=120, sample=3840)
    assert Timestamp() < Time(10, "ep")
    assert ts >= Time(3, "ep") and ts > Time(2, "ep") and ts <= "3ep" and not ts < "3ep"
    assert ts == Time(120, "ba") and ts != Time(121, "ba") and ts == "3840sp"
    assert Time(100, "ba") < ts  # reflected: Time.__lt__ defers to the Timestamp
    assert Time(3, "ep") == ts
    with pytest.raises(ValueError, match="get_elapsed_duration"):
        _ = ts < Time(0.5, "dur")  # a fraction of the run needs max_duration
    with pytest.raises(TypeError):
        _ = ts < 3  # a bare number has no unit


def test_copy_overrides_fields():
    ts = Timestamp(epoch=3, batch=9)
    copied = ts.copy(batch=10)
    assert copied.epoch == Time(3, "ep") and copied.batch == Time(10, "ba")
    assert ts.copy() == ts and ts.copy() is not ts
    with pytest.raises(TypeError, match="no field"):
        ts.copy(epochs=1)


def test_timestamp_equality_and_repr():
    ts = Timestamp(epoch=1, batch=5, total_wct=datetime.timedelta(seconds=3))
    assert ts == Timestamp(epoch=1, batch=5, total_wct=3.0)
    assert ts != Timestamp(epoch=1, batch=6)
    text = repr(ts)
    assert text.startswith("Timestamp(") and "epoch=1" in text and "batch=5" in text
    assert eval(text) == ts
    assert len({ts, ts.copy()}) == 1


def _full_timestamp() -> Timestamp:
    ts = Timestamp()
    for _ in range(3):
        ts = ts.to_next_batch(samples=16, tokens=256, duration=datetime.timedelta(seconds=0.125))
    return ts.to_next_epoch().to_next_batch(samples=16, duration=datetime.timedelta(microseconds=123_456))


def test_state_dict_is_plain_data_and_round_trips():
    ts = _full_timestamp()
    state = ts.state_dict()
    assert all(type(v) in (int, float) for v in state.values())
    restored = Timestamp()
    restored.load_state_dict(state)
    assert restored == ts


def test_state_dict_survives_torch_save_with_weights_only():
    ts = _full_timestamp()
    buffer = io.BytesIO()
    torch.save({"timestamp": ts.state_dict()}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    restored = Timestamp()
    restored.load_state_dict(loaded["timestamp"])
    assert restored == ts


def test_load_state_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="epochz"):
        Timestamp().load_state_dict({"epochz": 1})


@given(st.lists(st.tuples(st.integers(0, 64), st.integers(0, 64), st.floats(0, 10)), max_size=12))
def test_to_next_batches_equals_one_to_next_batch_per_batch(batches):
    start = Timestamp(epoch=2, batch=5, batch_in_epoch=1, sample=40, sample_in_epoch=8, total_wct=3.0, epoch_wct=1.0)
    one_by_one = start
    for samples, tokens, seconds in batches:
        one_by_one = one_by_one.to_next_batch(samples=samples, tokens=tokens, duration=seconds)
    together = start.to_next_batches(
        len(batches),
        samples=sum(b[0] for b in batches),
        tokens=sum(b[1] for b in batches),
        duration=sum(b[2] for b in batches),
        last_duration=batches[-1][2] if batches else 0.0,
    )
    expected, got = one_by_one.state_dict(), together.state_dict()
    assert {k: v for k, v in got.items() if not k.endswith("_wct")} == {
        k: v for k, v in expected.items() if not k.endswith("_wct")
    }
    for clock in ("total_wct", "iteration_wct", "epoch_wct", "batch_wct"):
        assert got[clock] == pytest.approx(expected[clock], rel=1e-12, abs=1e-12)


def test_to_next_batches_refuses_a_negative_or_non_integer_batch_count():
    with pytest.raises(ValueError, match=r"batches=-1.*int >= 0"):
        Timestamp().to_next_batches(-1)
    with pytest.raises(ValueError, match=r"batches=1.5"):
        Timestamp().to_next_batches(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"sample must be >= 0 \(a count\), got -3"):
        Timestamp().to_next_batches(2, samples=-3)
    assert Timestamp().to_next_batches(4, duration=2.0).batch_wct == datetime.timedelta(seconds=0.5)  # default: the mean
