"""Real DDP (2 CPU processes, gloo): a mixed recipe ends identical on both ranks, only rank zero logs,
and an algorithm failing on one rank ends both processes with the error shown instead of hanging."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from helpers.support import run_ddp_script
from helpers.two_processes import saved_by_each_rank

MIXED = """
import torch
from helpers.support import L
from helpers.support import image_loader, quiet_trainer, tiny_classifier
from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import BlurPool, CutOut, EMA, GradientClipping, LayerFreezing

L.seed_everything(0)
algorithms = [BlurPool(min_channels=1), CutOut(length=0.25), EMA(half_life="2ba"),
              LayerFreezing(freeze_start=0.3, freeze_level=0.5), GradientClipping("norm", 1.0)]
callback = AlgorithmEngineCallback(algorithms, trace_mode="every_event")
logger = L.loggers.CSVLogger("logs", name="mixed")
trainer = quiet_trainer(strategy="ddp", devices=2, max_epochs=3, limit_train_batches=3, logger=logger,
                        callbacks=[callback])
model = tiny_classifier()
trainer.fit(model, image_loader(n=96, batch_size=8))
torch.save({"params": {k: v.detach() for k, v in model.named_parameters()},
            "ema": algorithms[2].ema_weights, "frozen": list(algorithms[3].frozen)}, f"rank{trainer.global_rank}.pt")
"""


@pytest.mark.timeout(300)
def test_mixed_recipe_under_ddp_ends_identical_and_only_rank_zero_logs(tmp_path: Path) -> None:
    ranks = saved_by_each_rank(MIXED, tmp_path)
    assert ranks[0]["frozen"] and ranks[0]["frozen"] == ranks[1]["frozen"]
    for key, value in ranks[0]["params"].items():
        assert torch.equal(value, ranks[1]["params"][key]), key
    for key, value in ranks[0]["ema"].items():
        if value.is_floating_point() and "running" not in key:
            assert torch.equal(value, ranks[1]["ema"][key]), key
    metrics = list((tmp_path / "logs").rglob("metrics.csv"))
    assert len(metrics) == 1, "one metrics file: rank zero's"
    assert "algorithm_traces/EMA/BATCH_END" in metrics[0].read_text().splitlines()[0]


ONE_RANK_FAILS = """
from helpers.support import L
from datetime import timedelta
DDPStrategy = L.strategies.DDPStrategy
from helpers.support import image_loader, quiet_trainer, tiny_classifier
from composer_bridge import AlgorithmEngineCallback, Algorithm, Event

class FailOnRankOne(Algorithm):
    def match(self, event, state):
        return event == Event.BEFORE_LOSS and state.rank == 1 and int(state.timestamp.batch) == 2
    def apply(self, event, state, logger):
        raise RuntimeError("rank one broke")

strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60))
trainer = quiet_trainer(strategy=strategy, devices=2, max_steps=6, callbacks=[AlgorithmEngineCallback([FailOnRankOne()])])
trainer.fit(tiny_classifier(), image_loader(n=96, batch_size=8))
print("RANK", trainer.global_rank, "FINISHED")
"""


@pytest.mark.timeout(300)
def test_an_algorithm_failing_on_one_rank_ends_both_processes_with_the_error(tmp_path: Path) -> None:
    try:
        result = run_ddp_script(ONE_RANK_FAILS, tmp_path, timeout=180)
    except subprocess.TimeoutExpired:  # pragma: no cover - the failure this test exists to catch
        pytest.fail("DDP hung after an algorithm failed on one rank")
    assert result.returncode != 0
    assert "FailOnRankOne failed at Event.BEFORE_LOSS: RuntimeError: rank one broke" in result.stderr
    assert "FINISHED" not in result.stdout
