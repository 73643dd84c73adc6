"""Two nodes simulated on the loopback: two processes, ``num_nodes=2`` and one CPU device each (gloo).

Each process is started the way a user starts Lightning on each node of a cluster without a
scheduler (Lightning's ``LightningEnvironment``): the same script, with ``MASTER_ADDR``,
``MASTER_PORT``, ``WORLD_SIZE`` and its own ``NODE_RANK``; no ``LOCAL_RANK``, so Lightning acts as
the launcher on each node (one device: no child process). Logs go to each node's own working
directory; checkpoints to a directory both nodes share, as on a cluster file system.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers.support import REPO, free_port

SCRIPT = """
import sys
import torch
from helpers.support import L
ModelCheckpoint = L.callbacks.ModelCheckpoint
CSVLogger = L.loggers.CSVLogger
from helpers.support import image_loader, quiet_trainer, tiny_classifier
from composer_bridge import AlgorithmEngineCallback, recipes

shared = sys.argv[1]

def run(ckpt_path=None, save=False):
    # the mild recipe, with EMA scaled to 6 steps and BlurPool reaching the 1-channel stem, plus
    # two random algorithms
    algorithms = recipes.vision("mild", ema={"half_life": "2ba", "update_interval": "1ba"},
                                blurpool={"min_channels": 1}, mixup=0.2, cutout=0.25)
    callback = AlgorithmEngineCallback(algorithms, seed=7)
    callbacks = [callback]
    if save:
        callbacks.append(ModelCheckpoint(dirpath=shared, filename="{epoch}", save_top_k=-1, every_n_epochs=1))
    trainer = quiet_trainer(strategy="ddp", num_nodes=2, devices=1, max_epochs=2, callbacks=callbacks,
                            enable_checkpointing=save, logger=CSVLogger("logs", name="run") if save else False)
    model = tiny_classifier()
    # 48 samples, 8 per batch, split by Lightning's DistributedSampler: 3 steps per epoch and rank
    trainer.fit(model, image_loader(n=48, batch_size=8), ckpt_path=ckpt_path)
    ema = next(a for a in algorithms if type(a).__name__ == "EMA")
    return trainer, callback, {
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "params": {k: v.detach().clone() for k, v in model.named_parameters()},
        "ema": {k: v.clone() for k, v in ema.ema_weights.items()},
        "rank": callback.state.rank, "world": callback.state.world_size,
        "node": trainer.node_rank, "global_rank": trainer.global_rank,
        "steps": int(callback.state.timestamp.batch),
    }

L.seed_everything(0)
trainer, _, full = run(save=True)
# resume from the checkpoint rank zero wrote at the end of epoch 0, in fresh objects
L.seed_everything(0)
_, _, resumed = run(ckpt_path=f"{shared}/epoch=0.ckpt")
torch.save({"full": full, "resumed": resumed}, f"{shared}/node{trainer.node_rank}.pt")
"""


def _launch_nodes(tmp_path: Path, timeout: float = 200) -> list[subprocess.CompletedProcess]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    shared = tmp_path / "shared"
    shared.mkdir()
    port = str(free_port())
    processes = []
    for node in (0, 1):
        cwd = tmp_path / f"node{node}"
        cwd.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "GROUP_RANK", "RANK")}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2", NODE_RANK=str(node),
                   OMP_NUM_THREADS="1", WANDB_MODE="offline",
                   PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")]))
        processes.append(subprocess.Popen(
            [sys.executable, str(script), str(shared)], cwd=cwd, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    results = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    finally:
        for process in processes:  # a node left waiting for its peer must not outlive the test
            if process.poll() is None:
                process.kill()
                process.communicate()
    return results


@pytest.mark.timeout(300)
def test_two_nodes_train_the_mild_recipe_identically_log_once_and_resume_exactly(tmp_path: Path) -> None:
    results = _launch_nodes(tmp_path)
    for node, result in enumerate(results):
        assert result.returncode == 0, f"node {node}:\n{result.stderr[-4000:]}"
    nodes = [torch.load(tmp_path / "shared" / f"node{n}.pt", weights_only=True) for n in (0, 1)]

    for n, out in enumerate(nodes):  # the bridge sees two ranks, one per node
        for run in ("full", "resumed"):
            assert out[run]["node"] == out[run]["global_rank"] == out[run]["rank"] == n
            assert out[run]["world"] == 2 and out[run]["steps"] == 6

    # the gradients are all-reduced, so both nodes hold the same parameters and EMA average, although
    # MixUp and CutOut drew different numbers on each (each rank has its own generators)
    for run in ("full", "resumed"):
        first, second = nodes[0][run], nodes[1][run]
        for key, value in first["params"].items():
            assert torch.equal(value, second["params"][key]), f"{run}: {key} differs between nodes"
        for key, value in first["ema"].items():
            if value.is_floating_point() and "running" not in key:
                assert torch.equal(value, second["ema"][key]), f"{run}: EMA {key} differs between nodes"

    # resuming on both nodes from the checkpoint rank zero wrote ends exactly where the
    # uninterrupted run ended, node by node, buffers included ...
    for n, out in enumerate(nodes):
        for part in ("state", "ema"):
            for key, value in out["full"][part].items():
                if n == 1 and part == "ema" and "running" in key:
                    continue
                assert torch.equal(value, out["resumed"][part][key]), f"node {n}: resumed {part} {key} differs"
    # ... except EMA's average of BatchNorm's running statistics on node 1: those buffers are
    # rank-local (DDP overwrites them from rank zero at each forward, and each rank then updates them
    # with its own batch), and the checkpoint holds rank zero's average, which node 1 resumes with.
    running = [k for k in nodes[1]["full"]["ema"] if "running_mean" in k]
    assert running and any(not torch.equal(nodes[1]["full"]["ema"][k], nodes[1]["resumed"]["ema"][k])
                           for k in running)

    # only rank zero logs: node 0 wrote the metrics (with the bridge's traces), node 1 wrote nothing
    metrics = list((tmp_path / "node0").rglob("metrics.csv"))
    assert len(metrics) == 1
    assert "algorithm_traces/EMA/BATCH_END" in metrics[0].read_text().splitlines()[0]
    assert not list((tmp_path / "node1").rglob("*.csv"))
    assert sorted(p.name for p in (tmp_path / "shared").glob("*.ckpt")) == ["epoch=0.ckpt", "epoch=1.ckpt"]
