"""composer_bridge.training.checkpoint_state: the bridge's entry in a checkpoint, written, checked and restored.

No Trainer here: a :class:`State` with a few algorithms and an engine callback is saved with
:class:`BridgeCheckpoint` and loaded into a fresh one, through ``torch.save``/``torch.load(weights_only=True)``
as Lightning's checkpoint does; every refusal raises :class:`CheckpointStateError` (or ``TypeError`` for a
wrong argument) with a message that names what is wrong.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import pytest
import torch

from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.callback import Callback
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.state import State
from composer_bridge.core.time import Time
from composer_bridge.training.checkpoint_state import (
    FORMAT,
    BridgeCheckpoint,
    CheckpointStateError,
    algorithm_entry,
    check_bridge_state,
    check_known_algorithms,
    plain_hparams,
    rebuild_algorithm,
)


class Drawing(Algorithm):
    """An algorithm with resumable state: a tensor and a counter."""

    def __init__(self, scale: float = 1.0, start: Time | str = "2ba") -> None:
        self.scale = scale
        self.start = Time.from_input(start) if isinstance(start, str) else start
        self.calls = 0
        self.draws = torch.zeros(3)

    def match(self, event: Event, state: State) -> bool:
        return False

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "draws": self.draws.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls, self.draws = int(state["calls"]), state["draws"].clone()


class Surgery(Drawing):
    """Stands for model surgery: a checkpoint written with it needs it at load time."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.width = width

    @classmethod
    def required_on_load(cls) -> bool:
        return True


class Counter(Callback):
    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


def through_a_checkpoint_file(entry: dict[str, Any]) -> Any:
    """The entry as a checkpoint loaded with ``weights_only=True`` gives it back."""
    buffer = io.BytesIO()
    torch.save({"callbacks": {"AlgorithmEngineCallback": entry}}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)["callbacks"]["AlgorithmEngineCallback"]


def trained_state(*algorithms: Algorithm) -> State:
    counter = Counter()
    state = State(torch.nn.Linear(2, 2), algorithms=list(algorithms), callbacks=[counter], seed=17)
    for _ in range(5):
        state.count_batch(samples=8, seconds=0.5)
    state.timestamp = state.timestamp.to_next_epoch()
    state.count_batch(samples=8, seconds=0.5)
    for number, algorithm in enumerate(algorithms, start=1):
        algorithm.calls = 10 * number
        algorithm.draws = torch.arange(3.0) * number
    counter.seen = 6
    return state


def test_a_saved_state_loads_back_through_a_weights_only_checkpoint() -> None:
    saved = BridgeCheckpoint().save(trained_state(Drawing(0.5), Surgery(width=8)), version="9.9")
    assert saved["format"] == FORMAT and saved["version"] == "9.9"
    fresh_algorithms = [Drawing(0.5), Surgery(width=8)]
    fresh = State(torch.nn.Linear(2, 2), algorithms=fresh_algorithms, callbacks=[Counter()])
    BridgeCheckpoint().load(fresh, through_a_checkpoint_file(saved))
    assert fresh.seed == 17
    assert fresh.timestamp.state_dict() == trained_state().timestamp.state_dict()
    assert (fresh.timestamp.epoch.value, fresh.timestamp.batch.value, fresh.timestamp.sample.value) == (1, 6, 48)
    assert [a.calls for a in fresh.algorithms] == [10, 20]
    assert torch.equal(fresh.algorithms[1].draws, torch.tensor([0.0, 2.0, 4.0]))
    assert fresh.callbacks[0].seen == 6


def test_hyper_parameters_are_saved_as_plain_data_and_the_rest_left_out() -> None:
    algorithm = Drawing(scale=0.25, start="3ep")
    algorithm.extra = object()
    entry = algorithm_entry(algorithm)
    assert entry["class"] == "Drawing" and entry["required_on_load"] is False
    assert entry["hparams"] == {"scale": 0.25, "start": "3ep"}  # a Time becomes its string
    assert type(entry["hparams"]["start"]) is str
    assert algorithm_entry(Surgery())["required_on_load"] is True

    class Opaque(Drawing):
        def __init__(self, scale: float = 1.0, start: Time | str = "2ba", module: Any = None) -> None:
            super().__init__(scale, start)
            self.module = module

    assert "module" not in plain_hparams(Opaque(module=torch.nn.Linear(1, 1)))


def test_an_algorithm_whose_state_cannot_be_written_stops_the_checkpoint() -> None:
    class Broken(Drawing):
        def state_dict(self) -> dict[str, Any]:
            raise KeyError("draws")

    with pytest.raises(RuntimeError, match=r"Broken.state_dict\(\) failed .*no checkpoint was written"):
        BridgeCheckpoint().save(State(torch.nn.Linear(1, 1), algorithms=[Broken()]), version="0")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (["not", "a", "dict"], "is a list, not a dict"),
        ({"format": "composer_bridge/0", "algorithms": [], "timestamp": {}}, "format 'composer_bridge/0'.*another version"),
        ({"algorithms": [], "timestamp": {}}, "format None"),
        ({"format": FORMAT, "algorithms": {"EMA": {}}, "timestamp": {}}, "'algorithms' must be a list"),
        ({"format": FORMAT, "algorithms": [{"hparams": {}}], "timestamp": {}}, "'algorithms' must be a list"),
        ({"format": FORMAT, "algorithms": [], "timestamp": 3}, "'timestamp' must be a dict"),
        ({"format": FORMAT, "algorithms": [], "timestamp": {}, "seed": "42"}, "'seed' must be an int"),
        ({"format": FORMAT, "algorithms": [], "timestamp": {}, "callbacks": {}}, "'callbacks' must be a list"),
    ],
)
def test_a_foreign_or_corrupted_entry_is_refused_saying_what_is_wrong(raw: Any, message: str) -> None:
    with pytest.raises(CheckpointStateError, match=message):
        check_bridge_state(raw)
    with pytest.raises(CheckpointStateError, match=message):
        BridgeCheckpoint().load(State(torch.nn.Linear(1, 1)), raw)


def test_every_problem_of_a_corrupted_entry_is_named_at_once() -> None:
    with pytest.raises(CheckpointStateError) as error:
        check_bridge_state({"format": FORMAT, "algorithms": None, "timestamp": None, "seed": 1.5})
    assert all(part in str(error.value) for part in ("'algorithms'", "'timestamp'", "'seed'"))


def test_entries_are_matched_by_class_in_order_and_a_new_algorithm_starts_fresh() -> None:
    saved = BridgeCheckpoint().save(trained_state(Drawing(), Drawing(), Surgery()), version="0")
    first, second, added = Drawing(), Drawing(), Drawing()
    fresh = State(torch.nn.Linear(2, 2), algorithms=[first, second, added, Surgery()])
    BridgeCheckpoint().load(fresh, saved)
    assert [first.calls, second.calls, added.calls] == [10, 20, 0]
    assert fresh.algorithms[3].calls == 30


def test_a_state_that_does_not_fit_the_algorithm_is_refused_naming_it() -> None:
    saved = BridgeCheckpoint().save(trained_state(Drawing()), version="0")
    saved["algorithms"][0]["state"] = {"calls": 3}  # no "draws"
    with pytest.raises(CheckpointStateError, match="Could not restore Drawing .*different hyper-parameters") as error:
        BridgeCheckpoint().load(State(torch.nn.Linear(1, 1), algorithms=[Drawing()]), saved)
    assert isinstance(error.value.__cause__, KeyError)


def test_a_checkpoint_without_a_seed_keeps_the_runs_own() -> None:
    saved = BridgeCheckpoint().save(State(torch.nn.Linear(1, 1)), version="0")
    assert saved["seed"] is None
    fresh = State(torch.nn.Linear(1, 1), seed=5)
    BridgeCheckpoint().load(fresh, saved)
    assert fresh.seed == 5


def test_surgery_the_run_lacks_is_refused_before_the_weights_load_with_the_call_to_add() -> None:
    saved = BridgeCheckpoint().save(trained_state(Surgery(width=8), Drawing()), version="0")
    run = State(torch.nn.Linear(1, 1), algorithms=[Drawing()])
    with pytest.raises(CheckpointStateError, match=r"lacks: Surgery\(width=8\).*add_missing_on_load=True"):
        BridgeCheckpoint().check_fits(run, saved, has_weights=True, late_restore=False)
    assert BridgeCheckpoint().check_fits(State(torch.nn.Linear(1, 1), algorithms=[Surgery(8)]), saved, True, False) == []


def test_add_missing_on_load_recreates_the_surgery_from_known_classes_only() -> None:
    saved = BridgeCheckpoint().save(trained_state(Surgery(width=8)), version="0")
    run = State(torch.nn.Linear(1, 1))
    with pytest.raises(CheckpointStateError, match="'Surgery', which is not a composer_bridge algorithm nor one passed"):
        BridgeCheckpoint(add_missing_on_load=True).check_fits(run, saved, has_weights=True, late_restore=False)
    with pytest.warns(UserWarning, match=r"Re-created Surgery\(width=8\)"):
        rebuilt = BridgeCheckpoint(add_missing_on_load=True, known_algorithms=[Surgery]).check_fits(
            run, saved, has_weights=True, late_restore=False)
    assert [type(a) for a in rebuilt] == [Surgery] and rebuilt[0].width == 8
    with pytest.raises(CheckpointStateError, match="too late to re-create model surgery"):
        BridgeCheckpoint(add_missing_on_load=True, known_algorithms=[Surgery]).check_fits(
            run, saved, has_weights=True, late_restore=True)


def test_weights_saved_without_the_bridge_warn_when_this_run_has_surgery() -> None:
    run = State(torch.nn.Linear(1, 1), algorithms=[Surgery()])
    with pytest.warns(UserWarning, match="holds no composer_bridge state.*Surgery"):
        assert BridgeCheckpoint().check_fits(run, None, has_weights=True, late_restore=False) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BridgeCheckpoint().check_fits(run, None, has_weights=False, late_restore=False)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"class": "os.system", "hparams": {}}, "not a composer_bridge algorithm"),
        ({"class": "Surgery", "hparams": {"__class__": "x"}}, "argument '__class__', which Surgery.__init__ does not take"),
        ({"class": "Surgery", "hparams": {"width": {"nested": object()}}}, "non-plain value for 'width'"),
        ({"class": "Surgery", "hparams": {"width": "wide"}}, None),  # accepted by the signature: built as given
    ],
)
def test_rebuilding_evaluates_nothing_from_the_file(entry: dict[str, Any], message: str | None) -> None:
    known = {"Surgery": Surgery}
    if message is None:
        assert rebuild_algorithm(entry, known).width == "wide"
        return
    with pytest.raises(CheckpointStateError, match=message):
        rebuild_algorithm(entry, known)


def test_an_entry_restored_before_setup_is_checked_at_once_and_handed_over_once() -> None:
    checkpoint = BridgeCheckpoint()
    with pytest.raises(CheckpointStateError, match="format"):
        checkpoint.defer({"format": "other"})
    assert checkpoint.deferred is None
    saved = BridgeCheckpoint().save(State(torch.nn.Linear(1, 1)), version="0")
    checkpoint.defer(saved)
    assert checkpoint.deferred is saved
    assert checkpoint.take_deferred() is saved
    assert checkpoint.take_deferred() is None


def test_a_checkpoint_written_before_the_step_is_counted_warns_with_the_fix() -> None:
    with pytest.warns(UserWarning, match="one step behind.*list AlgorithmEngineCallback before that callback"):
        BridgeCheckpoint.warn_if_step_open(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BridgeCheckpoint.warn_if_step_open(False)


@pytest.mark.parametrize(
    ("given", "message"),
    [("Surgery", "expected a list of Algorithm classes"), ([Surgery()], "not an instance"), ([int], r"known_algorithms\[0\]")],
)
def test_known_algorithms_must_be_algorithm_classes(given: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        check_known_algorithms(given)
    assert check_known_algorithms([Surgery, Drawing]) == (Surgery, Drawing)
