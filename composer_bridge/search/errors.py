"""The recipe search's errors and warnings."""

from __future__ import annotations

__all__ = ["BudgetWarning", "CandidateWarning", "SearchInputError"]


class SearchInputError(ValueError):
    """The search's input cannot work; the message names the value, what was expected and the fix."""


class CandidateWarning(UserWarning):
    """A default candidate cannot apply to this model or data and is left out of the search."""


class BudgetWarning(UserWarning):
    """The budget will not cover the search's first step (every candidate on the first search seed)."""
