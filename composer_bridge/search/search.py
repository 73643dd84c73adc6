"""The recipe search's entry point: check the arguments, run the greedy search, confirm, report.

:func:`search_recipe` checks its arguments and the model (before any training), freezes them in a
:class:`~composer_bridge.search.settings.SearchSettings`, and hands the fits to a
:class:`~composer_bridge.search.fit_scheduler.FitScheduler` and the decisions to a
:class:`~composer_bridge.search.greedy.GreedySearch` (its module docstring describes the method's
five steps); what it hands back is a :class:`~composer_bridge.search.results.SearchResult`.

Examples:
    >>> from composer_bridge.search import search_recipe  # doctest: +SKIP
    >>> result = search_recipe(make_module, make_data, monitor="val/acc", run_lengths=[50, 100, 200],
    ...                        max_fits=60, search_seeds=[0, 1], confirm_seeds=[100, 101, 102],
    ...                        state_dir="outputs/search")  # doctest: +SKIP
    >>> print(result.summary())  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from composer_bridge.search import checks
from composer_bridge.search.candidates import Candidate, as_candidates
from composer_bridge.search.cost import SearchCost
from composer_bridge.search.errors import SearchInputError
from composer_bridge.search.executor import Executor, InProcessExecutor
from composer_bridge.search.fit_scheduler import FitScheduler, baseline_run_seconds
from composer_bridge.search.greedy import GreedySearch, mean_score
from composer_bridge.search.prescription import Prescription
from composer_bridge.search.proxy import Proxy
from composer_bridge.search.recorded_settings import RecordedSettings
from composer_bridge.search.results import BudgetExhausted, SearchResult, config_name
from composer_bridge.search.settings import SearchSettings
from composer_bridge.search.state import SearchState
from composer_bridge.search.trial import CLOCKS

__all__ = ["DEFAULT_BASELINE_RUNS", "search_recipe"]

#: the prescription search's budget when none is given, in baseline runs (one = the baseline at the longest length)
DEFAULT_BASELINE_RUNS = 3.0


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
    starting_recipes: Mapping[str, Sequence[Candidate | str]] | None = None,
    confidence: float = 0.8,
    proxy: Proxy | None = None,
    finalist_seeds: Sequence[int] | None = None,
    max_baseline_runs: float | None = None,
    screen: float | None = 1 / 3,
    first_look: float | None = None,
    shortlist: bool = False,
    method: str | None = None,
    target: float | None = None,
    eval_every: int | None = None,
    baseline_run: Sequence[Sequence[float]] | None = None,
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
        max_baseline_runs: the search's budget in its own baseline runs (one = every run length on one
            search seed, timed by the search's baseline curves; ``12`` lets the search train twelve times
            what one baseline curve took, those curves included). With several budgets, the first
            reached stops the search.
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
        starting_recipes: recipes the first step races whole, beside the single candidates, by name
            (``{"mine": ["BlurPool", Candidate("LabelSmoothing", {"smoothing": 0.1})]}``); the greedy
            steps then add and remove single candidates from the best of them, so the search never
            settles below it on its own seeds. ``None`` (default): the published recipes of
            :mod:`composer_bridge.recipes` that apply whole to this model (``from_recipe``'s labels,
            ``"mild:BlurPool"``, ...); ``{}``: none. A recipe you name that cannot apply is refused.
        confidence: how sure the search must be that a change helps before it takes it (0.8): the
            probability, given the seed-to-seed noise it measured, that the addition's true speed-up beats
            the current recipe's. It also sets nothing else: the estimate's interval is at 90 %.
        proxy: search a cheaper version of the run (:class:`~composer_bridge.search.proxy.Proxy`: shorter
            run lengths, a smaller model, less data) and confirm the pick at full size (``run_lengths``,
            ``make_module``, ``make_data``). ``None``: search at full size.
        finalist_seeds: seeds a step's best configuration is scored on before it is taken, which played no
            part in choosing it: the decision there, and the estimate from there, are free of the winner's
            luck. ``None`` (default): one seed, the first after the search seeds that is not a confirmation
            seed; ``[]``: none (then the best of many must clear a stricter bar, and the estimate is
            corrected by shrinkage).
        screen: before a step races its configurations in full, each one's shortest run on the first search
            seed is compared with the baseline's quality at the same training time, and only the best
            ``screen`` share of them (at least two) go on; at each longer run length but the longest, the best
            ``screen`` share of those (at least one) go on again (1/3, the default); ``None``: every
            configuration is raced in full, as before. A step's full curves are most of a search's cost.
        first_look: with ``screen``, the first look reads a run of its own this share of the shortest run length
            long (0.5: half as long), beside the baseline's run of the same length, and the next look reads the
            shortest run; ``None`` (default): the first look reads the shortest run itself.
        shortlist: with ``screen``, the steps after the first try only the candidates the first step's first
            look kept (``False``, the default: every step tries every candidate not yet taken).
        method: ``"prescribe"`` (the default, ``None``, unless ``proxy`` is given): runs validated as they train, at each of ``run_lengths``, raced by
            successive halving at equal training time; the answer is a run to start, ``result.prescription``
            (algorithms and length), measured as handed over (:mod:`composer_bridge.search.prescribe`).
            ``"greedy"``: the earlier method (curves across run lengths, greedy forward selection over the search
            seeds; :mod:`composer_bridge.search.greedy`), whose prescription is its recipe at the longest length;
            ``None`` with a ``proxy`` (a config written for the greedy search keeps running as it did).
            Without a budget, ``"prescribe"`` spends at most 3 baseline runs.
        target: the quality to reach (``monitor`` in ``mode``'s direction); ``None``: the baseline run's best.
        eval_every: optimizer steps between validations of a run (``"prescribe"``; default a sixteenth of the
            longest run length).
        baseline_run: the baseline run you already have (``"prescribe"``): its validations ``[(step, training
            seconds on clock, quality), ...]``, a run of the longest run length on the first search seed, validated
            every ``eval_every`` steps with validation time left out. Read instead of trained; no part of the cost.

    Returns:
        A :class:`SearchResult`.

    Raises:
        composer_bridge.search.SearchInputError: bad input, before any training (a time budget
            smaller than the baseline curves is found after the first baseline fit).
    """
    arguments = dict(locals())
    del arguments["make_module"], arguments["make_data"]
    with _quiet_lightning():
        return _search(make_module, make_data, **arguments)


def _search(make_module: Callable[..., Any], make_data: Callable[[int], Any], *, monitor: str, mode: str,
            candidates: Sequence[Candidate | str] | None, run_lengths: Sequence[int], max_fits: int | None,
            max_train_seconds: float | None, search_seeds: Sequence[int], confirm_seeds: Sequence[int],
            trainer_kwargs: Mapping[str, Any] | None, clock: str, min_gain: float,
            also_confirm: Mapping[str, Sequence[Candidate | str]] | None, state_dir: str | Path | None,
            progress: bool, executor: Executor | str | None,
            starting_recipes: Mapping[str, Sequence[Candidate | str]] | None, confidence: float,
            proxy: Proxy | None, finalist_seeds: Sequence[int] | None,
            max_baseline_runs: float | None, screen: float | None, first_look: float | None,
            shortlist: bool, method: str | None, target: float | None, eval_every: int | None,
            baseline_run: Sequence[Sequence[float]] | None) -> SearchResult:
    started = (time.perf_counter(), time.process_time())  # the probe and the checks are overhead too
    higher = checks.check_mode(mode)
    method = checks.check_method(("greedy" if proxy is not None else "prescribe") if method is None else method)
    lengths = checks.check_run_lengths(run_lengths)
    search_seeds, confirm_seeds = checks.check_seeds(search_seeds, confirm_seeds, allow_no_confirm=method == "prescribe")
    target = checks.check_target(target)
    eval_every = checks.check_eval_every(eval_every, max(lengths))
    baseline_run = checks.check_baseline_run(baseline_run, max(lengths))
    if method == "prescribe" and max_fits is None and max_train_seconds is None and max_baseline_runs is None:
        max_baseline_runs = DEFAULT_BASELINE_RUNS
    finalists = checks.check_finalist_seeds(finalist_seeds, search_seeds, confirm_seeds)
    tkw = checks.check_trainer_kwargs(trainer_kwargs)
    checks.check_clock(clock)
    confidence = checks.check_confidence(confidence)
    screen = checks.check_screen(screen)
    proxy = checks.check_proxy(proxy)
    if method == "prescribe" and proxy is not None:
        raise SearchInputError("proxy= searches on a cheaper run and confirms at full size, which is the greedy "
                               "search's way (method='greedy'); the prescription search measures the run it hands "
                               "over. Pass method='greedy' with proxy=, or leave proxy out.")
    search_lengths = list(proxy.run_lengths) if proxy is not None and proxy.run_lengths else lengths
    look = checks.check_first_look(first_look, search_lengths[0]) if screen is not None else None
    shortlist = checks.check_shortlist(shortlist) and screen is not None
    if method == "prescribe":
        checks.check_budget(max_fits, max_train_seconds, 1, 1, max_baseline_runs)
    else:
        checks.check_budget(max_fits, max_train_seconds, len(search_lengths), len(search_seeds), max_baseline_runs)
    pool = as_candidates(candidates)
    extra = {name: as_candidates(list(recipe)) for name, recipe in (also_confirm or {}).items()}
    probe = checks.probe(make_module, make_data, monitor, lengths[0], search_seeds[0], tkw)
    if proxy is not None and (proxy.make_module is not None or proxy.make_data is not None):
        checks.probe(proxy.make_module or make_module, proxy.make_data or make_data, monitor, search_lengths[0],
                     search_seeds[0], tkw)
    usable = checks.filter_candidates(pool, probe, lengths[0], explicit=candidates is not None)
    # A recipe to confirm is trained whole or refused: what is reported is exactly what was trained.
    extra = {name: checks.filter_candidates(recipe, probe, lengths[0], explicit=True, what=f"also_confirm[{name!r}]")
             for name, recipe in extra.items()}
    starts, left_out = _starting_recipes(starting_recipes, probe, lengths[0])
    checks.check_same_labels(pool, {**{f"also_confirm[{n!r}]": r for n, r in extra.items()},
                                    **{f"starting_recipes[{n!r}]": r for n, r in starts.items()}})
    checks.warn_small_budget(max_fits, len(search_lengths), len(search_seeds), len(usable) + len(starts), "fits")
    everything = list(usable)
    for c in (c for recipe in (*extra.values(), *starts.values()) for c in recipe):
        if c.label not in {e.label for e in everything}:
            everything.append(c)
    settings = SearchSettings(
        make_module=make_module, make_data=make_data, monitor=monitor, higher=higher, candidates=tuple(everything),
        search_pool=tuple(c.label for c in usable), run_lengths=tuple(lengths), search_seeds=tuple(search_seeds),
        confirm_seeds=tuple(confirm_seeds), clock=clock, trainer_kwargs=tkw, max_fits=max_fits,
        max_train_seconds=max_train_seconds, max_baseline_runs=max_baseline_runs, min_gain=min_gain,
        starting_recipes={name: tuple(c.label for c in recipe) for name, recipe in starts.items()},
        confidence=confidence, proxy=proxy, finalist_seeds=tuple(finalists), screen=screen,
        first_look=look, shortlist=shortlist)
    recorded = _recorded_settings(settings, mode, extra, method, target, eval_every, baseline_run)
    state = SearchState(Path(state_dir) / "search.json" if state_dir is not None else None, recorded.as_dict())
    runner = _executor(executor)
    if method == "prescribe":
        return _prescribe(settings, state, runner, recorded, extra, usable, target, eval_every, started, baseline_run)
    bar = _progress_bar(progress, max_fits, max_train_seconds, clock)
    # the confirmation's baselines, which idle workers of a speculating executor may train early: they are read
    # unless the search finds nothing and has no also_confirm recipe (then they are reported as unread)
    later = [((), seed, steps, "confirm") for seed in confirm_seeds for steps in lengths]
    fits = FitScheduler(settings, state, runner, bar, started=started, needed_later=later)
    search = GreedySearch(settings, fits)
    search.steps.extend(f"published recipe {name} is not a starting recipe: {why}" for name, why in left_out.items())
    recipes = {name: settings.config(c.label for c in recipe) for name, recipe in extra.items()}
    stopped = False
    try:
        runner.start(settings.task((), search_seeds[0], lengths[0]))
        try:
            incumbent, scores = search.run()
        except BudgetExhausted as budget:
            stopped = True
            incumbent, scores = search.incumbent, search.incumbent_scores
            search.steps.append(f"budget spent ({budget}): the search stops with {config_name(incumbent)}")
        estimate = search.estimate(incumbent, scores)
        # nothing taken: the best configuration tried is still confirmed, for the second answer (quality in time)
        runner_up = (search.book.runner_up() or ()) if not incumbent and not stopped else ()
        search.book.prefetch_confirmation([incumbent, runner_up, *recipes.values()],
                                     baselines=bool(recipes) or proxy is not None)
        confirmed = search.book.confirm(incumbent) if incumbent else None
        runner_up_confirmed = search.book.confirm(runner_up) if runner_up else None
        also = {name: search.book.confirm(config) for name, config in recipes.items()}
        if confirmed is None and (recipes or proxy is not None):  # the full-size baseline: the proxy's cost unit
            for seed in confirm_seeds:
                search.book.baseline(seed, "confirm")
        confirmed_configs = {**({"recipe": incumbent} if incumbent else {}),
                             **({"best tried": runner_up} if runner_up else {}), **recipes}
        within = {name: search.book.quality_within_baseline_time(config)
                  for name, config in ({"baseline": ()} | confirmed_configs if confirmed_configs else {}).items()}
    finally:
        runner.close()
        if bar is not None:
            bar.close()
    if fits.trained:  # a re-report (nothing trained) leaves the state, and the search's overhead, as they were
        state.overhead_s, state.overhead_cpu_s = fits.overhead()
        state.save()
    return SearchResult(
        recipe=[settings.candidate(label) for label in incumbent], confirmed=confirmed,
        beats_baseline=bool(confirmed is not None and confirmed.mean > 1.0),
        search_score=mean_score(scores, search_seeds) if incumbent else None,
        also_confirmed=also, fits=fits.used_fits(), curves=list(search.curves.values()), steps=search.steps,
        cost=_cost(settings, fits), settings=recorded, candidates=usable, stopped_by_budget=stopped,
        quality_within_baseline_time=within, estimate=estimate,
        runner_up=[settings.candidate(label) for label in runner_up], runner_up_confirmed=runner_up_confirmed,
        prescription=_greedy_prescription(settings, mode, incumbent, estimate, search),
    )


def _greedy_prescription(settings: SearchSettings, mode: str, incumbent: tuple[str, ...], estimate: Any,
                         search: GreedySearch) -> Prescription:
    """The greedy search's answer as a run: its recipe at the longest run length (what its curves measured there)."""
    longest = max(settings.run_lengths)
    q = search.book.target("search")[0] if search.curves else float("nan")
    return Prescription(algorithms=tuple(settings.candidate(label) for label in incumbent), steps=longest,
                        baseline_steps=longest, target=q, monitor=settings.monitor, mode=mode,
                        speedup=estimate.mean if estimate is not None else 1.0,
                        low=estimate.low if estimate is not None else None,
                        high=estimate.high if estimate is not None else None,
                        measured="the greedy search's curves (interpolated between run lengths)")


def _prescribe(settings: SearchSettings, state: SearchState, runner: Executor, recorded: RecordedSettings,
               extra: Mapping[str, list[Candidate]], usable: list[Candidate], target: float | None,
               eval_every: int | None, started: tuple[float, float],
               baseline_run: list[list[float]] | None) -> SearchResult:
    """The prescription search (``method="prescribe"``) and its optional confirmation, as a :class:`SearchResult`."""
    from composer_bridge.search.prescribe import RunBook, prescribe

    book = RunBook(settings, state, runner)
    recipes = {name: settings.config(c.label for c in recipe) for name, recipe in extra.items()}
    try:
        runner.start(settings.task((), settings.search_seeds[0], max(settings.run_lengths)))
        search, prescription, confirmed, also = prescribe(settings, book, target=target, eval_every=eval_every,
                                                          also=recipes, baseline_run=baseline_run)
    finally:
        runner.close()
    wall, cpu = time.perf_counter() - started[0], time.process_time() - started[1]
    if book.trained:
        trained = [f for f in state.fits[-book.trained:]]
        state.overhead_s += max(0.0, wall - sum(f.fit_wall_s for f in trained))
        state.overhead_cpu_s += max(0.0, cpu - sum(f.cpu_s for f in trained))
        state.save()
    search_s = book.spent()
    baseline = search.baseline_seconds
    cost = SearchCost(
        clock=settings.clock, clock_means=CLOCKS[settings.clock], search_fits=len(book.search_fits),
        confirm_fits=len(book.confirm_fits), search_train=search_s,
        confirm_train=sum(f.seconds for f in book.confirm_fits), baseline_run=baseline,
        baseline_run_given=search.baseline_seconds_given,
        max_fits=settings.max_fits, max_train=settings.max_train_seconds, max_baseline_runs=settings.max_baseline_runs,
        overhead_s=state.overhead_s, overhead_cpu_s=state.overhead_cpu_s, fits_trained_now=book.trained,
        lightning_outside_training_s=sum(f.fit_wall_s - f.wall_s for f in (*book.search_fits, *book.confirm_fits)))
    return SearchResult(
        recipe=list(prescription.algorithms), confirmed=confirmed,
        beats_baseline=bool(confirmed.mean > 1.0) if confirmed is not None else (prescription.speedup > 1.0),
        search_score=(search.T / search.best_trial().time) if search.T and search.best_trial().time else None,
        also_confirmed=also, fits=[*book.search_fits, *book.confirm_fits], curves=search.curves(), steps=search.steps,
        cost=cost, settings=recorded, candidates=usable, estimate=search.estimate, prescription=prescription)


def _recorded_settings(settings: SearchSettings, mode: str, extra: Mapping[str, list[Candidate]], method: str = "greedy",
                       target: float | None = None, eval_every: int | None = None,
                       baseline_run: list[list[float]] | None = None) -> RecordedSettings:
    """The settings as the state file and the result record them (a state with other ones is refused)."""
    return RecordedSettings(
        monitor=settings.monitor, mode=mode, run_lengths=list(settings.run_lengths),
        search_seeds=list(settings.search_seeds), confirm_seeds=list(settings.confirm_seeds),
        clock=settings.clock, min_gain=settings.min_gain, confidence=settings.confidence,
        finalist_seeds=list(settings.finalist_seeds),
        candidates=[[c.label, c.algorithm, dict(c.kwargs)] for c in settings.candidates],
        search_candidates=list(settings.search_pool),
        also_confirm={name: [c.label for c in recipe] for name, recipe in extra.items()},
        trainer_kwargs={k: repr(v) for k, v in sorted(settings.trainer_kwargs.items())},
        starting_recipes={name: list(labels) for name, labels in settings.starting_recipes.items()} or None,
        proxy=settings.proxy.describe() if settings.proxy is not None else None,
        screen=settings.screen, first_look=settings.first_look, shortlist=settings.shortlist or None,
        method=None if method == "greedy" else method, target=target, eval_every=eval_every,
        baseline_run=baseline_run,
    )


def _starting_recipes(requested: Mapping[str, Sequence[Candidate | str]] | None, probe: checks.Probe,
                      steps: int) -> tuple[dict[str, list[Candidate]], dict[str, str]]:
    """The recipes the first step races whole, and why each published one left out was (``None``: published)."""
    if requested is None:
        return checks.published_starting_recipes(probe, steps)
    return {name: checks.filter_candidates(as_candidates(list(recipe)), probe, steps, explicit=True,
                                           what=f"starting_recipes[{name!r}]")
            for name, recipe in requested.items()}, {}


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


def _cost(settings: SearchSettings, fits: FitScheduler) -> SearchCost:
    max_fits, max_seconds, state = settings.max_fits, fits.max_seconds(), fits.state
    one_baseline = fits.baseline_run(complete=False)
    search_s = fits.spent()
    confirm_s = sum(f.seconds for f in fits.confirm_fits)
    used = fits.used_fits()
    trained_wall = sum(f.wall_s for f in used)
    # fits trained ahead, side by side, that the decisions then did not need (a curve stopped sooner than the
    # scheduler could know): paid for, so part of the cost, though no decision rests on them
    read = {id(f) for f in used}
    unread = [f for f in state.fits if id(f) not in read] if fits.trained else []
    full_run = baseline_run_seconds(fits.confirm_fits, settings.confirm_seeds)
    budget = max_seconds if max_seconds is not None else (search_s if max_fits is not None else float("nan"))
    overhead = state.overhead_cpu_s if settings.clock == "cpu" else state.overhead_s
    return SearchCost(
        clock=settings.clock, clock_means=CLOCKS[settings.clock],
        search_fits=len(fits.search_fits), confirm_fits=len(fits.confirm_fits),
        search_train=search_s, confirm_train=confirm_s,
        baseline_run=one_baseline if one_baseline is not None else float("nan"),
        search_unread_fits=len(unread), search_unread_train=sum(f.seconds for f in unread),
        max_fits=max_fits, max_train=max_seconds, max_baseline_runs=settings.max_baseline_runs,
        full_baseline_run=full_run,  # with a proxy, the search's cost in these is what a user at full size pays
        overhead_s=state.overhead_s, overhead_cpu_s=state.overhead_cpu_s,
        # ... as a fraction of the budget, on the budget's clock (CPU time for "cpu", wall time for "wall")
        overhead_fraction_of_budget=(overhead / budget if budget and settings.clock != "steps" else None),
        overhead_fraction_of_training_wall=state.overhead_s / trained_wall if trained_wall else None,
        fits_trained_now=fits.trained,
        lightning_outside_training_s=sum(f.fit_wall_s - f.wall_s for f in used),
    )


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
