"""QKNorm on fused-qkv attention and Compile, on 2 processes (gloo): every rank ends with the same weights, and
they are the weights one process reaches on the whole batch (each rank trains on half of it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.support import ResumableLoader, assert_same_weights, quiet_trainer
from torch.utils.data import TensorDataset

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import Compile, QKNorm

DDP_SCRIPT = """
import os
import torch
from helpers.support import ResumableLoader, quiet_trainer
from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import Compile, QKNorm
from algorithms.test_newer_methods_ddp import dataset
from algorithms.test_qk_norm_fused import ViTModule

model = ViTModule()
trainer = quiet_trainer(strategy="ddp", devices=2, max_steps=3, max_epochs=-1, use_distributed_sampler=False,
                        callbacks=[AlgorithmEngineCallback([Compile(backend="eager"), QKNorm()], seed=0)])
rank = int(os.environ.get("LOCAL_RANK", 0))
trainer.fit(model, ResumableLoader(dataset(), batch_size=8, rank=rank, world_size=2))
assert type(model.attn.q_norm).__name__ == "HeadRMSNorm", type(model.attn.q_norm)
torch.save({k: v.detach() for k, v in model.named_parameters()}, f"rank{trainer.global_rank}.pt")
"""


def dataset() -> TensorDataset:
    from algorithms.test_qk_norm_fused import DIM

    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(64, 6, DIM, generator=g), torch.randint(0, 3, (64,), generator=g))


@pytest.mark.timeout(300)
def test_ddp_two_processes_train_fused_qknorm_compiled_as_one_process_does(tmp_path: Path) -> None:
    from algorithms.test_qk_norm_fused import ViTModule
    from helpers.support import run_ddp_script

    result = run_ddp_script(DDP_SCRIPT, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert_same_weights(ranks[0], ranks[1])
    assert "attn.q_norm.weight" in ranks[0]  # QKNorm's scales were trained, under the module's own names
    single = ViTModule()
    quiet_trainer(max_steps=3, max_epochs=-1,
                  callbacks=[AlgorithmEngineCallback([Compile(backend="eager"), QKNorm()], seed=0)]).fit(
        single, ResumableLoader(dataset(), batch_size=16))  # each step's two half-batches together
    for name, value in single.named_parameters():
        torch.testing.assert_close(ranks[0][name], value.detach(), rtol=0, atol=1e-5)
