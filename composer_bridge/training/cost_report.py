"""The cost report: how much wall time each algorithm spent in ``apply``, per event.

The engine (with ``measure_cost=True``, the callback's default) adds up every ``apply`` call into
``engine.cost`` / ``callback.cost``: ``"<label>/<EVENT>"`` → ``[calls, seconds]``, where the label
is the algorithm's class name (``Name#2``, ``Name#3``... for further instances of a class, so each
instance has its own rows).
:func:`cost_report` turns that into a table you can print, with each algorithm's share of the
training time when it is known, so you can see whether an algorithm pays for itself.

Only the time inside ``apply`` is counted: work an algorithm causes elsewhere (a bigger
backward pass, extra forward passes inside the model, a GPU kernel still running when
``apply`` returns) is not. On a GPU, ``apply`` times are launch times unless the algorithm
synchronises.

Examples:
    >>> report = cost_report({"MixUp/BEFORE_FORWARD": [4, 0.002], "MixUp/BEFORE_LOSS": [4, 0.001]},
    ...                      train_seconds=1.0)
    >>> report.by_algorithm()
    {'MixUp': 0.003}
    >>> print(report)  # doctest: +NORMALIZE_WHITESPACE
    algorithm  event           calls  total ms  mean ms  % of training
    MixUp      BEFORE_FORWARD      4     2.000    0.500          0.20%
    MixUp      BEFORE_LOSS         4     1.000    0.250          0.10%
    MixUp      (all events)        8     3.000    0.375          0.30%
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from composer_bridge.core.event import Event

__all__ = ["CostReport", "CostRow", "cost_report"]

_EVENT_POSITION = {event.name: i for i, event in enumerate(Event)}


@dataclass(frozen=True)
class CostRow:
    """Time one algorithm spent in ``apply`` at one event (``event == "(all events)"`` for its total)."""

    algorithm: str
    event: str
    calls: int
    seconds: float

    @property
    def mean_seconds(self) -> float:
        """Seconds per call (0 when it never ran)."""
        return self.seconds / self.calls if self.calls else 0.0


@dataclass
class CostReport:
    """The rows of the cost table; ``print(report)`` shows it, ``rows`` holds the numbers.

    ``train_seconds`` is the training wall time the shares are taken of (``None``: unknown).
    """

    rows: list[CostRow] = field(default_factory=list)
    train_seconds: float | None = None
    note: str = ""

    def by_algorithm(self) -> dict[str, float]:
        """Seconds in ``apply`` per algorithm (per label: each instance apart), all events together."""
        totals: dict[str, float] = {}
        for row in self.rows:
            if row.event != "(all events)":
                totals[row.algorithm] = round(totals.get(row.algorithm, 0.0) + row.seconds, 12)
        return totals

    @property
    def total_seconds(self) -> float:
        """Seconds in ``apply`` over all algorithms and events."""
        return sum(self.by_algorithm().values())

    @property
    def text(self) -> str:
        """The table (what ``str(report)`` returns)."""
        if not self.rows:
            return self.note or "No algorithm has run yet."
        header = ["algorithm", "event", "calls", "total ms", "mean ms"]
        if self.train_seconds:
            header.append("% of training")
        table = [header]
        for row in self.rows:
            cells = [row.algorithm, row.event, str(row.calls), f"{row.seconds * 1e3:.3f}", f"{row.mean_seconds * 1e3:.3f}"]
            if self.train_seconds:
                cells.append(f"{100 * row.seconds / self.train_seconds:.2f}%")
            table.append(cells)
        widths = [max(len(r[i]) for r in table) for i in range(len(header))]
        lines = []
        for cells in table:
            left = [c.ljust(w) for c, w in zip(cells[:2], widths[:2], strict=True)]
            right = [c.rjust(w) for c, w in zip(cells[2:], widths[2:], strict=True)]
            lines.append("  ".join(left + right).rstrip())
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text


def cost_report(
    cost: Mapping[str, Sequence[float]], train_seconds: float | None = None, note: str = ""
) -> CostReport:
    """Build a :class:`CostReport` from an engine cost table (``"<label>/<EVENT>"`` → ``[calls, seconds]``).

    Rows are grouped by algorithm (in the order they first appear), events in the order they
    fire, each algorithm followed by its ``(all events)`` total when it ran at several events.
    """
    if train_seconds is not None and train_seconds <= 0:
        train_seconds = None
    grouped: dict[str, list[CostRow]] = {}
    for key, entry in cost.items():
        if len(entry) != 2:
            raise ValueError(
                f"cost[{key!r}] = {entry!r}: each entry must be [calls, seconds], as Engine.cost holds them."
            )
        algorithm, _, event = key.rpartition("/")
        grouped.setdefault(algorithm, []).append(CostRow(algorithm, event, int(entry[0]), float(entry[1])))
    rows: list[CostRow] = []
    for algorithm, items in grouped.items():
        items.sort(key=lambda r: _EVENT_POSITION.get(r.event, len(_EVENT_POSITION)))
        rows.extend(items)
        if len(items) > 1:
            rows.append(
                CostRow(algorithm, "(all events)", sum(r.calls for r in items), sum(r.seconds for r in items))
            )
    return CostReport(rows, train_seconds, note)
