"""What a recipe search hands back: one curve's result, the whole search's result, the budget's stop.

Examples:
    >>> CurveResult(("MixUp",), 0, "search", [(1.0, 0.8)], "reached Q", 1.5).speedup
    1.5
    >>> config_name(()), config_name(("BlurPool", "MixUp"))
    ('baseline', 'BlurPool + MixUp')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from composer_bridge.search.candidates import Candidate
from composer_bridge.search.cost import SearchCost
from composer_bridge.search.estimate import Estimate
from composer_bridge.search.prescription import Prescription
from composer_bridge.search.recorded_settings import RecordedSettings
from composer_bridge.search.scoring import QualityWithin, SpeedUp
from composer_bridge.search.trial import FitRecord

__all__ = ["BudgetExhausted", "Config", "CurveResult", "SearchResult", "config_name"]

#: A configuration: candidate labels in the search's candidate order (``()`` is the baseline).
Config = tuple[str, ...]


def config_name(config: Sequence[str]) -> str:
    """A configuration as a reader sees it: its labels joined by ``" + "``, or ``"baseline"``."""
    return " + ".join(config) or "baseline"


class BudgetExhausted(Exception):
    """Raised inside the search when the next fit would overrun the budget (the search then stops)."""


@dataclass
class CurveResult:
    """One configuration on one seed: its points, why it stopped and its strict speed-up."""

    config: Config
    seed: int
    phase: str
    points: list[tuple[float, float]]
    status: str  #: "reached Q", "never reached Q", "stopped: past the baseline's time to Q", "baseline", "stopped: cannot beat 2.50x"
    speedup: float | None
    stopped_below: float | None = None  #: the speed-up it could not beat, where it stopped for that reason


@dataclass(kw_only=True)
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
            search's cost in baseline-run equivalents and its own overhead (a
            :class:`~composer_bridge.search.cost.SearchCost`; ``cost["search_fits"]`` reads it too).
        settings: the settings the search ran with, as its state file records them (a
            :class:`~composer_bridge.search.recorded_settings.RecordedSettings`; ``settings["clock"]`` reads it too).
        quality_within_baseline_time: the second answer, for a goal of quality rather than time: the
            best quality reached within the baseline's training time (its longest run) on each
            confirmation seed, keyed ``"baseline"``, ``"recipe"`` (the search's pick) and each
            ``also_confirm`` name; empty when nothing was confirmed.
        estimate: what the pick should give on seeds it never saw, from the search's own scores corrected
            for having been chosen, with a 90 % interval (:class:`~composer_bridge.search.estimate.Estimate`;
            ``None`` when the recipe is empty). The confirmation checks it.
        prescription: the run to start: the algorithms, the run length (``max_steps`` and the schedule's
            ``total_steps``), the target and the speed-up to expect with its interval
            (:class:`~composer_bridge.search.prescription.Prescription`; ``prescription.callback()`` builds it).
        runner_up: when the recipe is empty, the configuration that scored best on the search seeds
            without being sure enough to be taken; it is confirmed too (``runner_up_confirmed``, and
            ``"best tried"`` in ``quality_within_baseline_time``), as a second opinion.
    """

    recipe: list[Candidate]
    confirmed: SpeedUp | None
    beats_baseline: bool
    search_score: float | None
    also_confirmed: dict[str, SpeedUp]
    fits: list[FitRecord]
    curves: list[CurveResult]
    steps: list[str]
    cost: SearchCost
    settings: RecordedSettings
    candidates: list[Candidate] = field(default_factory=list)
    stopped_by_budget: bool = False
    quality_within_baseline_time: dict[str, QualityWithin] = field(default_factory=dict)
    estimate: Estimate | None = None
    runner_up: list[Candidate] = field(default_factory=list)
    runner_up_confirmed: SpeedUp | None = None
    prescription: Prescription | None = None

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
