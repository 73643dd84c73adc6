"""Reusing a callback or an algorithm instance with a new model starts a fresh run: nothing leaks.

Each reused run is compared with the same run made with brand-new objects (``torch.equal``).
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
from helpers.support import (
    assert_same_state,
    assert_same_weights,
    image_loader,
    quiet_trainer,
    tiny_classifier,
    weights_of,
)

import composer_bridge.algorithms as library
from composer_bridge import AlgorithmEngineCallback


def run(callback: AlgorithmEngineCallback, steps: int = 3) -> Any:
    model = tiny_classifier()
    quiet_trainer(max_steps=steps, callbacks=[callback]).fit(model, image_loader(n=48))
    return model


def algorithms() -> list[Any]:
    return [library.EMA(half_life="2ba"), library.LayerFreezing(freeze_start=0.0, freeze_level=0.5),
            library.MixUp(alpha=0.2), library.SWA(swa_start="1ba", swa_end="3ba", update_interval="1ba")]


def test_a_reused_callback_gives_a_new_model_the_run_a_fresh_callback_gives() -> None:
    reused = AlgorithmEngineCallback(algorithms(), seed=5)
    run(reused, steps=6)  # model A: EMA averages, LayerFreezing freezes, SWA averages
    model_b = run(reused)
    fresh = AlgorithmEngineCallback(algorithms(), seed=5)
    model_fresh = run(fresh)
    assert_same_weights(weights_of(model_b), weights_of(model_fresh))
    for a, b in zip(reused.algorithms, fresh.algorithms, strict=True):
        assert_same_state(a.state_dict(), b.state_dict(), type(a).__name__)
    frozen_b = [n for n, p in model_b.named_parameters() if not p.requires_grad]
    frozen_fresh = [n for n, p in model_fresh.named_parameters() if not p.requires_grad]
    assert frozen_b == frozen_fresh
    assert int(reused.state.timestamp.batch) == 3, "the step count restarts for the new model"
    assert max(reused.traces) <= 3, "traces of model A are not mixed into model B's"
    assert reused.cost["MixUp/BEFORE_LOSS"][0] == fresh.cost["MixUp/BEFORE_LOSS"][0]


@pytest.mark.parametrize("name", ["EMA", "LayerFreezing"])
def test_one_algorithm_instance_in_two_callbacks_starts_fresh_in_the_second(name: str) -> None:
    make = {"EMA": lambda: library.EMA(half_life="2ba"),
            "LayerFreezing": lambda: library.LayerFreezing(freeze_start=0.5, freeze_level=1.0)}[name]
    shared = make()
    run(AlgorithmEngineCallback([shared], seed=1), steps=6)
    model_b = run(AlgorithmEngineCallback([shared], seed=1))
    fresh = make()
    model_fresh = run(AlgorithmEngineCallback([fresh], seed=1))
    assert_same_state(shared.state_dict(), fresh.state_dict(), name)
    assert_same_weights(weights_of(model_b), weights_of(model_fresh))
    frozen = [n for n, p in model_b.named_parameters() if not p.requires_grad]
    assert frozen == [n for n, p in model_fresh.named_parameters() if not p.requires_grad]


def test_fitting_the_same_model_again_continues_the_run() -> None:
    callback = AlgorithmEngineCallback([library.EMA(half_life="2ba")], seed=1)
    model = tiny_classifier()
    trainer = quiet_trainer(max_epochs=1, callbacks=[callback])
    trainer.fit(model, image_loader(n=32))
    updates = callback.algorithms[0].num_updates
    trainer.fit_loop.max_epochs = 2
    trainer.fit(model, image_loader(n=32))
    assert int(callback.state.timestamp.epoch) == 2 and int(callback.state.timestamp.batch) == 4
    assert callback.algorithms[0].num_updates == updates + 2


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda c: pickle.loads(pickle.dumps(c))], ids=["deepcopy", "pickle"])
def test_the_callback_copies_before_and_after_fit_and_a_copy_trains_like_a_fresh_callback(copier: Any) -> None:
    every = [getattr(library, name) for name in ("EMA", "SWA", "MixUp", "CutMix", "CutOut", "LabelSmoothing",
                                                 "SelectiveBackprop", "BlurPool", "ChannelsLast", "SAM", "LayerFreezing")]
    make = lambda: AlgorithmEngineCallback([cls() for cls in every], seed=3)  # noqa: E731
    before = copier(make())
    original = make()
    run(original)
    after = copier(original)  # weakrefs, non-leaf tensors, file handles: none may stop a copy
    assert after.state is None and after.engine is None, "a copy carries the configuration, not the run"
    assert [repr(a) for a in after.algorithms] == [repr(a) for a in original.algorithms]
    model_after, model_before, model_fresh = run(after), run(before), run(make())
    assert_same_weights(weights_of(model_after), weights_of(model_fresh))
    assert_same_weights(weights_of(model_before), weights_of(model_fresh))
