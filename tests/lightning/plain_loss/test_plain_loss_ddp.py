"""Real DDP (2 CPU processes, gloo): the loss algorithms on a plain module train the weights the ComposerModule path does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.two_processes import saved_by_each_rank

SCRIPT = """
import torch, torch.nn.functional as F
import lightning as L
from helpers.support import image_loader, quiet_trainer
from composer_bridge import AlgorithmEngineCallback, ComposerClassifier
from composer_bridge.algorithms import LabelSmoothing, MixUp

def network():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 4))

class Plain(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = network()
    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

composer = ComposerClassifier(network(), 4, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
plain = Plain()
for model in (plain, composer):
    trainer = quiet_trainer(strategy="ddp", devices=2, max_steps=3, use_distributed_sampler=True,
                            callbacks=[AlgorithmEngineCallback([LabelSmoothing(0.2), MixUp(0.5)], seed=1)])
    trainer.fit(model, image_loader(n=64, batch_size=8))
torch.save({"plain": {k: v.detach() for k, v in plain.net.state_dict().items()},
            "composer": {k: v.detach() for k, v in composer.module.state_dict().items()}},
           f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(300)
def test_ddp_plain_module_equals_the_composer_module_on_every_rank(tmp_path: Path) -> None:
    ranks = saved_by_each_rank(SCRIPT, tmp_path)
    for out in ranks:
        for key, value in out["composer"].items():
            assert torch.equal(out["plain"][key], value), key
    torch.manual_seed(0)
    start = torch.nn.Linear(64, 4).weight.detach()  # the untrained weights
    assert not torch.equal(ranks[0]["plain"]["1.weight"], start)
    for key, value in ranks[0]["plain"].items():
        assert torch.equal(value, ranks[1]["plain"][key]), key
