"""benchmarks/search_variants.py: a cheaper search replayed on the workloads benchmark's searches, from their fits."""

from __future__ import annotations

import json

from helpers.support import load_script

bench = load_script("benchmarks/run_workloads.py", "run_workloads_for_variants")
variants = load_script("benchmarks/search_variants.py", "search_variants_under_test")


def test_a_variant_replays_each_search_from_a_copy_of_its_fits_and_records_what_it_cost(tmp_path) -> None:
    out = tmp_path / "w"
    bench.main(["--dry-run", "--executor", "local", "--no-progress", "--out", str(out), "--workloads", "ctr",
                "--configs", "baseline", "search", "--search-method", "halving"])
    original = next(json.loads(line) for line in (out / "fits.jsonl").read_text().splitlines()
                    if '"kind": "search"' in line and '"proxy": null' in line)
    held = json.loads((out / "search_ctr_screen_halving" / "search.json").read_text())["fits"]
    results = tmp_path / "variants.jsonl"
    assert variants.main(["--out", str(out), "--variant", "shortlist", "--dry-run", "--results", str(results)]) == 0
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["variant"] == "shortlist" and row["workload"] == "ctr" and row["proxy"] is None
    assert row["original_labels"] == original["labels"] and row["original_cost"] == round(
        original["cost"]["search_in_baseline_runs"], 3)
    assert row["cost"] > 0 and any("first look" in step for step in row["steps"])
    # the replay read the original search's fits from its copy: only what the variant alone needs was trained
    copy = json.loads((out / "variants" / "search_ctr_screen_halving-shortlist" / "search.json").read_text())
    assert len(copy["fits"]) == len(held) + row["fits_trained_now"]
    # the original search's state is untouched
    assert json.loads((out / "search_ctr_screen_halving" / "search.json").read_text())["fits"] == held
