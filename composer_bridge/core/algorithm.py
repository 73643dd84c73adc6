"""The :class:`Algorithm` base class: code that runs at chosen events and changes the :class:`State`.

Example:
    >>> from composer_bridge.core.event import Event
    >>> class Halve(Algorithm):
    ...     def __init__(self, factor: float = 0.5):
    ...         self.factor = factor
    ...     def match(self, event, state):
    ...         return event == Event.AFTER_LOSS
    ...     def apply(self, event, state, logger):
    ...         state.loss = state.loss * self.factor
    >>> Halve(0.25)
    Halve(factor=0.25)
    >>> Halve(0.25) == eval(repr(Halve(0.25)))
    True
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from composer_bridge.core.event import Event
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["Algorithm", "AlgorithmError", "check_algorithms"]


class Algorithm(ABC):
    """Base class for algorithms: ``match`` decides *when*, ``apply`` changes the state.

    Subclasses store each ``__init__`` argument under an attribute of the same name; that is
    what :meth:`hparams`, ``repr`` (which evaluates back to an equal algorithm) and ``==`` use.

    Class attributes the engine and the bridge read:

    - ``backwards_create_graph``: backward must build the graph (second-order methods);
    - ``find_unused_parameters``: some parameters may get no gradient (DDP must be told);
    - ``interpolates_loss``: the algorithm mixes the loss of two targets (the default passes
      warn when several do);
    - ``runs_first`` / ``runs_last``: markers the default passes sort by (SelectiveBackprop
      runs first; the low-precision norms run last);
    - ``augments_data``: the algorithm changes the training examples (inputs or targets) before
      the model sees them (MixUp, CutMix, CutOut, ColOut, RandAugment, ...); ``plan()`` warns
      when one runs before a ``runs_first`` algorithm such as SelectiveBackprop;
    - ``needs_loss_events``: acts between the forward pass and the loss: a module with separate
      ``forward`` and ``loss``, or a plain ``training_step`` module whose loss call the bridge can
      see (it refuses one where it cannot); an algorithm that turns the targets into probabilities
      there also sets ``replaces_targets`` (LabelSmoothing, MixUp, CutMix), which the bridge reads
      to refuse losses that cannot take them;
    - ``unique``: at most one instance may be used in a run (the library's algorithms set it).
    """

    backwards_create_graph: bool = False
    find_unused_parameters: bool = False
    interpolates_loss: bool = False
    runs_first: bool = False
    runs_last: bool = False
    augments_data: bool = False
    needs_loss_events: bool = False
    unique: bool = False

    @abstractmethod
    def match(self, event: Event, state: State) -> bool:
        """Whether to run at ``event`` given ``state``."""

    @abstractmethod
    def apply(self, event: Event, state: State, logger: Logger) -> int | None:
        """Change ``state`` in place; the return value is stored as the trace's exit code."""

    @classmethod
    def required_on_load(cls) -> bool:
        """Whether a checkpoint written with this algorithm needs it when loaded (model surgery)."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """The algorithm's resumable state (tensors and plain data only). Empty by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if state:
            raise ValueError(
                f"{type(self).__name__} keeps no state but the checkpoint holds {sorted(state)} for it; "
                "was the checkpoint written by another version of this algorithm?"
            )

    def hparams(self) -> dict[str, Any]:
        """The ``__init__`` arguments, read back from the attributes of the same names."""
        values: dict[str, Any] = {}
        for name, param in inspect.signature(type(self).__init__).parameters.items():
            if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            if hasattr(self, name):
                values[name] = getattr(self, name)
            elif hasattr(self, "_" + name):
                values[name] = getattr(self, "_" + name)
        return values

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.hparams().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.hparams() == other.hparams()  # type: ignore[union-attr]

    def __hash__(self) -> int:
        return hash(type(self).__qualname__)

    @property
    def state_key(self) -> str:
        """Not a Lightning callback: reading ``state_key`` (as Lightning does for its callbacks) explains the fix."""
        name = type(self).__name__
        raise TypeError(
            f"{name} is a composer_bridge Algorithm, not a Lightning callback; wrap it: "
            f"Trainer(callbacks=[AlgorithmEngineCallback([{name}()])])."
        )


class AlgorithmError(RuntimeError):
    """An algorithm raised inside ``apply``; names the algorithm and event, chains the original error."""

    def __init__(self, algorithm: Algorithm, event: Event, error: BaseException) -> None:
        self.algorithm = algorithm
        self.event = event
        self.error = error
        super().__init__(
            f"{type(algorithm).__name__} failed at Event.{event.name}: {type(error).__name__}: {error}"
        )


def check_algorithms(algorithms: Sequence[Any]) -> list[Algorithm]:
    """Return ``algorithms`` as a list, raising a clear error for anything that is not an ``Algorithm``."""
    if isinstance(algorithms, Algorithm):
        return [algorithms]
    if not isinstance(algorithms, (list, tuple)):
        raise TypeError(
            f"algorithms must be a list of Algorithm instances, got {type(algorithms).__name__}: {algorithms!r}."
        )
    checked = list(algorithms)
    for i, algorithm in enumerate(checked):
        if isinstance(algorithm, type) and issubclass(algorithm, Algorithm):
            raise TypeError(
                f"algorithms[{i}] is the class {algorithm.__name__}, not an instance: write {algorithm.__name__}()."
            )
        if not isinstance(algorithm, Algorithm):
            raise TypeError(
                f"algorithms[{i}] = {algorithm!r} ({type(algorithm).__name__}) is not an Algorithm: "
                "algorithms must subclass composer_bridge.Algorithm and define match() and apply()."
            )
    return checked
