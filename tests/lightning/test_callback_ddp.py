"""Real DDP: 2 CPU processes (gloo) launched by Lightning, the bridge on both ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.two_processes import saved_by_each_rank

SCRIPT = """
import json, sys, torch
from helpers.support import L
from helpers.support import image_loader, quiet_trainer, tiny_classifier
from composer_bridge import AlgorithmEngineCallback, Algorithm, Event

class HalveLoss(Algorithm):
    find_unused_parameters = True
    def match(self, event, state):
        return event in (Event.BEFORE_BACKWARD, Event.AFTER_DATALOADER, Event.FIT_START)
    def apply(self, event, state, logger):
        if event == Event.BEFORE_BACKWARD:
            state.loss = state.loss * 0.5
        elif event == Event.AFTER_DATALOADER:
            state.batch_set_item(0, state.batch_get_item(0) + state.rank)  # ranks see different data
        else:
            ddp = state.trainer.strategy.model
            state.extra["ddp"] = type(ddp).__name__
            state.extra["unused"] = bool(getattr(ddp, "find_unused_parameters", False))

L.seed_everything(0)
callback = AlgorithmEngineCallback([HalveLoss()])
trainer = quiet_trainer(strategy="ddp", devices=2, max_steps=3, callbacks=[callback])
model = tiny_classifier()
trainer.fit(model, image_loader(n=64, batch_size=8))
rank = trainer.global_rank
# parameters, not buffers: DDP syncs BatchNorm running stats from rank 0 at each forward, so the
# last step's local update differs between ranks by design.
torch.save({"weights": {k: v.detach() for k, v in model.named_parameters()},
            "extra": callback.state.extra, "rank": callback.state.rank, "world": callback.state.world_size,
            "steps": int(callback.state.timestamp.batch)}, f"rank{rank}.pt")
"""


@pytest.mark.timeout(300)
def test_ddp_two_processes_configure_unused_parameters_and_end_identical(tmp_path: Path) -> None:
    ranks = saved_by_each_rank(SCRIPT, tmp_path)
    for r, out in enumerate(ranks):
        assert out["rank"] == r and out["world"] == 2 and out["steps"] == 3
        assert out["extra"] == {"ddp": "DistributedDataParallel", "unused": True}
    for key, value in ranks[0]["weights"].items():
        assert torch.equal(value, ranks[1]["weights"][key]), key
