"""benchmarks/pareto.py: the strict speed-up the Pareto benchmark and the demo report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.support import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pareto():
    return load_script("benchmarks/pareto.py", "pareto_under_test")


def test_time_to_reach_interpolates_between_budgets_and_never_extrapolates(pareto) -> None:
    curve = [(1.0, 0.5), (3.0, 0.9), (4.0, 0.95)]
    assert pareto.time_to_reach(curve, 0.7, True) == pytest.approx(2.0)  # half way from 0.5 to 0.9
    assert pareto.time_to_reach(curve, 0.4, True) == 1.0  # already there at the first budget
    assert pareto.time_to_reach(curve, 0.96, True) is None  # beyond the last budget: no extrapolation
    losses = [(1.0, 4.0), (2.0, 3.0), (4.0, 2.0)]  # lower is better
    assert pareto.time_to_reach(losses, 2.5, False) == pytest.approx(3.0)
    assert pareto.time_to_reach(losses, 1.9, False) is None


def test_strict_speedup_is_the_baselines_own_time_to_its_best_over_the_recipes(pareto) -> None:
    base = [(1.0, 0.80), (2.0, 0.90), (4.0, 0.96), (8.0, 0.95)]  # best at t=4, not at the last budget
    recipe = [(0.5, 0.85), (1.0, 0.92), (2.0, 0.98)]
    speed, q, t_base, t_recipe = pareto.strict_speedup(base, recipe, True)
    expected_t_recipe = 1.0 + (0.96 - 0.92) / (0.98 - 0.92) * 1.0
    assert (q, t_base) == (0.96, 4.0)  # not 8.0: the baseline's own first time at Q
    assert t_recipe == pytest.approx(expected_t_recipe, abs=1e-6)
    assert speed == pytest.approx(4.0 / expected_t_recipe, abs=1e-5)
    assert pareto.strict_speedup(base, [(0.5, 0.5), (9.0, 0.959)], True)[0] is None


def test_a_seed_that_never_reaches_q_counts_as_zero_in_the_mean(pareto) -> None:
    def run(config: str, budget: int, seed: int, quality: float, seconds: float):
        return pareto.Run("t", config, budget, seed, quality, seconds, seconds, 0.0)

    runs = []
    for seed in (0, 1, 2):
        runs += [run("baseline", 1, seed, 3.0, 1.0), run("baseline", 2, seed, 2.0, 2.0)]
    runs += [run("r", 1, 0, 2.5, 0.5), run("r", 2, 0, 1.5, 1.0)]  # reaches 2.0 at t=0.75: 2.0/0.75
    runs += [run("r", 1, 1, 2.0, 1.0), run("r", 2, 1, 1.9, 2.0)]  # reaches 2.0 at t=1.0: 2.0x
    runs += [run("r", 1, 2, 3.5, 1.0), run("r", 2, 2, 2.5, 2.0)]  # never: failure
    task = {"name": "t", "higher_is_better": False, "unit": "steps", "configs": ["baseline", "r"]}
    summary = pareto.summarise(task, runs)
    speeds = summary.speedups["r"]
    assert speeds["per_seed"][0] == pytest.approx(2.0 / 0.75, abs=1e-5)
    assert speeds["per_seed"][1:] == [pytest.approx(2.0), None]
    assert speeds["reached"] == 2 and speeds["mean"] == pytest.approx((2.0 / 0.75 + 2.0 + 0.0) / 3, abs=1e-5)
    assert "fail" in summary.table and summary.best == "r"


def test_the_curve_check_holds_a_cheaper_recipe_at_its_last_quality_after_its_last_run(pareto) -> None:
    def run(config: str, budget: int, quality: float, seconds: float):
        return pareto.Run("t", config, budget, 0, quality, seconds, seconds, 0.0)

    base = [run("baseline", b, q, t) for b, q, t in [(1, 0.5, 1.0), (2, 0.8, 2.0), (4, 0.9, 4.0), (8, 0.95, 8.0)]]
    # Cheaper per step and better at every budget: its longest run ends (at 6 s) before the baseline's.
    cheaper = [run("cheaper", b, q, t) for b, q, t in [(1, 0.6, 0.75), (2, 0.85, 1.5), (4, 0.93, 3.0), (8, 0.96, 6.0)]]
    # Just as cheap, but its longest run ends below the baseline's: holding its last quality is not enough.
    short = [run("short", b, q, t) for b, q, t in [(1, 0.6, 0.75), (2, 0.85, 1.5), (4, 0.93, 3.0), (8, 0.94, 6.0)]]
    task = {"name": "t", "higher_is_better": True, "unit": "steps", "configs": ["baseline", "cheaper", "short"]}
    speeds = pareto.summarise(task, base + cheaper + short).speedups
    assert speeds["cheaper"]["above_from_middle"] == "yes"
    assert speeds["short"]["above_from_middle"] == "no"
    assert pareto.quality_by([(1.0, 0.5), (3.0, 0.9)], 2.0) == pytest.approx(0.7)
    assert pareto.quality_by([(1.0, 0.5), (3.0, 0.9)], 5.0) == 0.9  # held, not extrapolated
    assert pareto.quality_by([(1.0, 0.5), (3.0, 0.9)], 0.5) is None


def test_timing_repeats_keep_the_least_cpu_time_and_refuse_a_quality_that_does_not_repeat(pareto) -> None:
    times = iter([1.4, 1.1, 1.3, 2.0, 2.0])
    qualities = iter([0.9, 0.9, 0.9, 0.9, 0.8])
    built = []

    def train(config, algorithms, steps, seed):
        built.append(algorithms)
        seconds = next(times)
        return next(qualities), seconds, seconds + 0.1, None

    task = pareto.Task("toy", "steps", "accuracy", True, [4], {"r": lambda steps: [object()]}, train, lambda b: b)
    run = pareto._run_one(task, "r", lambda: pareto._algorithms(task, "r", 4), 4, 0, False, repeats=3)
    assert (run.quality, run.cpu_s, run.cpu_repeats) == (0.9, 1.1, [1.4, 1.1, 1.3])
    assert run.wall_s == pytest.approx(1.2)
    assert len({id(a) for a in built}) == 3 and len({id(a[0]) for a in built}) == 3  # fresh algorithms each time
    with pytest.raises(RuntimeError, match=r"different qualities \[0.8, 0.9\].*--timing-repeats 1"):
        pareto._run_one(task, "r", lambda: pareto._algorithms(task, "r", 4), 4, 0, False, repeats=2)


# --- the GPU options, proven on the CPU -------------------------------------------------------------


def test_the_clock_is_cpu_time_on_the_cpu_and_synchronised_wall_time_on_a_gpu(pareto) -> None:
    assert pareto.training_clock("cpu") == "cpu"
    assert pareto.training_clock("gpu") == "wall"
    with pytest.raises(ValueError, match=r"accelerator='tpu'.*'cpu' or 'gpu'"):
        pareto.training_clock("tpu")
    # The curves, tables and speed-ups read the chosen clock: here wall time is half the CPU time.
    def run(config: str, budget: int, quality: float, cpu: float, clock: str):
        return pareto.Run("t", config, budget, 0, quality, cpu, cpu / 2, 0.0, clock=clock)

    for clock, scale in (("cpu", 1.0), ("wall", 0.5)):
        runs = [run("baseline", 1, 0.5, 2.0, clock), run("baseline", 2, 0.9, 4.0, clock),
                run("r", 1, 0.7, 1.0, clock), run("r", 2, 0.95, 3.0, clock)]
        assert [r.seconds for r in runs] == [scale * c for c in (2.0, 4.0, 1.0, 3.0)]
        expected = pareto.strict_speedup([(2.0 * scale, 0.5), (4.0 * scale, 0.9)],
                                         [(1.0 * scale, 0.7), (3.0 * scale, 0.95)], True)[0]
        summary = pareto.summarise({"name": "t", "higher_is_better": True, "unit": "steps"}, runs)
        assert summary.speedups["r"]["per_seed"] == [expected]
        assert f"0.9000 in {4.0 * scale:.1f} s" in summary.table
    with pytest.raises(ValueError, match="different clocks"):
        pareto._clock_of([run("baseline", 1, 0.5, 2.0, "cpu"), run("baseline", 2, 0.9, 4.0, "wall")])


def test_the_timeline_synchronises_a_cuda_device_where_it_starts_and_stops(pareto, monkeypatch) -> None:
    """On a GPU the wall time must include the queued work: the timeline waits for the device (no GPU needed)."""
    from types import SimpleNamespace

    synced: list[Any] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    for device, expected in ((torch.device("cpu"), 0), (torch.device("cuda", 0), 2)):
        synced.clear()
        trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=device), sanity_checking=False)
        timeline = pareto.vision.AccuracyTimeline()
        timeline.on_train_start(trainer, None)
        timeline.on_train_end(trainer, None)
        assert len(synced) == expected, device
        assert timeline.train_seconds > 0.0


def _bilinear_weights(size_in: int, size_out: int) -> torch.Tensor:
    """Bilinear resampling (half-pixel centres, edges clamped) as a matrix: out = W @ in."""
    weights = torch.zeros(size_out, size_in, dtype=torch.float64)
    for j in range(size_out):
        c = max((j + 0.5) * size_in / size_out - 0.5, 0.0)
        i0 = min(int(c), size_in - 1)
        i1, w = min(i0 + 1, size_in - 1), c - int(c)
        weights[j, i0] += 1 - w
        weights[j, i1] += w
    return weights


def test_the_large_vision_setup_upsamples_the_digits_once_bilinearly(pareto) -> None:
    from composer_bridge.data import digits_datasets

    large = pareto.VISION_SETUPS["large"]
    train, val = pareto.vision_loaders(large, seed=1)
    small_train, small_val = digits_datasets(seed=1)
    images, labels = train.dataset.tensors
    assert images.shape == (len(small_train), 1, 64, 64) and len(val.dataset) == len(small_val)
    assert torch.equal(labels, small_train.tensors[1])
    w = _bilinear_weights(8, 64)
    reference = w @ small_train.tensors[0][:5, 0].double() @ w.T
    torch.testing.assert_close(images[:5, 0].double(), reference, rtol=1e-5, atol=1e-5)
    assert train.batch_size == large.batch_size == 128
    model = pareto.vision_module(92, widths=large.widths)
    assert model(torch.zeros(2, 1, 64, 64)).shape == (2, 10)
    # The small set-up is the committed CPU one, unchanged.
    assert pareto.VISION_SETUPS["small"] == pareto.VisionSetup("small", 8, (16, 32), 64, (12, 23, 46, 92), (12, 23, 46))


def test_the_demos_cluttered_setup_is_cluttered_digits_at_16_pixels_and_its_recipe_fits_them(pareto) -> None:
    from composer_bridge.data import cluttered_digits_datasets

    setup = pareto.VISION_SETUPS["cluttered"]
    train, val = pareto.vision_loaders(setup, seed=2)
    expected_train, expected_val = cluttered_digits_datasets(image_size=16, copies=2, train_per_class=50)
    assert torch.equal(train.dataset.tensors[0], expected_train.tensors[0])
    assert torch.equal(val.dataset.tensors[1], expected_val.tensors[1])
    assert len(train.dataset) == 1000 and train.batch_size == 32
    # The seed orders the batches (two seeds, two orders), not the task.
    other, _ = pareto.vision_loaders(setup, seed=3)
    assert not torch.equal(next(iter(train))[1], next(iter(other))[1])
    # mild's ProgressiveResizing starts at 12x12 of the 16x16 images and grows by 4 pixels.
    resizing = [a for a in pareto.vision_recipe("mild", setup.image_size)(300) if type(a).__name__ == "ProgressiveResizing"]
    assert (resizing[0].initial_scale, resizing[0].size_increment) == (0.75, 4)
    fit = pareto.vision_train("baseline", [], 2, 0, setup=setup)
    assert 0.0 <= fit.quality <= 1.0 and fit.cpu_s > 0


def test_the_large_setup_trains_in_bf16_mixed_through_the_task_the_gpu_run_uses(pareto, monkeypatch) -> None:
    """On the CPU, with narrow widths and 32 images so it is quick: precision, image size and recipe reach the run."""
    import dataclasses

    from torch.utils.data import DataLoader, Subset

    setup = dataclasses.replace(pareto.VISION_SETUPS["large"], widths=(8, 16, 32), batch_size=4)
    loaders = pareto.vision_loaders

    def few_images(setup, seed):
        train, val = loaders(setup, seed)
        return (DataLoader(Subset(train.dataset, range(32)), batch_size=setup.batch_size, shuffle=True,
                           generator=torch.Generator().manual_seed(seed)),
                DataLoader(Subset(val.dataset, range(16)), batch_size=16))

    seen: list[tuple[tuple[int, ...], torch.dtype, bool]] = []
    build = pareto.vision_module

    def probed(total_steps, lr=0.1, widths=pareto.VISION_WIDTHS):
        module = build(total_steps, lr, widths)
        module.module.register_forward_hook(lambda m, args, out: seen.append(
            (tuple(args[0].shape[-2:]), out.dtype, m.training)))
        return module

    monkeypatch.setattr(pareto, "vision_loaders", few_images)
    monkeypatch.setattr(pareto, "vision_module", probed)
    task = pareto.vision_task(quick=True, setup=setup, options=pareto.TrainerOptions("cpu", "bf16-mixed"))
    algorithms = task.configs["mild"](3)
    assert "ChannelsLast" in pareto._names(algorithms)
    fit = task.train("mild", algorithms, 3, 0)
    training = [(size, dtype) for size, dtype, is_training in seen if is_training]
    # ProgressiveResizing starts at three quarters of the side (48 of 64, as 6 of 8) and grows in
    # 4-pixel steps (the last of 3 steps is part-way up its ramp: 60).
    assert [size for size, _ in training] == [(48, 48), (48, 48), (60, 60)]
    assert {dtype for _, dtype in training} == {torch.bfloat16}  # bf16-mixed reached the Trainer
    # Not training: ProgressiveResizing's size probe at the first batch (one example at the full and at the
    # smallest size it will use, in eval mode), then validation at the full size.
    assert [size for size, _, is_training in seen if not is_training] == [(64, 64), (48, 48), (64, 64)]
    assert 0.0 <= fit.quality <= 1.0 and fit.cpu_s > 0 and fit.wall_s > 0
    assert task.details["setup"]["image_size"] == 64


def test_an_old_cpu_runs_file_replots_as_before(pareto, tmp_path) -> None:
    """A runs.json from before --accelerator (no clock anywhere) is timed in CPU seconds, as it was."""
    import json

    path = ROOT / "benchmarks" / "pareto_runs_cpu_short_retimed2.json"
    data = json.loads(path.read_text())
    assert "clock" not in data["meta"] and all("clock" not in r for r in data["runs"])
    result = pareto.main(["--replot", str(path), "--out", str(tmp_path)])
    assert {r.clock for r in result["runs"]} == {"cpu"}
    assert "Trainer:" not in result["text"]  # the report of an old file is unchanged
    # Independent of the module's Run: each seed's strict speed-up from the file's own cpu_s.
    grid = [r for r in data["runs"] if r["task"] == "vision" and not r["ablation"]]
    summary = pareto.summarise(data["meta"]["tasks"][0], result["runs"])

    def curve(name: str, seed: int) -> list[tuple[float, float]]:
        return [(r["cpu_s"], r["quality"]) for r in sorted(grid, key=lambda r: r["budget"])
                if r["config"] == name and r["seed"] == seed]

    assert summary.speedups
    for config, speeds in summary.speedups.items():
        for seed, speed in zip(sorted({r["seed"] for r in grid}), speeds["per_seed"], strict=True):
            assert speed == pareto.strict_speedup(curve("baseline", seed), curve(config, seed), True)[0]
    assert (tmp_path / "pareto_vision.png").stat().st_size > 10_000
