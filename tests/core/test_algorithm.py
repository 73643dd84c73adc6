"""Behaviour of the Algorithm base class: hyper-parameters, repr, equality, persistence defaults."""

from __future__ import annotations

import io

import pytest
import torch

from composer_bridge.core import Algorithm, AlgorithmError, Event


class Smooth(Algorithm):
    def __init__(self, smoothing: float = 0.1, target_key: int | str = 1, layers: tuple = ("conv",), note=None):
        self.smoothing = smoothing
        self.target_key = target_key
        self.layers = layers
        self.note = note

    def match(self, event, state):
        return event == Event.BEFORE_LOSS

    def apply(self, event, state, logger):
        return None


class OtherWithSameArgs(Smooth):
    pass


class PrivateStorage(Algorithm):
    """Stores its argument under a leading underscore, which hparams also reads."""

    def __init__(self, alpha: float = 0.2):
        self._alpha = alpha

    def match(self, event, state):
        return False

    def apply(self, event, state, logger):
        return None


class Counter(Algorithm):
    def __init__(self):
        self.steps = torch.tensor(0)

    def match(self, event, state):
        return event == Event.BATCH_END

    def apply(self, event, state, logger):
        self.steps += 1

    def state_dict(self):
        return {"steps": self.steps.clone()}

    def load_state_dict(self, state):
        self.steps = state["steps"].clone()


class Surgery(Smooth):
    @classmethod
    def required_on_load(cls) -> bool:
        return True


# --- repr, ==, hash -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "algorithm",
    [Smooth(), Smooth(0.25, "labels", ("a", "b"), note="x"), Smooth(smoothing=0, layers=[1, 2]), PrivateStorage(0.5)],
    ids=repr,
)
def test_repr_evaluates_back_to_an_equal_algorithm(algorithm):
    again = eval(repr(algorithm))
    assert again == algorithm
    assert again is not algorithm
    assert repr(again) == repr(algorithm)


def test_repr_names_the_class_and_every_init_argument():
    assert repr(Smooth(0.2)) == "Smooth(smoothing=0.2, target_key=1, layers=('conv',), note=None)"


def test_hparams_are_the_init_arguments_read_back_from_attributes():
    assert Smooth(0.3, note="n").hparams() == {"smoothing": 0.3, "target_key": 1, "layers": ("conv",), "note": "n"}
    assert PrivateStorage(0.7).hparams() == {"alpha": 0.7}


def test_algorithms_are_equal_when_of_the_same_class_with_the_same_hparams():
    assert Smooth(0.1) == Smooth(0.1)
    assert Smooth(0.1) != Smooth(0.2)
    assert Smooth(0.1) != OtherWithSameArgs(0.1)
    assert Smooth(0.1) != "Smooth(0.1)"


def test_equal_algorithms_hash_equally():
    assert hash(Smooth(0.1)) == hash(Smooth(0.1))
    assert len({Smooth(0.1), Smooth(0.1)}) == 1


# --- defaults -------------------------------------------------------------------------------------------
def test_class_attribute_defaults_are_all_false():
    for name in ("backwards_create_graph", "find_unused_parameters", "interpolates_loss", "runs_first",
                 "runs_last", "needs_loss_events", "unique"):
        assert getattr(Smooth(), name) is False, name


def test_required_on_load_defaults_to_false_and_can_be_overridden():
    assert Smooth.required_on_load() is False
    assert Smooth().required_on_load() is False
    assert Surgery.required_on_load() is True


def test_state_dict_defaults_to_empty_and_loads_back():
    algorithm = Smooth()
    assert algorithm.state_dict() == {}
    algorithm.load_state_dict({})


def test_loading_state_into_a_stateless_algorithm_names_the_keys():
    with pytest.raises(ValueError, match=r"Smooth keeps no state but the checkpoint holds \['ema'\]"):
        Smooth().load_state_dict({"ema": 1})


def test_resumable_state_survives_a_weights_only_checkpoint():
    counter = Counter()
    for _ in range(3):
        counter.apply(Event.BATCH_END, None, None)
    buffer = io.BytesIO()
    torch.save(counter.state_dict(), buffer)
    buffer.seek(0)
    restored = Counter()
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.steps.item() == 3


# --- abstract methods, errors --------------------------------------------------------------------------------
def test_algorithm_is_abstract_and_needs_match_and_apply():
    with pytest.raises(TypeError):
        Algorithm()  # type: ignore[abstract]

    class MatchOnly(Algorithm):
        def match(self, event, state):
            return True

    with pytest.raises(TypeError, match="apply"):
        MatchOnly()  # type: ignore[abstract]


def test_algorithm_error_keeps_the_algorithm_event_and_original_error():
    cause = ValueError("bad shape")
    error = AlgorithmError(Smooth(), Event.AFTER_LOSS, cause)
    assert error.algorithm == Smooth() and error.event is Event.AFTER_LOSS and error.error is cause
    assert str(error) == "Smooth failed at Event.AFTER_LOSS: ValueError: bad shape"
    assert isinstance(error, RuntimeError)


def test_algorithm_error_crosses_a_process_boundary_as_itself():
    # a search's Ray worker sends the error back pickled: it must arrive as the AlgorithmError it was
    import pickle

    error = pickle.loads(pickle.dumps(AlgorithmError(Smooth(), Event.AFTER_LOSS, KeyError("labels"))))
    assert isinstance(error, AlgorithmError) and error.algorithm == Smooth() and error.event is Event.AFTER_LOSS
    assert str(error) == "Smooth failed at Event.AFTER_LOSS: KeyError: 'labels'"


def test_every_capability_is_a_documented_false_by_default_bool_and_listed_for_algorithm_writers():
    import inspect
    from pathlib import Path

    from composer_bridge.core.algorithm import CAPABILITIES, declaring

    source = inspect.getsource(Algorithm)
    page = (Path(__file__).resolve().parents[2] / "docs" / "writing-algorithms.md").read_text()
    for name in CAPABILITIES:
        assert getattr(Algorithm, name) is False, name
        before = source.split(f"\n    {name}: bool")[0].rsplit("\n", 1)[-1]
        assert before.strip().startswith("#:"), f"{name} has no doc comment (#:) right above it"
        assert f"`{name}" in page, f"{name} is not in docs/writing-algorithms.md's table"
    assert {"needs_run_length", "needs_optimizer_closure", "averages_weights", "clips_gradients",
            "freezes_layers", "converts_memory_format", "needs_loss_events"} <= set(CAPABILITIES)
    with pytest.raises(ValueError, match="'averages_weight' is not an Algorithm capability"):
        declaring([], "averages_weight")


def test_a_capability_is_read_one_way_and_a_misspelt_one_is_an_error() -> None:
    from composer_bridge.algorithms import CutMix
    from composer_bridge.core.algorithm import declares

    assert declares(CutMix(), "mixes_examples") and not declares(object(), "mixes_examples")
    with pytest.raises(ValueError, match="'mixes_example' is not an Algorithm capability"):
        declares(CutMix(), "mixes_example")
