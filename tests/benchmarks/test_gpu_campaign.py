"""benchmarks/gpu_campaign.py, the GPU campaign's one command: without a GPU it refuses before running anything.

(Its steps run on a GPU only; ``--dry-run`` runs them on the CPU at toy sizes, by hand: minutes.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.support import load_script

campaign = load_script("benchmarks/gpu_campaign.py", "gpu_campaign")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the campaign would run")
def test_without_a_gpu_it_exits_2_naming_the_torch_and_the_fix_and_runs_nothing(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert campaign.main(["--out", str(tmp_path / "out")]) == 2
    message = capsys.readouterr().err
    assert f"no CUDA GPU: torch {torch.__version__}" in message and "Nothing was run" in message
    assert "Fix: run it on a machine with an NVIDIA GPU" in message
    assert not (tmp_path / "out").exists()


def test_the_steps_cover_tests_gpu_and_gpu_checks_within_nine_minutes(tmp_path: Path) -> None:
    steps = campaign.steps(tmp_path)
    commands = [" ".join(map(str, s["argv"])) for s in steps]
    assert any("tests/gpu" in c for c in commands) and any("benchmarks/gpu_checks.py" in c for c in commands)
    assert sum(s["limit"] for s in steps) <= 9 * 60


def test_pytest_counts_reads_the_final_line() -> None:
    output = "....\n=========== 12 passed, 1 skipped in 40.10s ===========\n"
    assert campaign.pytest_counts(output) == "12 passed, 1 skipped in 40.10s"
    assert campaign.pytest_counts("1 failed, 3 passed in 2.00s\n") == "1 failed, 3 passed in 2.00s"
    assert campaign.pytest_counts("Traceback ...") == ""
