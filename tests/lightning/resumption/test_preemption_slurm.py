"""SLURM auto-requeue: ``SIGUSR1`` at a chosen step, Lightning's hpc checkpoint, a new process restores it.

A simulated SLURM job: the job's environment variables, ``SLURMEnvironment(auto_requeue=True)``,
and an ``scontrol`` on ``PATH`` that records the requeue and then does what SLURM does next: it
kills the job (``SIGKILL``). The signal is raised from inside the run at a chosen step, so the
point repeats. Lightning's handler writes ``hpc_ckpt_1.ckpt`` and calls ``scontrol requeue <job
id>``; the requeued job is a new process (forked from the test, as in ``tests/helpers/preemption.py``) with the
same environment, and Lightning resumes it from the hpc checkpoint by itself (no ``ckpt_path``).

Oracle: plain Lightning requeued at the same point. Where it ends equal to its uninterrupted run
(the signal handled between two steps), the bridge with six algorithms must end equal to its own
(``torch.equal`` on weights, optimizer state and the bridge's state). Where it does not (the signal
handled after the next batch was drawn: Lightning's checkpoint skips that batch), the bridge hearing
every event and drawing nothing must end exactly where plain Lightning ends.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.preemption import CADENCES, run_chain, segment
from helpers.resume_points import Outcome, differences
from helpers.support import L

pytestmark = [pytest.mark.preemption, pytest.mark.timeout(900)]

JOB_ID = "4242"
SIGNAL_AT = 4  # optimizer step 4 is one batch into epoch 1
CADENCE = CADENCES["end of epoch (save_on_train_epoch_end=True)"]  # last.ckpt is epoch 0's: the hpc one must win
SCONTROL = """#!/bin/sh
echo "$@" >> "$SCONTROL_LOG"
kill -KILL $PPID
"""


class RequeueSignalAt(L.Callback):
    """SLURM's warning signal, raised from inside the run: after optimizer step ``step`` (``on_train_batch_end``)
    or once ``step`` steps are done and the next batch was drawn (``on_train_batch_start``)."""

    def __init__(self, step: int, hook: str) -> None:
        self.step, self.hook = step, hook

    def _maybe_signal(self, trainer: Any, hook: str) -> None:
        if hook == self.hook and trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGUSR1)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._maybe_signal(trainer, "on_train_batch_start")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._maybe_signal(trainer, "on_train_batch_end")


def _job(bridge: str, directory: Path, hook: str | None, env: dict[str, str]) -> None:
    os.environ.update(env)
    slurm = importlib.import_module(f"{L.__name__}.plugins.environments").SLURMEnvironment(auto_requeue=True)
    assert slurm.detect(), "the simulated SLURM job is not detected"
    extra = [RequeueSignalAt(SIGNAL_AT, hook)] if hook is not None else []
    outcome = segment(bridge, CADENCE, directory, None, None,
                      trainer_options={"plugins": [slurm], "default_root_dir": directory}, extra=extra)
    torch.save(outcome, directory / "outcome.pt")


def slurm_job(bridge: str, directory: Path, hook: str, steps_trained: int = 12) -> tuple[list[int | None], Outcome]:
    """The job signalled at ``SIGNAL_AT`` from ``hook``, then requeued: ``(both processes' exit codes, final outcome)``.

    ``steps_trained``: the optimizer steps the requeued job ends at (the uninterrupted run's: 12).
    """
    directory.mkdir(parents=True)
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(stat.S_IRWXU)
    env = {
        "SLURM_JOB_ID": JOB_ID, "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SCONTROL_LOG": str(directory / "scontrol.log"),
    }
    codes = []
    for signalled in (hook, None):  # the job, then its requeued run
        child = multiprocessing.get_context("fork").Process(target=_job, args=(bridge, directory, signalled, env))
        child.start()
        child.join(timeout=300)
        codes.append(child.exitcode)
    assert codes == [-signal.SIGKILL, 0], f"exit codes {codes}: the job is killed after it asked for the requeue"
    assert (directory / "scontrol.log").read_text().split() == ["requeue", JOB_ID]
    steps = [int(start.split(",")[2]) for start in (directory / "seen.txt").read_text().split()]
    # last.ckpt (epoch 0's end, step 3) would train step 3 again: the requeued job resumed from the hpc checkpoint
    assert steps.count(SIGNAL_AT - 1) == 1 and steps[-1] == steps_trained - 1, steps
    return codes, torch.load(directory / "outcome.pt", weights_only=False)


def test_a_job_signalled_between_steps_resumes_exactly_with_six_algorithms(tmp_path: Path) -> None:
    hook = "on_train_batch_end"
    plain_full = run_chain("plain", CADENCE, tmp_path / "plain-full", []).outcome
    plain = slurm_job("plain", tmp_path / "plain", hook)[1]
    assert differences(plain_full, plain) == [], "plain Lightning resumes this hpc checkpoint exactly"
    full = run_chain("six", CADENCE, tmp_path / "six-full", []).outcome
    requeued = slurm_job("six", tmp_path / "six", hook)[1]
    hpc = torch.load(tmp_path / "six" / "hpc_ckpt_1.ckpt", weights_only=True)
    assert any("AlgorithmEngineCallback" in key for key in hpc["callbacks"]), "the hpc checkpoint holds the bridge's state"
    assert differences(full, requeued) == []


def test_a_job_signalled_after_the_next_batch_was_drawn_ends_where_plain_lightning_ends(tmp_path: Path) -> None:
    """The batch drawn before the signal is not trained again after the requeue, with or without the bridge."""
    hook = "on_train_batch_start"
    plain_full = run_chain("plain", CADENCE, tmp_path / "plain-full", []).outcome
    plain = slurm_job("plain", tmp_path / "plain", hook, steps_trained=11)[1]  # one step fewer than uninterrupted
    assert differences(plain_full, plain), "plain Lightning now resumes exactly here: update docs/checkpoints.md"
    listening = slurm_job("listen", tmp_path / "listen", hook, steps_trained=11)[1]
    assert listening.bridge is not None and listening.bridge["timestamp"]["batch"] == 11
    listening.bridge = None
    assert differences(plain, listening) == []
