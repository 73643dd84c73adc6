"""A configuration's quality against the baseline's at the prescription search's rungs, on the held-out seeds.

Reads a workloads benchmark fits file (``benchmarks/results/workloads_cpu_5seeds_paired_fits.jsonl`` by default)
and, for every workload and held-out seed where both the baseline and ``--config`` trained, reads both curves at
the fractions of the baseline's time to the target that the search's rungs use (``T/12`` and ``T/3``; ``T`` is the
baseline's own run on that seed, its whole run where it misses the target), interpolated between validations as
the search reads them. It prints, per workload, on how many seeds the configuration was ahead at each rung and the
ranges of both qualities: whether a method pays only late (behind at the first rung, ahead at the last).

Usage::

    python benchmarks/workloads_rungs.py                       # EMA, the AVX-512 machine's five-seed fits
    python benchmarks/workloads_rungs.py --config recipe:mild --fits benchmarks/results/workloads_cpu_avx2_5seeds_fits.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads.scores import time_to_target  # noqa: E402

from composer_bridge.search.prescribe import RUNGS  # noqa: E402
from composer_bridge.search.scoring import quality_at  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=Path, default=RESULTS / "workloads_cpu_5seeds_paired_fits.jsonl")
    parser.add_argument("--config", default="EMA")
    args = parser.parse_args()
    records = [json.loads(line) for line in args.fits.read_text().splitlines() if line.strip()]
    runs: dict[tuple[str, str], dict[int, list[dict]]] = defaultdict(dict)
    for r in records:
        if r.get("phase") == "heldout":
            runs[(r["workload"], r["config"])][r["seed"]] = r["points"]
    results = json.loads(args.fits.with_name(args.fits.name.replace("_fits.jsonl", ".json")).read_text())
    higher_is = {"max": 1, "min": -1}
    print(f"{args.config} against the baseline at the rungs ({', '.join(f'T x {f:.3g}' for f in RUNGS)}), "
          f"held-out seeds, from {args.fits.name}")
    for workload, spec in results["workloads"].items():
        base, other = runs.get((workload, "baseline"), {}), runs.get((workload, args.config), {})
        seeds = sorted(set(base) & set(other))
        if not seeds:
            continue
        sign = higher_is[spec["mode"]]
        cells = []
        for fraction in RUNGS:
            ahead, mine, theirs = 0, [], []
            for seed in seeds:
                _, reach = time_to_target(base[seed], spec["target"], spec["mode"])
                t = (reach or base[seed][-1]["cpu_s"]) * fraction
                b = quality_at([(p["cpu_s"], p["quality"]) for p in base[seed]], t)
                o = quality_at([(p["cpu_s"], p["quality"]) for p in other[seed]], t)
                ahead += sign * (o - b) > 0
                mine.append(o)
                theirs.append(b)
            cells.append(f"ahead on {ahead}/{len(seeds)} ({min(mine):.3g}-{max(mine):.3g} against "
                         f"{min(theirs):.3g}-{max(theirs):.3g})")
        print(f"{workload:17s} " + " | ".join(cells))


if __name__ == "__main__":
    main()
