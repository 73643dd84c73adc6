"""A failing algorithm, wherever it fails, never costs the user their data."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.support import REPO, L, image_loader, quiet_trainer, tiny_classifier

from composer_bridge import Algorithm, AlgorithmEngineCallback, Callback, Event, State
from composer_bridge.core.algorithm import AlgorithmError


class FailAt(Algorithm):
    def __init__(self, event: str, step: int = 2) -> None:
        self.event = event
        self.step = step

    def match(self, event: Event, state: State) -> bool:
        return event == Event(self.event) and (event == Event.INIT or int(state.timestamp.batch) >= self.step)

    def apply(self, event: Event, state: State, logger: Any) -> None:
        raise RuntimeError("injected fault")


class Closing(Callback):
    def __init__(self) -> None:
        self.closed = self.post_closed = False

    def close(self, state: State, logger: Any) -> None:
        self.closed = True

    def post_close(self) -> None:
        self.post_closed = True


@pytest.mark.parametrize("event", ["INIT", "AFTER_DATALOADER", "BEFORE_LOSS", "AFTER_BACKWARD", "BATCH_END", "EVAL_START"])
def test_a_fault_names_algorithm_and_event_closes_everything_and_keeps_checkpoints(event: str, tmp_path: Path) -> None:
    closing = Closing()
    checkpoints = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    wandb_logger = L.loggers.WandbLogger(project="faults", save_dir=str(tmp_path), offline=True)
    callback = AlgorithmEngineCallback([FailAt(event)], callbacks=[closing])
    trainer = quiet_trainer(max_steps=6, enable_checkpointing=True, logger=wandb_logger, val_check_interval=3,
                            limit_val_batches=1, callbacks=[callback, checkpoints])
    try:
        with pytest.raises(AlgorithmError, match=f"FailAt failed at Event.{event}: RuntimeError: injected fault"):
            trainer.fit(tiny_classifier(), image_loader(n=128), image_loader(n=16))
    finally:
        import wandb

        # the run is the user's: as Lightning leaves it, it is still open after the failure
        assert wandb.run is None or wandb.run is wandb_logger.experiment
        wandb.finish(exit_code=1)
    assert closing.closed and closing.post_closed
    run_dirs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1 and any(run_dirs[0].glob("*.wandb")), "the W&B run was written"
    saved = sorted((tmp_path / "ckpt").glob("*.ckpt")) if (tmp_path / "ckpt").exists() else []
    if event == "INIT":
        assert saved == []
        return
    assert saved, "checkpoints written before the fault are kept"
    last = max(saved, key=lambda p: p.stat().st_mtime)
    torch.load(last, weights_only=True)
    resumed = quiet_trainer(max_steps=6, callbacks=[AlgorithmEngineCallback([])])
    resumed.fit(tiny_classifier(), image_loader(n=128), ckpt_path=last)
    assert resumed.global_step == 6


KEYBOARD_INTERRUPT = """
import sys, torch
from helpers.support import L
from helpers.support import image_loader, quiet_trainer, tiny_classifier
from composer_bridge import AlgorithmEngineCallback, Algorithm, Callback, Event

class Interrupt(Algorithm):
    def match(self, event, state):
        return event == Event.BATCH_START and int(state.timestamp.batch) == 3
    def apply(self, event, state, logger):
        raise KeyboardInterrupt

class Closing(Callback):
    def close(self, state, logger):
        print("ENGINE-CALLBACK-CLOSED", flush=True)

ckpt = L.callbacks.ModelCheckpoint(dirpath="ckpt", every_n_train_steps=1, save_top_k=-1)
trainer = quiet_trainer(max_steps=8, enable_checkpointing=True,
                        callbacks=[AlgorithmEngineCallback([Interrupt()], callbacks=[Closing()]), ckpt])
trainer.fit(tiny_classifier(), image_loader(n=128))
print("NOT-REACHED")
"""


def test_keyboard_interrupt_mid_epoch_ends_cleanly_and_the_last_checkpoint_resumes(tmp_path: Path) -> None:
    import os
    import subprocess

    script = tmp_path / "interrupt.py"
    script.write_text(textwrap.dedent(KEYBOARD_INTERRUPT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0 and "NOT-REACHED" not in result.stdout
    assert "ENGINE-CALLBACK-CLOSED" in result.stdout, result.stderr[-2000:]
    saved = sorted((tmp_path / "ckpt").glob("*.ckpt"))
    assert [p.name for p in saved] == ["epoch=0-step=1.ckpt", "epoch=0-step=2.ckpt", "epoch=0-step=3.ckpt"]
    resumed = quiet_trainer(max_steps=8, callbacks=[AlgorithmEngineCallback([])])
    resumed.fit(tiny_classifier(), image_loader(n=128), ckpt_path=saved[-1])
    assert resumed.global_step == 8
