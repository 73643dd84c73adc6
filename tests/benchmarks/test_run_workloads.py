"""benchmarks/run_workloads.py: the workloads benchmark's dry run, its resumption, its scores and every workload."""

from __future__ import annotations

import json
import math
import statistics

import pytest
from helpers.support import load_script

bench = load_script("benchmarks/run_workloads.py", "run_workloads_under_test")
import workloads  # noqa: E402  (benchmarks/ is on the path once the script is loaded)
from workloads import scores  # noqa: E402
from workloads.curve_fit import FitSpec, run_curve_fit  # noqa: E402


def _fits(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "fits.jsonl").read_text().splitlines()]


def _best(points: list[dict], mode: str) -> float:
    values = [p["quality"] for p in points]
    return max(values) if mode == "max" else min(values)


def test_the_dry_run_fixes_targets_before_the_methods_and_scores_them_on_seeds_nothing_else_touched(tmp_path) -> None:
    out = tmp_path / "w"
    results = bench.main(["--dry-run", "--executor", "local", "--no-progress", "--out", str(out),
                          "--workloads", "cluttered_resnet", "ctr", "--configs", "baseline", "LabelSmoothing", "search"])
    saved = json.loads((out / "results.json").read_text())
    assert saved["workloads"].keys() == {"cluttered_resnet", "ctr"} and (out / "profiles.png").exists()
    fits = _fits(out)
    for name, entry in saved["workloads"].items():
        mode = entry["mode"]
        assert set(entry["heldout_seeds"]).isdisjoint(entry["target_seeds"] + entry["tuning_seeds"])
        # the learning rate is the grid's best on the tuning seeds; the target is the median of the target fits' best
        tuning = [f for f in fits if f["workload"] == name and f.get("phase") == "tune"]
        by_lr = {}
        for f in tuning:
            by_lr.setdefault(f["lr"], []).append(_best(f["points"], mode))
        pick = (max if mode == "max" else min)(by_lr, key=lambda lr: statistics.mean(by_lr[lr]))
        assert entry["lr"] == pick
        targets = [f for f in fits if f["workload"] == name and f.get("phase") == "target"]
        assert sorted(f["seed"] for f in targets) == entry["target_seeds"] and {f["lr"] for f in targets} == {pick}
        assert entry["target"] == statistics.median(_best(f["points"], mode) for f in targets)
        # every configuration's time to target, recomputed from its recorded validations
        for config, row in entry["configs"].items():
            assert set(row["seeds"]) == {str(s) for s in entry["heldout_seeds"]}, config
            for seed, got in row["seeds"].items():
                # every configuration trains the held-out length but the search's pick, which trains its
                # prescription's length (what it hands over)
                steps = entry["search"]["steps"] if config == "search" else entry["run_steps"]
                assert row["steps"] == steps
                key = FitSpec(name, config, tuple((a, k) for a, k in row["algorithms"]), int(seed), entry["lr"],
                              steps, entry["eval_every"]).key
                fit = next(f for f in fits if f["key"] == key)  # a search that picks nothing shares the baseline's fits
                assert fit["total_steps"] == steps and (config == "search" or steps > entry["budget_steps"])
                first = next((p for p in fit["points"] if (p["quality"] >= entry["target"] if mode == "max"
                                                           else p["quality"] <= entry["target"])), None)
                expected = (None, None) if first is None or first["cpu_s"] > entry["cap_seconds"] else (
                    first["step"], first["cpu_s"])
                assert (got["steps"], got["seconds"]) == expected
        search = entry["search"]  # the prescription search: never a held-out seed
        used = search["search_seeds"] + search["finalist_seeds"] + search["confirm_seeds"]
        assert set(used).isdisjoint(entry["heldout_seeds"]) and len(set(used)) == len(used)
        assert set(search["search_seeds"] + search["finalist_seeds"]) <= set(entry["target_seeds"])
        assert "search" in entry["configs"] or search["error"]
        if not search["error"]:
            # it aims at the workload's target, and hands over a run of one of its lengths
            assert search["prescription"]["target"] == entry["target"]
            assert search["steps"] in search["run_lengths"] and max(search["run_lengths"]) == entry["run_steps"]
            # its baseline run is the user's: the reference fit, read, not trained by the search
            reference = [f for f in fits if f["workload"] == name and f.get("phase") == "reference"]
            assert [(f["seed"], f["total_steps"]) for f in reference] == [(entry["target_seeds"][0], entry["run_steps"])]
            assert search["decisions"][0].startswith(f"baseline @ {entry['run_steps']} steps on seed "
                                                     f"{entry['target_seeds'][0]} (your run, given)")
    assert {"baseline", "LabelSmoothing"} <= set(saved["scores"]) and all(0 <= v <= 1 for v in saved["scores"].values())
    assert results["scores"] == saved["scores"]


def test_a_run_killed_halfway_trains_only_the_fits_it_lacks(tmp_path) -> None:
    out = tmp_path / "w"
    args = ["--dry-run", "--executor", "local", "--no-progress", "--no-search", "--out", str(out),
            "--workloads", "signal_cnn", "--configs", "baseline", "LabelSmoothing"]
    bench.main(args)
    lines = (out / "fits.jsonl").read_text().splitlines()
    first = json.loads((out / "results.json").read_text())
    bench.main(args)  # nothing missing: nothing trained
    assert (out / "fits.jsonl").read_text().splitlines() == lines
    # killed after the tuning and target fits, in the middle of writing the next line
    kept = [line for line in lines if json.loads(line)["phase"] != "heldout"]
    (out / "fits.jsonl").write_text("\n".join(kept) + "\n" + lines[-1][: len(lines[-1]) // 2])
    bench.main(args)
    again = [json.loads(line) for line in (out / "fits.jsonl").read_text().splitlines()[len(kept):]]
    assert sorted(f["key"] for f in again) == sorted(json.loads(line)["key"] for line in lines if line not in kept)
    assert all(f["phase"] == "heldout" for f in again)
    assert json.loads((out / "results.json").read_text())["workloads"]["signal_cnn"]["target"] == (
        first["workloads"]["signal_cnn"]["target"])


def test_performance_profiles_and_the_score_follow_algoperf() -> None:
    times = {"a": {"w1": 10.0, "w2": 30.0, "w3": math.inf},
             "b": {"w1": 20.0, "w2": 10.0, "w3": 40.0},
             "c": {"w1": 50.0, "w2": math.inf, "w3": math.inf}}
    r = scores.ratios(times)
    assert r["a"] == {"w1": 1.0, "w2": 3.0, "w3": math.inf} and r["b"] == {"w1": 2.0, "w2": 1.0, "w3": 1.0}
    # a configuration measured on some workloads only has ratios there (not failures elsewhere)
    assert scores.ratios({**times, "d": {"w1": 5.0}})["d"] == {"w1": 1.0} and scores.ratios(
        {**times, "d": {"w2": 20.0}})["d"] == {"w2": 2.0}
    assert scores.profile(r["a"], [1.0, 2.9, 3.0, 100]) == [1 / 3, 1 / 3, 2 / 3, 2 / 3]
    # area from 1 to 4 of the step function, over 3: a = (3 + 1 + 0) / 9, b = (2 + 3 + 3) / 9, c (5x) = 0
    assert scores.score(r["a"]) == pytest.approx(4 / 9, abs=1e-6)
    assert scores.score(r["b"]) == pytest.approx(8 / 9, abs=1e-6)
    assert scores.score(r["c"]) == 0.0
    assert scores.median_time([3.0, None, 1.0]) == 3.0 and scores.median_time([None, None, 1.0]) == math.inf
    assert scores.time_to_target([{"step": 4, "cpu_s": 9.0, "quality": 0.9}], 0.8, "max", cap_seconds=5.0) == (None, None)
    assert scores.time_to_target([{"step": 4, "cpu_s": 2.0, "quality": 0.3}], 0.5, "min") == (4, 2.0)


@pytest.mark.parametrize("name", workloads.NAMES)
def test_every_workload_trains_as_a_plain_lightning_module_and_logs_its_metric(name: str) -> None:
    if workloads.available(name):
        pytest.skip(workloads.available(name))
    workload = workloads.load(name)
    assert workload.mode in ("max", "min") and len(workload.lr_grid) >= 3 and workload.budget_steps > 0
    record = run_curve_fit(FitSpec(name, "baseline", (), seed=0, lr=workload.lr_grid[1], total_steps=2, eval_every=1))
    assert record["error"] is None, record.get("traceback")
    assert [p["step"] for p in record["points"]] == [1, 2]
    assert all(math.isfinite(p["quality"]) for p in record["points"]) and record["cpu_s"] > 0
    # the data set is the same for every seed; the seed orders the training batches
    import torch

    first, other = workload.make_data(0), workload.make_data(1)
    assert len(first[0].dataset) == len(other[0].dataset)
    a, b = next(iter(first[1])), next(iter(other[1]))
    flat = lambda batch: [t for t in (batch.values() if isinstance(batch, dict) else batch) if isinstance(t, torch.Tensor)]  # noqa: E731
    assert all(torch.equal(x, y) for x, y in zip(flat(a), flat(b), strict=True))


def test_the_search_budget_option_sets_the_searches_budget() -> None:
    import argparse

    def settings(budget):
        return bench.settings_from(argparse.Namespace(
            configs=None, no_search=False, search_on=None, proxy_fraction=0.25, heldout_seeds=5, dry_run=False,
            search_method="prescribe", search_budget_runs=budget))

    default, doubled = settings(None), settings(6.0)
    assert default.search_budget_runs == 3.0 and doubled.search_budget_runs == 6.0
    assert doubled.search_lengths == default.search_lengths  # only the budget changes
