"""Shared pytest configuration: quiet Lightning, deterministic CPU runs, W&B offline."""

from __future__ import annotations

import logging
import os
import warnings

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_DISABLE_GIT", "true")
torch.set_num_threads(1)
if torch.cuda.is_available():
    # Exact-resumption checks on a GPU need deterministic cuBLAS, which reads this once, when it starts.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
if os.environ.get("COMPOSER_BRIDGE_TEST_ACCELERATOR", "cpu") != "cpu":
    torch.use_deterministic_algorithms(True, warn_only=True)

for name in ("lightning.pytorch", "lightning.fabric", "lightning", "pytorch_lightning"):
    logging.getLogger(name).setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message=".*does not have many workers.*")
warnings.filterwarnings("ignore", message=".*LeafSpec.*")
warnings.filterwarnings("ignore", message=".*GPU available but not used.*")
warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)
