"""Cheaper variants of the recipe search, replayed on the workloads benchmark's searches: what each saves, what it loses.

For every workload, each search the workloads benchmark ran (``python benchmarks/run_workloads.py``, its records
in ``<out>/fits.jsonl``) runs again with one change to its settings, starting from a copy of that search's state:
every fit the variant reads that the original search trained is read from there (the same code trains it), the
rest is trained. The variant's pick is confirmed on the same confirmation seeds as the original's, and its cost
counts every fit its decisions read, whether read from the copy or trained.

    python benchmarks/search_variants.py --out /tmp/workloads --variant shortlist   # the later steps: a shortlist
    python benchmarks/search_variants.py --out /tmp/workloads --variant half-look   # a first look at half length

Appends one row per workload to ``benchmarks/results/search_variants_cpu.jsonl`` (``--results`` for another file):
the variant, the workload, the pick and its confirmed speed-up, the cost in the search's own baseline runs, the
same for the original search, and the variant's steps in words.

Examples:
    >>> VARIANTS["shortlist"]
    {'shortlist': True}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

#: each variant: the ``search_recipe`` arguments it changes
VARIANTS: dict[str, dict[str, Any]] = {
    "shortlist": {"shortlist": True},  # the steps after the first try only what the first step's first look kept
    "half-look": {"first_look": 0.5},  # the first look reads runs half as long as the shortest, then halving
}


def replay(out: Path, variant: str, workloads: list[str] | None, proxy: bool, dry_run: bool = False) -> list[dict[str, Any]]:
    """Run ``variant`` on every search of ``out`` (full size, or the quarter-length proxy); return one row each.

    ``dry_run``: ``out`` holds the workloads benchmark's ``--dry-run`` (its searches' candidates and budget)."""
    import run_workloads
    from workloads import search_task
    from workloads.plan import SearchSpec

    settings = run_workloads.settings_from(argparse.Namespace(dry_run=dry_run, configs=None, no_search=False,
                                                              search_on=None, proxy_fraction=0.25,
                                                              search_method="halving"))
    base, method = settings.search_kwargs, settings.search_method
    rows = []
    for line in (out / "fits.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") != "search" or not record["key"].endswith(f"|{method}"):
            continue
        fraction = (record.get("proxy") or {}).get("fraction")
        if (fraction is not None) != proxy or fraction not in (None, 0.25) or (workloads and record["workload"] not in workloads):
            continue
        kwargs = dict(base)  # the original's arguments and budget (its own baseline runs), as the plan gives them
        if "max_fits" not in kwargs:
            kwargs["max_baseline_runs"] = record["budget_runs"]
        original = SearchSpec(record["workload"], record["lr"], tuple(record["run_lengths"]),
                              tuple(record["search_seeds"]), tuple(record["confirm_seeds"]), kwargs,
                              budget_runs=record["budget_runs"], finalist_seeds=tuple(record["finalist_seeds"]),
                              proxy_fraction=fraction, screen=record["screen"], method=method)
        if original.key != record["key"]:
            raise RuntimeError(f"{record['key']}: rebuilt as {original.key}; this script cannot replay that search")
        spec = dataclasses.replace(original, search_kwargs={**kwargs, **VARIANTS[variant]}, method=f"{method}-{variant}")
        folder = out / "variants"
        state = search_task.state_folder(spec, folder)
        if not state.exists():  # the original search's fits, read instead of trained
            shutil.copytree(search_task.state_folder(original, out), state)
        found = search_task.run_search(spec, folder)
        if found.get("error"):
            raise RuntimeError(f"{variant} on {spec.workload}: {found['error']}")
        cost, was = found["cost"], record["cost"]
        rows.append({
            "variant": variant, "workload": spec.workload, "proxy": fraction, "labels": found["labels"],
            "confirmed": found["confirmed_mean"], "cost": round(cost["search_in_baseline_runs"], 3),
            "cost_full_runs": cost.get("search_in_full_runs"), "fits_trained_now": cost["fits_trained_now"],
            "original_labels": record["labels"], "original_confirmed": record["confirmed_mean"],
            "original_cost": round(was["search_in_baseline_runs"], 3), "steps": found.get("decisions", found["steps"]),
        })
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "steps"}), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the workloads benchmark's --out folder")
    parser.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    parser.add_argument("--workloads", nargs="*", help="only these workloads")
    parser.add_argument("--proxy", action="store_true", help="the quarter-length proxy searches, not the full-size ones")
    parser.add_argument("--dry-run", action="store_true", help="--out holds the workloads benchmark's --dry-run")
    parser.add_argument("--results", type=Path, default=BENCHMARKS / "results" / "search_variants_cpu.jsonl")
    args = parser.parse_args(argv)
    rows = replay(args.out, args.variant, args.workloads, args.proxy, args.dry_run)
    with args.results.open("a") as sink:
        for row in rows:
            sink.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
