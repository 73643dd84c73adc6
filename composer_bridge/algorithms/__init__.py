"""The algorithm library: one module per algorithm, Composer's names and defaults.

Each module holds a functional form (also exported from :mod:`composer_bridge.functional`) and
an :class:`~composer_bridge.Algorithm` class. None of them imports Lightning.
"""

# Each algorithm module adds one import line below and its name to __all__ (keep both sorted).

__all__: list[str] = []
