"""The scheduling of a search's fits: the fit cache, the budget, the executor, fits side by side, the overhead.

The greedy search (:mod:`composer_bridge.search.greedy`) asks for one fit at a time, in its own
order, with :meth:`FitScheduler.fit`; the answer comes from the cache (the state file of an earlier
call, or a fit trained ahead) or from a fresh training. With a concurrent executor the greedy
search first announces the curves it is about to read (:meth:`FitScheduler.prefetch`): their fits
are then trained side by side, and the search replays its decisions from the cache, so the path
never depends on which fit finished first.

Examples:
    >>> from composer_bridge.search.candidates import Candidate
    >>> from composer_bridge.search.executor import InProcessExecutor
    >>> from composer_bridge.search.settings import SearchSettings
    >>> from composer_bridge.search.state import SearchState
    >>> settings = SearchSettings(make_module=None, make_data=None, monitor="q", higher=True,
    ...                           candidates=(Candidate("MixUp"),), search_pool=("MixUp",), run_lengths=(1, 2),
    ...                           search_seeds=(0,), confirm_seeds=(10,), clock="steps", max_fits=4)
    >>> fits = FitScheduler(settings, SearchState(None, {}), InProcessExecutor())
    >>> fits.search_fits, fits.trained
    ([], 0)
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from composer_bridge.search import checks
from composer_bridge.search.executor import Executor, FitOutcome
from composer_bridge.search.results import BudgetExhausted, Config, config_name
from composer_bridge.search.scoring import CurveGoal
from composer_bridge.search.settings import SearchSettings
from composer_bridge.search.state import SearchState
from composer_bridge.search.trial import FitRecord

__all__ = ["FitScheduler", "baseline_run_seconds"]

class _InFlight(enum.Enum):
    """The state of a fit submitted to the executor and not back yet."""

    FLYING = "flying"


_FLYING = _InFlight.FLYING
#: One run length of a curve being trained: not started (``None``), training (``_FLYING``), or its record.
Slot = FitRecord | _InFlight | None


@dataclass(eq=False)
class _Pending:
    """A curve being trained side by side with others: one slot per run length."""

    config: Config
    seed: int
    records: list[Slot]
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

    def finished(self) -> list[FitRecord]:
        """The records of the fits that are back, by run length."""
        return [r for r in self.records if isinstance(r, FitRecord)]

    def seconds(self) -> float:
        return sum(r.seconds for r in self.finished())


@dataclass(eq=False)
class _Batch:
    """The curves one :meth:`FitScheduler.prefetch` trains side by side, and the fits it has in flight."""

    curves: list[_Pending]
    phase: str
    lengths: tuple[int, ...]
    goal: Callable[[Config, int], CurveGoal]
    flying: dict[int, tuple[_Pending, int]] = field(default_factory=dict)  #: ticket -> (curve, run-length index)

    def submit(self, executor: Executor, settings: SearchSettings, c: _Pending, index: int) -> None:
        """Start fit ``index`` of curve ``c``."""
        ticket = executor.submit(settings.task(c.config, c.seed, self.lengths[index], self.phase))
        self.track(ticket, c, index)

    def track(self, ticket: int, c: _Pending, index: int) -> None:
        """Wait for ``ticket`` as fit ``index`` of ``c``."""
        self.flying[ticket] = (c, index)
        c.records[index] = _FLYING


class FitScheduler:
    """The fits of one search: from the cache or trained, charged to the budget, side by side where possible.

    Args:
        settings: the search's settings (budget, run lengths, clock, what a fit needs).
        state: the state file: its fits are the cache; every new fit is appended and saved.
        executor: where fits train.
        progress: a tqdm bar, or ``None``.
        started: when the search began (``perf_counter``, ``process_time``): its overhead counts from there.
        needed_later: fits the search will likely read later, ``(config, seed, steps, phase)`` (the
            confirmation's baselines): with an executor that speculates, a worker that would otherwise
            wait trains them early.
    """

    def __init__(self, settings: SearchSettings, state: SearchState, executor: Executor, progress: Any = None, *,
                 started: tuple[float, float] | None = None,
                 needed_later: Sequence[tuple[Config, int, int, str]] = ()) -> None:
        self.settings = settings
        self.state, self.cache = state, state.lookup()
        self.executor, self.progress = executor, progress
        self.search_fits: list[FitRecord] = []  # the search-phase fits this replay has charged, in order
        self.confirm_fits: list[FitRecord] = []
        self.trained = 0  # fits trained in this call (not read from the state)
        self.fit_wall_s = 0.0  # waiting for fits in this call (their set-up and validation included)
        self.fit_cpu_s = 0.0
        self.started = started if started is not None else (time.perf_counter(), time.process_time())
        self.earlier = (state.overhead_s, state.overhead_cpu_s)  # from earlier, interrupted calls
        self.needed_later = list(needed_later)
        self._early: dict[int, tuple[Config, int, int, str]] = {}  # tickets of fits trained early, not back yet

    # --- one fit at a time, in the search's order --------------------------------------------------

    def fit(self, config: Config, seed: int, steps: int, phase: str) -> FitRecord:
        """The fit of ``config`` on ``seed`` at ``steps``, charged to ``phase`` (``"search"`` or ``"confirm"``).

        Raises :class:`~composer_bridge.search.results.BudgetExhausted` when a search fit would
        overrun the budget.
        """
        if phase == "search":
            self._check_budget(steps)
        record = self.cache.get((config, seed, steps))
        if record is None:
            ticket = self._claim_early(config, seed, steps)
            if ticket is None:
                ticket = self.executor.submit(self.settings.task(config, seed, steps, phase))
            while True:
                done, outcome = self._wait()
                if done == ticket:
                    break
            record = self._record(config, seed, steps, phase, outcome)
        (self.search_fits if phase == "search" else self.confirm_fits).append(record)
        if phase == "search" and len(self.search_fits) == 1:
            self._check_first_fit(record)
        self._tick(record)
        return record

    def spent(self) -> float:
        """The search fits' training time so far, on the search's clock."""
        return sum(f.seconds for f in self.search_fits)

    def _estimate(self, steps: int) -> float:
        """The clock's expected cost of a fit of ``steps`` steps: the most a baseline fit of that length took."""
        if self.settings.clock == "steps":
            return float(steps)
        seen = [f.seconds for f in self.search_fits if not f.config and f.steps == steps]
        return max(seen) if seen else 0.0

    def baseline_run(self, complete: bool = True) -> float | None:
        """One baseline run on the search's clock (every run length on one search seed, mean over the seeds),
        once every search seed's baseline curve is in (``None`` before); with ``complete=False``, from the baseline
        fits there are (the cost of a search the budget stopped early)."""
        ladder = self.settings.lengths("search")
        return baseline_run_seconds(self.search_fits, self.settings.search_seeds, len(ladder) if complete else None,
                                    ladder=ladder)

    def max_seconds(self) -> float | None:
        """The time budget: ``max_train_seconds``, or ``max_baseline_runs`` baseline runs once they are known."""
        limits = [self.settings.max_train_seconds]
        if self.settings.max_baseline_runs is not None:
            run = self.baseline_run()
            limits.append(None if run is None else self.settings.max_baseline_runs * run)
        known = [x for x in limits if x is not None]
        return min(known) if known else None

    def _check_budget(self, steps: int) -> None:
        max_fits, max_seconds = self.settings.max_fits, self.max_seconds()
        if max_fits is not None and len(self.search_fits) + 1 > max_fits:
            raise BudgetExhausted(f"{max_fits} fits")
        if max_seconds is not None and self.spent() + self._estimate(steps) > max_seconds:
            runs = self.settings.max_baseline_runs
            what = f"{runs:g} baseline runs = " if runs is not None and max_seconds != self.settings.max_train_seconds else ""
            raise BudgetExhausted(f"{what}{max_seconds:g} {self.settings.unit}")

    def _check_first_fit(self, record: FitRecord) -> None:
        """After the first (shortest) baseline fit: is a time budget big enough to compare anything?"""
        s = self.settings
        lengths = s.lengths("search")
        checks.check_time_budget(s.max_train_seconds, record, lengths, len(s.search_seeds), s.unit)
        checks.warn_small_budget(s.max_train_seconds, record.seconds * sum(lengths) / lengths[0],
                                 len(s.search_seeds), len(s.search_pool), s.unit)

    def _claim_early(self, config: Config, seed: int, steps: int) -> int | None:
        """The ticket of this fit if it was started early and is not back yet (no longer early: the caller waits)."""
        ticket = next((t for t, key in self._early.items() if key[:3] == (config, seed, steps)), None)
        if ticket is not None:
            del self._early[ticket]
        return ticket

    def _wait(self) -> tuple[int, FitOutcome]:
        """The next finished fit that someone waits for (a fit trained early is recorded when it comes back);
        the time waited counts as the fits' time, not the search's overhead."""
        while True:
            started = time.perf_counter(), time.process_time()
            ticket, outcome = self.executor.next_done()
            self.fit_wall_s += time.perf_counter() - started[0]
            self.fit_cpu_s += time.process_time() - started[1]
            if ticket not in self._early:
                return ticket, outcome
            config, seed, steps, phase = self._early.pop(ticket)
            self._record(config, seed, steps, phase, outcome)

    def _record(self, config: Config, seed: int, steps: int, phase: str, outcome: FitOutcome) -> FitRecord:
        """Keep a finished fit: in the cache and in the state file (written after every fit)."""
        self.trained += 1
        record = FitRecord(list(config), seed, steps, outcome.quality, outcome.seconds, outcome.cpu_s, outcome.wall_s,
                           phase, fit_wall_s=outcome.fit_wall_s, error=outcome.error, processes=outcome.processes)
        self.state.fits.append(record)
        self.cache[(config, seed, steps)] = record
        self.state.overhead_s, self.state.overhead_cpu_s = self.overhead()
        self.state.save()
        if self.progress is not None and self.executor.concurrent:
            self.progress.set_postfix_str(f"{self.trained} fits trained, latest {config_name(config)} seed {seed} "
                                          f"@{steps}", refresh=True)
        return record

    # --- fits side by side -------------------------------------------------------------------------

    def prefetch(self, wanted: Sequence[tuple[Config, int]], phase: str,
                 goal: Callable[[Config, int], CurveGoal]) -> None:
        """Train, side by side, the fits the curves ``wanted`` (in the search's order) will ask for.

        Only with a concurrent executor; the search then replays its decisions from the cache, in
        its own order, so the path does not depend on which fit finished first. A curve's next run
        length starts only when its shorter ones have not settled it against ``goal(config, seed)``,
        asked again each time (a goal may rise as other curves finish; baseline curves have no early
        stop: all their lengths start at once). A goal may stop a curve later than the search will, never
        sooner: the fits trained beyond what the search reads are in the state, not in its decisions. A
        fit the budget certainly cannot reach (counting only fits known to come before it) is not started.
        """
        if not self.executor.concurrent:
            return
        lengths = self.settings.lengths(phase)
        batch = _Batch([], phase, lengths, goal)
        for config, seed in wanted:
            if all(c.key != (config, seed) for c in batch.curves):
                batch.curves.append(_Pending(config, seed, [None] * len(lengths)))
        for c in batch.curves:
            self._launch(c, batch)
        self._speculate(batch)
        while any(not c.done for c, _ in batch.flying.values()):
            ticket, outcome = self._wait()
            c, i = batch.flying.pop(ticket)
            c.records[i] = self._record(c.config, c.seed, lengths[i], phase, outcome)
            for d in batch.curves:  # a finished curve may raise another's goal: each decides again
                self._launch(d, batch)
            self._speculate(batch)
        for ticket, (c, i) in batch.flying.items():  # started ahead, no longer needed: kept when they come back
            self._early[ticket] = (c.config, c.seed, lengths[i], phase)

    def prefetch_runs(self, wanted: Sequence[tuple[Config, int, int]], phase: str) -> None:
        """Start, side by side, single fits ``(config, seed, steps)`` the search reads next, in this order (the
        screening's shortest runs); each is recorded when it comes back and read from the cache then."""
        if not self.executor.concurrent:
            return
        for config, seed, steps in wanted:
            self._start_early(config, seed, steps, phase)

    def _start_early(self, config: Config, seed: int, steps: int, phase: str) -> None:
        """Start one fit ahead of the search reading it (kept when it comes back), unless it is in the cache or
        already started ahead."""
        key = (config, seed, steps)
        if key in self.cache or any(started[:3] == key for started in self._early.values()):
            return
        ticket = self.executor.submit(self.settings.task(config, seed, steps, phase))
        self._early[ticket] = (config, seed, steps, phase)

    def _free(self, batch: _Batch) -> int:
        """How many workers would otherwise wait."""
        return self.executor.slots() - len(batch.flying) - len(self._early)

    def _speculate(self, batch: _Batch) -> None:
        """With an executor that speculates: while a worker would wait, start the next run length of the
        first curve (in the search's order) whose shorter run is still training; then a fit needed later."""
        if not self.executor.speculate:
            return
        lengths = batch.lengths
        started = True
        while started and self._free(batch) > 0:
            started = False
            for c in batch.curves:
                if c.done or not c.config or self._free(batch) <= 0:
                    continue
                n = c.prefix()
                ahead = next((i for i in range(n + 1, len(lengths)) if c.records[i] is None), None)
                if n == len(lengths) or c.records[n] is not _FLYING or ahead is None:
                    continue
                cached = self.cache.get((c.config, c.seed, lengths[ahead]))
                if cached is not None:
                    c.records[ahead] = cached
                elif batch.phase == "confirm" or self._reachable(c, ahead, batch.curves):
                    batch.submit(self.executor, self.settings, c, ahead)
                    started = True
        # then the fits certain to be read later (the confirmation's baselines), while workers are still free
        while self.needed_later and self._free(batch) > 0:
            config, seed, steps, later = self.needed_later.pop(0)
            if all((d.config, d.seed, lengths[i]) != (config, seed, steps) for d, i in batch.flying.values()):
                self._start_early(config, seed, steps, later)

    def _launch(self, c: _Pending, batch: _Batch) -> None:
        """Start ``c``'s next fits: every length of a baseline curve; for a candidate, the next length
        once the shorter ones are in and leave its score open."""
        lengths = batch.lengths
        while not c.done:
            if c.config:  # a candidate's curve: one length at a time, while its goal leaves its score open
                n = c.prefix()
                points = [(r.seconds, r.quality) for r in c.finished()[:n] if not r.error]
                if n == len(lengths) or batch.goal(c.config, c.seed).settled(points) is not None:
                    c.done = True  # a longer fit still training (started ahead) is no longer waited for
                    return
                if c.records[n] is _FLYING:
                    return
                todo = [n]
            else:  # a baseline curve trains every length at once: it sets the goal, it has none
                todo = [i for i, r in enumerate(c.records) if r is None]
            for i in todo:
                cached = self.cache.get((c.config, c.seed, lengths[i]))
                early = None if cached is not None else self._claim_early(c.config, c.seed, lengths[i])
                if cached is not None:
                    c.records[i] = cached
                elif early is not None:  # trained early and still training: this curve waits for it now
                    batch.track(early, c, i)
                elif batch.phase == "search" and not self._reachable(c, i, batch.curves):
                    c.done = True
                    return
                else:
                    batch.submit(self.executor, self.settings, c, i)
            if not c.config or c.records[todo[0]] is _FLYING:
                return

    def _reachable(self, c: _Pending, index: int, curves: list[_Pending]) -> bool:
        """Can the budget reach fit ``index`` of ``c``, counting only fits certain to be charged before it?"""
        max_fits, max_seconds = self.settings.max_fits, self.max_seconds()
        before = curves[: next(k for k, d in enumerate(curves) if d is c)]
        count = len(self.search_fits) + sum(d.known() for d in before) + index + 1
        if max_fits is not None and count > max_fits:
            return False
        if max_seconds is not None:
            spent = self.spent() + sum(d.seconds() for d in (*before, c))
            if spent + self._estimate(self.settings.lengths("search")[index]) > max_seconds:
                return False
        return True

    # --- what the fits cost ------------------------------------------------------------------------

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
            self.progress.update(1 if self.settings.max_fits is not None else record.seconds)
        self.progress.set_postfix_str(f"{record.phase} fits {len(self.search_fits)}+{len(self.confirm_fits)}, "
                                      f"{'+'.join(record.config) or 'baseline'} seed {record.seed} @{record.steps}",
                                      refresh=True)


def baseline_run_seconds(fits: Sequence[FitRecord], seeds: Sequence[int], lengths: int | None = None, *,
                         ladder: Collection[int] | None = None) -> float | None:
    """One baseline run on the fits' clock: the baseline fits of one seed summed, the mean over the seeds that have any.

    With ``lengths``, ``None`` unless every seed has that many baseline fits (its whole curve); without, ``None``
    only when no seed has one. With ``ladder``, only the fits of these run lengths count (the baseline's run
    for the first look, shorter than any of them, is no part of a baseline run).

    Examples:
        >>> from composer_bridge.search.trial import FitRecord
        >>> fits = [FitRecord([], seed, n, 0.5, float(n), float(n), float(n), "search") for seed in (0, 1) for n in (2, 4)]
        >>> baseline_run_seconds(fits, [0, 1]), baseline_run_seconds(fits, [0, 1], lengths=3)
        (6.0, None)
    """
    runs = []
    for seed in seeds:
        mine = [f for f in fits if not f.config and f.seed == seed and (ladder is None or f.steps in ladder)]
        if lengths is not None and len(mine) < lengths:
            return None
        if mine:
            runs.append(sum(f.seconds for f in mine))
    return sum(runs) / len(runs) if runs else None
