"""On a CUDA GPU: benchmarks/pareto.py's GPU set-up (large vision, bf16-mixed, channels-last) runs and is timed on the device.

Skipped without CUDA (CI has none); the same code path runs on the CPU in
``tests/benchmarks/test_pareto.py::test_the_large_setup_trains_in_bf16_mixed_through_the_task_the_gpu_run_uses``
(narrow widths, 32 images). Here it runs at full width and batch on the device.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.support import load_script

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (the CPU path is in tests/benchmarks/test_pareto.py)")


@pytest.fixture(scope="module")
def pareto() -> Any:
    return load_script("benchmarks/pareto.py", "pareto_on_gpu")


def test_the_large_vision_setup_trains_on_the_gpu_in_bf16_with_channels_last(pareto: Any, monkeypatch: Any) -> None:
    seen: list[tuple[str, torch.dtype, tuple[int, ...], bool, bool]] = []
    build = pareto.vision_module

    def probed(total_steps: int, lr: float = 0.1, widths: tuple[int, ...] = pareto.VISION_WIDTHS) -> Any:
        module = build(total_steps, lr, widths)

        def record(m: torch.nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
            stem = m.stem[0].weight
            seen.append((out.device.type, out.dtype, tuple(args[0].shape[-2:]), m.training,
                         stem.is_contiguous(memory_format=torch.channels_last)))

        module.module.register_forward_hook(record)
        return module

    monkeypatch.setattr(pareto, "vision_module", probed)
    large = pareto.VISION_SETUPS["large"]
    task = pareto.vision_task(quick=True, setup=large, options=pareto.TrainerOptions("gpu", "bf16-mixed"))
    fit = task.train("mild", task.configs["mild"](6), 6, 0)
    training = [s for s in seen if s[3]]
    assert len(training) == 6
    assert {(device, dtype) for device, dtype, *_ in seen} == {("cuda", torch.bfloat16)}
    assert training[0][2] == (48, 48) and all(size[0] % 4 == 0 for _, _, size, *_ in training)
    assert all(channels_last for *_, channels_last in training)  # the recipe's ChannelsLast reached the device model
    assert 0.0 <= fit.quality <= 1.0 and fit.wall_s > 0.0


def test_the_gpu_command_records_synchronised_wall_time_and_names_the_gpu(pareto: Any, tmp_path: Path) -> None:
    """The documented command, shortened (--quick, one seed, no ablation): what runs.json and pareto.md record."""
    threads = torch.get_num_threads()
    try:
        result = pareto.main(["--tasks", "vision", "--vision-size", "large", "--accelerator", "gpu",
                              "--precision", "bf16-mixed", "--quick", "--seeds", "1", "--no-ablation",
                              "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)  # main sets one thread for the whole process
    data = json.loads((tmp_path / "runs.json").read_text())
    meta = data["meta"]
    assert (meta["accelerator"], meta["precision"], meta["vision_size"], meta["clock"]) == (
        "gpu", "bf16-mixed", "large", "wall")
    assert torch.cuda.get_device_name(0) in meta["machine"]
    assert meta["tasks"][0]["setup"]["image_size"] == 64
    assert {r["clock"] for r in data["runs"]} == {"wall"} and len(data["runs"]) == 2 * 3  # baseline, mild x 3 budgets
    assert all(r["wall_s"] > 0 for r in data["runs"])
    assert "precision bf16-mixed" in result["text"] and "device synchronised" in result["text"]
    assert (tmp_path / "pareto_vision.png").exists()
