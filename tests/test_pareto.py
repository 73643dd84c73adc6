"""benchmarks/pareto.py: the strict speed-up the Pareto benchmark and the demo report."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pareto():
    spec = importlib.util.spec_from_file_location("pareto_under_test", ROOT / "benchmarks" / "pareto.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


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
