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
import logging
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.checkpoint_layout import FORMAT
from composer_bridge.core.time import Time

__all__ = [
    "FORMAT",
    "BridgeCheckpoint",
    "CheckpointStateError",
    "algorithm_entry",
    "check_bridge_state",
    "check_known_algorithms",
    "known_algorithm_classes",
    "plain_hparams",
    "rebuild_algorithm",
]

log = logging.getLogger(__name__)

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


def check_bridge_state(state: Any) -> dict[str, Any]:
    """Validate the bridge's entry of a checkpoint and return it; raise :class:`CheckpointStateError` if unusable."""
    if not isinstance(state, Mapping):
        raise CheckpointStateError(
            f"The composer_bridge state is a {type(state).__name__}, not a dict: the checkpoint is corrupted "
            "or was not written by AlgorithmEngineCallback. Resume from another checkpoint, or load only the "
            "weights (model.load_state_dict) and start a new run."
        )
    found = state.get("format")
    if found != FORMAT:
        raise CheckpointStateError(
            f"The composer_bridge state has format {found!r}, but this version ({FORMAT}) reads only "
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
            f"The composer_bridge state is corrupted: {'; '.join(problems)}. "
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


class BridgeCheckpoint:
    """The bridge's part of a Lightning checkpoint: write it, check a checkpoint fits the run, restore it.

    Args:
        add_missing_on_load: re-create surgery algorithms the checkpoint needs and the run lacks.
        known_algorithms: the user's own ``Algorithm`` classes that may be re-created.

    Examples:
        >>> import torch
        >>> from composer_bridge.core.state import State
        >>> from composer_bridge.algorithms import EMA
        >>> state = State(torch.nn.Linear(1, 1), algorithms=[EMA()], seed=3)
        >>> saved = BridgeCheckpoint().save(state, version="0")
        >>> saved["seed"], [entry["class"] for entry in saved["algorithms"]]
        (3, ['EMA'])
        >>> fresh = State(torch.nn.Linear(1, 1), algorithms=[EMA()])
        >>> BridgeCheckpoint().load(fresh, saved)
        >>> fresh.seed
        3
    """

    def __init__(self, add_missing_on_load: bool = False, known_algorithms: Sequence[type] = ()) -> None:
        self.add_missing_on_load = add_missing_on_load
        self.known_algorithms = tuple(known_algorithms)
        self._deferred: Any = None
        #: a checkpoint was restored while no engine ran (after teardown): AFTER_LOAD is due at the next setup
        self.after_load_due = False

    def defer(self, raw: Any) -> None:
        """Keep the bridge's entry of a checkpoint restored before the run exists, for :meth:`take_deferred`.

        Lightning may restore callback state before ``setup`` (its checkpoint connector's
        ``restore_callbacks`` ahead of ``validate``/``test``/``predict``); the entry is checked now
        and applied at setup, as Lightning's own callbacks keep theirs.
        """
        check_bridge_state(raw)
        self._deferred = raw

    def take_deferred(self) -> Any:
        """The entry kept by :meth:`defer` (``None`` if none), handed over once."""
        raw, self._deferred = self._deferred, None
        return raw

    @property
    def deferred(self) -> Any:
        """The entry kept by :meth:`defer` and not yet applied (``None`` if none)."""
        return self._deferred

    @staticmethod
    def warn_if_step_open(step_open: bool) -> None:
        """Warn that a checkpoint written while the bridge has not counted the finished step resumes one step behind."""
        if step_open:
            warnings.warn(
                "A checkpoint is being written in on_train_batch_end by a callback that Lightning calls before "
                "AlgorithmEngineCallback (it is listed before it in Trainer(callbacks=[...])): the bridge has not "
                "counted this optimizer step yet, so a run resumed from this checkpoint is one step behind in its "
                "timestamp and random draws. Fix: list AlgorithmEngineCallback before that callback, or save with "
                "ModelCheckpoint (Lightning always calls it last).",
                stacklevel=3,
            )

    def save(self, state: Any, version: str) -> dict[str, Any]:
        """The bridge's checkpoint entry for ``state``: tensors and plain data only."""
        return {
            "format": FORMAT,
            "version": version,
            "seed": int(state.seed) if state.seed is not None else None,
            "timestamp": state.timestamp.state_dict(),
            "algorithms": [algorithm_entry(a) for a in state.algorithms],
            "callbacks": [{"class": type(c).__name__, "state": c.state_dict()} for c in state.callbacks],
        }

    def load(self, state: Any, raw: Any) -> None:
        """Restore the timestamp, the seed (when the checkpoint has one) and every algorithm's and callback's state.

        Entries are matched to this run's algorithms by class, in order; an algorithm with no entry
        starts fresh.
        """
        saved = check_bridge_state(raw)
        state.timestamp.load_state_dict(saved["timestamp"])
        if saved.get("seed") is not None:
            state.seed = saved["seed"]
        entries = list(saved["algorithms"])
        for algorithm in state.algorithms:
            index = next((i for i, e in enumerate(entries) if e["class"] == type(algorithm).__name__), None)
            if index is None:
                log.info("%s is new in this run: it starts fresh (no state for it in the checkpoint).", type(algorithm).__name__)
                continue
            entry = entries.pop(index)
            try:
                algorithm.load_state_dict(dict(entry.get("state", {})))
            except Exception as error:
                raise CheckpointStateError(
                    f"Could not restore {type(algorithm).__name__} from the checkpoint: {error}. "
                    "Was the checkpoint written with different hyper-parameters for it?"
                ) from error
        callback_entries = list(saved.get("callbacks", []))
        for callback in state.callbacks:
            index = next((i for i, e in enumerate(callback_entries) if e.get("class") == type(callback).__name__), None)
            if index is not None:
                callback.load_state_dict(dict(callback_entries.pop(index).get("state", {})))

    def check_fits(self, state: Any, raw: Any, has_weights: bool, late_restore: bool) -> list[Algorithm]:
        """Before the weights load: refuse a checkpoint that needs surgery this run lacks, or re-create it.

        Args:
            state: the run's state.
            raw: the bridge's entry of the checkpoint (``None`` if it has none).
            has_weights: whether the checkpoint holds model weights.
            late_restore: the strategy restores checkpoints after wrapping the model (too late for surgery).

        Returns:
            The algorithms re-created (``add_missing_on_load=True``); the caller adds them to the run.
        """
        surgery_here = [type(a).__name__ for a in state.algorithms if type(a).required_on_load()]
        if raw is None:
            if surgery_here and has_weights:
                warnings.warn(
                    "This checkpoint holds no composer_bridge state (it was written without AlgorithmEngineCallback); "
                    f"its weights were saved without the model surgery of {', '.join(surgery_here)}, so they may "
                    "not fit this run's modified model.",
                    stacklevel=3,
                )
            return []
        saved = check_bridge_state(raw)
        present = [type(a).__name__ for a in state.algorithms]
        missing = []
        for entry in (e for e in saved["algorithms"] if e.get("required_on_load")):
            if entry["class"] in present:
                present.remove(entry["class"])
            else:
                missing.append(entry)
        if not missing:
            return []
        if not self.add_missing_on_load:
            names = ", ".join(_call_text(e) for e in missing)
            raise CheckpointStateError(
                f"The checkpoint was written with model-surgery algorithms this run lacks: {names}. Its weights "
                "belong to the modified model and cannot load into this one. Fix: add them to "
                "AlgorithmEngineCallback(algorithms=[...]), or pass add_missing_on_load=True to re-create them."
            )
        if late_restore:
            raise CheckpointStateError(
                f"The checkpoint needs {', '.join(e['class'] for e in missing)}, and this strategy restores "
                "checkpoints after the model is wrapped and the optimizers exist, too late to re-create model "
                "surgery. Add them to AlgorithmEngineCallback(algorithms=[...]) instead of add_missing_on_load."
            )
        known = known_algorithm_classes(self.known_algorithms)
        rebuilt = []
        for entry in missing:
            algorithm = rebuild_algorithm(entry, known)
            warnings.warn(f"Re-created {algorithm!r} from the checkpoint (add_missing_on_load=True).", stacklevel=3)
            rebuilt.append(algorithm)
        return rebuilt


def _call_text(entry: Mapping[str, Any]) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in entry.get("hparams", {}).items())
    return f"{entry['class']}({args})"


def check_known_algorithms(known_algorithms: Any) -> tuple[type, ...]:
    """``known_algorithms`` as a tuple of ``Algorithm`` subclasses; a clear error for anything else."""
    if isinstance(known_algorithms, (str, bytes)) or not isinstance(known_algorithms, Iterable):
        raise TypeError(
            f"known_algorithms={known_algorithms!r}: expected a list of Algorithm classes, e.g. "
            "known_algorithms=[MyAlgorithm] (the classes themselves, not their names)."
        )
    items = tuple(known_algorithms)
    for i, cls in enumerate(items):
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            hint = f" (pass the class {type(cls).__name__}, not an instance)" if isinstance(cls, Algorithm) else ""
            raise TypeError(
                f"known_algorithms[{i}] = {cls!r} is not an Algorithm subclass{hint}; expected a list of Algorithm "
                "classes, e.g. known_algorithms=[MyAlgorithm]."
            )
    return items

