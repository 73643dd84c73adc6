"""Bad input to the recipe search, refused before any training with a message that says how to fix it.

Examples:
    >>> check_run_lengths([200, 50, 100])
    [50, 100, 200]
    >>> check_mode("maximise")
    Traceback (most recent call last):
    ...
    composer_bridge.search.errors.SearchInputError: mode='maximise': expected 'max' (higher quality is better, e.g. accuracy) or 'min' (e.g. a loss).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from composer_bridge.lightning.package import LIGHTNING, package_of
from composer_bridge.search.candidates import Candidate, applicability
from composer_bridge.search.errors import BudgetWarning, CandidateWarning, SearchInputError
from composer_bridge.search.executor import needs_own_launcher
from composer_bridge.search.trial import (
    CLOCKS,
    OWNED_TRAINER_KWARGS,
    FitRecord,
    build_module,
    load_data,
    trainer_for,
)

__all__ = ["CandidateWarning", "Probe", "SearchInputError", "check_budget", "check_clock", "check_mode",
           "check_run_lengths", "check_seeds", "check_time_budget", "check_trainer_kwargs", "filter_candidates",
           "probe"]


def check_mode(mode: str) -> bool:
    """``True`` for ``"max"``, ``False`` for ``"min"``."""
    if mode not in ("max", "min"):
        raise SearchInputError(f"mode={mode!r}: expected 'max' (higher quality is better, e.g. accuracy) "
                               "or 'min' (e.g. a loss).")
    return mode == "max"


def check_run_lengths(run_lengths: Sequence[int]) -> list[int]:
    """Sorted run lengths (optimizer steps); at least two, distinct positive ints."""
    lengths = list(run_lengths)
    if len(lengths) < 2 or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths) \
            or len(set(lengths)) != len(lengths):
        raise SearchInputError(
            f"run_lengths={run_lengths!r}: expected two or more distinct positive ints (optimizer steps), "
            "e.g. [50, 100, 200]: each is one point of a quality-vs-time curve, trained from scratch.")
    return sorted(lengths)


def check_seeds(search_seeds: Sequence[int], confirm_seeds: Sequence[int],
                allow_no_confirm: bool = False) -> tuple[list[int], list[int]]:
    """The seeds as lists; both non-empty ints (``confirm_seeds`` may be empty with ``allow_no_confirm``), and no
    confirmation seed among the search seeds."""
    search, confirm = list(search_seeds), list(confirm_seeds)
    for name, seeds in (("search_seeds", search), ("confirm_seeds", confirm)):
        if name == "confirm_seeds" and allow_no_confirm and seeds == []:
            continue
        if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds) \
                or len(set(seeds)) != len(seeds):
            raise SearchInputError(f"{name}={seeds!r}: expected a non-empty list of distinct ints.")
    shared = sorted(set(search) & set(confirm))
    if shared:
        raise SearchInputError(
            f"confirm_seeds={confirm!r} shares {shared} with search_seeds={search!r}: a recipe confirmed on the seeds it "
            "was chosen on looks better than it is. Use seeds the search never sees, e.g. "
            f"confirm_seeds={[max(search) + 1000 + i for i in range(len(confirm))]}.")
    return search, confirm


def check_finalist_seeds(finalist_seeds: Sequence[int] | None, search: Sequence[int],
                         confirm: Sequence[int]) -> list[int]:
    """The finalist seeds: ``None`` gives one, the first int after the search seeds used by neither list."""
    if finalist_seeds is None:
        seed = max(search) + 1
        while seed in search or seed in confirm:
            seed += 1
        return [seed]
    seeds = list(finalist_seeds)
    if any(isinstance(s, bool) or not isinstance(s, int) for s in seeds) or len(set(seeds)) != len(seeds):
        raise SearchInputError(f"finalist_seeds={finalist_seeds!r}: expected a list of distinct ints (or None for "
                               "one, or [] for none).")
    shared = sorted(set(seeds) & (set(search) | set(confirm)))
    if shared:
        raise SearchInputError(f"finalist_seeds={seeds!r} shares {shared} with the search or confirmation seeds: a "
                               "finalist seed must be one no other decision or report uses. Use e.g. "
                               f"finalist_seeds={[max([*search, *confirm]) + 1]}.")
    return seeds


def check_screen(screen: float | None) -> float | None:
    """``None`` or the share of a step's configurations kept after the first look, in (0, 1]."""
    if screen is None:
        return None
    if isinstance(screen, bool) or not isinstance(screen, (int, float)) or not 0 < screen <= 1:
        raise SearchInputError(f"screen={screen!r}: expected a share in (0, 1], such as 1/3 (a third of a step's "
                               "configurations go on to full curves), or None to race every one in full.")
    return float(screen)


def check_first_look(first_look: float | None, shortest: int) -> int | None:
    """The steps of the first look's own run (``first_look`` of the ``shortest`` run length), ``None`` when that is
    the shortest run itself.

    Examples:
        >>> check_first_look(0.5, 100), check_first_look(None, 100), check_first_look(1, 100)
        (50, None, None)
    """
    if first_look is None:
        return None
    if isinstance(first_look, bool) or not isinstance(first_look, (int, float)) or not 0 < first_look <= 1:
        raise SearchInputError(f"first_look={first_look!r}: expected a share of the shortest run length in (0, 1], "
                               "such as 0.5 (a first look at runs half as long as the shortest), or None to look at "
                               "the shortest run itself.")
    steps = max(1, round(first_look * shortest))
    return steps if steps < shortest else None


def check_shortlist(shortlist: bool) -> bool:
    """``shortlist`` is ``True`` or ``False``."""
    if not isinstance(shortlist, bool):
        raise SearchInputError(f"shortlist={shortlist!r}: expected True (the steps after the first try only the "
                               "candidates the first look kept) or False (every step tries every candidate).")
    return shortlist


def check_method(method: str) -> str:
    """``method`` is ``"prescribe"`` or ``"greedy"``."""
    if method not in ("prescribe", "greedy"):
        raise SearchInputError(f"method={method!r}: expected 'prescribe' (a run to start, measured as handed over: the "
                               "default) or 'greedy' (the earlier greedy search over curves).")
    return method


def check_target(target: float | None) -> float | None:
    """``target`` is ``None`` or a finite number."""
    if target is None:
        return None
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target):
        raise SearchInputError(f"target={target!r}: expected the quality to reach as a number (e.g. target=0.9 for "
                               "val/acc), or None for the baseline run's best.")
    return float(target)


def check_eval_every(eval_every: int | None, longest: int) -> int | None:
    """``eval_every`` is ``None`` or a positive int no longer than the longest run."""
    if eval_every is None:
        return None
    if isinstance(eval_every, bool) or not isinstance(eval_every, int) or not 1 <= eval_every <= longest:
        raise SearchInputError(f"eval_every={eval_every!r}: expected optimizer steps between validations, an int from "
                               f"1 to the longest run length {longest} (e.g. {max(1, longest // 16)}), or None.")
    return eval_every


def check_baseline_run(baseline_run: Sequence[Sequence[float]] | None, longest: int) -> list[list[float]] | None:
    """``baseline_run`` is ``None`` or validations ``(step, seconds, quality)`` in step order, up to ``longest`` steps."""
    if baseline_run is None:
        return None
    try:
        points = [[int(p[0]), float(p[1]), float(p[2])] for p in baseline_run]
    except (TypeError, ValueError, IndexError) as error:
        raise SearchInputError(f"baseline_run={baseline_run!r}: expected validations [(step, training seconds, "
                               f"quality), ...] of your baseline run ({error}).") from error
    steps = [p[0] for p in points]
    if not points or steps != sorted(set(steps)) or steps[-1] != longest:
        raise SearchInputError(f"baseline_run: steps {steps[:5]}...{steps[-1:]} must rise and end at the longest run "
                               f"length {longest}: it is your baseline run at that length, validated as it trained.")
    return points


def check_confidence(confidence: float) -> float:
    """A confidence strictly between 0 and 1."""
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 <= confidence < 1:
        raise SearchInputError(f"confidence={confidence!r}: expected a number from 0 up to (not including) 1, such as "
                               "0.9: an addition joins the recipe only when the search is this sure it helps (0: "
                               "whenever its mean is ahead, whatever the noise).")
    return float(confidence)


def check_proxy(proxy: Any) -> Any:
    """A :class:`~composer_bridge.search.proxy.Proxy` (or ``None``) with valid run lengths and factories."""
    from composer_bridge.search.proxy import Proxy

    if proxy is None:
        return None
    if not isinstance(proxy, Proxy):
        raise SearchInputError(f"proxy={proxy!r}: expected None or composer_bridge.search.Proxy(run_lengths=..., "
                               "make_module=..., make_data=...), e.g. Proxy.shorter(run_lengths, 0.25).")
    if proxy.run_lengths is not None:
        try:
            lengths = check_run_lengths(proxy.run_lengths)
        except SearchInputError as error:
            raise SearchInputError(f"proxy: {error}") from None
        proxy = Proxy(tuple(lengths), proxy.make_module, proxy.make_data)
    for name in ("make_module", "make_data"):
        factory = getattr(proxy, name)
        if factory is not None and not callable(factory):
            raise SearchInputError(f"proxy.{name}={factory!r}: expected a function like {name} (or None to use "
                                   f"{name} itself).")
    return proxy


def check_trainer_kwargs(trainer_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The user's Trainer arguments, without those the search sets itself."""
    kwargs = dict(trainer_kwargs or {})
    owned = sorted(k for k in kwargs if k in OWNED_TRAINER_KWARGS)
    if owned:
        raise SearchInputError(
            f"trainer_kwargs sets {owned}: the search sets {list(OWNED_TRAINER_KWARGS)} itself (each fit runs "
            "max_steps = one of run_lengths, no logger, no checkpoints). Remove them; choose the lengths with run_lengths=.")
    return kwargs


def check_clock(clock: str) -> None:
    if clock not in CLOCKS:
        raise SearchInputError(f"clock={clock!r}: expected one of {sorted(CLOCKS)} ({CLOCKS}).")


def check_budget(max_fits: int | None, max_seconds: float | None, n_lengths: int, n_seeds: int,
                 max_runs: float | None = None) -> None:
    """A budget is given, and (in fits) covers the baseline curves on the search seeds plus one candidate curve."""
    if max_fits is None and max_seconds is None and max_runs is None:
        raise SearchInputError("no budget: pass max_baseline_runs= (training time in the search's own baseline runs), "
                               "max_fits= (fits, baseline fits included) or max_train_seconds= (training time on the "
                               "search's clock).")
    if max_runs is not None and (isinstance(max_runs, bool) or not isinstance(max_runs, (int, float))
                                 or not max_runs > n_seeds):
        raise SearchInputError(
            f"max_baseline_runs={max_runs!r}: expected a number above the {n_seeds} baseline runs the search seeds "
            f"take themselves (one baseline run = every run length on one seed), e.g. {n_seeds + 10}.")
    if max_fits is not None:
        need = n_lengths * (n_seeds + 1)
        if isinstance(max_fits, bool) or not isinstance(max_fits, int) or max_fits < need:
            raise SearchInputError(
                f"max_fits={max_fits!r} is smaller than one baseline run on every search seed plus one candidate "
                f"({n_lengths} run lengths x ({n_seeds} baseline seeds + 1) = {need} fits): the search could compare "
                f"nothing. Raise max_fits to at least {need} (a useful search needs several times that), or use "
                "fewer run_lengths or search_seeds.")
    if max_seconds is not None and not max_seconds > 0:
        raise SearchInputError(f"max_train_seconds={max_seconds!r}: expected a positive number.")


def check_time_budget(max_seconds: float | None, first: FitRecord, lengths: Sequence[int], n_seeds: int,
                      unit: str) -> None:
    """After the first (shortest) baseline fit: does a time budget cover the baseline curves and one more?"""
    if max_seconds is None:
        return
    projected = first.seconds * sum(lengths) / lengths[0] * (n_seeds + 1)
    if projected > max_seconds:
        raise SearchInputError(
            f"max_train_seconds={max_seconds:g} is smaller than one baseline run on every search seed plus one "
            f"candidate: the first baseline fit ({lengths[0]} steps) took {first.seconds:.3g} {unit}, so the "
            f"{len(lengths)} run lengths x ({n_seeds} + 1) curves need about {projected:.3g} {unit}. Raise the "
            "budget (a useful search needs several times that), or shorten run_lengths.")


def warn_small_budget(budget: float | None, curve_cost: float, n_seeds: int, n_candidates: int, unit: str) -> None:
    """Warn when ``budget`` cannot cover the baseline curves and one curve per candidate on one seed.

    ``curve_cost`` is one baseline curve's cost (fits, or time on the search's clock).
    """
    if budget is None:
        return
    need = curve_cost * (n_seeds + n_candidates)
    if budget < need:
        warnings.warn(BudgetWarning(
            f"the budget ({budget:g} {unit}) covers about {budget / curve_cost:.1f} baseline curves; the first step "
            f"alone needs about {need:.3g} {unit} ({n_seeds} baseline curves + one per candidate, {n_candidates}, on "
            "the first search seed), so the search will likely stop before it chooses anything. Raise the budget "
            "or pass fewer candidates."), stacklevel=4)


def check_same_labels(candidates: list[Candidate], recipes: Mapping[str, list[Candidate]]) -> None:
    """One label, one algorithm: a label in a recipe (keyed ``"also_confirm['name']"``, ...) that names a
    candidate must mean the same one."""
    known = {c.label: c for c in candidates}
    for where, recipe in recipes.items():
        for c in recipe:
            other = known.setdefault(c.label, c)
            if (other.algorithm, dict(other.kwargs)) != (c.algorithm, dict(c.kwargs)):
                raise SearchInputError(
                    f"{where}: the label {c.label!r} means {c.algorithm}({dict(c.kwargs)}) there and "
                    f"{other.algorithm}({dict(other.kwargs)}) elsewhere in the search. Give one of them another "
                    "name= (from_recipe prefixes its labels with the recipe's name).")


@dataclass
class Probe:
    """What a validation-only look at the module and data found."""

    module: torch.nn.Module
    batch: Any
    metrics: list[str]


def probe(make_module: Callable[..., Any], make_data: Callable[..., Any], monitor: str, steps: int, seed: int,
          trainer_kwargs: dict[str, Any]) -> Probe:
    """Build the module twice (they must be different objects), draw one batch and validate on one batch."""
    LIGHTNING.module.seed_everything(seed, verbose=False)  # the same function in both packages
    first = build_module(make_module, steps)
    second = build_module(make_module, steps)
    if package_of(first) is None:
        raise SearchInputError(f"make_module returned {type(first).__name__}; expected a LightningModule "
                               "(of lightning or pytorch_lightning).")
    if first is second:
        raise SearchInputError(
            f"make_module returned the same {type(first).__name__} object twice: every fit must start from a fresh "
            "module, or later fits would continue training the first. Build the module inside the function "
            "(def make_module(total_steps): return MyModule(...)).")
    shared = {id(p) for p in first.parameters()} & {id(p) for p in second.parameters()}
    if shared:
        raise SearchInputError(
            f"make_module returned two {type(first).__name__} objects that share {len(shared)} parameter tensors "
            "(a network built once, outside the function?): every fit must start from fresh weights. Build the "
            "network inside make_module too.")
    train, val = load_data(make_data, seed)
    batch = next(iter(train))
    kwargs = {**trainer_kwargs, "limit_val_batches": 1}
    if needs_own_launcher(kwargs):  # the look runs here, on one device; the fits run on all of them
        kwargs.update(devices=1, num_nodes=1, strategy="auto")
    trainer = trainer_for(second, 1, kwargs, [])
    metrics = trainer.validate(second, dataloaders=val, verbose=False)[0]
    if monitor not in metrics:
        raise SearchInputError(
            f"monitor={monitor!r} is not logged by {type(first).__name__}'s validation; it logs {sorted(metrics)}. "
            "Pass one of those, or log it in validation_step with self.log(...).")
    return Probe(first, batch, sorted(metrics))


def filter_candidates(candidates: list[Candidate], found: Probe, steps: int, explicit: bool,
                      what: str = "candidates") -> list[Candidate]:
    """The candidates that can apply; an explicit list with one that cannot is an error, defaults warn.

    What the user names (``candidates=``, a recipe in ``also_confirm=`` or ``starting_recipes=``) is
    trained whole or refused, never trimmed: a reported recipe is always exactly what was trained.
    """
    reasons = {c.label: applicability(c, found.module, found.batch, steps) for c in candidates}
    bad = {label: why for label, why in reasons.items() if why is not None}
    if bad and explicit:
        lines = "; ".join(f"{label}: {why}" for label, why in bad.items())
        raise SearchInputError(f"{what}: {sorted(bad)} cannot apply to this model or data ({lines}). "
                               f"The search trains what you name whole or not at all: remove {', '.join(bad)} from "
                               f"{what}, or give the model and data what {'they need' if len(bad) > 1 else 'it needs'}.")
    if bad:
        warnings.warn(CandidateWarning(f"{what}: left out, they cannot apply: " +
                                       "; ".join(f"{label} ({why})" for label, why in bad.items())), stacklevel=3)
    usable = [c for c in candidates if c.label not in bad]
    if not usable:
        raise SearchInputError(f"{what}: none of {sorted(reasons)} can apply to this model or data ({bad}).")
    return usable


def published_starting_recipes(found: Probe, steps: int) -> tuple[dict[str, list[Candidate]], dict[str, str]]:
    """The published recipes (:mod:`composer_bridge.recipes`) that apply whole to this model and data.

    Returns ``(recipes, left_out)``: the recipes as candidates (labels ``"<recipe>:<class name>"``)
    and, for each recipe left out, why (its first part that cannot apply). A language recipe's
    ``max_seq_length`` is the length of the probe batch's token sequences (its first 2-D integer tensor:
    ``input_ids`` in a dict batch, the inputs in a tuple).
    """
    from composer_bridge import recipes as published
    from composer_bridge.search.candidates import from_recipe

    batch = found.batch
    items = list(batch.values()) if isinstance(batch, dict) else list(batch) if isinstance(batch, (list, tuple)) else [batch]
    tokens = next((t for t in items if isinstance(t, torch.Tensor) and t.dim() == 2 and not t.is_floating_point()
                   and not t.dtype == torch.bool), None)  # (batch, sequence) token ids, first in the batch
    fill = {"max_seq_length": int(tokens.shape[1])} if tokens is not None else {}
    usable, left_out = {}, {}
    for name in [*published.VISION_RECIPES, *published.LANGUAGE_RECIPES]:
        recipe = from_recipe(name, **fill)
        unfilled = [c.label for c in recipe if any(isinstance(v, str) and v.startswith("{") for v in c.kwargs.values())]
        why = f"{unfilled[0]} needs the length of token sequences, and the batch holds none" if unfilled else None
        for c in [] if unfilled else recipe:
            why = applicability(c, found.module, found.batch, steps)
            if why is not None:
                break
        if why is None:
            usable[name] = recipe
        else:
            left_out[name] = why
    return usable, left_out
