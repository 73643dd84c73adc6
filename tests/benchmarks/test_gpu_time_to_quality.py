"""benchmarks/gpu_time_to_quality.py: the GPU's wall-clock time to quality, checked through its CPU dry run.

The dry run trains the same tasks and configurations at toy sizes on the CPU (a few seconds); the
JSON it writes must hold every run's point, and the strict speed-ups in it must be the shared
function's (composer_bridge.search.scoring.strict_speedup) applied to those points on the wall clock.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.support import load_script

from composer_bridge import recipes
from composer_bridge.search.scoring import strict_speedup

ttq = load_script("benchmarks/gpu_time_to_quality.py", "gpu_time_to_quality_under_test")

LENGTHS = ["2", "4", "8"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("ttq") / "ttq"
    code = ttq.main(["--dry-run", "--out", str(out), "--vision-lengths", *LENGTHS, "--language-lengths", *LENGTHS,
                     "--language-configs", "glu=GatedLinearUnits", "--commit", "abc1234"])
    assert code == 0
    return out, json.loads(out.with_suffix(".json").read_text())


def test_the_json_names_the_machine_and_holds_every_run_on_the_wall_clock(dry_run) -> None:
    _, report = dry_run
    machine = report["machine"]
    assert machine["torch"] == torch.__version__ and {"gpu", "cuda", "cudnn", "date", "lightning"} <= set(machine)
    assert machine["commit"] == "abc1234"  # --commit: a copy of the repository without git history
    assert report["clock"] == "wall" and report["dry_run"] is True and report["seeds"] == [0, 1]
    assert set(report["estimate"]["measured_s"]) == {"vision", "language"} and report["scaled_by"] == 1.0
    vision, language = report["tasks"]["vision"], report["tasks"]["language"]
    assert vision["configs"] == ["baseline", "mild"] and language["configs"] == ["baseline", "gpt-fast", "glu"]
    # both vision configurations run channels-last; the baseline nothing else
    assert vision["algorithms"]["baseline"] == ["ChannelsLast"] and "ChannelsLast" in vision["algorithms"]["mild"]
    assert language["algorithms"]["glu"] == ["GatedLinearUnits"]
    for task in (vision, language):
        assert task["budgets"] == [2, 4, 8]
        points = {(r["config"], r["seed"], r["budget"]) for r in task["runs"]}
        assert points == {(c, s, b) for c in task["configs"] for s in (0, 1) for b in (2, 4, 8)}
        assert all(r["clock"] == "wall" and r["wall_s"] > 0 for r in task["runs"])
        pick = max if task["higher_is_better"] else min
        for seed in (0, 1):  # where the baseline's best quality lies: is the longest run on its plateau?
            base = [r for r in task["runs"] if r["config"] == "baseline" and r["seed"] == seed]
            assert task["baseline_best_at"][str(seed)] == pick(base, key=lambda r: r["quality"])["budget"]


def test_the_speedups_are_the_shared_strict_speedup_of_the_points_on_the_wall_clock(dry_run) -> None:
    _, report = dry_run
    for task in report["tasks"].values():
        higher = task["higher_is_better"]

        def curve(config: str, seed: int, runs: list[dict[str, Any]] = task["runs"]) -> list[tuple[float, float]]:
            mine = sorted((r for r in runs if r["config"] == config and r["seed"] == seed), key=lambda r: r["budget"])
            return [(r["wall_s"], r["quality"]) for r in mine]

        for config in task["configs"][1:]:
            expected = [strict_speedup(curve("baseline", s), curve(config, s), higher)[0] for s in (0, 1)]
            got = task["speedups"][config]
            assert got["per_seed"] == pytest.approx(expected)
            assert got["mean"] == pytest.approx(statistics.mean(s or 0.0 for s in expected))
            assert got["reached"] == sum(s is not None for s in expected)


def test_one_quality_against_time_png_per_task(dry_run) -> None:
    out, report = dry_run
    for name, task in report["tasks"].items():
        png = out.parent / task["png"]
        assert png.name == f"{out.name}_{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the measurement would run")
def test_without_a_gpu_it_exits_2_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ttq.main(["--out", str(tmp_path / "ttq")]) == 2
    assert "gpu_time_to_quality: no CUDA GPU" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_language_configs_are_algorithm_names_resolved_at_run_time() -> None:
    config = ttq.parse_language_config('slw=GatedLinearUnits+SeqLengthWarmup{"duration": 0.3, "min_seq_length": 8, '
                                       '"max_seq_length": "{max_seq_length}"}', 64)
    glu, warmup = config.build(100)
    assert config.name == "slw" and type(glu).__name__ == "GatedLinearUnits"
    assert type(warmup).__name__ == "SeqLengthWarmup" and warmup.max_seq_length == 64  # the placeholder, filled
    recipe = ttq.parse_language_config("fast=gpt-fast", 64)
    published = recipes.language("gpt-fast", max_seq_length=64, total_steps=100)
    assert [type(a).__name__ for a in recipe.build(100)] == [type(a).__name__ for a in published]
    with pytest.raises(ValueError, match="GatedLinearUnits"):  # the close match, before any training
        ttq.parse_language_config("typo=GatedLinearUnit", 64)
    with pytest.raises(ValueError, match="NAME="):
        ttq.parse_language_config("GatedLinearUnits", 64)


def test_an_estimate_over_budget_shortens_every_run_by_one_factor_or_stops() -> None:
    args = ttq.parser().parse_args(["--dry-run", "--vision-lengths", "10", "20", "40", "--language-lengths", "10",
                                    "20", "40", "--budget-s", "100"])
    plan = ttq.plan_from(args)
    rates = {"vision": ttq.Rates(1.0, {"baseline": 0.5, "mild": 0.5}),
             "language": ttq.Rates(1.0, {"baseline": 0.5, "gpt-fast": 0.5})}
    # 24 runs: 24 s of fits and 2 x 2 x 2 x 70 steps x 0.5 s = 280 s of steps: 304 s
    assert sum(ttq.planned_seconds(plan, rates).values()) == pytest.approx(304.0)
    shorter, factor = ttq.fit_to_budget(plan, rates, elapsed=6.0)
    assert factor == pytest.approx((100 - 6 - 24) / 280)
    assert shorter.vision.budgets == shorter.language.budgets == (2, 5, 10)
    assert ttq.fit_to_budget(plan, rates, elapsed=90.0)[1] == 0.0  # not even the fits' own seconds fit: stop
    fits = ttq.fit_to_budget(ttq.plan_from(ttq.parser().parse_args(["--dry-run"])), rates, elapsed=0.0)
    assert fits[1] == 1.0


@pytest.mark.filterwarnings("ignore:LowPrecisionLayerNorm only helps")  # gpt-fast's, in the dry run's fp32
def test_a_configuration_that_fails_in_its_warm_up_is_left_out_and_recorded() -> None:
    class Broken:
        def build(self, total_steps: int) -> Any:
            raise RuntimeError("this algorithm cannot train here")

    plan = ttq.plan_from(ttq.parser().parse_args(["--dry-run", "--tasks", "language"]))
    plan = ttq.dataclasses.replace(plan, language_configs=(ttq.LanguageConfig("broken", (Broken(),)),))
    assert list(plan.configs("language")) == ["baseline", "gpt-fast", "broken"]
    kept, rates, _ = ttq.measure_rates(plan)
    assert list(kept.configs("language")) == ["baseline", "gpt-fast"] and set(rates["language"].per_step_s) == {
        "baseline", "gpt-fast"}
    assert dict(kept.dropped) == {"language/broken": "RuntimeError: this algorithm cannot train here"}
