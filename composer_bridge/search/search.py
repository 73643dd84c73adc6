"""The recipe search: which candidate algorithms make *this* model reach its baseline's quality sooner.

Method (docs/search.md has the reasoning):

1. **Baseline curves.** On every search seed, the baseline (no algorithm) is trained once per run
   length; its quality-vs-time points are the curve every candidate is measured against. ``Q`` is
   the baseline's best quality on that seed.
2. **Score.** A configuration's score on a seed is its strict speed-up
   (:func:`composer_bridge.search.scoring.strict_speedup`): the baseline's time to ``Q`` over the
   configuration's time to ``Q``; never reaching ``Q`` is a failure, 0x in the mean over seeds.
3. **Greedy forward selection with removal.** Starting from the baseline, each step tries adding
   every remaining candidate to the current recipe and keeps the best addition if its mean score
   beats the current recipe's by more than ``min_gain``; then it drops any earlier algorithm whose
   removal scores at least as well. It ends when no addition helps or the budget is spent.
4. **Stopping hopeless trials early.** Within a step, the additions race over the search seeds by
   successive halving: after each seed only the better half of those still ahead of the current
   recipe go on. Along a curve, run lengths go from short to long and stop once the curve reaches
   ``Q`` (longer runs cannot change its score), or once its training time passes the baseline's
   time to ``Q`` without reaching it (it cannot beat the baseline on that seed: a failure).
5. **Confirmation.** The chosen recipe (and any ``also_confirm`` recipes) and the baseline are
   trained on the confirmation seeds, which the search never saw; only those numbers are the result.

Example:
    >>> from composer_bridge.search import search_recipe  # doctest: +SKIP
    >>> result = search_recipe(make_module, make_data, monitor="val/acc", run_lengths=[50, 100, 200],
    ...                        max_fits=60, search_seeds=[0, 1], confirm_seeds=[100, 101, 102],
    ...                        state_dir="outputs/search")  # doctest: +SKIP
    >>> print(result.summary())  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composer_bridge.search import checks
from composer_bridge.search.candidates import Candidate, as_candidates
from composer_bridge.search.errors import SearchInputError
from composer_bridge.search.executor import Executor, FitOutcome, FitTask, InProcessExecutor
from composer_bridge.search.scoring import (
    SpeedUp,
    best_quality,
    strict_speedup,
    summarise_speedups,
    time_to_reach,
)
from composer_bridge.search.state import SearchState
from composer_bridge.search.trial import CLOCKS, FitRecord

__all__ = ["BudgetExhausted", "CurveResult", "SearchResult", "search_recipe"]

Config = tuple[str, ...]


class BudgetExhausted(Exception):
    """Raised inside the search when the next fit would overrun the budget (the search then stops)."""


@dataclass
class CurveResult:
    """One configuration on one seed: its points, why it stopped and its strict speed-up."""

    config: Config
    seed: int
    phase: str
    points: list[tuple[float, float]]
    status: str  #: "reached Q", "never reached Q", "stopped: past the baseline's time to Q", "baseline"
    speedup: float | None


@dataclass
class SearchResult:
    """What a search found; everything reported comes from the confirmation seeds.

    Attributes:
        recipe: the chosen candidates (empty: the search found nothing better than the baseline).
        confirmed: the recipe's strict speed-up on the confirmation seeds (``None`` if ``recipe`` is empty).
        beats_baseline: ``True`` when the confirmed mean speed-up (failures 0x) is above 1.
        search_score: the recipe's mean speed-up on the search seeds (biased upwards: it was chosen on them).
        also_confirmed: ``{name: SpeedUp}`` for the ``also_confirm`` recipes, same seeds.
        fits: every fit this result rests on, search and confirmation (the trial table).
        curves: every configuration-seed curve and its score.
        steps: what each greedy step tried and decided, in words.
        cost: training time and fits of the search and of the confirmation, the budget, the
            search's cost in baseline-run equivalents and its own overhead.
    """

    recipe: list[Candidate]
    confirmed: SpeedUp | None
    beats_baseline: bool
    search_score: float | None
    also_confirmed: dict[str, SpeedUp]
    fits: list[FitRecord]
    curves: list[CurveResult]
    steps: list[str]
    cost: dict[str, Any]
    settings: dict[str, Any]
    candidates: list[Candidate] = field(default_factory=list)
    stopped_by_budget: bool = False

    def summary(self) -> str:
        """A few lines for the terminal: the verdict, the recipe and the confirmed speed-up, the cost."""
        from composer_bridge.search.report import summary

        return summary(self)

    def python_code(self, total_steps: int | None = None) -> str:
        """The recipe as Python code (:func:`composer_bridge.search.report.python_code`)."""
        from composer_bridge.search.report import python_code

        return python_code(self, total_steps)

    def yaml_fragment(self, total_steps: int | None = None) -> str:
        """The recipe as a LightningCLI ``trainer.callbacks`` fragment."""
        from composer_bridge.search.report import yaml_fragment

        return yaml_fragment(self, total_steps)

    def table(self) -> str:
        """Every fit as a Markdown table."""
        from composer_bridge.search.report import fits_table

        return fits_table(self)

    def write(self, out_dir: str | Path, wandb: bool | str = "auto") -> dict[str, Path]:
        """Write the summary, code, YAML, tables and the Pareto PNG into ``out_dir`` (and W&B offline)."""
        from composer_bridge.search.report import write_outputs

        return write_outputs(self, Path(out_dir), wandb=wandb)


_FLYING = "flying"  # a fit submitted to the executor and not back yet


@dataclass(eq=False)
class _Pending:
    """A curve being trained side by side with others: its records by run length (None: not started)."""

    config: Config
    seed: int
    records: list[Any]
    q: float = 0.0
    t_base: float = 0.0
    done: bool = False

    @property
    def key(self) -> tuple[Config, int]:
        return self.config, self.seed

    def prefix(self) -> int:
        """How many of the shortest run lengths have finished, in a row."""
        return next((i for i, r in enumerate(self.records) if r is None or r is _FLYING), len(self.records))

    def known(self) -> int:
        """Fits finished or started: the search will charge at least these for this curve."""
        return sum(r is not None for r in self.records)

    def seconds(self) -> float:
        return sum(r.seconds for r in self.records if r is not None and r is not _FLYING)


class _Search:
    """The search's moving parts: the fit cache, the budget, the curves and the greedy loop."""

    def __init__(self, make_module: Callable[..., Any], make_data: Callable[..., Any], monitor: str,
                 higher: bool, candidates: list[Candidate], run_lengths: list[int], search_seeds: list[int],
                 confirm_seeds: list[int], clock: str, trainer_kwargs: dict[str, Any], max_fits: int | None,
                 max_train_seconds: float | None, min_gain: float, state: SearchState, progress: Any,
                 executor: Executor | None = None) -> None:
        self.make_module, self.make_data, self.monitor, self.higher = make_module, make_data, monitor, higher
        self.by_label = {c.label: c for c in candidates}
        self.order = [c.label for c in candidates]
        self.lengths, self.search_seeds, self.confirm_seeds = run_lengths, search_seeds, confirm_seeds
        self.clock, self.trainer_kwargs = clock, trainer_kwargs
        self.max_fits, self.max_seconds, self.min_gain = max_fits, max_train_seconds, min_gain
        self.state, self.cache = state, state.lookup()
        self.progress = progress
        self.executor: Executor = executor if executor is not None else InProcessExecutor()
        self.search_fits: list[FitRecord] = []  # the search-phase fits this replay has charged, in order
        self.confirm_fits: list[FitRecord] = []
        self.curves: dict[tuple[Config, int], CurveResult] = {}
        self.steps: list[str] = []
        self.search_pool = list(self.order)
        self.incumbent: Config = ()  # the recipe the greedy loop has accepted so far
        self.inc_scores: dict[int, float | None] = {s: 1.0 for s in search_seeds}
        self.fit_wall_s = 0.0  # waiting for fits in this call (their set-up and validation included)
        self.fit_cpu_s = 0.0
        self.started = (time.perf_counter(), time.process_time())
        self.earlier = (state.overhead_s, state.overhead_cpu_s)  # from earlier, interrupted calls
        self.trained = 0

    # --- fits and the budget ---------------------------------------------------------------------

    def _key(self, config: Sequence[str]) -> Config:
        return tuple(sorted(config, key=self.order.index))

    def _estimate(self, steps: int) -> float:
        """The clock's expected cost of a fit of ``steps`` steps: the most a baseline fit of that length took."""
        if self.clock == "steps":
            return float(steps)
        seen = [f.seconds for f in self.search_fits if not f.config and f.steps == steps]
        return max(seen) if seen else 0.0

    def _spent(self) -> float:
        return sum(f.seconds for f in self.search_fits)

    def _check_budget(self, steps: int) -> None:
        if self.max_fits is not None and len(self.search_fits) + 1 > self.max_fits:
            raise BudgetExhausted(f"{self.max_fits} fits")
        if self.max_seconds is not None and self._spent() + self._estimate(steps) > self.max_seconds:
            raise BudgetExhausted(f"{self.max_seconds:g} {self._unit()}")

    def _unit(self) -> str:
        return "steps" if self.clock == "steps" else "s"

    def fit(self, config: Config, seed: int, steps: int, phase: str) -> FitRecord:
        if phase == "search":
            self._check_budget(steps)
        key = (config, seed, steps)
        record = self.cache.get(key)
        if record is None:
            self.executor.submit(self.task(config, seed, steps))
            record = self._record(config, seed, steps, phase, self._wait()[1])
        (self.search_fits if phase == "search" else self.confirm_fits).append(record)
        self._tick(record)
        return record

    def task(self, config: Config, seed: int, steps: int) -> FitTask:
        return FitTask(self.make_module, self.make_data, [self.by_label[label] for label in config], steps, seed,
                       self.monitor, self.clock, self.trainer_kwargs)

    def _wait(self) -> tuple[int, FitOutcome]:
        """The next finished fit; the time waited counts as the fits' time, not the search's overhead."""
        started = time.perf_counter(), time.process_time()
        done = self.executor.next_done()
        self.fit_wall_s += time.perf_counter() - started[0]
        self.fit_cpu_s += time.process_time() - started[1]
        return done

    def _record(self, config: Config, seed: int, steps: int, phase: str, outcome: FitOutcome) -> FitRecord:
        """Keep a finished fit: in the cache and in the state file (written after every fit)."""
        self.trained += 1
        record = FitRecord(list(config), seed, steps, outcome.quality, outcome.seconds, outcome.cpu_s, outcome.wall_s,
                           phase, outcome.fit_wall_s, outcome.error, outcome.processes)
        self.state.fits.append(record)
        self.cache[(config, seed, steps)] = record
        self.state.overhead_s, self.state.overhead_cpu_s = self.overhead()
        self.state.save()
        if self.progress is not None and self.executor.concurrent:
            self.progress.set_postfix_str(f"{self.trained} fits trained, latest {self._name(config)} seed {seed} "
                                          f"@{steps}", refresh=True)
        return record

    # --- fits side by side -----------------------------------------------------------------------

    def _settled(self, points: list[tuple[float, float]], q: float, t_base: float, phase: str) -> str | None:
        """Why a candidate curve needs no longer run (``None``: it goes on to the next run length)."""
        if points and time_to_reach(points, q, self.higher) is not None:
            return "reached Q"
        if phase == "search" and points and points[-1][0] >= t_base:
            return "stopped: past the baseline's time to Q"
        return None

    def prefetch(self, wanted: Sequence[tuple[Config, int]], phase: str) -> None:
        """Train, side by side, the fits the curves ``wanted`` (in the search's order) will ask for.

        Only with a concurrent executor; the search then replays its decisions from the cache, in
        its own order, so the path does not depend on which fit finished first. A curve's next run
        length starts only when its shorter ones have not settled its score (baseline curves have
        no early stop: all their lengths start at once). A fit the budget certainly cannot reach
        (counting only fits known to come before it) is not started.
        """
        if not self.executor.concurrent:
            return
        curves: list[_Pending] = []
        for config, seed in wanted:
            if (config, seed) not in self.curves and all(c.key != (config, seed) for c in curves):
                curves.append(_Pending(config, seed, [None] * len(self.lengths)))
        for c in curves:
            if c.config:
                base = self.baseline(c.seed, phase).points  # cached: baselines are prefetched first
                c.q = best_quality(base, self.higher)
                c.t_base = time_to_reach(base, c.q, self.higher) or 0.0
        flying: dict[int, tuple[_Pending, int]] = {}
        for c in curves:
            self._launch(c, curves, phase, flying)
        while flying:
            ticket, outcome = self._wait()
            c, i = flying.pop(ticket)
            c.records[i] = self._record(c.config, c.seed, self.lengths[i], phase, outcome)
            self._launch(c, curves, phase, flying)

    def _launch(self, c: _Pending, curves: list[_Pending], phase: str, flying: dict[int, tuple[_Pending, int]]) -> None:
        """Start ``c``'s next fits: every length of a baseline curve; for a candidate, the next length
        once the shorter ones are in and leave its score open."""
        while not c.done:
            if c.config:
                n = c.prefix()
                if n < len(self.lengths) and c.records[n] is _FLYING:
                    return
                points = [(r.seconds, r.quality) for r in c.records[:n] if not r.error]
                if n == len(self.lengths) or self._settled(points, c.q, c.t_base, phase) is not None:
                    c.done = True
                    return
                todo = [n]
            else:
                todo = [i for i, r in enumerate(c.records) if r is None]
            for i in todo:
                cached = self.cache.get((c.config, c.seed, self.lengths[i]))
                if cached is not None:
                    c.records[i] = cached
                elif phase == "search" and not self._reachable(c, i, curves):
                    c.done = True
                    return
                else:
                    flying[self.executor.submit(self.task(c.config, c.seed, self.lengths[i]))] = (c, i)
                    c.records[i] = _FLYING
            if not c.config or c.records[todo[0]] is _FLYING:
                return

    def _reachable(self, c: _Pending, index: int, curves: list[_Pending]) -> bool:
        """Can the budget reach fit ``index`` of ``c``, counting only fits certain to be charged before it?"""
        before = curves[: next(k for k, d in enumerate(curves) if d is c)]
        count = len(self.search_fits) + sum(d.known() for d in before) + index + 1
        if self.max_fits is not None and count > self.max_fits:
            return False
        if self.max_seconds is not None:
            spent = self._spent() + sum(d.seconds() for d in (*before, c))
            if spent + self._estimate(self.lengths[index]) > self.max_seconds:
                return False
        return True

    def used_fits(self) -> list[FitRecord]:
        """The fits this search's decisions and confirmation used, in the state's order.

        All of the state's fits, except when a state is re-reported with a smaller budget than it
        was searched with: then the fits past that budget are not part of this result.
        """
        used = {id(f) for f in (*self.search_fits, *self.confirm_fits)}
        return [f for f in self.state.fits if id(f) in used]

    def overhead(self) -> tuple[float, float]:
        """The search's own time so far, outside the fits, wall and CPU (earlier interrupted calls included)."""
        return (self.earlier[0] + time.perf_counter() - self.started[0] - self.fit_wall_s,
                self.earlier[1] + time.process_time() - self.started[1] - self.fit_cpu_s)

    def _tick(self, record: FitRecord) -> None:
        if self.progress is None:
            return
        if record.phase == "search":
            self.progress.update(1 if self.max_fits is not None else record.seconds)
        label = "+".join(record.config) or "baseline"
        self.progress.set_postfix_str(f"{record.phase} fits {len(self.search_fits)}+{len(self.confirm_fits)}, "
                                      f"{label} seed {record.seed} @{record.steps}", refresh=True)

    # --- curves ----------------------------------------------------------------------------------

    def baseline(self, seed: int, phase: str) -> CurveResult:
        key = ((), seed)
        if key not in self.curves:
            points = []
            self.prefetch([((), seed)], phase)
            for steps in self.lengths:
                record = self.fit((), seed, steps, phase)
                if not record.error:
                    points.append((record.seconds, record.quality))
                if phase == "search" and len(self.search_fits) == 1:
                    checks.check_time_budget(self.max_seconds, record, self.lengths, len(self.search_seeds),
                                             self._unit())
                    checks.warn_small_budget(self.max_seconds, record.seconds * sum(self.lengths) / self.lengths[0],
                                             len(self.search_seeds), len(self.search_pool), self._unit())
            if not points:
                reasons = "; ".join(f.error or "" for f in self.state.fits if not f.config and f.seed == seed)
                raise RuntimeError(f"every baseline fit on seed {seed} failed, so nothing can be compared on it: "
                                   f"{reasons}")
            self.curves[key] = CurveResult((), seed, phase, points, "baseline", 1.0)
        return self.curves[key]

    def curve(self, config: Config, seed: int, phase: str) -> CurveResult:
        if not config:
            return self.baseline(seed, phase)
        key = (config, seed)
        if key in self.curves:
            return self.curves[key]
        base = self.baseline(seed, phase).points
        q = best_quality(base, self.higher)
        t_base = time_to_reach(base, q, self.higher)
        assert t_base is not None
        points: list[tuple[float, float]] = []
        status = "never reached Q"
        for steps in self.lengths:
            record = self.fit(config, seed, steps, phase)
            if record.error:  # a fit that failed twice is no point of the curve; the next length may still be
                continue
            points.append((record.seconds, record.quality))
            settled = self._settled(points, q, t_base, phase)
            if settled is not None:
                status = settled
                break
        speed = strict_speedup(base, points, self.higher)[0] if status == "reached Q" else None
        result = CurveResult(config, seed, phase, points, status, speed)
        self.curves[key] = result
        return result

    def scores(self, config: Config, seeds: Sequence[int]) -> dict[int, float | None]:
        return {seed: self.curve(config, seed, "search").speedup for seed in seeds}

    # --- the greedy loop -------------------------------------------------------------------------

    @staticmethod
    def _mean(scores: Mapping[int, float | None], seeds: Sequence[int]) -> float:
        return statistics.mean((scores[s] or 0.0) for s in seeds)

    def _name(self, config: Config) -> str:
        return " + ".join(config) or "baseline"

    def greedy(self) -> tuple[Config, dict[int, float | None]]:
        seeds = self.search_seeds
        self.prefetch([((), seed) for seed in seeds], "search")
        for seed in seeds:
            self.baseline(seed, "search")
        incumbent: Config = ()
        inc_scores: dict[int, float | None] = {s: 1.0 for s in seeds}
        while True:
            pool = [self._key((*incumbent, c)) for c in self.search_pool if c not in incumbent]
            if not pool:
                self.steps.append("every candidate is in the recipe")
                break
            survivors, results = list(pool), {cfg: {} for cfg in pool}
            for i, seed in enumerate(seeds):
                self.prefetch([(cfg, seed) for cfg in survivors], "search")
                for cfg in survivors:
                    results[cfg][seed] = self.curve(cfg, seed, "search").speedup
                seen = seeds[: i + 1]
                bar = self._mean(inc_scores, seen)
                ahead = sorted((c for c in survivors if self._mean(results[c], seen) > bar),
                               key=lambda c: -self._mean(results[c], seen))
                if i < len(seeds) - 1:
                    ahead = ahead[: max(1, math.ceil(len(ahead) / 2))]
                dropped = [c for c in survivors if c not in ahead]
                if dropped and i < len(seeds) - 1:
                    self.steps.append(f"after seed {seed}: {', '.join(self._name(c) for c in dropped)} stopped "
                                      f"(behind {self._name(incumbent)}'s {bar:.2f}x or in the lower half)")
                survivors = ahead
                if not survivors:
                    break
            bar = self._mean(inc_scores, seeds)
            if not survivors or self._mean(results[survivors[0]], seeds) <= bar * (1 + self.min_gain):
                best = f"; best addition {self._name(survivors[0])} at {self._mean(results[survivors[0]], seeds):.2f}x" \
                    if survivors else ""
                self.steps.append(f"no addition beats {self._name(incumbent)} ({bar:.2f}x) by more than "
                                  f"{100 * self.min_gain:g} %{best}: stop")
                break
            newest = next(c for c in survivors[0] if c not in incumbent)
            incumbent, inc_scores = survivors[0], results[survivors[0]]
            self.incumbent, self.inc_scores = incumbent, inc_scores
            self.steps.append(f"add {newest}: {self._name(incumbent)} at {self._mean(inc_scores, seeds):.2f}x")
            incumbent, inc_scores = self._remove(incumbent, inc_scores, newest)
        return incumbent, inc_scores

    def _remove(self, incumbent: Config, inc_scores: dict[int, float | None],
                newest: str) -> tuple[Config, dict[int, float | None]]:
        """Drop earlier algorithms that stopped helping (the one just added stays)."""
        seeds = self.search_seeds
        while len(incumbent) > 1:
            bar = self._mean(inc_scores, seeds)
            trials = [(tuple(x for x in incumbent if x != a), a) for a in incumbent if a != newest]
            self.prefetch([(cfg, seed) for cfg, _ in trials for seed in seeds], "search")
            scored = [(self._mean(self.scores(cfg, seeds), seeds), cfg, a) for cfg, a in trials]
            keep = [t for t in scored if t[0] >= bar]
            if not keep:
                break
            score, cfg, removed = max(keep, key=lambda t: t[0])
            self.steps.append(f"remove {removed}: {self._name(cfg)} at {score:.2f}x >= {bar:.2f}x")
            incumbent, inc_scores = cfg, self.scores(cfg, seeds)
            self.incumbent, self.inc_scores = incumbent, inc_scores
        return incumbent, inc_scores

    def prefetch_confirmation(self, configs: Sequence[Config], baselines: bool) -> None:
        """The confirmation's fits side by side: the baselines first (they set ``Q``), then every recipe.

        ``baselines``: whether the confirmation trains its baselines even with no recipe to confirm.
        """
        if not any(configs) and not baselines:
            return  # nothing to confirm: the baselines on the confirmation seeds are not trained either
        self.prefetch([((), seed) for seed in self.confirm_seeds], "confirm")
        self.prefetch([(c, seed) for c in configs if c for seed in self.confirm_seeds], "confirm")

    def confirm(self, config: Config) -> SpeedUp:
        return summarise_speedups({seed: self.curve(config, seed, "confirm").speedup for seed in self.confirm_seeds})


def search_recipe(
    make_module: Callable[..., Any],
    make_data: Callable[[int], Any],
    monitor: str = "val/acc",
    mode: str = "max",
    candidates: Sequence[Candidate | str] | None = None,
    run_lengths: Sequence[int] = (50, 100, 200),
    max_fits: int | None = None,
    max_train_seconds: float | None = None,
    search_seeds: Sequence[int] = (0, 1),
    confirm_seeds: Sequence[int] = (1000, 1001, 1002),
    trainer_kwargs: Mapping[str, Any] | None = None,
    clock: str = "cpu",
    min_gain: float = 0.02,
    also_confirm: Mapping[str, Sequence[Candidate | str]] | None = None,
    state_dir: str | Path | None = None,
    progress: bool = True,
    executor: Executor | str | None = None,
) -> SearchResult:
    """Search which candidate algorithms make this model reach the baseline's best quality sooner.

    Args:
        make_module: ``make_module(total_steps)`` (or ``make_module()``) → a fresh LightningModule
            for a run of ``total_steps`` optimizer steps (scale its learning-rate schedule to it).
            Called once per fit; it must return a new object every time.
        make_data: ``make_data(seed)`` → ``(train_loader, val_loader)`` or a LightningDataModule.
        monitor: the validation metric the module logs (``self.log("val/acc", ...)``).
        mode: ``"max"`` (higher is better) or ``"min"`` (a loss).
        candidates: class names or :class:`Candidate` objects; ``None``: the defaults that apply
            to this model (:data:`~composer_bridge.search.candidates.DEFAULT_CANDIDATES`).
        run_lengths: optimizer steps of each point of a quality-vs-time curve (ascending).
        max_fits: the search's budget in fits (baseline fits on the search seeds included).
        max_train_seconds: the search's budget in training time on ``clock`` (steps for ``"steps"``).
        search_seeds: seeds the search decides on.
        confirm_seeds: seeds the chosen recipe is confirmed on; never used by the search.
        trainer_kwargs: your ``lightning.Trainer`` arguments (accelerator, precision, ...); the
            search sets ``max_steps``, ``max_epochs``, ``callbacks``, ``logger`` and checkpointing.
        clock: ``"cpu"`` (process CPU time, default: steady on shared CPUs), ``"wall"`` (for a GPU)
            or ``"steps"`` (deterministic, for reproducibility checks).
        min_gain: an addition must beat the current recipe's mean speed-up by this fraction.
        also_confirm: more recipes to confirm on the same seeds (e.g. a published one), by name.
        state_dir: where ``search.json`` lives: an interrupted search resumes from it and a
            finished one re-reports from it without training. ``None``: nothing is saved.
        progress: show a progress bar (fits done, budget left) on stderr.
        executor: where the fits run. ``None`` (default): here, one at a time
            (:class:`~composer_bridge.search.executor.InProcessExecutor`). ``"ray"`` or a
            :class:`~composer_bridge.search.ray_executor.RayExecutor`: side by side as Ray tasks, each
            with its own cores or GPUs; every fit that does not depend on another runs at once. The
            decisions are the same either way (with ``clock="steps"``, exactly the same path).
            A Trainer on several devices (``strategy="ddp", devices=2``) trains each fit in a child
            process whose script is the fit itself, with either executor.

    Returns:
        A :class:`SearchResult`.

    Raises:
        composer_bridge.search.SearchInputError: bad input, before any training (a time budget
            smaller than the baseline curves is found after the first baseline fit).
    """
    arguments = dict(locals())
    with _quiet_lightning():
        return _search(**arguments)


def _search(make_module: Callable[..., Any], make_data: Callable[[int], Any], monitor: str, mode: str,
            candidates: Sequence[Candidate | str] | None, run_lengths: Sequence[int], max_fits: int | None,
            max_train_seconds: float | None, search_seeds: Sequence[int], confirm_seeds: Sequence[int],
            trainer_kwargs: Mapping[str, Any] | None, clock: str, min_gain: float,
            also_confirm: Mapping[str, Sequence[Candidate | str]] | None, state_dir: str | Path | None,
            progress: bool, executor: Executor | str | None) -> SearchResult:
    started = (time.perf_counter(), time.process_time())  # the probe and the checks are overhead too
    higher = checks.check_mode(mode)
    lengths = checks.check_run_lengths(run_lengths)
    search_seeds, confirm_seeds = checks.check_seeds(search_seeds, confirm_seeds)
    tkw = checks.check_trainer_kwargs(trainer_kwargs)
    checks.check_clock(clock)
    checks.check_budget(max_fits, max_train_seconds, len(lengths), len(search_seeds))
    pool = as_candidates(candidates)
    extra = {name: as_candidates(list(recipe)) for name, recipe in (also_confirm or {}).items()}
    probe = checks.probe(make_module, make_data, monitor, lengths[0], search_seeds[0], tkw)
    usable = checks.filter_candidates(pool, probe, lengths[0], explicit=candidates is not None)
    # A published recipe is confirmed as it can run here: parts that cannot apply are left out, with a warning.
    extra = {name: checks.filter_candidates(recipe, probe, lengths[0], explicit=False, what=f"also_confirm[{name!r}]")
             for name, recipe in extra.items()}
    checks.check_same_labels(pool, extra)
    checks.warn_small_budget(max_fits, len(lengths), len(search_seeds), len(usable), "fits")
    everything = usable + [c for recipe in extra.values() for c in recipe if c.label not in {u.label for u in usable}]
    settings = {
        "monitor": monitor, "mode": mode, "run_lengths": lengths, "search_seeds": search_seeds,
        "confirm_seeds": confirm_seeds, "clock": clock, "min_gain": min_gain,
        "candidates": [[c.label, c.algorithm, dict(c.kwargs)] for c in everything],
        "search_candidates": [c.label for c in usable],
        "also_confirm": {name: [c.label for c in recipe] for name, recipe in extra.items()},
        "trainer_kwargs": {k: repr(v) for k, v in sorted(tkw.items())},
    }
    state = SearchState(Path(state_dir) / "search.json" if state_dir is not None else None, settings)
    runner = _executor(executor)
    bar = _progress_bar(progress, max_fits, max_train_seconds, clock)
    search = _Search(make_module, make_data, monitor, higher, everything, lengths, search_seeds, confirm_seeds,
                     clock, tkw, max_fits, max_train_seconds, min_gain, state, bar, runner)
    search.search_pool = [c.label for c in usable]
    search.started = started
    stopped = False
    try:
        runner.start(search.task((), search_seeds[0], lengths[0]))
        try:
            incumbent, scores = search.greedy()
        except BudgetExhausted as budget:
            stopped = True
            incumbent, scores = search.incumbent, search.inc_scores
            search.steps.append(f"budget spent ({budget}): the search stops with {search._name(incumbent)}")
        search.prefetch_confirmation([incumbent, *(search._key([c.label for c in r]) for r in extra.values())],
                                     baselines=bool(extra))
        confirmed = search.confirm(incumbent) if incumbent else None
        also = {name: search.confirm(search._key([c.label for c in recipe])) for name, recipe in extra.items()}
        if confirmed is None and extra:
            for seed in confirm_seeds:
                search.baseline(seed, "confirm")
    finally:
        runner.close()
        if bar is not None:
            bar.close()
    if search.trained:  # a re-report (nothing trained) leaves the state, and the search's overhead, as they were
        state.overhead_s, state.overhead_cpu_s = search.overhead()
        state.save()
    cost = _cost(search, max_fits, max_train_seconds)
    recipe = [search.by_label[label] for label in incumbent]
    result = SearchResult(
        recipe=recipe, confirmed=confirmed, beats_baseline=bool(confirmed is not None and confirmed.mean > 1.0),
        search_score=(statistics.mean((scores[s] or 0.0) for s in search_seeds) if incumbent else None),
        also_confirmed=also, fits=search.used_fits(), curves=list(search.curves.values()), steps=search.steps,
        cost=cost, settings=settings, candidates=usable, stopped_by_budget=stopped,
    )
    return result


def _executor(executor: Executor | str | None) -> Executor:
    if executor is None or executor == "local":
        return InProcessExecutor()
    if executor == "ray":
        from composer_bridge.search.ray_executor import RayExecutor

        return RayExecutor()
    if isinstance(executor, str) or not all(hasattr(executor, m) for m in ("start", "submit", "next_done", "close")):
        raise SearchInputError(f"executor={executor!r}: expected None (fits one at a time here), 'ray', or an "
                               "executor object such as composer_bridge.search.RayExecutor(workers=2).")
    return executor


def _progress_bar(progress: bool, max_fits: int | None, max_seconds: float | None, clock: str) -> Any:
    if not progress:
        return None
    from tqdm.auto import tqdm

    if max_fits is not None:
        return tqdm(total=max_fits, desc="recipe search", unit="fit", leave=True)
    unit = "step" if clock == "steps" else "s"
    return tqdm(total=max_seconds, desc="recipe search", unit=unit, leave=True,
                bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} " + unit + " trained [{elapsed}<{remaining}{postfix}]")


def _cost(search: _Search, max_fits: int | None, max_seconds: float | None) -> dict[str, Any]:
    seeds = search.search_seeds
    baseline_runs = [sum(f.seconds for f in search.search_fits if not f.config and f.seed == s) for s in seeds]
    one_baseline = statistics.mean(baseline_runs) if baseline_runs else float("nan")
    search_s = sum(f.seconds for f in search.search_fits)
    confirm_s = sum(f.seconds for f in search.confirm_fits)
    used = search.used_fits()
    trained_wall = sum(f.wall_s for f in used)
    budget = max_seconds if max_seconds is not None else (search_s if max_fits is not None else float("nan"))
    overhead = search.state.overhead_cpu_s if search.clock == "cpu" else search.state.overhead_s
    return {
        "clock": search.clock, "clock_means": CLOCKS[search.clock],
        "search_fits": len(search.search_fits), "confirm_fits": len(search.confirm_fits),
        "search_train": search_s, "confirm_train": confirm_s,
        "baseline_run": one_baseline,  # one baseline curve: every run length, one seed
        "search_in_baseline_runs": search_s / one_baseline if one_baseline else float("nan"),
        "max_fits": max_fits, "max_train": max_seconds,
        # The search's own time outside the fits (probe, checks, bookkeeping, state writes), all calls together.
        "overhead_s": search.state.overhead_s, "overhead_cpu_s": search.state.overhead_cpu_s,
        # ... as a fraction of the budget, on the budget's clock (CPU time for "cpu", wall time for "wall").
        "overhead_fraction_of_budget": (overhead / budget if budget and search.clock != "steps" else None),
        "overhead_fraction_of_training_wall": search.state.overhead_s / trained_wall if trained_wall else None,
        "fits_trained_now": search.trained,
        "lightning_outside_training_s": sum(f.fit_wall_s - f.wall_s for f in used),
    }


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Lightning's per-fit banners (GPU available, ...) off while the search runs; restored afterwards."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            warnings.filterwarnings("ignore", message=".*limit_val_batches=1.*")
            warnings.filterwarnings("ignore", message=".*have no `val_dataloader`.*")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
