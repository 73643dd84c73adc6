"""The workloads benchmark: does a method help on tasks nobody tuned it for? Scored as AlgoPerf scores.

Nine small offline workloads (``benchmarks/workloads/``: a ResNet on cluttered digits, a vision
transformer, a 1-D CNN on generated signals, a message-passing network on generated graphs, a
click-through-rate model on teacher-labelled tabular data, the library's character-level GPT, a Hugging
Face Llama and GPT-2 built from configs, an encoder-decoder transformer on a synthetic translation
task), each a plain LightningModule with AdamW, linear warm-up and cosine decay. Per workload
(:mod:`workloads.plan`): the learning rate tuned on the tuning seeds and frozen; a target fixed from
the baseline on five target seeds before any method runs; then every configuration (the baseline,
every default search candidate alone where it applies, every published recipe that applies, and the
recipe search's pick, searched on the target seeds only) trains on three held-out seeds for 4/3 of the
reference budget, validated as it trains, and its time to the target is measured in CPU seconds and
in steps. Scores: AlgoPerf's performance profiles and their area up to 4x (:mod:`workloads.scores`).

    python benchmarks/run_workloads.py                                  # everything (hours; Ray, 2 workers)
    python benchmarks/run_workloads.py --workloads vit ctr              # some workloads
    python benchmarks/run_workloads.py --configs baseline MixUp         # some configurations
    python benchmarks/run_workloads.py --no-search --executor local     # without the search, one fit at a time
    python benchmarks/run_workloads.py --dry-run --out /tmp/workloads   # the whole pipeline at toy budgets
    python benchmarks/run_workloads.py --report-only --publish          # the tables from the finished fits

Every finished fit is appended to ``<out>/fits.jsonl``: run it again with the same ``--out`` and it
trains only what is missing. Writes ``<out>/results.json`` (the shape in docs/benchmarks.md),
``<out>/table.md`` and ``<out>/profiles.png``; ``--publish`` also copies them to
``benchmarks/results/workloads_cpu.json`` and ``docs/img/workloads_profiles.png``.
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
import sys
import time
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

import workloads  # noqa: E402
from workloads import report  # noqa: E402
from workloads.curve_fit import FitSpec, run_curve_fit  # noqa: E402
from workloads.plan import SearchSpec, Settings, WorkloadPlan  # noqa: E402
from workloads.search_task import run_search  # noqa: E402
from workloads.store import Store  # noqa: E402

from composer_bridge.search import Candidate  # noqa: E402

PUBLISHED_JSON = BENCHMARKS / "results" / "workloads_cpu.json"
PUBLISHED_PNG = BENCHMARKS.parent / "docs" / "img" / "workloads_profiles.png"


def work(blob: bytes, folder: str, import_path: list[str]) -> dict[str, Any]:
    """One task (pickled, so a Ray worker can import the workloads first): a fit with its curve, or a search."""
    import logging
    import pickle

    for entry in import_path:
        if entry not in sys.path:
            sys.path.append(entry)
    import torch

    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)
    task = pickle.loads(blob)
    if isinstance(task, SearchSpec):
        return run_search(task, Path(folder))
    return run_curve_fit(task)


class LocalPool:
    """One task at a time, in this process."""

    def __init__(self) -> None:
        self.queue: list[FitSpec | SearchSpec] = []
        self.slots = 1

    def submit(self, task: FitSpec | SearchSpec, folder: str) -> None:
        self.queue.append(task)
        self.folder = folder

    def next_done(self) -> dict[str, Any]:
        return work(pickle.dumps(self.queue.pop(0)), self.folder, [])

    def pending(self) -> int:
        return len(self.queue)

    def close(self) -> None:
        pass


class RayPool:
    """Tasks side by side as Ray tasks of one CPU each, on a local Ray with ``workers`` CPUs."""

    def __init__(self, workers: int) -> None:
        import ray

        self.ray = ray
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        self.remote = ray.remote(num_cpus=1, max_retries=1)(work)
        self.slots = workers
        self.refs: list[Any] = []

    def submit(self, task: FitSpec | SearchSpec, folder: str) -> None:
        self.refs.append(self.remote.remote(pickle.dumps(task), folder, [p for p in sys.path if p]))

    def next_done(self) -> dict[str, Any]:
        done, self.refs = self.ray.wait(self.refs, num_returns=1)
        return self.ray.get(done[0])

    def pending(self) -> int:
        return len(self.refs)

    def close(self) -> None:
        self.ray.shutdown()


def _priority(task: FitSpec | SearchSpec) -> tuple[int, int]:
    """Tuning first, then the targets, the baselines, the other configurations, then the searches (each takes many
    fits' time), so a run stopped early has every configuration but the search's pick."""
    if isinstance(task, SearchSpec):
        return (4, 0)
    order = {"tune": 0, "target": 1}.get(task.phase, 3)
    return (order, 0 if task.config == "baseline" else 1)


def label(task: FitSpec | SearchSpec) -> str:
    if isinstance(task, SearchSpec):
        return f"{task.workload}: search"
    return f"{task.workload}: {task.phase} {task.config} seed {task.seed}"


def run(plans: list[WorkloadPlan], store: Store, pool: Any, progress: bool = True) -> None:
    """Train everything the plans want, as their phases open, until nothing is left."""
    flying: set[str] = set()
    done = 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=0, unit="task", dynamic_ncols=True, file=sys.stderr)
    while True:
        ready = sorted((t for p in plans for t in p.ready(store) if t.key not in flying), key=_priority)
        if bar is not None:
            bar.total = done + len(flying) + len(ready)
            bar.refresh()
        while ready and pool.pending() < pool.slots:
            task = ready.pop(0)
            flying.add(task.key)
            pool.submit(task, str(store.folder))
        if not flying:
            break
        record = pool.next_done()
        flying.discard(record["key"])
        store.add(record)
        done += 1
        if bar is not None:
            bar.update(1)
            what = record.get("config") or "search"
            bar.set_description(f"{record['workload']}: {what}" + (" (error)" if record.get("error") else ""))
    if bar is not None:
        bar.close()


#: the settings of each search method: its run lengths (fractions of B), its budget (runs) and whether it has a proxy
METHODS: dict[str, dict[str, Any]] = {
    "prescribe": {"search_method": "prescribe", "search_lengths": (0.5, 0.75, 1.0, 4 / 3), "search_budget_runs": 3.0},
    # the greedy search as published before (its records carry the method name "halving")
    "halving": {"search_method": "halving", "search_lengths": (0.25, 0.5, 1.0), "search_budget_runs": 30.0},
}


def settings_from(args: argparse.Namespace) -> Settings:
    method = getattr(args, "search_method", "prescribe")
    proxy = args.proxy_fraction if method == "halving" else None
    if args.dry_run:
        lengths = (0.5, 1.0, 4 / 3) if method == "prescribe" else (1.0, 2.0, 4.0)
        return Settings(tuning_seeds=(0,), target_seeds=(10, 11, 12), heldout_seeds=(1000, 1001), budget_scale=0.0,
                        evals_per_budget=2, lr_grid_size=2, configs=tuple(args.configs) if args.configs else None,
                        search=not args.no_search, search_lengths=lengths, search_method=method, proxy_fraction=proxy,
                        search_kwargs={"candidates": [Candidate("GradientClipping", {"clipping_type": "norm",
                                                                                 "clipping_threshold": 1.0})],
                                       "starting_recipes": {},
                                       "max_fits": 12})
    method_settings = dict(METHODS[method])
    if getattr(args, "search_budget_runs", None):
        method_settings["search_budget_runs"] = args.search_budget_runs
    return Settings(configs=tuple(args.configs) if args.configs else None, search=not args.no_search,
                    search_workloads=tuple(args.search_on) if args.search_on else None, proxy_fraction=proxy,
                    heldout_seeds=tuple(range(1000, 1000 + getattr(args, "heldout_seeds", 5))), **method_settings)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=None, choices=workloads.NAMES, metavar="NAME",
                        help=f"some workloads (default: all of {', '.join(workloads.NAMES)})")
    parser.add_argument("--configs", nargs="+", default=None, metavar="CONFIG",
                        help="only these configurations (baseline, an algorithm's name, recipe:mild, search)")
    parser.add_argument("--no-search", action="store_true", help="leave the recipe search out")
    parser.add_argument("--search-on", nargs="+", default=None, metavar="NAME", help="the search on these workloads only")
    parser.add_argument("--search-method", choices=sorted(METHODS), default="prescribe",
                        help="the search's method: prescribe (the default) or halving (the greedy search of before)")
    parser.add_argument("--proxy-fraction", type=float, default=0.25,
                        help="the proxy search's share of every run length (the published results: 0.25)")
    parser.add_argument("--search-budget-runs", type=float, default=None, metavar="RUNS",
                        help="the search's budget in runs of B (default: the method's, 3 for prescribe)")
    parser.add_argument("--executor", choices=("ray", "local"), default="ray")
    parser.add_argument("--workers", type=int, default=2, help="with --executor ray: tasks at once, one CPU each")
    parser.add_argument("--out", default="outputs/workloads")
    parser.add_argument("--heldout-seeds", type=int, default=5, metavar="N",
                        help="held-out seeds per configuration (1000, 1001, ...; the published results: 5)")
    parser.add_argument("--dry-run", action="store_true", help="a few steps per fit: the pipeline, not a result")
    parser.add_argument("--publish", action="store_true", help=f"copy the results to {PUBLISHED_JSON.name} and the docs")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--report-only", action="store_true", help="write the results of the finished fits; train nothing")
    args = parser.parse_args(argv)
    settings = settings_from(args)
    names = args.workloads or list(workloads.NAMES)
    skipped = {n: why for n in names if (why := workloads.available(n))}
    plans = [WorkloadPlan(workloads.load(n), settings) for n in names if n not in skipped]
    store = Store(Path(args.out))
    started = time.perf_counter()
    if not args.report_only:
        pool = RayPool(args.workers) if args.executor == "ray" else LocalPool()
        try:
            run(plans, store, pool, progress=not args.no_progress)
        finally:
            pool.close()
    results = report.assemble(plans, store)
    results["skipped"] = skipped
    results["settings"] = {"dry_run": args.dry_run, "executor": args.executor, "workers": args.workers,
                           "wall_s_this_invocation": round(time.perf_counter() - started, 1)}
    results["machine"] = machine()
    out = Path(args.out)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text(report.workload_table(results) + "\n\n" + report.markdown(results) + "\n\n"
                                  + report.prescription_table(results) + "\n")
    report.plot(results, out / "profiles.png")
    if args.publish:
        PUBLISHED_JSON.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(out / "results.json", PUBLISHED_JSON)
        shutil.copy(out / "profiles.png", PUBLISHED_PNG)
    print(report.markdown(results))
    return results


def machine() -> dict[str, Any]:
    import platform

    import lightning
    import torch

    commit = None
    try:
        import subprocess

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=BENCHMARKS, check=False).stdout.strip() or None
    except OSError:
        pass
    return {"python": platform.python_version(), "torch": torch.__version__, "lightning": lightning.__version__,
            "cpu": platform.processor() or platform.machine(), "commit": commit,
            "date": time.strftime("%Y-%m-%d")}


if __name__ == "__main__":
    main()
