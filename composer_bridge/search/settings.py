"""The settings of one recipe search, checked and frozen: what every part of the search reads.

:func:`composer_bridge.search.search_recipe` checks its arguments and builds one
:class:`SearchSettings`; the fit scheduler and the greedy search read it and never change it.

Examples:
    >>> from composer_bridge.search.candidates import Candidate
    >>> settings = SearchSettings(make_module=None, make_data=None, monitor="val/acc", higher=True,
    ...                           candidates=(Candidate("MixUp"), Candidate("BlurPool")),
    ...                           search_pool=("MixUp", "BlurPool"), run_lengths=(50, 100), search_seeds=(0,),
    ...                           confirm_seeds=(10,), clock="steps", max_fits=20)
    >>> settings.config(["BlurPool", "MixUp"]), settings.unit
    (('MixUp', 'BlurPool'), 'steps')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from composer_bridge.search.candidates import Candidate
from composer_bridge.search.executor import FitTask
from composer_bridge.search.proxy import Proxy

__all__ = ["SearchSettings"]


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """One search's checked settings (the arguments of :func:`~composer_bridge.search.search_recipe`).

    Attributes:
        candidates: every candidate a fit may use: the search's own and the parts of the recipes to
            confirm beside it; their order is the order of a configuration's labels.
        search_pool: the labels the greedy steps may add (those that apply to this model).
        starting_recipes: name → configuration (labels) of each recipe the first step races whole
            beside the single candidates.
        higher: ``True`` when a higher ``monitor`` is better (``mode="max"``).
        confidence: how sure a change must be to be taken (:mod:`composer_bridge.search.estimate`).
        proxy: the cheaper run the search phase trains, if any.
        finalist_seeds: more seeds a step's best configuration is scored on before it is taken.
        screen: the share of a step's configurations that go on after a look at each run length but the
            longest on the first search seed (``None``: every one goes on to a full curve).
        first_look: the steps of the first look's run when shorter than the shortest run length (a run read
            by that look only); ``None``: the first look reads the shortest run.
        shortlist: whether the steps after the first try only the candidates the first step's first look kept.
    """

    make_module: Callable[..., Any]
    make_data: Callable[..., Any]
    monitor: str
    higher: bool
    candidates: tuple[Candidate, ...]
    search_pool: tuple[str, ...]
    run_lengths: tuple[int, ...]
    search_seeds: tuple[int, ...]
    confirm_seeds: tuple[int, ...]
    clock: str
    trainer_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_fits: int | None = None
    max_train_seconds: float | None = None
    max_baseline_runs: float | None = None
    min_gain: float = 0.02
    starting_recipes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    confidence: float = 0.8
    proxy: Proxy | None = None
    finalist_seeds: tuple[int, ...] = ()
    screen: float | None = None
    first_look: int | None = None
    shortlist: bool = False

    def seeds(self, phase: str) -> tuple[int, ...]:
        """The seeds of a phase (``"search"`` or ``"confirm"``)."""
        return self.search_seeds if phase == "search" else self.confirm_seeds

    def lengths(self, phase: str) -> tuple[int, ...]:
        """The run lengths of a phase: the proxy's in the search when there is one, else ``run_lengths``."""
        if phase == "search" and self.proxy is not None and self.proxy.run_lengths:
            return tuple(self.proxy.run_lengths)
        return self.run_lengths

    def looks(self) -> list[tuple[int, int | None]]:
        """The run lengths a step's screening looks at, short to long: ``(steps, index of that run length)``, the
        index ``None`` for the first look's own run (``first_look``)."""
        lengths = self.lengths("search")
        looks: list[tuple[int, int | None]] = [(steps, index) for index, steps in enumerate(lengths[:-1])]
        if self.first_look is not None and self.first_look < lengths[0]:
            looks.insert(0, (self.first_look, None))
        return looks

    @property
    def unit(self) -> str:
        """The unit of the clock's training time: ``"steps"`` or ``"s"``."""
        return "steps" if self.clock == "steps" else "s"

    def candidate(self, label: str) -> Candidate:
        """The candidate with this label."""
        return next(c for c in self.candidates if c.label == label)

    def algorithms_in(self, config: Iterable[str]) -> set[str]:
        """The algorithm classes of a configuration's candidates (``{"MixUp", "EMA"}``)."""
        return {self.candidate(label).algorithm for label in config}

    def pays_late(self, config: Iterable[str]) -> bool:
        """Whether a configuration holds a candidate whose gain shows only late (:attr:`Candidate.pays_late`)."""
        return any(self.candidate(label).pays_late for label in config)

    def config(self, labels: Iterable[str]) -> tuple[str, ...]:
        """The configuration of these labels: in candidate order, so one set of labels has one key."""
        order = [c.label for c in self.candidates]
        return tuple(sorted(labels, key=order.index))

    def task(self, config: tuple[str, ...], seed: int, steps: int, phase: str = "confirm") -> FitTask:
        """The fit of ``config`` on ``seed`` for ``steps`` optimizer steps (the proxy's factories in the search)."""
        make_module, make_data = self.make_module, self.make_data
        if phase == "search" and self.proxy is not None:
            make_module = self.proxy.make_module or make_module
            make_data = self.proxy.make_data or make_data
        return FitTask(make_module, make_data, [self.candidate(label) for label in config], steps, seed,
                       self.monitor, self.clock, dict(self.trainer_kwargs))
