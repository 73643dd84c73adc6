"""composer_bridge.lightning.run_checkpoint: when a restored entry loads and when AFTER_LOAD fires, the loss record kept.

Lightning restores callbacks before setup (``trainer.validate(ckpt_path=...)``) and after teardown (its
HPC restore); the whole-run tests check the events a user sees, these check each moment's rule.
"""

from __future__ import annotations

import torch

from composer_bridge.algorithms import LabelSmoothing
from composer_bridge.core import State
from composer_bridge.lightning.plain_loss import CHECKPOINT_KEY
from composer_bridge.lightning.run_checkpoint import RunCheckpoint
from composer_bridge.training.checkpoint_state import BridgeCheckpoint


def _saved_entry() -> tuple[dict, torch.Tensor]:
    state = State(torch.nn.Linear(2, 2), algorithms=[LabelSmoothing(0.1)])
    state.timestamp = state.timestamp.to_next_batch(samples=4)
    return RunCheckpoint(BridgeCheckpoint(), "key").entry(state, step_open=False, version="0"), state.timestamp.sample.value


def test_an_entry_restored_before_setup_waits_for_it_and_then_fires_after_load_once() -> None:
    entry, samples = _saved_entry()
    part = RunCheckpoint(BridgeCheckpoint(), "key")
    assert part.restore(None, entry, engine_open=False) is False
    assert part.entry(None, step_open=False, version="0") == entry  # saved again before setup: the same entry
    state = State(torch.nn.Linear(2, 2), algorithms=[LabelSmoothing(0.1)])
    assert part.load_deferred(state) is True
    assert state.timestamp.sample.value == samples
    assert part.load_deferred(state) is False  # once


def test_a_restore_after_teardown_loads_now_and_fires_after_load_at_the_next_setup() -> None:
    entry, samples = _saved_entry()
    part = RunCheckpoint(BridgeCheckpoint(), "key")
    state = State(torch.nn.Linear(2, 2), algorithms=[LabelSmoothing(0.1)])
    assert part.restore(state, entry, engine_open=False) is False
    assert state.timestamp.sample.value == samples and part.restored
    assert part.load_deferred(state) is True and part.load_deferred(state) is False
    assert part.restore(state, entry, engine_open=True) is True  # an open engine: AFTER_LOAD fires now


def test_the_loss_record_kept_at_teardown_is_written_until_a_live_one_replaces_it() -> None:
    part = RunCheckpoint(BridgeCheckpoint(), "key")
    checkpoint: dict = {}
    part.save_loss_record(checkpoint, None)
    assert CHECKPOINT_KEY not in checkpoint
    part.kept_loss_record = {"loss": torch.ones(3)}
    part.save_loss_record(checkpoint, None)
    assert torch.equal(checkpoint[CHECKPOINT_KEY]["loss"], torch.ones(3))
    part.save_loss_record(checkpoint, {"loss": torch.zeros(3)})
    assert torch.equal(checkpoint[CHECKPOINT_KEY]["loss"], torch.zeros(3))
