"""tests/gpu: deterministic cuBLAS for the exact-resumption checks.

cuBLAS reads ``CUBLAS_WORKSPACE_CONFIG`` once, when it starts; pytest imports this file at
collection, before any test touches the GPU, so setting it here is early enough.
"""

from __future__ import annotations

import os

import torch

if torch.cuda.is_available():
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
