"""A soak: thousands of tiny steps with every algorithm family and periodic checkpoints; memory and fds stay flat.

A long preemptible job is the same process for hours: anything the bridge keeps per step (traces,
timings, checkpoint entries, module patches) or opens per checkpoint would grow without bound. The
run (3,000 optimizer steps, a checkpoint every 100, in a forked child so the test process's own
memory does not count) samples the process's resident memory (``VmRSS``) and open file descriptors
every 250 steps. After the first 500 steps (allocator and Lightning warm-up) both must stay flat:
RSS within ``RSS_BOUND_MB`` of the warm-up sample and the open fds exactly equal.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
from helpers.preemption import PlainClassifier, six_algorithms
from helpers.support import L, ResumableLoader, image_dataset

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import ChannelsLast, SelectiveBackprop

pytestmark = [pytest.mark.preemption, pytest.mark.timeout(900)]

STEPS = 3000
SAMPLE_EVERY = 250
WARM_UP = 500
RSS_BOUND_MB = 2.0


def resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class Sample(L.Callback):
    """``(step, RSS in MB, open fds)`` every ``SAMPLE_EVERY`` optimizer steps."""

    def __init__(self) -> None:
        self.samples: list[tuple[int, float, int]] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step % SAMPLE_EVERY == 0:
            self.samples.append((trainer.global_step, resident_mb(), len(os.listdir("/proc/self/fd"))))


def _soak(directory: Path) -> None:
    sample = Sample()
    algorithms = [*six_algorithms(), ChannelsLast(), SelectiveBackprop(start="1ba", end=1.0, keep=0.5, interrupt=2)]
    checkpoints = L.callbacks.ModelCheckpoint(dirpath=directory, every_n_train_steps=100, save_last=True)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, max_steps=STEPS, limit_val_batches=0,
                        callbacks=[AlgorithmEngineCallback(algorithms, seed=1), sample, checkpoints])
    trainer.fit(PlainClassifier(), ResumableLoader(image_dataset(n=400, size=(8, 8)), 8))
    assert trainer.global_step == STEPS
    (directory / "samples.json").write_text(json.dumps(sample.samples))


def test_thousands_of_steps_with_checkpoints_keep_memory_and_file_descriptors_flat(tmp_path: Path) -> None:
    child = multiprocessing.get_context("fork").Process(target=_soak, args=(tmp_path,))
    child.start()
    child.join(timeout=800)
    assert child.exitcode == 0
    samples = json.loads((tmp_path / "samples.json").read_text())
    assert [s[0] for s in samples] == list(range(SAMPLE_EVERY, STEPS + 1, SAMPLE_EVERY))
    warm = next(s for s in samples if s[0] == WARM_UP)
    later = [s for s in samples if s[0] > WARM_UP]
    growth = max(s[1] for s in later) - warm[1]
    print(f"RSS at step {WARM_UP}: {warm[1]:.1f} MB; largest growth after it: {growth:.2f} MB; samples: {samples}")
    assert growth <= RSS_BOUND_MB, samples
    assert {s[2] for s in later} == {warm[2]}, f"open file descriptors changed: {samples}"
