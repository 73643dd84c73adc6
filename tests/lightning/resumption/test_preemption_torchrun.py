"""``torchrun --nproc-per-node=2 --max-restarts=1``: one DDP worker killed mid-run, the group restarted.

Real torchrun (``python -m torch.distributed.run``), DDP on 2 CPU processes (gloo), the plain
module with six algorithms. Rank 1 ``SIGKILL``s itself before optimizer step 5 on the first attempt;
torchrun's agent stops the surviving worker and starts both again (``TORCHELASTIC_RESTART_COUNT=1``),
and the script resumes them from ``last.ckpt`` (written at epoch 0's last batch, step 3). Oracle: the
same script under torchrun with no kill. On each rank: weights, optimizer state and the bridge's
state ``torch.equal`` to the uninterrupted run's, except on rank 1 EMA's copy of the BatchNorm
running statistics: those are per rank (each rank's own batches after MixUp/CutOut), and like
everything Lightning checkpoints they are saved by rank 0 only, so the restarted rank 1 continues
from rank 0's (see docs/distributed.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.resume_points import differences
from helpers.support import REPO

pytestmark = [pytest.mark.preemption, pytest.mark.timeout(900)]

SCRIPT = """
import datetime, os, sys
from pathlib import Path
import torch
from helpers.preemption import CADENCES, segment

kill = sys.argv[1] == "kill"
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
# A restarted round's workers meet in torchrun's store (the agent's, kept from round to round), which still
# holds the killed round's keys. Under the same process-group keys a new worker may read a dead worker's
# gloo address and fail with "connectFullMesh failed ... Connection refused", or hang (now and then under
# load; in 4 launches of 5 when rank 0 of the restarted round was made to start 10 s late). So the script
# creates the process group itself, its keys under the round's own prefix; Lightning finds it initialised
# and uses it.
agent_store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                         int(os.environ["WORLD_SIZE"]), is_master=False,
                                         timeout=datetime.timedelta(seconds=300))
torch.distributed.init_process_group("gloo", store=torch.distributed.PrefixStore(f"round{attempt}", agent_store),
                                     rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
directory = Path("checkpoints")
directory.mkdir(exist_ok=True)
last = directory / "last.ckpt"
with open(f"attempts-rank{rank}.txt", "a") as out:
    out.write(f"{attempt} {'resumed' if last.exists() else 'fresh'}\\n")
outcome = segment("six", CADENCES["every_n_train_steps at an epoch's last batch"], directory,
                  4 if kill and rank == 1 and attempt == 0 else None, last if last.exists() else None,
                  trainer_options={"strategy": "ddp", "devices": 2, "accelerator": "cpu"})
torch.save(outcome, f"outcome-rank{rank}.pt")
torch.distributed.destroy_process_group()
"""


def torchrun(directory: Path, mode: str) -> list[object]:
    """The script under ``torchrun --nproc-per-node=2 --max-restarts=1``; each rank's final outcome.

    Gloo's first connection of the two workers was seen to fail once under heavy load ("Gloo
    connectFullMesh failed ... Connection refused", load average near 12, before the script gave each
    round its own keys; the failures at restarts were the stale keys the script now avoids); such a
    launch is run again from scratch, up to three times.
    """
    for attempt in (0, 1, 2):
        result = _launch(directory / f"launch{attempt}", mode)
        if result.returncode == 0 or "connectFullMesh failed" not in result.stderr:
            break
    assert result.returncode == 0, result.stderr[-4000:]
    directory = directory / f"launch{attempt}"
    return [torch.load(directory / f"outcome-rank{rank}.pt", weights_only=False) for rank in (0, 1)]


def _launch(directory: Path, mode: str) -> subprocess.CompletedProcess:
    directory.mkdir(parents=True)
    (directory / "run.py").write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    for inherited in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK", "RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(inherited, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "--max-restarts=1", "--monitor-interval=0.5", "run.py", mode]
    return subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True, timeout=600)


def test_a_worker_killed_under_torchrun_restarts_from_last_ckpt_and_ends_like_the_uninterrupted_run(tmp_path: Path) -> None:
    full = torchrun(tmp_path / "full", "full")
    restarted = torchrun(tmp_path / "kill", "kill")
    launch = max((tmp_path / "kill").iterdir())
    for rank in (0, 1):
        attempts = (launch / f"attempts-rank{rank}.txt").read_text().splitlines()
        assert attempts == ["0 fresh", "1 resumed"], (rank, attempts)
        found = differences(full[rank], restarted[rank])
        if rank == 1:
            found = [f for f in found if not (f.startswith("bridge.algorithms[3].state.ema_weights") and "running_" in f)]
        assert found == [], rank
        assert restarted[rank].bridge["timestamp"]["batch"] == 12

