"""The :class:`Algorithm` base class: code that runs at chosen events and changes the :class:`State`.

Examples:
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
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from composer_bridge.core.event import Event
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["CAPABILITIES", "INPUT_KINDS", "Algorithm", "AlgorithmError", "check_algorithms", "check_owners", "check_unique", "declares", "declaring"]


#: The kinds of training input an algorithm may need (:attr:`Algorithm.needs`), each with what it
#: asks of the batch's input (the item at the algorithm's ``input_key``, by default the first).
INPUT_KINDS: dict[str, str] = {
    "floating input": "a floating-point input tensor of any shape (N, ...): features, signals or images",
    "image": "a floating-point image batch (N, C, H, W): two spatial dimensions",
    "sequence": "a batch item of at least two dimensions (N, L, ...): sequences of tokens or steps",
}


class Algorithm(ABC):
    """Base class for algorithms: ``match`` decides *when*, ``apply`` changes the state.

    Subclasses store each ``__init__`` argument under an attribute of the same name; that is
    what :meth:`hparams`, ``repr`` (which evaluates back to an equal algorithm) and ``==`` use.

    Capabilities: what an algorithm does or needs, declared as class attributes (a property
    where it depends on the hyper-parameters). The engine, its passes, ``plan()`` and the
    Lightning bridge's setup checks read these declarations, never the algorithm's class name,
    so an algorithm of yours takes part by setting them. All default to ``False``.
    """

    # --- how the engine runs it ------------------------------------------------------------
    #: Backward must build the graph (second-order methods); the bridge passes ``create_graph=True``.
    backwards_create_graph: bool = False
    #: Some parameters may get no gradient; the bridge tells DDP (``find_unused_parameters=True``).
    find_unused_parameters: bool = False
    #: Runs first at every event (the default passes sort by it: SelectiveBackprop ranks the clean examples).
    runs_first: bool = False
    #: Runs last at every event (the default passes sort by it: the low-precision norms).
    runs_last: bool = False
    #: Compiles the model (Compile): the default passes run it after every other algorithm, the
    #: ``runs_last`` ones included, so it compiles the model every surgery has left.
    compiles_model: bool = False
    #: At most one instance may be used in a run (the library's algorithms set it).
    unique: bool = False

    # --- what it changes (the known conflicts are found by these) ---------------------------
    #: Mixes the loss of two targets (MixUp, CutMix); several together compound their mixing,
    #: which the default passes and ``plan()`` warn about.
    interpolates_loss: bool = False
    #: Reads the logits and targets of the step's loss position by position and adds to the loss,
    #: replacing nothing (ZLoss): on a plain module it needs neither ``forward(inputs)`` nor the
    #: batch's own target tensor, so it acts on targets the step derives (Hugging Face's shifted labels).
    acts_per_position: bool = False
    #: Changes the training examples (inputs or targets) before the model sees them (MixUp,
    #: CutMix, CutOut, ColOut, RandAugment, ...); ``plan()`` warns when one runs before a
    #: ``runs_first`` algorithm.
    augments_data: bool = False
    #: Replaces the weights by an average (EMA, SWA): refused beside Lightning's own weight
    #: averaging callbacks; ``plan()`` warns when two such algorithms run together.
    averages_weights: bool = False
    #: Chooses the weights every checkpoint holds (ScheduleFree: its averaged ones): its
    #: :meth:`checkpoint_weights` is entered around each save, whoever writes it.
    chooses_checkpoint_weights: bool = False
    #: Clips the gradients (GradientClipping): refused beside ``Trainer(gradient_clip_val=...)``.
    clips_gradients: bool = False
    #: Changes ``requires_grad`` of the model's parameters (LayerFreezing): the setup checks warn
    #: beside Lightning's ``BaseFinetuning`` callbacks.
    freezes_layers: bool = False
    #: Converts the model's layers to another memory format at ``INIT`` (ChannelsLast): ``plan()``
    #: warns when a model-surgery algorithm runs after it (the layers it creates keep the default format).
    converts_memory_format: bool = False
    #: Leaves the model's weights non-contiguous (ChannelsLast): refused with FSDP2, which cannot shard them.
    non_contiguous_weights: bool = False
    #: Turns the targets into probabilities at ``BEFORE_LOSS`` (LabelSmoothing; MixUp and CutMix
    #: without loss interpolation): the bridge refuses a plain module's loss that cannot take them.
    replaces_targets: bool = False
    #: Combines each example with a partner from the batch (MixUp, CutMix), inputs and targets: a
    #: target position ignored in one example (``ignore_index``) is not ignored in its partner, so
    #: the bridge refuses such losses when it mixes the targets themselves.
    mixes_examples: bool = False

    #: Takes over the optimizer the user's ``configure_optimizers`` built (Muon, ScheduleFree): the
    #: bridge hands it the user's optimizers at ``FIT_START`` and trains with what it returns; two
    #: such algorithms in one run are refused at setup, naming both (:func:`check_owners`).
    owns_optimizer: bool = False
    #: Replaces (or removes) the user's learning-rate schedule (WarmupStableDecay; ScheduleFree,
    #: which trains without one): two such algorithms in one run are refused at setup, naming both.
    owns_schedule: bool = False

    # --- what it needs of the training inputs (the recipe search reads it) -------------------
    #: The kinds of input it works on, names from :data:`INPUT_KINDS` (empty: any input). MixUp
    #: mixes any floating input; CutMix cuts boxes out of two spatial dimensions, so it needs an
    #: image. The recipe search offers an algorithm only where its batches are of these kinds and
    #: refuses an explicit request otherwise; what it needs of the loss is ``needs_loss_events``.
    needs: frozenset[str] = frozenset()

    # --- what it needs from the training loop (refused at setup when missing) -----------------
    #: Acts between the forward pass and the loss (the BEFORE_FORWARD ... AFTER_LOSS events): a
    #: module with separate ``forward`` and ``loss``, or a plain ``training_step`` module whose loss
    #: call the bridge can see (it refuses one where it cannot).
    needs_loss_events: bool = False
    #: The run's length (``max_epochs`` or ``max_steps``), to place a schedule given as a fraction of the run.
    needs_run_length: bool = False
    #: The optimizer's closure, evaluated twice per step (SAM): automatic optimization, no fp16
    #: gradient scaler, no gradient accumulation.
    needs_optimizer_closure: bool = False

    def checkpoint_weights(self) -> AbstractContextManager[Any]:
        """The weights a checkpoint holds while it is written (read when ``chooses_checkpoint_weights``).

        By default the model's weights as they are; override it (a context manager that puts the
        weights to save in place and back after) together with ``chooses_checkpoint_weights = True``.
        """
        return nullcontext()

    @abstractmethod
    def match(self, event: Event, state: State) -> bool:
        """Whether to run at ``event`` given ``state``."""

    @abstractmethod
    def apply(self, event: Event, state: State, logger: Logger) -> int | None:
        """Change ``state`` in place; the return value is stored as the trace's exit code."""

    def finds_nothing_in(self, model: torch.nn.Module) -> str | None:
        """Why this algorithm would have nothing to act on in ``model`` (``None``: it would act).

        Read by the recipe search before it offers the algorithm (surgery algorithms are checked by
        running their surgery on a copy instead). Muon, for instance, needs a hidden ``nn.Linear``.
        """
        return None

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


#: The capabilities :class:`Algorithm` declares (its ``bool`` class attributes), in declaration order.
CAPABILITIES: tuple[str, ...] = tuple(
    name for name, annotation in Algorithm.__annotations__.items() if annotation in ("bool", bool)
)


def check_unique(algorithms: Sequence[Algorithm]) -> None:
    """Raise a clear error when an algorithm that declares ``unique`` appears twice."""
    seen: set[str] = set()
    for algorithm in algorithms:
        name = type(algorithm).__name__
        if declares(algorithm, "unique") and name in seen:
            raise ValueError(
                f"{name} appears more than once in algorithms; it must be unique in a run (two instances would "
                f"apply it twice). Keep one {name}(...) with the settings you want."
            )
        seen.add(name)


def check_owners(algorithms: Iterable[Any]) -> None:
    """Refuse two algorithms that both own the optimizer, or both the learning-rate schedule, naming both.

    Examples:
        >>> class Schedule(Algorithm):
        ...     owns_schedule = True
        ...     def match(self, event, state): return False
        ...     def apply(self, event, state, logger): pass
        >>> check_owners([Schedule()])
        >>> check_owners([Schedule(), Schedule()])
        Traceback (most recent call last):
        ...
        ValueError: Schedule and Schedule both replace the learning-rate schedule ...
    """
    algorithms = list(algorithms)
    for capability, what in (("owns_optimizer", "take over the optimizer"), ("owns_schedule", "replace the learning-rate schedule")):
        owners = [a for a in algorithms if getattr(a, capability, False)]
        if len(owners) > 1:
            first, second = (type(a).__name__ for a in owners[:2])
            raise ValueError(
                f"{first} and {second} both {what} of the run ({capability}); only one can. Keep one of them "
                f"(a schedule-free optimizer needs no schedule; Muon keeps your own scheduler)."
            )


def declares(algorithm: Any, capability: str) -> bool:
    """Whether ``algorithm`` declares ``capability`` (one of :data:`CAPABILITIES`); ``False`` for any other object.

    The one way a capability is read (with :func:`declaring` for a list), so a misspelt name is an error,
    not a silent ``False``.

    Examples:
        >>> from composer_bridge.algorithms import CutMix, LabelSmoothing
        >>> declares(CutMix(), "mixes_examples"), declares(LabelSmoothing(), "mixes_examples")
        (True, False)
    """
    if capability not in CAPABILITIES:
        raise ValueError(f"{capability!r} is not an Algorithm capability; the capabilities are {', '.join(CAPABILITIES)}.")
    return bool(getattr(algorithm, capability, False))


def declaring(algorithms: Iterable[Any], capability: str) -> list[Any]:
    """The algorithms among ``algorithms`` that declare ``capability`` (one of :data:`CAPABILITIES`).

    Examples:
        >>> from composer_bridge.algorithms import EMA, LabelSmoothing
        >>> [type(a).__name__ for a in declaring([EMA(), LabelSmoothing()], "averages_weights")]
        ['EMA']
    """
    if capability not in CAPABILITIES:
        raise ValueError(f"{capability!r} is not an Algorithm capability; the capabilities are {', '.join(CAPABILITIES)}.")
    return [algorithm for algorithm in algorithms if declares(algorithm, capability)]


class AlgorithmError(RuntimeError):
    """An algorithm raised inside ``apply``; names the algorithm and event, chains the original error."""

    def __init__(self, algorithm: Algorithm, event: Event, error: BaseException) -> None:
        self.algorithm = algorithm
        self.event = event
        self.error = error
        super().__init__(
            f"{type(algorithm).__name__} failed at Event.{event.name}: {type(error).__name__}: {error}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt from its three parts, so it crosses process boundaries (a search's Ray worker, a DDP
        # launcher) as itself; the default would call __init__ with the message alone and fail
        return (type(self), (self.algorithm, self.event, self.error))


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
