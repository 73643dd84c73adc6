"""The prescription search: which run to start (algorithms *and* length), measured the way it is handed over.

Every trial is one run of a configuration at one of ``run_lengths`` (its schedule that long), validated as it
trains; its score is AlgoPerf's: the training time at the first validation that reaches the target. What the
search hands over (:class:`~composer_bridge.search.prescription.Prescription`) is the trial that reached it
soonest, at its length, so the user trains exactly the run that was measured.

1. **The baseline run.** The baseline (no algorithm) at the longest run length ``B`` (the user's run) on the first
   search seed, validated every ``eval_every`` steps, or the user's own such run (``baseline_run``: read, not
   trained). The target ``Q`` is ``target`` if given, else that run's best validation; ``T`` is its time to
   ``Q``. One such run is the cost's unit.
2. **Successive halving at equal training time, on runs that go on, on another seed.** The candidates race on a
   seed of their own (the first finalist seed, else the second search seed), so your run's seed makes no choice:
   first the baseline there, to the last rung, then every starting recipe and candidate at ``B``, two at a time
   (one where the budget left holds one run as long as it needs, not two), for at most ``T/3`` of training (the
   last rung). Each is raced against what is known when it starts: it stops once it reaches ``Q`` (its time is
   known), once it has trained the best time so far (less ``min_gain``) without reaching ``Q`` (it cannot win), at
   its share of the budget left (the pick's run kept aside once one leads, and in the uncapped waves of shorter
   lengths: :meth:`PrescriptionSearch._reserve`), or at a rung (``T/12``, ``T/3``) if its quality there is below
   the bar by more than the noise of a gap between two runs' validations (``sqrt(2)`` times one validation's: a
   smaller gap the noise alone can make): the bar is the worst of the best quarter of the qualities the
   runs before it had there on the race seed, the baseline's included (ASHA's promotion rule, read at equal
   training time rather than at equal steps, since methods differ in their cost per step).
   A run that clears the rung trains on: nothing is retrained. Qualities at a rung are read between a run's
   validations at the rung's time exactly. A configuration whose gain shows only late (one that averages the
   weights or owns the schedule: :attr:`~composer_bridge.search.candidates.Candidate.pays_late`) is judged at
   the last rung alone: an average lags the weights it averages early in a run, so the first rung would stop
   it before it pays.
3. **The pick.** The run that reached ``Q`` soonest, if one beat the baseline's time; else the one with the best
   quality at the last rung, if it is ahead of the race seed's baseline there by more than the baseline curve's
   validation noise. If none is, the baseline at each shorter length: is the gain the shorter schedule itself?
4. **The pick on your run's seed.** The pick's run on the seed of your baseline run, which chose nothing, to the
   target (at most twice ``T`` or the budget left), and, with budget left, at the next shorter length on the same
   seed (kept if it reaches the target sooner there). Its time against your run's ``T`` is the estimate: the two
   runs share the seed's luck, and the comparison costs no baseline run. ``T`` is on the clock of the runs trained
   now: scaled by the race seed's baseline's time over your run's for the same steps (:func:`clock_ratio`), and so
   is the budget's unit, one baseline run (from then on the budget buys the runs it says at today's speed). A given
   run is also timed again beside the pick when the budget left holds it. Its interval comes from
   the seed-to-seed spread of a run's time to the target: a prior of 10 % worth two seed pairs, pooled with the
   pairs measured, never below what the validations' own noise gives, and widened by Student's t for the few
   degrees of freedom. It is prescribed only if it is sure enough (``confidence``) to beat the baseline, read
   from Student's t at those degrees of freedom (:func:`how_sure`); otherwise the prescription is the baseline at
   ``B``. The budget keeps aside for the pick's run the longest it may take and still be prescribed: ``T`` over
   the least speed-up the prior noise reads as ``confidence`` sure (:meth:`PrescriptionSearch.least_speedup`).
5. **Confirmation (optional).** The prescription and the baseline at ``B`` on ``confirm_seeds``, reported on
   its own: it is not part of the search's cost.

Examples:
    >>> round(validation_noise([(1, 1.0, 0.5), (2, 2.0, 0.6), (3, 3.0, 0.7), (4, 4.0, 0.8)]), 6)
    0.0
    >>> round(validation_noise([(1, 1.0, 0.5), (2, 2.0, 0.65), (3, 3.0, 0.7), (4, 4.0, 0.85)]), 4)
    0.0408
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from composer_bridge.search.curve_rule import CurvePoint, CurveRule, first_reach
from composer_bridge.search.estimate import Estimate, t_cdf
from composer_bridge.search.estimate import t_quantile as estimate_t_quantile
from composer_bridge.search.executor import Executor
from composer_bridge.search.prescription import Prescription
from composer_bridge.search.results import BudgetExhausted, Config, CurveResult, config_name
from composer_bridge.search.scoring import SpeedUp, quality_at, summarise_speedups
from composer_bridge.search.settings import SearchSettings
from composer_bridge.search.state import SearchState
from composer_bridge.search.trial import FitRecord

__all__ = ["RUNGS", "PrescriptionSearch", "RunBook", "Trial", "clock_ratio", "how_sure", "prescribe", "validation_noise"]

#: the rungs, as fractions of the baseline's time to the target, and the share of runs kept at each (ASHA's eta)
RUNGS = (1 / 12, 1 / 3)
ETA = 4
#: trials started together with the same bars (so a search on two workers takes the path of one in a process)
WAVE = 2
#: the seed-to-seed spread of a run's time to a target assumed before any is measured (10 %), and its weight in
#: seed pairs: one or two pairs measured cannot tell the spread alone
PRIOR_CV = 0.1
PRIOR_DF = 2
# one-sided 95 % quantiles of Student's t by degrees of freedom (larger: the normal's, corrected)
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812}


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for ``p = 0.95`` (the one-sided 95 %, a two-sided 90 % interval) at ``df`` degrees of
    freedom; Cornish-Fisher's first correction beyond the table.

    Examples:
        >>> t_quantile(0.95, 3), round(t_quantile(0.95, 1000), 3)
        (2.353, 1.646)
    """
    if p != 0.95:
        raise ValueError(f"t_quantile(p={p!r}): only p=0.95 is tabled (the search's 90 % intervals).")
    if df in _T95:
        return _T95[df]
    z = statistics.NormalDist().inv_cdf(p)
    return z + (z ** 3 + z) / (4 * df)


def how_sure(speedup: float, sd: float, df: int) -> float:
    """How sure a measured ``speedup`` says the run beats the baseline: the probability that its log is above 0
    under Student's t with ``df`` degrees of freedom, ``sd`` the log-speed-up's standard deviation (itself measured
    on few seed pairs, hence the t's heavier tails at every level, not only at the interval's 95 %).

    Examples:
        >>> round(how_sure(math.exp(0.2), 0.1, 2), 3), round(how_sure(math.exp(0.2), 0.1, 10**6), 3)
        (0.908, 0.977)
        >>> how_sure(1.3, 0.0, 2), how_sure(0.9, 0.0, 2)
        (1.0, 0.0)
    """
    if sd <= 0:
        return float(speedup > 1)
    return t_cdf(math.log(speedup) / sd, df)


def clock_ratio(now: Sequence[CurvePoint], before: Sequence[CurvePoint]) -> float | None:
    """How much longer the run ``now`` took than the run ``before`` for the steps ``now`` trained (``None``: no
    steps to compare); ``before``'s time at ``now``'s last step is read between its validations.

    Examples:
        >>> clock_ratio([(10, 1.2, 0.5), (20, 2.4, 0.6)], [(10, 1.0, 0.5), (20, 2.0, 0.6), (30, 3.0, 0.7)])
        1.2
        >>> clock_ratio([(15, 3.0, 0.5)], [(10, 1.0, 0.5), (20, 2.0, 0.6)])
        2.0
    """
    if not now or not before or now[-1][0] > before[-1][0]:
        return None
    step, seconds = now[-1][0], now[-1][1]
    then = quality_at([(0, 0.0), *((s, t) for s, t, _ in before)], step)  # the time curve, read as a curve
    return round(seconds / then, 6) if then > 0 and seconds > 0 else None


def validation_noise(points: Sequence[CurvePoint]) -> float:
    """The standard deviation of one validation's quality about a smooth curve: from the second differences of
    successive validations (each the sum of four independent noise terms' worth of variance: ``6 sigma^2``)."""
    q = [p[2] for p in points if not math.isnan(p[2])]
    if len(q) < 4:
        return 0.0
    second = [q[i - 1] - 2 * q[i] + q[i + 1] for i in range(1, len(q) - 1)]
    return math.sqrt(statistics.fmean(d * d for d in second) / 6)


@dataclass
class Trial:
    """One run of a configuration at one length on one seed, and what it measured."""

    config: Config
    steps: int
    seed: int
    record: FitRecord
    phase: str = "search"
    target: float = math.nan
    higher: bool = True

    @property
    def points(self) -> list[CurvePoint]:
        return [(int(s), float(t), float(q)) for s, t, q in (self.record.points or [])]

    @property
    def time(self) -> float | None:
        """Training time to the target (``None``: not reached in this run)."""
        reach = first_reach(self.points, self.target, self.higher) if self.record.error is None else None
        return None if reach is None else reach[1]

    @property
    def name(self) -> str:
        return f"{config_name(self.config)} @ {self.steps} steps"


@dataclass
class RunBook:
    """The runs of one search: from the state file when recorded (resumption replays them), else trained.

    Every run is charged to its phase; ``spent()`` is the search phase's training time on the search's clock.
    """

    settings: SearchSettings
    state: SearchState
    executor: Executor
    search_fits: list[FitRecord] = field(default_factory=list)
    confirm_fits: list[FitRecord] = field(default_factory=list)
    trained: int = 0

    def __post_init__(self) -> None:
        self.cache = {(tuple(f.config), f.seed, f.steps, f.rule): f for f in self.state.fits if f.rule is not None}

    def spent(self) -> float:
        return sum(f.seconds for f in self.search_fits)

    def run(self, wanted: Sequence[tuple[Config, int, int, CurveRule]], phase: str) -> list[FitRecord]:
        """The runs ``(config, seed, steps, rule)``, side by side where the executor allows, in this order."""
        records: dict[int, FitRecord] = {}
        tickets: dict[int, int] = {}
        for i, (config, seed, steps, rule) in enumerate(wanted):
            hit = self.cache.get((config, seed, steps, rule.key()))
            if hit is not None:
                records[i] = hit
                continue
            task = self.settings.task(config, seed, steps, phase)
            task.curve = rule
            tickets[self.executor.submit(task)] = i
            if not self.executor.concurrent:
                self._collect(wanted, tickets, records, phase)
        self._collect(wanted, tickets, records, phase)
        ordered = [records[i] for i in range(len(wanted))]
        (self.search_fits if phase == "search" else self.confirm_fits).extend(ordered)
        return ordered

    def _collect(self, wanted: Sequence[tuple[Config, int, int, CurveRule]], tickets: dict[int, int],
                 records: dict[int, FitRecord], phase: str) -> None:
        while tickets:
            ticket, outcome = self.executor.next_done()
            i = tickets.pop(ticket)
            config, seed, steps, rule = wanted[i]
            record = FitRecord(list(config), seed, steps, outcome.quality, outcome.seconds, outcome.cpu_s,
                               outcome.wall_s, phase, fit_wall_s=outcome.fit_wall_s, error=outcome.error,
                               processes=outcome.processes, points=outcome.points or [], stopped=outcome.stopped,
                               rule=rule.key())
            if record.error is not None and not config:
                raise RuntimeError(f"the baseline run on seed {seed} failed: {record.error}")
            self.trained += 1
            self.state.fits.append(record)
            self.cache[(config, seed, steps, rule.key())] = record
            self.state.save()
            records[i] = record


class PrescriptionSearch:
    """Steps 1-5 of the method above (see the module's docstring)."""

    def __init__(self, settings: SearchSettings, book: RunBook, target: float | None = None,
                 eval_every: int | None = None, baseline_run: Sequence[Sequence[float]] | None = None) -> None:
        self.settings, self.book = settings, book
        self.baseline_run = baseline_run
        self.B = max(settings.run_lengths)
        self.eval_every = eval_every or max(1, self.B // 16)
        self.given_target = target
        self.trials: list[Trial] = []
        self.steps: list[str] = []
        self.rung_values: dict[int, list[float]] = {}
        self.cleared: dict[tuple[Config, int], float] = {}  # trials that cleared the last rung: quality there
        self.finalist: Trial | None = None
        self.race_seed: int = settings.search_seeds[0]  #: the seed the candidates race on (set by :meth:`run`)
        self.race_base: Trial | None = None  #: the baseline on the race seed, to the last rung
        #: the race seed's baseline's time over your run's for the same steps (``None``: not measured); your run's
        #: times are scaled by it (:meth:`_on_search_clock`)
        self.clock_ratio: float | None = None
        #: your run's time as given, before it was put on the search's clock (``None``: not rescaled)
        self.baseline_seconds_given: float | None = None
        self.confirmed_trials: list[Trial] = []
        self.estimate: Estimate | None = None

    # --- the measurements ------------------------------------------------------------------------------

    @property
    def higher(self) -> bool:
        return self.settings.higher

    def _trial(self, config: Config, steps: int, seed: int, record: FitRecord, phase: str = "search") -> Trial:
        return Trial(config, steps, seed, record, phase, self.Q, self.higher)

    def _rule(self, share: float | None = None, late: bool = False) -> CurveRule:
        """The rule a trial started now runs under: the target, the time it must beat (or its ``share`` of the
        budget left, if less), the rungs' bars (a ``late`` payer's: the last rung's alone)."""
        limit = self._must_beat()
        if share is not None:
            limit = min(limit, share)
        gates = []
        for i, at in enumerate(self.rungs):
            if late and i < len(self.rungs) - 1:
                continue
            values = sorted(self.rung_values.get(i, []), reverse=self.higher)
            if values:
                # a run behind the bar by no more than the noise of a gap between two validations may be behind by
                # that noise alone
                margin = -self.gap_noise if self.higher else self.gap_noise
                gates.append((round(at, 6), round(values[math.ceil(len(values) / ETA) - 1] + margin, 6)))
        return CurveRule(self.eval_every, self.Q, self.higher, round(limit, 6), tuple(gates))

    def _must_beat(self) -> float:
        """The training time a run started now must beat to win: the best time so far less ``min_gain`` (your
        baseline run's whole time while nothing has reached the target)."""
        best = self.best_time()
        return best / (1 + self.settings.min_gain) if best is not None else self.baseline_seconds

    def _pick(self) -> Trial:
        """The run the finalist seed measures: the one that reached the target soonest, if any beat the baseline's
        time; else the one with the best quality at the last rung, if it is ahead of the baseline's quality there
        by more than the validation noise (a lenient bar: its run on your run's seed decides); else the baseline."""
        best = self.best_trial()
        if best.config or best.steps != self.B:
            return best
        last = len(self.rungs) - 1
        if not self.cleared:
            return best
        top = (max if self.higher else min)(self.cleared, key=self.cleared.__getitem__)
        lead = (self.cleared[top] - self.rung_values[last][0]) * (1 if self.higher else -1)
        if lead > self.noise:
            return next(t for t in self.trials if (t.config, t.steps) == top)
        return best

    @property
    def gap_noise(self) -> float:
        """The standard deviation of the gap between two runs' validations (each with :func:`validation_noise`'s):
        the gap that noise alone makes between two runs that are equally good."""
        return math.sqrt(2) * self.noise

    def best_trial(self) -> Trial:
        reached = [t for t in self.trials if t.time is not None]
        if not reached:
            return self.trials[0]
        return min(reached, key=lambda t: (t.time, len(t.config)))

    def best_time(self) -> float | None:
        return self.best_trial().time

    def _record_rungs(self, trial: Trial) -> None:
        """A run's quality at each rung it trained past, read between its validations at the rung's time exactly
        (as the baseline's is), so runs validated at other moments compare fairly. A late payer's counts at the
        rungs it skips too: the bar is set by every run that reached the rung (a late payer fast early, such as
        Muon with its decay at the end, raises it)."""
        curve = [(t, q) for _, t, q in trial.points]
        for i, at in enumerate(self.rungs):
            if curve and curve[-1][0] >= at:
                value = quality_at(curve, at)
                self.rung_values.setdefault(i, []).append(value)
                if i == len(self.rungs) - 1 and trial.config:
                    self.cleared[(trial.config, trial.steps)] = value

    def _wave(self, wanted: Sequence[tuple[Config, int]], what: str, cap: float | None = None) -> None:
        """Run ``wanted`` (configuration, length) on the race seed, :data:`WAVE` at a time (fewer where the budget
        left holds fewer runs as long as they need: :meth:`_wave_size`), each for at most ``cap`` of training."""
        seed = self.race_seed
        done = {(t.config, t.steps) for t in self.trials}
        wanted = [w for w in wanted if w not in done]
        start = 0
        while start < len(wanted):
            size = self._wave_size(what, len(wanted) - start, cap)
            chunk, start = wanted[start:start + size], start + size
            stops = [x for x in (self._share(what, len(chunk), capped=cap is not None), cap) if x is not None]
            share = min(stops) if stops else None
            records = self.book.run([(config, seed, steps, self._rule(share, self.settings.pays_late(config)))
                                     for config, steps in chunk], "search")
            before = self.best_time()
            trials = [self._trial(config, steps, seed, record) for (config, steps), record in zip(chunk, records,
                                                                                                  strict=True)]
            for trial in trials:
                self.trials.append(trial)
                self._record_rungs(trial)
            for trial in trials:
                self._describe(trial, before)

    def _wave_size(self, what: str, remaining: int, cap: float | None) -> int:
        """How many of the next runs start together: :data:`WAVE`, or one where the budget left would give each of
        :data:`WAVE` less than a run needs (``cap``, or the time it must beat to win) and one alone more: runs that
        split a budget neither can win in would both be wasted. The same budget takes the same path on any number
        of workers."""
        size = min(WAVE, remaining)
        if size == 1:
            return 1
        need = self._must_beat() if cap is None else min(self._must_beat(), cap)
        try:
            share = self._share(what, size, capped=cap is not None)
        except BudgetExhausted:
            return 1  # one run alone may still have a share: the next call says
        return size if share is None or share >= need else 1

    def _describe(self, trial: Trial, before: float | None) -> None:
        unit = self.settings.unit
        if trial.record.error:
            how = f"failed: {trial.record.error}"
        elif trial.time is not None:
            how = f"reached {self.Q:.4g} at {trial.time:.3g} {unit}" + (
                f", {self.T / trial.time:.2f}x" if self.T else "")
            if before is not None and trial.time * (1 + self.settings.min_gain) < before:
                how += " (best so far)"
        elif (trial.config, trial.steps) in self.cleared and not (trial.record.stopped or "").startswith("pruned"):
            # stopped where the race ends (not pruned there): judged by its quality there
            last = len(self.rungs) - 1
            how = (f"at the last rung ({self.rungs[last]:.3g} {unit}) without reaching the target: "
                   f"{self.cleared[(trial.config, trial.steps)]:.4g}, the race seed's baseline "
                   f"{self.rung_values[last][0]:.4g}")
        else:
            how = trial.record.stopped or "trained to its end without reaching the target"
        self.steps.append(f"{trial.name}: {how}")

    def _time_limit(self) -> float | None:
        """The search's time budget on its clock: ``max_train_seconds`` or ``max_baseline_runs`` baseline runs,
        whichever is less (``None``: no time budget)."""
        s = self.settings
        runs = None if s.max_baseline_runs is None else s.max_baseline_runs * self.baseline_seconds
        limits = [x for x in (s.max_train_seconds, runs) if x is not None]
        return min(limits) if limits else None

    def _reserve(self, capped: bool = True) -> float:
        """The budget kept aside for the pick's run on your run's seed: the longest that run may take and still be
        prescribed, your run's ``T`` over :meth:`least_speedup`, with room for its last validation past it. Not the
        pick's time on the race seed: your run's seed may be slower for it, and a pick cut short there is a search
        thrown away. Kept once a candidate leads, and before that in a wave whose runs are not ``capped`` at the
        last rung (the shorter lengths: they share the budget left, and the one that reaches the target is the
        pick); not before in the capped waves, where a budget held for a run that may never come would stop the
        exploration early. Its baseline is your run itself, on the same seed: nothing is kept for that; nor when
        your run does not reach the target (the pick is then not measured on your run's seed)."""
        if self.T is None:
            return 0.0
        pick = self._pick()
        if capped and not pick.config and pick.steps == self.B:
            return 0.0
        return self.T / self.least_speedup() + self._overshoot()

    def least_speedup(self) -> float:
        """The least speed-up on your run's seed that can be prescribed: ``1 + min_gain``, or, when a pick must be
        ``confidence`` sure, the speed-up that the prior noise alone (:data:`PRIOR_CV`, :data:`PRIOR_DF`) reads as
        that sure (:func:`how_sure`). A run on your seed slower than ``T`` over it cannot change the answer."""
        s = self.settings
        least = 1 + s.min_gain
        if s.confidence:
            least = max(least, math.exp(estimate_t_quantile(s.confidence, PRIOR_DF) * math.sqrt(2) * PRIOR_CV))
        return least

    def _overshoot(self) -> float:
        """How far past its limit one run may train: a run stops at its first validation past it, up to one
        validation interval later (``eval_every`` steps, at your baseline run's time per step)."""
        return self.eval_every * self.baseline_seconds / self.B

    def _left(self) -> float:
        """The time budget a next run may be given: what is not yet spent, less the room for its last validation past
        its limit (``math.inf``: no time budget)."""
        limit = self._time_limit()
        return limit - self.book.spent() - self._overshoot() if limit is not None else math.inf

    def _share(self, what: str, runs: int, capped: bool = True) -> float | None:
        """Each of the next ``runs`` trials' share of the budget left (``None``: no time budget), the pick's run kept
        aside (:meth:`_reserve`) and room left for each run's last validation past its share (:meth:`_overshoot`);
        stops exploring when a share could not reach the first rung."""
        s = self.settings
        if s.max_fits is not None and len(self.book.search_fits) + runs + 1 > s.max_fits:
            raise BudgetExhausted(f"{s.max_fits} fits, in {what}")
        limit = self._time_limit()
        if limit is None:
            return None
        reserve = self._reserve(capped) if s.finalist_seeds or len(s.search_seeds) > 1 else 0.0
        share = (limit - reserve - self.book.spent()) / runs - self._overshoot()  # each may end a validation late
        if share <= self.rungs[0]:
            what_budget = (f"{s.max_baseline_runs:g} baseline runs" if s.max_baseline_runs is not None else
                           f"{limit:g} {s.unit}")
            raise BudgetExhausted(f"{what_budget}, in {what}")
        return share

    # --- the method ----------------------------------------------------------------------------------

    def run(self) -> Prescription:
        s = self.settings
        seed = s.search_seeds[0]
        if self.baseline_run is not None:  # the user's own run: read, not trained, and no part of the search's cost
            points_given = [[int(a), float(b), float(c)] for a, b, c in self.baseline_run]
            record = FitRecord([], seed, self.B, points_given[-1][2], points_given[-1][1], points_given[-1][1],
                               points_given[-1][1], "given", points=points_given)
        else:
            (record,) = self.book.run([((), seed, self.B, CurveRule(self.eval_every, None, self.higher))], "search")
        self.baseline_seconds = record.seconds
        points = [(int(a), float(b), float(c)) for a, b, c in record.points or []]
        qualities = [q for _, _, q in points]
        self.Q = self.given_target if self.given_target is not None else (max(qualities) if self.higher else min(qualities))
        reach = first_reach(points, self.Q, self.higher)
        self.T = reach[1] if reach is not None else None
        reference = self.T if self.T is not None else self.baseline_seconds
        self.noise = validation_noise(points)
        self.rungs = [reference * f for f in RUNGS]
        base = self._trial((), self.B, seed, record)
        self.trials.append(base)
        self._start_bars(points)
        given = " (your run, given)" if self.baseline_run is not None else ""
        self.steps.append(f"baseline @ {self.B} steps on seed {seed}{given}: " + (
            f"reaches the target {self.Q:.4g} at {self.T:.3g} {s.unit}" if self.T is not None else
            f"does not reach the target {self.Q:.4g} in {self.baseline_seconds:.3g} {s.unit} (speed-ups are lower bounds)")
            + f"; validation noise {self.noise:.3g}")
        others = list(s.finalist_seeds) or list(s.search_seeds[1:2])
        try:
            if others:
                self._race_baseline(others[0])
            # every candidate and published recipe to the last rung at most: the ranking there picks the one the
            # finalist seed measures to the target (a run that reaches it sooner is ranked by its time)
            starts = [(labels, self.B) for labels in s.starting_recipes.values()]
            singles = [((label,), self.B) for label in s.search_pool]
            self._wave([*starts, *singles], "the first round", cap=self.rungs[-1])
            if not self._pick().config:
                # nothing ahead of the baseline: is the gain the shorter schedule itself?
                self._wave([((), steps) for steps in sorted(s.run_lengths, reverse=True) if steps < self.B],
                           "the shorter lengths")
        except BudgetExhausted as stop:
            self.steps.append(f"budget spent ({stop}): the search stops exploring")
        return self._finalise()

    def _race_baseline(self, seed: int) -> None:
        """The baseline at ``B`` on the race seed, to the last rung (or the target, if sooner): the candidates race on
        that seed, so your run's seed has made no choice when the pick is measured on it. Its qualities at the rungs
        are the bars' first values, in place of your run's (a rung compares runs that share a seed's luck)."""
        if self._left() <= self.rungs[-1]:
            raise BudgetExhausted(f"no budget for the baseline on the race seed {seed}")
        rule = CurveRule(self.eval_every, self.Q, self.higher, round(self.rungs[-1], 6))
        (record,) = self.book.run([((), seed, self.B, rule)], "search")
        self.race_seed = seed
        self.race_base = trial = self._trial((), self.B, seed, record)
        self._start_bars(trial.points)
        self.steps.append(f"baseline @ {self.B} steps on the race seed {seed}, to the last rung ({self.rungs[-1]:.3g} "
                          f"{self.settings.unit}): the candidates race on this seed")
        self._on_search_clock(trial)

    def _on_search_clock(self, race: Trial) -> None:
        """Your run's times put on the clock of the runs trained now: the same configuration (the baseline) takes the
        same time for the same steps, so the race seed's baseline against your run over its steps is how much faster
        or slower the machine trains now than when your run was timed (another load, another machine). Your run's
        time to the target, against which the pick is measured, is scaled by that ratio, and so is the budget's unit
        (one baseline run is what your run costs on this clock now: the budget buys the runs it says at the machine's
        speed now); the rungs stay where your run's time put them (every run they compare is trained now)."""
        base = self.trials[0]
        self.clock_ratio = ratio = clock_ratio(race.points, base.points)
        if ratio is None or ratio == 1.0:
            return
        scaled = [[step, round(seconds * ratio, 6), quality] for step, seconds, quality in base.points]
        base.record = replace(base.record, points=scaled, seconds=round(base.record.seconds * ratio, 6))
        before, self.T = self.T, base.time
        self.baseline_seconds_given, self.baseline_seconds = self.baseline_seconds, base.record.seconds
        self.steps.append(f"your run on this machine's clock now: the race seed's baseline took {ratio:.3f}x your run's "
                          f"time for its first {race.points[-1][0]} steps" +
                          (f"; your run's time to the target {before:.3g} -> {self.T:.3g} {self.settings.unit}"
                           if before is not None and self.T is not None else "") +
                          f"; one baseline run, the budget's unit, {self.baseline_seconds_given:.3g} -> "
                          f"{self.baseline_seconds:.3g} {self.settings.unit}")

    def _start_bars(self, points: Sequence[CurvePoint]) -> None:
        """Each rung's bar starts from this baseline curve's quality there (read at the rung's time exactly)."""
        curve = [(t, q) for _, t, q in points]
        for i, at in enumerate(self.rungs):
            self.rung_values[i] = [quality_at(curve, at)]

    def _finalise(self) -> Prescription:
        s, best = self.settings, self._pick()
        seed = s.search_seeds[0]  # your run's seed: the pick is measured there, beside your run
        baseline = self._prescription((), self.B, 1.0, None, None, "the baseline run itself")
        if not best.config and best.steps == self.B:
            self.steps.append("nothing reached the target sooner than the baseline: prescribe the baseline")
            return baseline
        fresh_seed = self.race_seed != seed  # the candidates raced on another seed: yours made no choice
        if (not fresh_seed or self.T is None) and not best.time:
            why = "the baseline run does not reach the target" if self.T is None else "no second seed to race on"
            self.steps.append(f"{best.name} cannot be measured against the baseline ({why}): prescribe the baseline")
            return baseline
        if not fresh_seed or self.T is None:
            speed = (self.T or self.baseline_seconds) / best.time
            self.steps.append(f"no second seed: {best.name} prescribed on one seed's measurement ({speed:.2f}x)")
            return self._prescription(best.config, best.steps, speed, None, None, "one search seed, chosen on it")
        rule = CurveRule(self.eval_every, self.Q, self.higher, round(min(2 * self.T, self._left()), 6))
        (record,) = self.book.run([(best.config, seed, best.steps, rule)], "search")
        self.finalist = first = self._trial(best.config, best.steps, seed, record)
        self.confirmed_trials.append(self.finalist)  # reported beside the others; never a candidate for the best
        if self.finalist.time is None:
            self.steps.append(f"{best.name} on your run's seed {seed}: not reached within twice the baseline's time "
                              "(or the budget left): prescribe the baseline")
            return baseline
        self._shorter_on_seed(seed)
        paired = self._baseline_again(seed)
        base_time = paired.time if paired is not None else None
        raw = self.T / best.time if best.time else math.nan
        fresh = (base_time or self.T) / self.finalist.time
        cv, df = self._time_noise(best, first, paired)
        new = max(1, len(s.confirm_seeds) or 5)
        # the estimate's spread (two runs of one seed); the spread of the ratio of two medians of `new` seeds each
        sd_est, sd_new = math.sqrt(2) * cv, math.sqrt(math.pi / new) * cv
        t = t_quantile(0.95, df)  # not the normal's: the noise itself is estimated
        low, high = fresh * math.exp(-t * math.hypot(sd_est, sd_new)), fresh * math.exp(t * math.hypot(sd_est, sd_new))
        self.estimate = Estimate(mean=fresh, low=low, high=high, raw=raw, confidence=0.9, noise_sd=cv,
                                 spread_sd=0.0, shrink=1.0, configurations=len(self.trials), new_seeds=new)
        sure = how_sure(fresh, sd_est, df)
        against = (f"the baseline's run again on that seed ({base_time:.3g} {s.unit})" if base_time is not None else
                   f"your baseline run ({self.T:.3g} {s.unit})")
        if s.confidence and (fresh <= 1 + s.min_gain or sure < s.confidence):
            self.steps.append(f"{self.finalist.name} on your run's seed {seed}: {fresh:.2f}x against {against}, "
                              f"{100 * sure:.0f} % sure it beats the baseline ({100 * s.confidence:g} % needed): "
                              "prescribe the baseline")
            return baseline
        chosen = (f"{raw:.2f}x on the race seed {self.race_seed}" if math.isfinite(raw) else
                  f"chosen by its quality at the last rung on the race seed {self.race_seed}")
        self.steps.append(f"{self.finalist.name} on your run's seed {seed}: {fresh:.2f}x against {against} "
                          f"({chosen}), {100 * sure:.0f} % sure it beats the baseline: prescribed")
        measured = (f"its run on seed {seed} against the baseline's run again on that seed" if base_time is not None
                    else f"its run on seed {seed} against your baseline run on that seed")
        return self._prescription(best.config, self.finalist.steps, fresh, low, high, measured)

    def _baseline_again(self, seed: int) -> Trial | None:
        """Your baseline run again on its seed, to the target, when it was given (timed elsewhere: a busier machine,
        another day) and the budget left holds it (``T``): the pick's time is then measured against times taken
        beside it. ``None``: your run itself is the baseline (the search trained it, or no budget is left)."""
        if self.baseline_run is None:
            return None
        left = self._left()
        if self.T is None or left < self.T:
            clock = "on this machine's clock now" if self.clock_ratio not in (None, 1.0) else "as given"
            self.steps.append(f"no budget left to time the baseline again on seed {seed}: the pick is measured "
                              f"against your run {clock}")
            return None
        rule = CurveRule(self.eval_every, self.Q, self.higher, round(min(2 * self.T, left), 6))
        (record,) = self.book.run([((), seed, self.B, rule)], "search")
        trial = self._trial((), self.B, seed, record)
        self.confirmed_trials.append(trial)
        how = (f"reaches the target at {trial.time:.3g} {self.settings.unit}" if trial.time is not None else
               record.stopped or "does not reach the target")
        self.steps.append(f"baseline @ {self.B} steps on seed {seed} again (your run timed beside the pick): {how}")
        return trial

    def _shorter_on_seed(self, seed: int) -> None:
        """With budget left, the finalist's configuration at the next shorter length on the same seed: if it reaches
        the target sooner there, it becomes the finalist (the two lengths compared on one seed share its luck)."""
        s, finalist = self.settings, self.finalist
        assert finalist is not None and finalist.time is not None
        shorter = [steps for steps in s.run_lengths if steps < finalist.steps]
        limit = self._time_limit()
        if not shorter or (limit is not None and self.book.spent() + finalist.time + self._overshoot() > limit):
            return
        rule = CurveRule(self.eval_every, self.Q, self.higher, round(finalist.time / (1 + s.min_gain), 6))
        steps = max(shorter)
        (record,) = self.book.run([(finalist.config, seed, steps, rule)], "search")
        trial = self._trial(finalist.config, steps, seed, record)
        self.confirmed_trials.append(trial)
        # a run may reach the target at the first validation past the time it had to beat: that is not sooner
        if trial.time is not None and trial.time * (1 + s.min_gain) < finalist.time:
            self.steps.append(f"{trial.name} on seed {seed}: reached at {trial.time:.3g} {s.unit}, sooner "
                              f"than at {finalist.steps} steps ({finalist.time:.3g}): the shorter run is the finalist")
            self.finalist = trial
        else:
            how = (f"reached at {trial.time:.3g} {s.unit}, not sooner than at {finalist.steps} steps" if trial.time
                   is not None else record.stopped or "not reached")
            self.steps.append(f"{trial.name} on seed {seed}: {how}")

    def _time_noise(self, best: Trial, finalist: Trial, paired: Trial | None) -> tuple[float, int]:
        """The relative seed-to-seed spread of one run's time to the target (its coefficient of variation), and its
        degrees of freedom: a prior of :data:`PRIOR_CV` worth :data:`PRIOR_DF` seed pairs, pooled with the pairs
        measured (the baseline on the two seeds, the pick on the two seeds), and at least the spread that the
        validations' own noise gives the crossing of the target (the curves' noise over their slopes there)."""
        variances, df = [PRIOR_CV ** 2] * PRIOR_DF, PRIOR_DF
        for a, b in ((self.trials[0], paired), (best, finalist)):
            if a is not None and b is not None and a.time and b.time:
                variances.append(statistics.variance([math.log(a.time), math.log(b.time)]))
                df += 1
        jitter = []
        for trial in (t for t in (self.trials[0], best, finalist, paired) if t is not None and t.time):
            slope = self._slope(trial)
            if slope:
                jitter.append((self.noise / slope / trial.time) ** 2)
        cv = math.sqrt(statistics.fmean(variances))
        return (max(cv, math.sqrt(statistics.fmean(jitter))) if jitter else cv), df

    def _slope(self, trial: Trial) -> float | None:
        """How fast quality changes per unit of time where the run crosses the target (``None``: it does not)."""
        points = trial.points
        for (_, t0, q0), (_, t1, q1) in zip(points, points[1:], strict=False):
            if (q1 >= self.Q if self.higher else q1 <= self.Q) and t1 > t0:
                return abs(q1 - q0) / (t1 - t0) or None
        return None

    def _prescription(self, config: Config, steps: int, speed: float, low: float | None, high: float | None,
                      measured: str) -> Prescription:
        s = self.settings
        return Prescription(algorithms=tuple(s.candidate(label) for label in config), steps=steps,
                            baseline_steps=self.B, target=self.Q, monitor=s.monitor, mode="max" if s.higher else "min",
                            speedup=speed, low=low, high=high, measured=measured)

    # --- the confirmation and the report ------------------------------------------------------------

    def confirm(self, prescription: Prescription, also: dict[str, Config]) -> tuple[SpeedUp | None, dict[str, SpeedUp]]:
        """The prescription (and ``also``'s recipes at ``B``) against the baseline at ``B`` on the confirmation seeds,
        each trained as handed over, to its end; a baseline that misses the target on a seed counts its whole run
        there (the speed-up is then a lower bound)."""
        s = self.settings
        if not s.confirm_seeds or (prescription.is_baseline and prescription.steps == self.B and not also):
            return None, {}
        full = CurveRule(self.eval_every, self.Q, self.higher)
        config = s.config(c.label for c in prescription.algorithms)
        wanted = [((), self.B), (config, prescription.steps), *((c, self.B) for c in also.values())]
        runs = [(c, seed, steps, full) for c, steps in wanted for seed in s.confirm_seeds]
        records = self.book.run(runs, "confirm")
        trials = [self._trial(c, st, seed, r, "confirm") for (c, seed, st, _), r in zip(runs, records, strict=True)]
        self.confirmed_trials.extend(trials)
        base = {t.seed: t.time or t.record.seconds for t in trials if not t.config and t.steps == self.B}

        def speed(c: Config, steps: int) -> SpeedUp:
            mine = {t.seed: t.time for t in trials if t.config == c and t.steps == steps}
            return summarise_speedups({seed: base[seed] / mine[seed] if mine[seed] else None for seed in s.confirm_seeds})

        return speed(config, prescription.steps), {name: speed(c, self.B) for name, c in also.items()}

    def curves(self) -> list[CurveResult]:
        out = []
        race = [self.race_base] if self.race_base is not None else []
        for t in [*self.trials, *race, *self.confirmed_trials]:
            status = ("baseline" if not t.config and t.steps == self.B else
                      (f"failed: {t.record.error}" if t.record.error else
                       ("reached Q" if t.time is not None else (t.record.stopped or "never reached Q"))))
            speed = (self.T / t.time) if (self.T and t.time) else None
            out.append(CurveResult(t.config, t.seed, t.phase, [(p[1], p[2]) for p in t.points], status,
                                   None if status == "baseline" else speed))
        return out


def prescribe(settings: SearchSettings, book: RunBook, *, target: float | None, eval_every: int | None,
              also: dict[str, Config], baseline_run: Sequence[Sequence[float]] | None = None,
              ) -> tuple[PrescriptionSearch, Prescription, SpeedUp | None, dict[str, SpeedUp]]:
    """Run the search, then the optional confirmation; return the search, its prescription and the confirmed speed-ups."""
    search = PrescriptionSearch(settings, book, target=target, eval_every=eval_every, baseline_run=baseline_run)
    prescription = search.run()
    confirmed, also_confirmed = search.confirm(prescription, also)
    return search, prescription, confirmed, also_confirmed
