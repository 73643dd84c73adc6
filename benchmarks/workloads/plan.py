"""What the benchmark trains for one workload, phase by phase, given what has already finished.

1. **tune**: the baseline at every learning rate of ``lr_grid`` on the tuning seeds, for the reference
   budget B; the rate whose runs reach the best quality (mean over seeds of each run's best validation)
   is frozen.
2. **target**: the baseline at the frozen rate on the target seeds, for B steps; the target is the
   median of their best validation metrics, and the time cap 4/3 of their median training time.
3. **held-out**: every configuration (:mod:`workloads.configs`) on the held-out seeds, for 4/3 of B
   steps (the schedule scaled to that length), validated every ``eval_every`` steps.
4. **search**: the recipe search on the target seeds (decides on two, checks a step's best on a third,
   confirms on the other two and one more), and the same search on a proxy (a quarter of every run length,
   confirmed at full size); each pick then trains on the held-out seeds like any configuration.

Nothing of a later phase starts before the phase it depends on has finished; what has finished is
read from the :class:`~workloads.store.Store`, so a killed run resumes where it stopped.

Examples:
    >>> settings = Settings()
    >>> settings.tuning_seeds, settings.heldout_seeds
    ((0, 1), (1000, 1001, 1002, 1003, 1004))
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from workloads.configs import configurations
from workloads.curve_fit import FitSpec
from workloads.store import Store

__all__ = ["SearchSpec", "Settings", "WorkloadPlan"]


@dataclass(frozen=True)
class Settings:
    """The seeds and lengths of a benchmark run (the dry run shrinks them)."""

    tuning_seeds: tuple[int, ...] = (0, 1)
    target_seeds: tuple[int, ...] = (10, 11, 12, 13, 14)
    heldout_seeds: tuple[int, ...] = (1000, 1001, 1002, 1003, 1004)
    budget_scale: float = 1.0  #: the reference budgets multiplied by this (the dry run: a few steps)
    evals_per_budget: int = 18  #: validations within B steps (24 within the held-out runs' 4/3 B)
    lr_grid_size: int | None = None  #: the first n learning rates of each grid only (the dry run)
    configs: tuple[str, ...] | None = None  #: only these configurations (names as in the tables)
    search: bool = True
    search_workloads: tuple[str, ...] | None = None  #: the search on these workloads only (``None``: every one)
    #: the search's run lengths, as fractions of B (the prescription search: its baseline run is the longest, the
    #: held-out runs' 4/3 B, and a prescription may be any of them)
    search_lengths: tuple[float, ...] = (0.5, 0.75, 1.0, 4 / 3)
    #: the search's budget in its own baseline runs (every run length on one seed), timed from the tuning fits
    search_budget_runs: float = 3.0
    search_screen: float | None = 1 / 3  #: the search's first look (search_recipe's ``screen``)
    #: the search method's revision: part of a search's key, so a changed method searches again (its state folder
    #: starts as a copy of the previous revision's, whose fits the same code trains)
    search_method: str = "prescribe"
    #: the proxy search: the same search at this fraction of every run length, confirmed at full size (None: none)
    proxy_fraction: float | None = None
    search_kwargs: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


#: the prescription search's current revision (a new one trains its searches again; the older records stay)
PRESCRIBE_REVISION = "reserve-7"


@dataclass(frozen=True)
class SearchSpec:
    """The recipe search on one workload: its seeds, run lengths, learning rate and budget (training CPU seconds)."""

    workload: str
    lr: float
    run_lengths: tuple[int, ...]
    search_seeds: tuple[int, ...]
    confirm_seeds: tuple[int, ...]
    search_kwargs: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    budget_seconds: float | None = None
    finalist_seeds: tuple[int, ...] = ()
    budget_runs: float | None = None  #: the budget in the search's own baseline runs
    proxy_fraction: float | None = None  #: search at this fraction of the run lengths, confirm at full size
    screen: float | None = None  #: search_recipe's ``screen`` (``None``: every configuration raced in full)
    method: str = ""  #: the search method's revision (``Settings.search_method``; ``""``: the first look at one length)
    target: float | None = None  #: the quality to reach (the prescription search: the workload's target)
    #: the method's revision within ``method`` (the prescription search: ``"race-seed-4"`` since your run's times
    #: are put on the clock of the runs trained now and a run is stopped at a rung only when behind its bar by more
    #: than the validation noise; ``"race-seed-3"``: every run's share
    #: leaves room for its last validation; ``"race-seed-2"``: it keeps the pick's run aside only once one leads;
    #: ``"race-seed-1"``: it races on another seed and measures its pick beside your run on your run's seed;
    #: ``"paired"`` before, ``""`` before that)
    revision: str = ""

    @property
    def name(self) -> str:
        """The configuration its pick trains as on the held-out seeds: ``search`` or ``search:proxy``."""
        return "search" if self.proxy_fraction is None else "search:proxy"

    @property
    def key(self) -> str:
        budget = "" if self.budget_seconds is None else f"|{self.budget_seconds:.0f}s"
        budget += "" if self.budget_runs is None else f"|{self.budget_runs:g} runs"
        extra = f"|finalists {list(self.finalist_seeds)}|confirm {list(self.confirm_seeds)}" if self.finalist_seeds else ""
        proxy = "" if self.proxy_fraction is None else f"|proxy {self.proxy_fraction:g}"
        screen = "" if self.screen is None else f"|screen {self.screen:.3g}"
        method = f"|{self.method}" if self.method else ""
        method += "" if self.target is None else f"|target {self.target:.6g}"
        method += f"|{self.revision}" if self.revision else ""
        return (f"{self.workload}|search|{self.lr:g}|{list(self.run_lengths)}|{list(self.search_seeds)}{budget}"
                f"{extra}{proxy}{screen}{method}")


class WorkloadPlan:
    """The fits and the search one workload needs, released phase by phase."""

    def __init__(self, workload: Any, settings: Settings) -> None:
        self.workload, self.settings = workload, settings
        self.budget = max(2, round(workload.budget_steps * settings.budget_scale))
        self.eval_every = max(1, self.budget // settings.evals_per_budget)
        self.run_steps = math.ceil(self.budget * 4 / 3)
        grid = workload.lr_grid
        self.lr_grid = tuple(grid[: settings.lr_grid_size] if settings.lr_grid_size else grid)
        self._configs: tuple[dict[str, tuple], dict[str, str]] | None = None

    def spec(self, config: str, candidates: tuple, seed: int, lr: float, steps: int, phase: str) -> FitSpec:
        return FitSpec(self.workload.name, config, candidates, seed, lr, steps, self.eval_every, phase)

    def key(self, spec: FitSpec) -> str:
        return spec.key

    # --- phase 1: the learning rate ---------------------------------------------------------------
    def tuning(self) -> list[FitSpec]:
        return [self.spec("baseline", (), seed, lr, self.budget, "tune")
                for lr in self.lr_grid for seed in self.settings.tuning_seeds]

    def best(self, record: dict[str, Any]) -> float:
        values = [p["quality"] for p in record.get("points", []) if not math.isnan(p["quality"])]
        if not values:
            return -math.inf if self.workload.mode == "max" else math.inf
        return max(values) if self.workload.mode == "max" else min(values)

    def tuned_lr(self, store: Store) -> tuple[float | None, dict[str, list[float]]]:
        """The frozen learning rate (``None`` until every tuning fit has finished) and the tuning table."""
        table: dict[str, list[float]] = {}
        for spec in self.tuning():
            record = store.get(self.key(spec))
            if record is None:
                return None, table
            table.setdefault(f"{spec.lr:g}", []).append(self.best(record))
        sign = 1 if self.workload.mode == "max" else -1
        chosen = max(self.lr_grid, key=lambda lr: sign * statistics.mean(table[f"{lr:g}"]))
        return chosen, table

    # --- phase 2: the target ----------------------------------------------------------------------
    def targets(self, lr: float) -> list[FitSpec]:
        return [self.spec("baseline", (), seed, lr, self.budget, "target") for seed in self.settings.target_seeds]

    def target(self, store: Store, lr: float) -> tuple[float, float] | None:
        """``(target, time cap in CPU seconds)`` once every target fit has finished."""
        records = [store.get(self.key(s)) for s in self.targets(lr)]
        if any(r is None for r in records):
            return None
        good = [r for r in records if r.get("error") is None]
        if not good:
            raise RuntimeError(f"{self.workload.name}: every target fit failed: {records[0].get('error')}")
        target = statistics.median(self.best(r) for r in good)
        return target, 4 / 3 * statistics.median(r["cpu_s"] for r in good)

    def reference(self, lr: float) -> FitSpec:
        """The user's own run: the baseline at the held-out length on the first target seed, validated as it trains.
        The prescription search reads it instead of training it (a user who asks how to train faster has trained
        once); its cost is reported beside the search's."""
        return self.spec("baseline", (), self.settings.target_seeds[0], lr, self.run_steps, "reference")

    # --- phase 3: every configuration on the held-out seeds ---------------------------------------
    def configurations(self, lr: float) -> tuple[dict[str, tuple], dict[str, str]]:
        if self._configs is None:
            configs, left_out = configurations(self.workload, lr, self.run_steps)
            if self.settings.configs is not None:
                configs = {c: v for c, v in configs.items() if c in self.settings.configs}
            self._configs = configs, left_out
        return self._configs

    def heldout(self, config: str, candidates: tuple, lr: float, steps: int | None = None) -> list[FitSpec]:
        """The held-out runs of a configuration, ``steps`` long (default the held-out length, 4/3 B)."""
        return [self.spec(config, candidates, seed, lr, steps or self.run_steps, "heldout")
                for seed in self.settings.heldout_seeds]

    # --- phase 4: the search ----------------------------------------------------------------------
    def search_spec(self, lr: float, store: Store, proxy: bool = False) -> SearchSpec:
        """The search, its budget ``search_budget_runs`` runs of B, in its own baseline runs (``max_baseline_runs``).

        With the prescription search (``search_method="prescribe"``): its baseline run is the longest run length
        (the held-out length, 4/3 B) on the first target seed, so 3 runs of B are 2.25 of its own; it aims at the
        workload's target (fixed from the target seeds, never the held-out ones), checks its best on the second
        target seed and confirms nothing (the held-out runs measure it). The greedy search (``"halving"``)
        decides on the first two target seeds, takes a step's best only after a third (its finalist seed), and
        confirms on the last two target seeds and one more; its proxy runs the same search at
        ``proxy_fraction`` of every run length and confirms on one full-size seed."""
        lengths = tuple(sorted({max(1, round(self.budget * f)) for f in self.settings.search_lengths}))
        kwargs = dict(self.settings.search_kwargs)
        fraction = self.settings.proxy_fraction if proxy else None
        target = self.settings.target_seeds
        if self.settings.search_method == "prescribe":
            # the longest is the held-out length itself (4/3 B rounded up, as every other configuration trains)
            lengths = tuple(sorted({n for n in lengths if abs(n - self.run_steps) > 1} | {self.run_steps}))
            fixed = self.target(store, lr)
            runs = self.settings.search_budget_runs * self.budget / max(lengths)
            if "max_fits" not in kwargs:
                kwargs["max_baseline_runs"] = round(runs, 6)
            kwargs.setdefault("eval_every", self.eval_every)
            reference = store.get(self.reference(lr).key)
            if reference is not None and max(lengths) == self.run_steps:  # the user's run: read, not trained
                kwargs["baseline_run"] = [(p["step"], p["cpu_s"], p["quality"]) for p in reference["points"]]
            return SearchSpec(self.workload.name, lr, lengths, target[:1], (), kwargs,
                              budget_runs=kwargs.get("max_baseline_runs"), finalist_seeds=target[1:2],
                              method="prescribe", target=None if fixed is None else fixed[0], revision=PRESCRIBE_REVISION)
        if "max_fits" not in kwargs:  # its own baseline runs, timed by the search (the proxy's, on the proxy)
            kwargs["max_baseline_runs"] = self.settings.search_budget_runs
        confirm = (*target[3:], max(target) + 1)[: 1 if proxy else None]
        return SearchSpec(self.workload.name, lr, lengths, target[:2], tuple(confirm), kwargs,
                          budget_runs=kwargs.get("max_baseline_runs"), finalist_seeds=target[2:3],
                          proxy_fraction=fraction, screen=self.settings.search_screen,
                          method=self.settings.search_method)

    def search_specs(self, lr: float, store: Store) -> list[SearchSpec]:
        """The full-size search, and the proxy search when ``proxy_fraction`` is set."""
        proxies = (False, True) if self.settings.proxy_fraction and self.settings.search_method != "prescribe" else (False,)
        return [self.search_spec(lr, store, proxy) for proxy in proxies]

    @property
    def searched(self) -> bool:
        """Does the recipe search run on this workload?"""
        chosen = self.settings.search_workloads
        return self.settings.search and (chosen is None or self.workload.name in chosen)

    def ready(self, store: Store) -> list[FitSpec | SearchSpec]:
        """Everything that can start now and has not finished."""
        lr, _ = self.tuned_lr(store)
        if lr is None:
            return [s for s in self.tuning() if self.key(s) not in store]
        wanted: list[FitSpec | SearchSpec] = [s for s in self.targets(lr) if self.key(s) not in store]
        configs, _ = self.configurations(lr)
        wanted += [s for name, cands in configs.items() for s in self.heldout(name, cands, lr)]
        if self.searched and (self.settings.configs is None or "search" in self.settings.configs):
            if self.settings.search_method == "prescribe" and self.key(self.reference(lr)) not in store:
                wanted.append(self.reference(lr))
                return [s for s in wanted if isinstance(s, SearchSpec) or self.key(s) not in store]
            for search in self.search_specs(lr, store):
                record = store.get(search.key)
                if record is None:
                    wanted.append(search)
                elif record.get("recipe") is not None:  # a search that failed has no pick (its error is reported)
                    pick = tuple((name, kwargs) for name, kwargs in record["recipe"])
                    steps = record.get("steps")  # the prescription's length (the greedy search's records: a list)
                    wanted += self.heldout(search.name, pick, lr, steps if isinstance(steps, int) else None)
        return [s for s in wanted if isinstance(s, SearchSpec) or self.key(s) not in store]
