"""The settings a search records: in its state file (a state with other ones is refused) and in its result.

:class:`RecordedSettings` has one typed attribute per setting; it also reads as a mapping
(``result.settings["run_lengths"]``), as ``SearchResult.settings`` did when it was a plain dict, and
:meth:`~composer_bridge.search._mapping.FieldsMapping.as_dict` gives the dict the state file holds
(the same keys as before, so state files written before still load).

Examples:
    >>> recorded = RecordedSettings(monitor="val/acc", mode="max", run_lengths=[10, 20], search_seeds=[0],
    ...                             confirm_seeds=[10], clock="steps", min_gain=0.02, confidence=0.8)
    >>> recorded["run_lengths"], "proxy" in recorded, recorded.proxy
    ([10, 20], False, None)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from composer_bridge.search._mapping import FieldsMapping

__all__ = ["RecordedSettings"]

#: keys a state file holds only when they are set (states saved before they existed load without them)
_ONLY_WHEN_SET = ("starting_recipes", "proxy", "screen", "first_look", "shortlist", "method", "target", "eval_every", "baseline_run")


@dataclass(frozen=True, kw_only=True)
class RecordedSettings(FieldsMapping):
    """One search's settings as plain data.

    Attributes:
        monitor, mode: the metric and whether higher (``"max"``) or lower (``"min"``) is better.
        run_lengths, search_seeds, confirm_seeds, finalist_seeds: the run lengths and seeds of each phase.
        clock, min_gain, confidence: how time is measured, the gain a step must bring, and how sure it must be.
        candidates: ``[label, algorithm, kwargs]`` of every candidate; search_candidates: the labels searched.
        also_confirm: each extra recipe confirmed beside the pick, by its labels.
        trainer_kwargs: the Trainer's keyword arguments, as ``repr`` strings.
        starting_recipes: the recipes the first step raced whole (left out of the mapping when none).
        proxy: the proxy searched on, in words (left out of the mapping when none).
        screen: the share of a step's configurations kept after the first look (left out of the mapping when none).
        first_look: the steps of the first look's own run (left out when it reads the shortest run).
        shortlist: ``True`` when the later steps try only the candidates the first look kept (left out otherwise).
    """

    monitor: str
    mode: str
    run_lengths: list[int]
    search_seeds: list[int]
    confirm_seeds: list[int]
    clock: str
    min_gain: float
    confidence: float
    finalist_seeds: list[int] = field(default_factory=list)
    candidates: list[list[Any]] = field(default_factory=list)
    search_candidates: list[str] = field(default_factory=list)
    also_confirm: dict[str, list[str]] = field(default_factory=dict)
    trainer_kwargs: dict[str, str] = field(default_factory=dict)
    starting_recipes: dict[str, list[str]] | None = None
    proxy: str | None = None
    screen: float | None = None
    first_look: int | None = None
    shortlist: bool | None = None
    method: str | None = None  #: ``"prescribe"``; left out for the greedy method (states saved before load)
    target: float | None = None
    eval_every: int | None = None
    baseline_run: list[list[float]] | None = None  #: the user's baseline run read instead of trained

    def _keys(self) -> list[str]:
        return [f.name for f in fields(self) if f.name not in _ONLY_WHEN_SET or getattr(self, f.name)]
