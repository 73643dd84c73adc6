"""Search small, train big: a cheaper version of the user's run for the search to decide on.

The search's decisions need many fits; the answer is only needed at full size. A :class:`Proxy`
says how the search phase's fits are made cheaper (shorter run lengths, a smaller model or a subset
of the data, built by the user's own factories); the confirmation then trains the pick and the baseline
at full size (``run_lengths``, ``make_module``, ``make_data``), and the cost is reported in full-size
baseline runs.

Examples:
    >>> Proxy(run_lengths=(25, 50)).describe()
    'run lengths [25, 50]'
    >>> Proxy.shorter((100, 200, 400), 0.25).run_lengths
    (25, 50, 100)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Proxy"]


@dataclass(frozen=True)
class Proxy:
    """What the search phase trains instead of the full-size run (``None``: as at full size).

    Attributes:
        run_lengths: the search's run lengths (optimizer steps), usually shorter than ``run_lengths``.
        make_module: a factory like ``make_module`` for a cheaper model, for example
            ``functools.partial(make_module, scale=0.25)`` (defined at module level to run on Ray).
        make_data: a factory like ``make_data`` for cheaper data (a subset, smaller images).

    Examples:
        >>> from composer_bridge.search import search_recipe  # doctest: +SKIP
        >>> search_recipe(make_module, make_data, run_lengths=[200, 400, 800],
        ...               proxy=Proxy(run_lengths=(50, 100, 200)))  # doctest: +SKIP
    """

    run_lengths: Sequence[int] | None = None
    make_module: Callable[..., Any] | None = None
    make_data: Callable[..., Any] | None = None

    @classmethod
    def shorter(cls, run_lengths: Sequence[int], fraction: float) -> Proxy:
        """The same run at ``fraction`` of each run length (at least one step each)."""
        if not 0 < fraction <= 1:
            raise ValueError(f"Proxy.shorter: fraction={fraction!r}; expected a number in (0, 1], such as 0.25.")
        return cls(run_lengths=tuple(sorted({max(1, round(n * fraction)) for n in run_lengths})))

    def describe(self) -> str:
        """In words, for the state file and the summary."""
        parts = []
        if self.run_lengths:
            parts.append(f"run lengths {list(self.run_lengths)}")
        for name in ("make_module", "make_data"):
            factory = getattr(self, name)
            if factory is not None:
                parts.append(f"{name}={_name_of(factory)}")
        return ", ".join(parts) or "as at full size"


def _name_of(factory: Callable[..., Any]) -> str:
    inner = getattr(factory, "func", None)  # functools.partial
    if inner is not None:
        args = ", ".join([*(repr(a) for a in factory.args),  # type: ignore[attr-defined]
                          *(f"{k}={v!r}" for k, v in factory.keywords.items())])  # type: ignore[attr-defined]
        return f"{_name_of(inner)}({args})"
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"
