"""What a search cost: its fits and training time, in baseline runs, beside the confirmation's and its own overhead.

:class:`SearchCost` has one typed attribute per number; it also reads as a mapping (``cost["search_fits"]``),
as ``SearchResult.cost`` did when it was a plain dict, so code written against that keeps working.

Examples:
    >>> cost = SearchCost(clock="steps", clock_means="optimizer steps", search_fits=12, confirm_fits=6,
    ...                   search_train=300.0, confirm_train=150.0, baseline_run=50.0)
    >>> cost.search_in_baseline_runs, cost["search_fits"], "baseline_run" in cost
    (6.0, 12, True)
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from composer_bridge.search._mapping import FieldsMapping

__all__ = ["SearchCost"]


@dataclass(frozen=True, kw_only=True)
class SearchCost(FieldsMapping):
    """The cost of one search (times on the search's clock: CPU seconds, wall seconds or steps).

    Attributes:
        clock, clock_means: the clock and what it measures, in words.
        search_fits, confirm_fits: fits the decisions read, and the confirmation's.
        search_train, confirm_train: their training time.
        baseline_run: one baseline run on the search seeds (every run length on one seed, mean over seeds); with a
            run you gave, that run on the search's clock (its time scaled by how much slower or faster the machine
            trains now, read from the baseline trained now).
        baseline_run_given: that run's time as given, where it was put on the search's clock (else ``None``).
        search_unread_fits, search_unread_train: fits trained ahead, side by side, that no decision read.
        max_fits, max_train, max_baseline_runs: the budgets given (``max_train`` is the time budget in force).
        full_baseline_run: one full-size baseline run (every run length on one confirmation seed), when trained.
        overhead_s, overhead_cpu_s: the search's own time outside the fits, all calls together.
        overhead_fraction_of_budget, overhead_fraction_of_training_wall: the same, as fractions.
        fits_trained_now: fits trained by this call (0 for a re-report).
        lightning_outside_training_s: Lightning's set-up and validation around the timed training.
    """

    clock: str
    clock_means: str
    search_fits: int
    confirm_fits: int
    search_train: float
    confirm_train: float
    baseline_run: float
    search_unread_fits: int = 0
    search_unread_train: float = 0.0
    max_fits: int | None = None
    max_train: float | None = None
    max_baseline_runs: float | None = None
    full_baseline_run: float | None = None
    baseline_run_given: float | None = None
    overhead_s: float = 0.0
    overhead_cpu_s: float = 0.0
    overhead_fraction_of_budget: float | None = None
    overhead_fraction_of_training_wall: float | None = None
    fits_trained_now: int = 0
    lightning_outside_training_s: float = 0.0

    @property
    def search_in_baseline_runs(self) -> float:
        """The search's training time in baseline runs."""
        return self.search_train / self.baseline_run if self.baseline_run else float("nan")

    @property
    def search_trained_in_baseline_runs(self) -> float:
        """The same, with the fits trained ahead that no decision read."""
        total = self.search_train + self.search_unread_train
        return total / self.baseline_run if self.baseline_run else float("nan")

    @property
    def search_in_full_runs(self) -> float | None:
        """The search's training time in full-size baseline runs (with a proxy: what a full-size user pays)."""
        return self.search_train / self.full_baseline_run if self.full_baseline_run else None

    def _keys(self) -> list[str]:
        return [f.name for f in fields(self)] + ["search_in_baseline_runs", "search_trained_in_baseline_runs",
                                                 "search_in_full_runs"]
