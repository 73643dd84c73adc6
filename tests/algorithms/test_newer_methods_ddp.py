"""The newer methods on 2 processes (gloo).

QKNorm on fused-qkv attention and Compile: every rank ends with the same weights, and they are the weights one
process reaches on the whole batch (each rank trains on half of it). ScheduleFree on a plain module with
BatchNorm: every rank ends with the same averaged weights, and each recomputes the statistics from its own
last batches' inputs, as documented (the bridge adds no communication of its own)."""

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
    from helpers.two_processes import assert_ranks_train_as_one_process, saved_by_each_rank

    ranks = saved_by_each_rank(DDP_SCRIPT, tmp_path)
    assert "attn.q_norm.weight" in ranks[0]  # QKNorm's scales were trained, under the module's own names
    single = ViTModule()
    quiet_trainer(max_steps=3, max_epochs=-1,
                  callbacks=[AlgorithmEngineCallback([Compile(backend="eager"), QKNorm()], seed=0)]).fit(
        single, ResumableLoader(dataset(), batch_size=16))  # each step's two half-batches together
    assert_ranks_train_as_one_process(ranks, single)


BATCHNORM_SCRIPT = """
import os
import torch
from helpers.support import L, ResumableLoader, image_dataset, quiet_trainer, weights_of
from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import ScheduleFree
from algorithms.test_schedule_free_plain_batchnorm import PlainResNet

class Recording(PlainResNet):
    def training_step(self, batch, batch_idx):
        self.inputs.append(batch[0].clone())
        return super().training_step(batch, batch_idx)

model = Recording()
model.inputs = []
rank = int(os.environ.get("LOCAL_RANK", 0))
checkpoint = L.callbacks.ModelCheckpoint(dirpath=".", every_n_train_steps=4, save_top_k=-1)
trainer = quiet_trainer(strategy="ddp", devices=2, max_steps=4, max_epochs=-1, use_distributed_sampler=False,
                        callbacks=[AlgorithmEngineCallback([ScheduleFree(batchnorm_batches=2)], seed=1), checkpoint],
                        enable_checkpointing=True)
trainer.fit(model, ResumableLoader(image_dataset(n=64), batch_size=8, rank=rank, world_size=2))
torch.save({"weights": weights_of(model), "inputs": model.inputs[-2:]}, f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(300)
def test_ddp_schedule_free_on_a_plain_batchnorm_module_recomputes_each_ranks_statistics_at_x(tmp_path: Path) -> None:
    from algorithms.test_schedule_free_plain_batchnorm import PlainResNet
    from helpers.support import weights_of
    from helpers.two_processes import saved_by_each_rank

    pytest.importorskip("schedulefree")
    ranks = saved_by_each_rank(BATCHNORM_SCRIPT, tmp_path)
    params = {name for name, _ in PlainResNet().named_parameters()}
    assert_same_weights(*({k: v for k, v in r["weights"].items() if k in params} for r in ranks))
    for rank in ranks:  # by hand: at x, a plain average of the statistics over this rank's last 2 inputs
        expected = PlainResNet()
        expected.load_state_dict(rank["weights"])
        norms = [m for m in expected.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None
        expected.train()
        with torch.no_grad():
            for x in rank["inputs"]:
                expected(x)
        assert_same_weights(weights_of(expected), rank["weights"])
    stats = [k for k in ranks[0]["weights"] if k.endswith("running_mean")]
    assert any(not torch.equal(ranks[0]["weights"][k], ranks[1]["weights"][k]) for k in stats)  # each its own
    saved = torch.load(tmp_path / "epoch=0-step=4.ckpt", weights_only=True)["state_dict"]
    assert_same_weights(ranks[0]["weights"], saved)  # the checkpoint holds rank 0's model at x
