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
# Another vector width, as another x86-64 CPU would have it: ATEN_CPU_CAPABILITY (default, avx2, avx512) picks
# ATen's kernels and, unless told otherwise, inductor's; COMPOSER_BRIDGE_TEST_SIMDLEN forces inductor's C++ vector
# width (torch._inductor.config.cpp.simdlen: 1 for scalar code, 256, 512; torch reads no variable for it). CI runs
# the compiled, fused and low-precision tests with another width too (.ci/run). Inductor's compiled-code cache is
# not keyed by the width (its code for one width, run under another, gave NaNs), so each width gets its own.
_width = (os.environ.get("ATEN_CPU_CAPABILITY", ""), os.environ.get("COMPOSER_BRIDGE_TEST_SIMDLEN", ""))
if any(_width):
    import getpass
    import tempfile

    if _width[1]:
        import torch._inductor.config

        torch._inductor.config.cpp.simdlen = int(_width[1])
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_{_width[0] or 'auto'}_simd{_width[1] or 'auto'}"))
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
