"""The search's score had it handed over another configuration on some workloads: where the score is decided.

Reads a workloads benchmark's ``results.json`` and replaces the search's held-out times on the workloads named by
``--hand WORKLOAD=CONFIG`` with that configuration's own held-out times (its fits on the same five seeds, trained
as that configuration: nothing is retrained or guessed), and, with ``--rest baseline``, on every other workload
with the baseline's (your run, as handed over). It prints every configuration's score with its 90 % bootstrap
interval, as the benchmark does, and how often the search scores above each other configuration in the bootstrap's
draws. The other configurations' scores move too: AlgoPerf's ratios are to the fastest configuration on each
workload.

Usage::

    python benchmarks/workloads_what_if.py benchmarks/results/workloads_cpu_avx2_reserve7_5seeds.json \\
        --hand cluttered_resnet=recipe:short ctr=EMA --rest baseline
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import report, scores  # noqa: E402


def what_if(results: dict[str, Any], hand: dict[str, str], rest: str | None = None,
            replicates: int = 2000) -> dict[str, Any]:
    """Scores with the search's held-out times replaced: on each ``hand`` workload by that configuration's, and,
    with ``rest``, on every other workload by ``rest``'s.

    Returns ``{"scores": {config: {"score", "low", "high"}}, "search_above": {config: share of draws}}``.

    Examples:
        >>> results = {"workloads": {"w": {"configs": {
        ...     "baseline": {"median_seconds": 2.0, "seeds": {"1": {"seconds": 2.0}, "2": {"seconds": 2.0}}},
        ...     "EMA": {"median_seconds": 1.0, "seeds": {"1": {"seconds": 1.0}, "2": {"seconds": 1.0}}},
        ...     "search": {"median_seconds": 2.0, "seeds": {"1": {"seconds": 2.0}, "2": {"seconds": 2.0}}}},
        ...     "not_applicable": []}}}
        >>> what_if(results, {"w": "EMA"}, replicates=50)["scores"]["search"]["score"]
        1.0
    """
    workloads = results["workloads"]
    times = report.heldout_seed_times(workloads)
    if "search" not in times:
        raise ValueError("what_if: these results have no 'search' configuration to replace; train the benchmark "
                         "with --configs ... search")
    search = dict(times["search"])
    for workload, config in hand.items():
        if workload not in search:
            raise ValueError(f"what_if: workload {workload!r} is not scored here; expected one of {sorted(search)}")
        if workload not in times.get(config, {}):
            have = sorted(c for c, per in times.items() if workload in per)
            raise ValueError(f"what_if: configuration {config!r} has no held-out times on {workload!r}; "
                             f"expected one of {have}")
        search[workload] = list(times[config][workload])
    if rest is not None:
        if rest not in times:
            raise ValueError(f"what_if: --rest {rest!r} is not a configuration here; expected one of {sorted(times)}")
        for workload in search:
            if workload not in hand and workload in times[rest]:
                search[workload] = list(times[rest][workload])
    out, draws = scores.bootstrap_scores({**times, "search": search}, replicates=replicates)
    return {"scores": out, "search_above": scores.above("search", out, draws)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a workloads benchmark's results.json")
    parser.add_argument("--hand", nargs="+", default=[], metavar="WORKLOAD=CONFIG",
                        help="hand CONFIG over on WORKLOAD instead of the search's prescription")
    parser.add_argument("--rest", default=None, help="the configuration handed over on every other workload")
    args = parser.parse_args(argv)
    hand = {}
    for item in args.hand:
        workload, sep, config = item.partition("=")
        if not sep or not workload or not config:
            parser.error(f"--hand {item!r}: expected WORKLOAD=CONFIG, e.g. ctr=EMA")
        hand[workload] = config
    out = what_if(json.loads(args.results.read_text()), hand, args.rest)
    for config, s in sorted(out["scores"].items(), key=lambda kv: -kv[1]["score"]):
        above = "" if config == "search" else f"  (search above it in {out['search_above'][config]:.0%} of draws)"
        print(f"{config:14s} {s['score']:.3f} [{s['low']:.2f}, {s['high']:.2f}]{above}")
    return out


if __name__ == "__main__":
    main()
