"""What the bridge writes into a Lightning checkpoint, and how it is read back safely.

The bridge's entry in ``checkpoint["callbacks"]`` holds only tensors and plain data (so
``torch.load(..., weights_only=True)`` accepts it)::

    {"format": "composer_bridge/1", "version": "0.1.0", "seed": 42,
     "timestamp": {...}, "algorithms": [{"class": "BlurPool", "hparams": {...},
     "required_on_load": True, "state": {...}}, ...], "callbacks": [{"class": ..., "state": ...}]}

Reading never evaluates anything from the file: an algorithm that must be re-created (a surgery
algorithm the new run lacks, when asked to add it back) is looked up by class name among the
library's algorithm classes and those the user names, and built with keyword arguments whose
names are checked against its ``__init__`` and whose values must be plain data.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.time import Time

__all__ = [
    "FORMAT",
    "CheckpointStateError",
    "algorithm_entry",
    "check_bridge_state",
    "known_algorithm_classes",
    "plain_hparams",
    "rebuild_algorithm",
]

FORMAT = "composer_bridge/1"
_PLAIN = (int, float, str, bool, type(None))


class CheckpointStateError(ValueError):
    """The bridge's state in a checkpoint is missing, from another version, corrupted, or does not fit the run."""


def _plain(value: Any) -> Any:
    """``value`` as plain data (Times become strings), or raise ``TypeError``."""
    if value is None or type(value) in _PLAIN:
        return value
    # Subclasses (str enums such as Event, IntEnum) become their plain base type: checkpoints must
    # unpickle with weights_only=True, which refuses unknown classes.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (int, float)):
        return int(value) if isinstance(value, int) else float(value)
    if isinstance(value, Time):
        return str(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    raise TypeError(type(value).__name__)


def plain_hparams(algorithm: Algorithm) -> dict[str, Any]:
    """The algorithm's hyper-parameters that are plain data (others are left out of the checkpoint)."""
    kept = {}
    for name, value in algorithm.hparams().items():
        try:
            kept[name] = _plain(value)
        except TypeError:
            continue
    return kept


def algorithm_entry(algorithm: Algorithm) -> dict[str, Any]:
    """One algorithm's record in the checkpoint."""
    try:
        state = algorithm.state_dict()
    except Exception as error:
        raise RuntimeError(
            f"{type(algorithm).__name__}.state_dict() failed while writing a checkpoint ({error}); "
            "no checkpoint was written."
        ) from error
    return {
        "class": type(algorithm).__name__,
        "hparams": plain_hparams(algorithm),
        "required_on_load": bool(type(algorithm).required_on_load()),
        "state": state,
    }


def check_bridge_state(state: Any, checkpoint_path: str | None = None) -> dict[str, Any]:
    """Validate the bridge's entry of a checkpoint and return it; raise :class:`CheckpointStateError` if unusable."""
    where = f" in {checkpoint_path}" if checkpoint_path else ""
    if not isinstance(state, Mapping):
        raise CheckpointStateError(
            f"The composer_bridge state{where} is a {type(state).__name__}, not a dict: the checkpoint is corrupted "
            "or was not written by AlgorithmEngineCallback. Resume from another checkpoint, or load only the "
            "weights (model.load_state_dict) and start a new run."
        )
    found = state.get("format")
    if found != FORMAT:
        raise CheckpointStateError(
            f"The composer_bridge state{where} has format {found!r}, but this version ({FORMAT}) reads only "
            f"{FORMAT!r}: it was written by another version of composer_bridge. Install the version that "
            "wrote it to resume, or load only the weights and start a new run."
        )
    problems = []
    if not isinstance(state.get("algorithms"), list) or not all(
        isinstance(a, Mapping) and isinstance(a.get("class"), str) and isinstance(a.get("hparams", {}), Mapping)
        and isinstance(a.get("state", {}), Mapping)
        for a in state.get("algorithms", [])
    ):
        problems.append("'algorithms' must be a list of {class, hparams, state} records")
    if not isinstance(state.get("callbacks", []), list):
        problems.append("'callbacks' must be a list")
    if not isinstance(state.get("timestamp"), Mapping):
        problems.append("'timestamp' must be a dict")
    if state.get("seed") is not None and not isinstance(state.get("seed"), int):
        problems.append("'seed' must be an int")
    if problems:
        raise CheckpointStateError(
            f"The composer_bridge state{where} is corrupted: {'; '.join(problems)}. "
            "Resume from an earlier checkpoint, or load only the weights and start a new run."
        )
    return dict(state)


def _all_subclasses(cls: type) -> Iterable[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def known_algorithm_classes(extra: Iterable[type] = ()) -> dict[str, type]:
    """The library's algorithm classes (from ``composer_bridge.algorithms``) plus ``extra``, by class name."""
    import composer_bridge.algorithms  # noqa: F401  (defines the library's classes)

    known = {
        sub.__name__: sub for sub in _all_subclasses(Algorithm)
        if sub.__module__.startswith("composer_bridge.algorithms") and not inspect.isabstract(sub)
    }
    for cls in extra:
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            raise TypeError(f"known_algorithms must hold Algorithm subclasses, got {cls!r}.")
        known[cls.__name__] = cls
    return known


def rebuild_algorithm(entry: Mapping[str, Any], known: Mapping[str, type]) -> Algorithm:
    """Build an algorithm from its checkpoint record, through ``known`` classes only; nothing is evaluated."""
    name = entry.get("class")
    cls = known.get(name) if isinstance(name, str) else None
    if cls is None:
        raise CheckpointStateError(
            f"The checkpoint needs algorithm {name!r}, which is not a composer_bridge algorithm nor one passed in "
            "known_algorithms=[...]; add it to the run's algorithms yourself."
        )
    hparams = entry.get("hparams", {})
    accepted = {
        p for p, spec in inspect.signature(cls.__init__).parameters.items()
        if p != "self" and spec.kind not in (spec.VAR_POSITIONAL, spec.VAR_KEYWORD)
    }
    for key, value in hparams.items():
        if key not in accepted:
            raise CheckpointStateError(
                f"The checkpoint's record of {name} has argument {key!r}, which {name}.__init__ does not take "
                f"(accepted: {sorted(accepted)}); refusing to build it. Add {name}(...) to the run yourself."
            )
        try:
            _plain(value)
        except TypeError:
            raise CheckpointStateError(
                f"The checkpoint's record of {name} has a non-plain value for {key!r}; refusing to build it."
            ) from None
    try:
        return cls(**hparams)
    except Exception as error:
        raise CheckpointStateError(
            f"Could not rebuild {name} from the checkpoint's arguments {dict(hparams)}: {error}. "
            f"Add {name}(...) to the run's algorithms yourself."
        ) from error


def tensors_to_cpu(value: Any) -> Any:
    """A copy of ``value`` with every tensor detached and on the CPU (checkpoints load anywhere)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: tensors_to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(tensors_to_cpu(v) for v in value)
    return value
