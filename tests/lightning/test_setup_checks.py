"""What the bridge refuses or warns about at setup, before a single step, and how it says so.

Run length unknown (``max_time`` only), conflicts with Lightning's own callbacks and Trainer
flags, and bad input — each message names the value, what was expected and the fix.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers.support import L, image_loader, quiet_trainer, tiny_classifier

import composer_bridge.algorithms as library
from composer_bridge import AlgorithmEngineCallback
from composer_bridge.lightning import BridgeConfigurationError

BackboneFinetuning, StochasticWeightAveraging = L.callbacks.BackboneFinetuning, L.callbacks.StochasticWeightAveraging


class CountSteps(L.Callback):
    def __init__(self) -> None:
        self.steps = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.steps += 1


# --- run length ------------------------------------------------------------------------------
def test_ema_averages_when_only_max_time_bounds_the_run() -> None:
    ema = library.EMA()
    trainer = quiet_trainer(max_epochs=None, max_steps=-1, max_time={"seconds": 4}, limit_train_batches=8,
                            callbacks=[AlgorithmEngineCallback([ema])])
    with pytest.warns(UserWarning, match="run's length is unknown"):
        trainer.fit(tiny_classifier(), image_loader(n=64))
    assert trainer.global_step > 0
    assert ema.num_updates == trainer.global_step, "EMA updates every step, from the first"


@pytest.mark.parametrize("make", [
    lambda: library.LayerFreezing(), lambda: library.ProgressiveResizing(),
    lambda: library.SWA(swa_start="0.5dur", swa_end="0.9dur"), lambda: library.EMA(half_life="0.1dur"),
], ids=["LayerFreezing", "ProgressiveResizing", "SWA(dur)", "EMA(dur half-life)"])
def test_fraction_schedules_are_refused_at_setup_when_only_max_time_bounds_the_run(make: Any) -> None:
    algorithm = make()
    counter = CountSteps()
    trainer = quiet_trainer(max_epochs=None, max_steps=-1, max_time={"seconds": 30},
                            callbacks=[AlgorithmEngineCallback([algorithm]), counter])
    with pytest.raises(BridgeConfigurationError, match=rf"{type(algorithm).__name__} needs the run's length.*max_time.*max_steps"):
        trainer.fit(tiny_classifier(), image_loader(n=32))
    assert counter.steps == 0, "refused at setup, before any step"


def test_schedules_in_steps_work_with_max_time_only() -> None:
    swa = library.SWA(swa_start="1ba", swa_end="3ba", update_interval="1ba")
    trainer = quiet_trainer(max_epochs=None, max_steps=-1, max_time={"seconds": 30}, limit_train_batches=4,
                            callbacks=[AlgorithmEngineCallback([swa]), CountSteps()])
    trainer.fit_loop.max_epochs = 1  # keep it short: max_time stays the only declared limit at setup
    trainer.fit(tiny_classifier(), image_loader(n=64))
    assert swa.num_averaged > 0


# --- conflicts with Lightning ----------------------------------------------------------------
def test_our_swa_beside_lightnings_weight_averaging_is_refused() -> None:
    trainer = quiet_trainer(callbacks=[AlgorithmEngineCallback([library.SWA(swa_start="1ba", swa_end="2ba")]),
                                       StochasticWeightAveraging(swa_lrs=0.01)])
    with pytest.raises(BridgeConfigurationError, match="SWA and Lightning's StochasticWeightAveraging.*keep one"):
        trainer.fit(tiny_classifier(), image_loader(n=32))


def test_our_ema_beside_lightnings_ema_weight_averaging_is_refused() -> None:
    ema_callbacks = pytest.importorskip(f"{L.__name__}.callbacks.weight_averaging")
    trainer = quiet_trainer(callbacks=[AlgorithmEngineCallback([library.EMA()]), ema_callbacks.EMAWeightAveraging()])
    with pytest.raises(BridgeConfigurationError, match="EMA and Lightning's EMAWeightAveraging"):
        trainer.fit(tiny_classifier(), image_loader(n=32))


def test_gradient_clipping_with_gradient_clip_val_is_refused() -> None:
    trainer = quiet_trainer(gradient_clip_val=0.5, callbacks=[AlgorithmEngineCallback([library.GradientClipping("norm", 1.0)])])
    with pytest.raises(BridgeConfigurationError, match=r"gradient_clip_val=0.5 both clip.*keep one"):
        trainer.fit(tiny_classifier(), image_loader(n=32))


def test_layer_freezing_beside_a_finetuning_callback_is_listed_by_plan() -> None:
    bridge = AlgorithmEngineCallback([library.LayerFreezing()])
    trainer = quiet_trainer(max_steps=1, callbacks=[bridge, BackboneFinetuning(unfreeze_backbone_at_epoch=5)])
    model = tiny_classifier()
    model.backbone = model.module  # BackboneFinetuning's convention
    with pytest.warns(UserWarning, match="both set requires_grad"):
        trainer.fit(model, image_loader(n=32))
    assert any("BackboneFinetuning" in w for w in bridge.plan().warnings)


# --- bad input -------------------------------------------------------------------------------
def test_a_class_instead_of_a_list_of_instances_says_how_to_write_it() -> None:
    with pytest.raises(TypeError, match=r"write AlgorithmEngineCallback\(\[EMA\(\)\]\)"):
        AlgorithmEngineCallback(library.EMA)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["EMA", ["EMA"], [library.EMA()]])
def test_known_algorithms_must_be_classes(value: Any) -> None:
    with pytest.raises(TypeError, match="known_algorithms.*Algorithm"):
        AlgorithmEngineCallback([], known_algorithms=value)


def test_an_algorithm_given_to_the_trainer_directly_says_to_wrap_it() -> None:
    with pytest.raises(TypeError, match=r"wrap it.*AlgorithmEngineCallback\(\[EMA\(\)\]\)"):
        quiet_trainer(callbacks=[library.EMA()]).fit(tiny_classifier(), image_loader(n=16))

