"""Schedule-free training (Defazio et al. 2024): the authors' ``schedulefree`` optimizers, in the right mode at every moment.

A schedule-free optimizer keeps two points: it takes gradients at ``y`` (train mode) and evaluates
at the average ``x`` (eval mode); ``optimizer.train()``/``optimizer.eval()`` move the model's weights
between them. :class:`ScheduleFree` makes those calls where Lightning has no place for them.

Examples:
    >>> import torch
    >>> is_schedule_free(torch.optim.AdamW(torch.nn.Linear(2, 1).parameters()))
    False
    >>> ScheduleFree(replace=True)  # builds schedulefree.AdamWScheduleFree in place of the user's AdamW
    ScheduleFree(replace=True, warmup_steps=0, batchnorm_batches=8, input_key=0)
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from composer_bridge.core.algorithm import Algorithm, check_owners, declaring
from composer_bridge.core.batch import BatchKey, get_batch_item
from composer_bridge.core.event import Event
from composer_bridge.core.logger import Logger
from composer_bridge.core.state import State

__all__ = ["ScheduleFree", "is_schedule_free", "schedule_free_counterpart", "switches_modes"]

_INSTALL = "pip install 'composer_bridge[schedulefree]' (or pip install schedulefree)"


def _package() -> Any:
    try:
        return importlib.import_module("schedulefree")
    except ImportError:
        raise ImportError(f"ScheduleFree needs the authors' schedulefree package, which is not installed: {_INSTALL}.") from None


def is_schedule_free(optimizer: Any) -> bool:
    """Whether ``optimizer`` comes from the ``schedulefree`` package (any of its optimizers or wrappers)."""
    return type(optimizer).__module__.split(".")[0] == "schedulefree"


def switches_modes(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a schedule-free optimizer with ``train()``/``eval()`` modes (the closure forms have none)."""
    return is_schedule_free(optimizer) and callable(getattr(optimizer, "train", None)) and callable(
        getattr(optimizer, "eval", None))


def schedule_free_counterpart(optimizer: torch.optim.Optimizer, warmup_steps: int = 0) -> torch.optim.Optimizer:
    """The schedule-free optimizer that replaces ``optimizer`` (``AdamW`` or ``SGD``), same parameters and hyper-parameters.

    Each parameter group keeps its ``lr`` (the one it was built with, before any scheduler scaled it) and ``weight_decay``; AdamW's ``betas`` and ``eps``, SGD's
    ``momentum`` (which must be > 0: schedule-free SGD interpolates with it) carry over. Options with
    no schedule-free counterpart (``amsgrad``, ``maximize``, SGD's ``nesterov``/``dampening``) are refused.
    Call it before ``optimizer`` has stepped (its state does not carry over).
    """
    package = _package()
    name = type(optimizer).__name__
    if optimizer.state:
        raise ValueError(f"schedule_free_counterpart needs an optimizer that has not stepped yet; this {name} has state.")
    groups: list[dict[str, Any]] = []
    if isinstance(optimizer, torch.optim.AdamW):
        keys, factory = ("lr", "betas", "eps", "weight_decay"), package.AdamWScheduleFree
        unsupported = ("amsgrad", "maximize")
    elif isinstance(optimizer, torch.optim.SGD) and not isinstance(optimizer, torch.optim.AdamW):
        keys, factory = ("lr", "momentum", "weight_decay"), package.SGDScheduleFree
        unsupported = ("nesterov", "maximize", "dampening")
    else:
        raise ValueError(
            f"ScheduleFree(replace=True) builds the schedule-free counterpart of torch.optim.AdamW or SGD; this is {name}. "
            "Return a schedulefree optimizer from configure_optimizers (e.g. schedulefree.AdamWScheduleFree) and use "
            "ScheduleFree() without replace."
        )
    for group in optimizer.param_groups:
        used = [k for k in unsupported if group.get(k)]
        if used:
            raise ValueError(f"ScheduleFree(replace=True): {name}({used[0]}={group[used[0]]!r}) has no schedule-free "
                             "counterpart; remove it, or build a schedulefree optimizer yourself.")
        if "momentum" in keys and not 0 < group["momentum"] < 1:
            raise ValueError(f"ScheduleFree(replace=True): SGD(momentum={group['momentum']!r}); schedule-free SGD needs a "
                             "momentum in (0, 1) (its interpolation weight), e.g. momentum=0.9.")
        # the learning rate the user built the optimizer with: a scheduler has already scaled ``lr`` for
        # its first step (a warm-up's tiny factor) and keeps the built one as ``initial_lr``
        built = {**{k: group[k] for k in keys}, "lr": group.get("initial_lr", group["lr"])}
        groups.append({"params": list(group["params"]), **built})
    return factory(groups, warmup_steps=warmup_steps)


class ScheduleFree(Algorithm):
    """Put the run's schedule-free optimizers in train mode to train and in eval mode to evaluate and save.

    For a ``configure_optimizers`` that returns a ``schedulefree`` optimizer (e.g.
    ``AdamWScheduleFree``): train mode before every training step (``BATCH_START``; the user writes no
    ``optimizer.train()``), eval mode for validation, test and prediction (``EVAL_START``,
    ``PREDICT_START``), around every checkpoint Lightning writes, and at the end of fit; so metrics,
    ``ModelCheckpoint``'s monitor, the saved weights and the model after ``fit`` are the averaged
    weights ``x``. Train mode returns at the next training step. Checkpoints are written in eval mode
    with the optimizer state that goes with it, so a resumed run continues exactly.

    BatchNorm: the running statistics are gathered at ``y`` during training. As the authors recommend,
    whenever the weights go to ``x`` during ``fit`` (validation, a checkpoint, the end of fit) the
    statistics are recomputed there, a plain average over the last ``batchnorm_batches`` training
    batches, in train mode, without gradients: a ``ComposerModule``'s ``forward(batch)``, or a plain
    module's ``forward`` on the input found in the batch (``input_key``, item 0 of a tuple batch by
    default; a module's ``batch_keys`` names it for dict batches). A plain module with BatchNorm is
    refused where no input can be found (its first training batch holds no tensor at ``input_key``) or
    it defines no ``forward``; ``batchnorm_batches=0`` leaves the statistics as trained. Those batches
    are kept in memory and in checkpoints (for the exact resumption of the statistics).

    Exactness: the optimizer's ``train()`` recomputes ``y`` from ``x`` with a rounding error, so the
    training weights ``y`` are kept (one copy of the weights, like EMA's, in checkpoints while the model
    holds ``x``) and put back exactly: evaluations and checkpoints do not change training, and a resumed
    run matches the uninterrupted one.

    With ``replace=True`` the user's ``torch.optim.AdamW`` or ``SGD`` is replaced by its schedule-free
    counterpart (:func:`schedule_free_counterpart`, same hyper-parameters, ``warmup_steps``) and their
    LR schedulers are dropped, with a warning naming them. Without it, a non-schedule-free optimizer
    or an LR scheduler is refused at fit start. Refused beside another algorithm that owns the
    optimizer or schedule (Muon, WarmupStableDecay), beside EMA/SWA (both would swap weights for
    evaluation, and the schedule-free average already is one), and beside SAM.

    Args:
        replace: build the schedule-free counterpart of the user's AdamW/SGD. Default ``False``.
        warmup_steps: the counterpart's ``warmup_steps`` (``replace=True`` only). Default ``0``.
        batchnorm_batches: training batches to recompute BatchNorm statistics at ``x`` before each
            validation. Default ``8``.
        input_key: where a plain module's input is in the batch (index, dict key or ``(getter, setter)``),
            for the BatchNorm statistics. Default ``0``; a module's ``batch_keys`` sets it.

    Examples:
        >>> ScheduleFree(replace=True, warmup_steps=100)
        ScheduleFree(replace=True, warmup_steps=100, batchnorm_batches=8, input_key=0)
    """

    unique = True
    owns_optimizer = True
    owns_schedule = True
    chooses_checkpoint_weights = True

    def __init__(self, replace: bool = False, warmup_steps: int = 0, batchnorm_batches: int = 8,
                 input_key: BatchKey = 0) -> None:
        if not isinstance(replace, bool):
            raise ValueError(f"ScheduleFree(replace={replace!r}): must be True or False.")
        for name, value in (("warmup_steps", warmup_steps), ("batchnorm_batches", batchnorm_batches)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"ScheduleFree({name}={value!r}): must be an int >= 0.")
        if warmup_steps and not replace:
            raise ValueError("ScheduleFree(warmup_steps=...) is for replace=True; give your schedulefree optimizer "
                             "its own warmup_steps.")
        self.replace = replace
        self.warmup_steps = warmup_steps
        self.batchnorm_batches = batchnorm_batches
        self.input_key = input_key
        self._optimizers: list[Any] = []
        self._recent: list[Any] = []  # the last training batches, for the BatchNorm statistics
        self._state: State | None = None
        self._has_batchnorm = False
        self._recomputed = False  # x's BatchNorm statistics are in the model (until the next train())
        self._y: list[torch.Tensor] | None = None  # the training weights, kept while the model holds x
        self._loaded_y: list[torch.Tensor] | None = None
        self._loaded_recent: list[Any] = []

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.INIT, Event.FIT_START, Event.BATCH_START, Event.AFTER_DATALOADER, Event.EVAL_START,
                         Event.PREDICT_START, Event.FIT_END)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.INIT:
            self._check_company(state)
        elif event == Event.FIT_START:
            self._take_over(state)
        elif event == Event.BATCH_START:
            self.train()
        elif event == Event.AFTER_DATALOADER:
            self._remember(state)
        else:  # EVAL_START, PREDICT_START, FIT_END
            self.eval(state if event != Event.EVAL_START or not state.sanity_checking else None)

    # --- modes -------------------------------------------------------------------------------
    def train(self) -> None:
        """Train mode: the weights back at ``y``, exactly the ``y`` that was left (see :meth:`eval`)."""
        for optimizer in self._optimizers:
            optimizer.train()
        if self._y is not None:
            with torch.no_grad():
                for param, kept in zip(self._params(), self._y, strict=True):
                    param.copy_(kept)
            self._y = None
        self._recomputed = False

    def eval(self, state: State | None = None) -> None:
        """Eval mode (weights at the average ``x``); with ``state``, BatchNorm statistics recomputed there.

        ``y`` is kept (a copy of the weights, saved in checkpoints while it is held): the optimizer's
        own ``train()`` recomputes ``y`` from ``x`` with a rounding error, so without the copy every
        evaluation or checkpoint would nudge training, and a resumed run would not match.
        """
        if self._y is None and self.training_mode():
            self._y = [param.detach().clone() for param in self._params()]
        for optimizer in self._optimizers:
            optimizer.eval()
        if state is not None and not self._recomputed and self._recent:
            self._recompute_batchnorm(state)
            self._recomputed = True

    def _params(self) -> list[torch.Tensor]:
        return [p for optimizer in self._optimizers for group in optimizer.param_groups for p in group["params"]]

    def state_dict(self) -> dict[str, Any]:
        # y while the model holds x (as in every checkpoint), and the batches x's BatchNorm statistics come from
        state: dict[str, Any] = {}
        if self._y is not None:
            state["y"] = [t.detach().clone() for t in self._y]
        if self._recent:
            state["recent"] = list(self._recent)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) - {"y", "recent"}:
            raise ValueError(f"ScheduleFree state has keys {sorted(state)}; expected at most ['recent', 'y'].")
        self._loaded_y = state.get("y")
        self._loaded_recent = list(state.get("recent", []))

    def training_mode(self) -> bool | None:
        """Whether the optimizers are in train mode (``None`` before fit)."""
        if not self._optimizers:
            return None
        group = self._optimizers[0].param_groups[0]
        return bool(group["train_mode"]) if "train_mode" in group else bool(self._optimizers[0].train_mode)

    @contextmanager
    def checkpoint_weights(self) -> Iterator[None]:
        """Eval mode while a checkpoint is written (the bridge enters it around every save), then the mode before."""
        training = self.training_mode()
        self.eval(self._state)
        try:
            yield
        finally:
            if training:
                self.train()

    # --- set-up ------------------------------------------------------------------------------
    def _check_company(self, state: State) -> None:
        _package()
        check_owners(state.algorithms)
        for capability, why in (
            ("averages_weights", "both swap the model's weights for evaluation, and the schedule-free average x already "
                                 "is the averaged model"),
            ("needs_optimizer_closure", "it wraps the optimizer and evaluates its closure twice, which the schedule-free "
                                        "optimizer's train/eval switching does not follow"),
        ):
            others = declaring(state.algorithms, capability)
            if others:
                name = type(others[0]).__name__
                raise ValueError(f"ScheduleFree and {name} cannot run together: {why}. Remove {name}.")

    def _take_over(self, state: State) -> None:
        self._recent, self._loaded_recent = self._loaded_recent, []  # restored from a checkpoint, or none
        self._recomputed = False
        self._y, self._loaded_y = self._loaded_y, None  # restored from a checkpoint: the y training goes on from
        if self.replace:
            dropped = [type(s).__name__ for s in state.schedulers]
            state.optimizers = [schedule_free_counterpart(o, self.warmup_steps) for o in state.optimizers]
            state.schedulers = []
            warnings.warn(
                f"ScheduleFree(replace=True) trains with {', '.join(type(o).__name__ for o in state.optimizers)} in place "
                "of the optimizer configure_optimizers returned"
                + (f", and drops its LR scheduler(s) ({', '.join(dropped)})" if dropped else "") + ".",
                stacklevel=2,
            )
        plain = [type(o).__name__ for o in state.optimizers if not is_schedule_free(o)]
        if plain:
            raise ValueError(
                f"ScheduleFree needs a schedule-free optimizer; configure_optimizers returned {', '.join(plain)}. Return "
                "one from the schedulefree package (e.g. schedulefree.AdamWScheduleFree(self.parameters(), lr=...)), or "
                "use ScheduleFree(replace=True) to build the counterpart of your AdamW or SGD."
            )
        if state.schedulers:
            schedulers = ", ".join(type(s).__name__ for s in state.schedulers)
            raise ValueError(
                f"ScheduleFree: configure_optimizers returns an LR scheduler ({schedulers}) with a schedule-free "
                "optimizer, which needs none. Remove the scheduler (warm up with "
                "the optimizer's warmup_steps), or use ScheduleFree(replace=True), which drops it."
            )
        self._optimizers = [o for o in state.optimizers if switches_modes(o)]
        self._state = state
        self._has_batchnorm = bool(_batchnorms(state.model))
        if self._needs_input(state) and not _defines_forward(state.model):
            raise ValueError(
                f"ScheduleFree recomputes BatchNorm statistics at the averaged weights (as the schedulefree authors "
                f"recommend) by running {type(state.model).__name__}'s forward on recent training inputs, and "
                f"{type(state.model).__name__} defines no forward. Define forward(x) (what training_step calls as "
                "self(x)), or use ScheduleFree(batchnorm_batches=0) to keep the statistics gathered in training."
            )

    def _needs_input(self, state: State) -> bool:
        """A plain module (not ``forward(batch)``) whose BatchNorm statistics will be recomputed."""
        return bool(self._has_batchnorm and self.batchnorm_batches and not callable(getattr(state.model, "loss", None)))

    # --- BatchNorm statistics at x -----------------------------------------------------------
    def _remember(self, state: State) -> None:
        if self.batchnorm_batches and self._has_batchnorm and state.batch is not None and not state.evaluating:
            if self._needs_input(state) and not self._recent:
                self._check_input(state.batch)
            self._recent = [*self._recent, state.batch][-self.batchnorm_batches:]

    def _check_input(self, batch: Any) -> None:
        try:
            found = get_batch_item(batch, self.input_key)
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError):
            found = None
        if not isinstance(found, torch.Tensor):
            kind = type(batch).__name__ + (f" with keys {sorted(batch)}" if isinstance(batch, dict) else "")
            raise ValueError(
                f"ScheduleFree recomputes BatchNorm statistics at the averaged weights by running the model's forward on "
                f"recent training inputs, but found no input tensor at input_key={self.input_key!r} in the batch (a "
                f"{kind}). Declare where it is on your module: batch_keys = {{'input_key': ...}} (or pass "
                "ScheduleFree(input_key=...)), or use ScheduleFree(batchnorm_batches=0) to keep the statistics "
                "gathered in training."
            )

    def _recompute_batchnorm(self, state: State) -> None:
        """x's statistics in the model: a plain average over the recent training batches (training then goes on from them)."""
        norms = _batchnorms(state.model)
        was_training = state.model.training
        momenta = [m.momentum for m in norms]
        try:
            for module in norms:
                module.reset_running_stats()
                module.momentum = None
            state.model.train()
            plain = self._needs_input(state)
            with torch.no_grad():
                for batch in self._recent:
                    batch = _on(batch, state.device)
                    state.model(get_batch_item(batch, self.input_key) if plain else batch)
        finally:
            for module, momentum in zip(norms, momenta, strict=True):
                module.momentum = momentum
            state.model.train(was_training)


def _defines_forward(model: torch.nn.Module) -> bool:
    """Does the module's class (below Lightning's and torch's base classes) define ``forward``?"""
    for cls in type(model).__mro__:
        if cls.__name__ in ("LightningModule", "Module") or cls.__module__.startswith(("lightning.", "pytorch_lightning.")):
            return False
        if "forward" in cls.__dict__:
            return True
    return False


def _batchnorms(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats]


def _on(batch: Any, device: Any) -> Any:
    """``batch`` (tensors in tuples, lists and dicts) on ``device`` (a checkpoint's batches are loaded on the CPU)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device) if device is not None else batch
    if isinstance(batch, (list, tuple)):
        return type(batch)(_on(item, device) for item in batch)
    if isinstance(batch, dict):
        return {key: _on(value, device) for key, value in batch.items()}
    return batch
