"""The run in progress is one object: a new model or a copy drops all of it; the module's old step calls still work."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from helpers.support import ComposerClassifier, L, image_loader, quiet_trainer, tiny_classifier

from composer_bridge import Algorithm, AlgorithmEngineCallback, Event
from composer_bridge import algorithms as library


def test_a_new_model_drops_the_conflicts_found_for_the_previous_one() -> None:
    bridge = AlgorithmEngineCallback([library.LayerFreezing()])
    first = tiny_classifier()
    first.backbone = first.module  # BackboneFinetuning's convention
    trainer = quiet_trainer(max_steps=1, callbacks=[bridge, L.callbacks.BackboneFinetuning(unfreeze_backbone_at_epoch=5)])
    with pytest.warns(UserWarning, match="both set requires_grad"):
        trainer.fit(first, image_loader(n=32))
    assert any("BackboneFinetuning" in w for w in bridge.plan().warnings)

    # The same callback validates another model, in a Trainer without BackboneFinetuning: nothing of
    # the first run (its state, traces, cost, conflicts) is listed for the second.
    quiet_trainer(callbacks=[bridge], limit_val_batches=1).validate(tiny_classifier(), image_loader(n=16))
    assert not any("BackboneFinetuning" in w for w in bridge.plan().warnings)
    assert bridge.state is not None and bridge.state.model is not first
    assert int(bridge.state.timestamp.batch) == 0
    assert not any(key.endswith("/BATCH_END") for key in bridge.cost)


def test_a_copy_carries_configuration_and_algorithms_but_none_of_the_run() -> None:
    bridge = AlgorithmEngineCallback([library.LabelSmoothing(0.1)], seed=3, trace_mode="every_event")
    quiet_trainer(max_steps=2, callbacks=[bridge]).fit(tiny_classifier(), image_loader(n=32))
    assert bridge.state is not None and len(bridge.traces.stats) > 0 and bridge.cost
    clone = copy.deepcopy(bridge)
    assert clone.algorithms == bridge.algorithms and clone.seed == 3
    assert clone.state is None and clone.engine is None and not clone.listening
    assert len(clone.traces.stats) == 0 and clone.cost == {}
    assert bridge.state is not None and len(bridge.traces.stats) > 0, "copying left the original's run alone"


class CountForward(Algorithm):
    def __init__(self) -> None:
        self.forwards = 0

    def match(self, event: Event, state: Any) -> bool:
        return event == Event.BEFORE_FORWARD

    def apply(self, event: Event, state: Any, logger: Any) -> None:
        self.forwards += 1


class OwnStepModule(ComposerClassifier):
    """A module whose own training_step calls the run's step API through the callback (callback.steps)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        bridge = next(c for c in self.trainer.callbacks if isinstance(c, AlgorithmEngineCallback))
        batch, outputs, loss = bridge.steps.train_step(self, batch)
        return loss


def test_a_module_calling_callback_steps_fires_the_events_and_the_former_names_are_gone() -> None:
    counter = CountForward()
    template = tiny_classifier()
    model = OwnStepModule(template.module, num_classes=4, optimizer=lambda p: torch.optim.SGD(p, lr=0.05))
    trainer = quiet_trainer(max_steps=2, callbacks=[AlgorithmEngineCallback([counter])])
    trainer.fit(model, image_loader(n=32))
    assert counter.forwards == 2
    former = ("composer_train_step", "composer_eval_forward", "composer_predict_forward", "after_dataloader", "before_load")
    assert not [name for name in former if hasattr(AlgorithmEngineCallback, name)], "see docs/changelog.md"
