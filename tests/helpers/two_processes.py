"""The shape the 2-process tests share: launch 2 ranks, read what each saved, compare the ranks (and one process).

A 2-process script ends with each rank saving its results as ``rank{global_rank}.pt`` in its folder;
:func:`saved_by_each_rank` runs it (:func:`~helpers.support.run_ddp_script`) and returns ``[rank 0's,
rank 1's]``, :func:`rank_files` reads them after any other launch (the FSDP2 runs' file).
:func:`assert_ranks_train_as_one_process` is the comparison of the tests that train a model on two ranks,
each on half of every batch: both ranks end with the same weights, and they are one process's on the
whole batch.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.support import assert_same_weights, run_ddp_script

__all__ = ["assert_ranks_train_as_one_process", "rank_files", "saved_by_each_rank"]


def rank_files(result: subprocess.CompletedProcess, folder: Path, weights_only: bool = True) -> list[Any]:
    """What ranks 0 and 1 saved in ``folder`` (``rank0.pt``, ``rank1.pt``); the test fails with the launch's stderr
    if it did not exit with 0."""
    if result.returncode != 0:
        pytest.fail(f"the 2-process launch exited with {result.returncode}:\n{result.stderr[-6000:]}")
    return [torch.load(folder / f"rank{rank}.pt", weights_only=weights_only) for rank in (0, 1)]


def saved_by_each_rank(body: str, tmp_path: Path, weights_only: bool = True, timeout: float = 240) -> list[Any]:
    """Run the script ``body`` on 2 DDP ranks in ``tmp_path``; what each rank saved, ``[rank 0's, rank 1's]``."""
    return rank_files(run_ddp_script(body, tmp_path, timeout), tmp_path, weights_only)


def assert_ranks_train_as_one_process(ranks: list[dict[str, torch.Tensor]], single: torch.nn.Module,
                                      prefix: str = "", atol: float = 1e-5) -> None:
    """Both ranks' parameters are exactly equal, and within ``atol`` of ``single``'s (named ``prefix + name``).

    ``single`` trained in one process on each step's two half-batches together: the ranks' gradients are
    averaged, so they differ from its gradient by the order of the float sums only.
    """
    assert_same_weights(ranks[0], ranks[1])
    for name, value in single.named_parameters():
        torch.testing.assert_close(ranks[0][prefix + name], value.detach(), rtol=0, atol=atol)
