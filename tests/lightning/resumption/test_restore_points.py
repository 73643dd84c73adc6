"""The bridge's state restores at every point Lightning restores callbacks, as Lightning's own callbacks do.

Lightning calls ``load_state_dict`` on callbacks before ``setup`` (its checkpoint connector's
``restore_callbacks`` ahead of validate/test/predict) and after fit's teardown (its restore of an
HPC checkpoint, used by its model pipelines and tuner). The first is kept and applied at setup;
the second is applied at once, and AFTER_LOAD fires at the next setup, never on the closed engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.support import image_loader, quiet_trainer, tiny_classifier

from composer_bridge import AlgorithmEngineCallback, Callback


class Counter(Callback):
    """An engine callback with state: counts the batches it saw, and records every event."""

    def __init__(self) -> None:
        self.batches = 0
        self.events: list[str] = []

    def run_event(self, event: Any, state: Any, logger: Any) -> None:
        self.events.append(event.name)
        if event.name == "BATCH_END":
            self.batches += 1

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches = state["batches"]


def trained_checkpoint(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A checkpoint after 4 steps, and the bridge's entry in it."""
    trainer = quiet_trainer(
        callbacks=[AlgorithmEngineCallback([], callbacks=[Counter()])], enable_checkpointing=True, default_root_dir=tmp_path
    )
    trainer.fit(tiny_classifier(), image_loader())
    path = trainer.checkpoint_callback.best_model_path
    saved = torch.load(path, weights_only=False)["callbacks"]
    (entry,) = [value for key, value in saved.items() if key.startswith("AlgorithmEngineCallback")]
    return path, entry


@pytest.mark.parametrize("fn", ["validate", "test", "predict"])
def test_a_restore_before_setup_is_applied_at_setup(fn: str, tmp_path: Path) -> None:
    """Lightning's own sequence: connector.restore_callbacks() on a fresh Trainer, then validate/test/predict."""
    path, _ = trained_checkpoint(tmp_path)
    counter = Counter()
    bridge = AlgorithmEngineCallback([], callbacks=[counter])
    model = tiny_classifier()
    trainer = quiet_trainer(callbacks=[bridge])
    trainer.strategy.connect(model)
    trainer._checkpoint_connector.resume_start(path)
    trainer._checkpoint_connector.restore_callbacks()
    assert bridge.state is None  # no run yet: the state is kept
    getattr(trainer, fn)(model, image_loader(), ckpt_path=path)
    assert bridge.state is not None
    assert bridge.state.timestamp.batch.value == 4
    assert counter.batches == 4
    assert counter.events.index("AFTER_LOAD") > counter.events.index("INIT")


def test_load_state_dict_called_directly_before_the_first_run(tmp_path: Path) -> None:
    _, entry = trained_checkpoint(tmp_path)
    counter = Counter()
    bridge = AlgorithmEngineCallback([], callbacks=[counter])
    bridge.load_state_dict(entry)
    assert bridge.state_dict() == entry  # saved again before any run: nothing lost
    trainer = quiet_trainer(callbacks=[bridge], max_epochs=2)
    trainer.fit(tiny_classifier(), image_loader())
    # the fit itself starts at step 0 (no ckpt_path), but the bridge's own count continues from the entry
    assert counter.batches == 4 + 8
    assert counter.events.count("AFTER_LOAD") == 1


def test_a_restore_after_teardown_applies_without_the_closed_engine(tmp_path: Path) -> None:
    """Lightning's HPC restore: connector.restore(path) after fit returned."""
    path, _ = trained_checkpoint(tmp_path / "first")
    counter = Counter()
    bridge = AlgorithmEngineCallback([], callbacks=[counter])
    model = tiny_classifier()
    trainer = quiet_trainer(callbacks=[bridge], max_epochs=2)
    trainer.fit(model, image_loader())
    assert counter.batches == 8
    trainer._checkpoint_connector.restore(path)
    assert bridge.state is not None and bridge.state.timestamp.batch.value == 4
    assert counter.batches == 4
    assert "AFTER_LOAD" not in counter.events
    trainer.fit_loop.max_epochs = 3
    trainer.fit(model, image_loader())
    assert counter.events.count("AFTER_LOAD") == 1
