"""The resumption matrix's cross-section on DDP: 2 CPU processes (gloo) launched by Lightning.

The issue's point (``ModelCheckpoint(every_n_train_steps=N)`` at an epoch's last batch) for plain
Lightning (the oracle), CutOut and MixUp: on each rank, the resumed run ends with the uninterrupted
run's weights, optimizer state and bridge state (``torch.equal``), and both ranks hold the same weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.two_processes import saved_by_each_rank

ALGORITHMS = ("plain", "CutOut", "MixUp")

SCRIPT = f"""
from pathlib import Path
import torch
from helpers.resume_points import POINTS, differences, lightning_api, resume
from helpers.support import LIGHTNING_PACKAGE

api = lightning_api(LIGHTNING_PACKAGE)
point = POINTS["every_n_train_steps, epoch's last batch"]
out = {{}}
for algorithm in {ALGORITHMS!r}:
    full, resumed = resume(api, algorithm, point, Path(algorithm), trainer=dict(strategy="ddp", devices=2, accelerator="cpu"))
    out[algorithm] = {{"differences": differences(full, resumed), "weights": resumed.weights,
                      "steps": None if resumed.bridge is None else resumed.bridge["timestamp"]["batch"]}}
torch.save(out, f"rank{{torch.distributed.get_rank()}}.pt")
"""


@pytest.mark.timeout(300)
def test_ddp_resumes_exactly_from_an_epochs_last_batch(tmp_path: Path) -> None:
    ranks = saved_by_each_rank(SCRIPT, tmp_path, weights_only=False)
    for rank, out in enumerate(ranks):
        for algorithm in ALGORITHMS:
            assert out[algorithm]["differences"] == [], (rank, algorithm)
            assert out[algorithm]["steps"] in (None, 9), (rank, algorithm)
    for algorithm in ALGORITHMS:
        # parameters: DDP keeps them identical on both ranks (BatchNorm's running stats are per rank)
        for key, value in ranks[0][algorithm]["weights"].items():
            if "running" not in key and "num_batches" not in key:
                assert torch.equal(value, ranks[1][algorithm]["weights"][key]), (algorithm, key)
