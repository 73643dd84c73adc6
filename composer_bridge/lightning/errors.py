"""The error the bridge raises when algorithms cannot run with a module, Trainer or checkpoint.

One class in a module of its own, so that every check (``setup_checks``, ``plain_loss``,
``batch_keys``) raises it without importing another check.

Examples:
    >>> try:
    ...     raise BridgeConfigurationError("MixUp needs ... Fix: ...")
    ... except ValueError as error:  # a ValueError, for code that catches those
    ...     print(type(error).__name__)
    BridgeConfigurationError
"""

from __future__ import annotations

__all__ = ["BridgeConfigurationError"]


class BridgeConfigurationError(ValueError):
    """The algorithms cannot run with this module, strategy or checkpoint; the message says how to fix it."""
