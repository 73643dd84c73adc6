"""Batch keys a module declares, given to the algorithms that were left on their default keys.

The algorithms that read parts of the batch (``LabelSmoothing``, ``MixUp``, ``CutMix``,
``SelectiveBackprop``, ...) default to tuple batches: ``input_key=0``, ``target_key=1``. A module
whose batches are dicts says where its inputs and targets are with a class attribute::

    class MyModule(L.LightningModule):
        batch_keys = {"input_key": "pixel_values", "target_key": "labels"}

``composer_bridge.hf.HuggingFaceModel`` declares ``{"input_key": "input_ids", "target_key": "labels"}``.
At setup, every algorithm whose ``input_key``/``target_key`` is still its default gets the
declared key (its ``repr`` shows it); a key passed explicitly, even the default's value on a module
that declares another, is replaced too, since a dict batch has no item ``0`` or ``1``. Pass a
(getter, setter) pair to keep a key of your own.

Examples:
    >>> from composer_bridge.algorithms import LabelSmoothing
    >>> class Module:
    ...     batch_keys = {"input_key": "input_ids", "target_key": "labels"}
    >>> algorithms = [LabelSmoothing(0.1), LabelSmoothing(0.1, target_key="y")]
    >>> give_declared_keys(algorithms, Module())
    >>> [a.target_key for a in algorithms]
    ['labels', 'y']
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from composer_bridge.core.algorithm import Algorithm
from composer_bridge.lightning.errors import BridgeConfigurationError

__all__ = ["KEY_ARGUMENTS", "give_declared_keys"]

#: the algorithm arguments a module's ``batch_keys`` may name
KEY_ARGUMENTS = ("input_key", "target_key")


def _defaults(algorithm: Algorithm) -> dict[str, Any]:
    try:
        parameters = inspect.signature(type(algorithm).__init__).parameters
    except (TypeError, ValueError):
        return {}
    return {name: p.default for name, p in parameters.items() if p.default is not p.empty}


def give_declared_keys(algorithms: Sequence[Algorithm], module: torch.nn.Module) -> None:
    """Set each algorithm's default ``input_key``/``target_key`` to the one ``module.batch_keys`` declares."""
    declared = getattr(module, "batch_keys", None)
    if declared is None:
        return
    if not isinstance(declared, Mapping) or not set(declared) <= set(KEY_ARGUMENTS):
        raise BridgeConfigurationError(
            f"{type(module).__name__}.batch_keys = {declared!r}: expected a dict with the keys {KEY_ARGUMENTS} "
            "(where the inputs and the targets are in the batch), e.g. {'input_key': 'input_ids', 'target_key': "
            "'labels'}."
        )
    for algorithm in algorithms:
        defaults = _defaults(algorithm)
        for argument, key in declared.items():
            if argument in defaults and getattr(algorithm, argument, None) == defaults[argument]:
                setattr(algorithm, argument, key)
