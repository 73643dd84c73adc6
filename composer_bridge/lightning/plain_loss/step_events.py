"""The per-step interception: a plain module's ``training_step`` wrapped so that the loss events fire inside it.

:class:`PlainLossStep` replaces ``training_step`` on the module instance for the run. In each step
it fires ``BEFORE_FORWARD`` on the batch, runs the user's step while
:func:`~composer_bridge.lightning.plain_loss.torch_functions.intercept` routes torch's loss calls
to it, and for each call

1. classifies it (:meth:`PlainLossStep._classify`): the batch's own targets, a flattened view of
   them, class indices derived inside the step, or another call that passes through unchanged;
2. for the step's loss, fires the loss events (:meth:`PlainLossStep._fire_loss_events`):
   ``AFTER_FORWARD`` on the call's input, ``BEFORE_LOSS`` on a copy of the batch, the call
   recomputed on the algorithms' targets (:class:`~composer_bridge.lightning.plain_loss.seen_call.LossCall`),
   ``AFTER_LOSS``;

then ``BEFORE_BACKWARD`` on the loss the step returned. What only a step can show (no loss call on
the batch's targets, a second loss, ``nll_loss`` on values that are not log-probabilities) is
refused there, before any backward pass. The object is also the state's
:class:`~composer_bridge.core.loss_source.LossSource` (SelectiveBackprop ranks examples with it)
and records the loss it saw for checkpoints (:data:`CHECKPOINT_KEY`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from composer_bridge.core.batch import get_batch_item, set_batch_item
from composer_bridge.core.loss_source import LossNotSeenYet
from composer_bridge.lightning.errors import BridgeConfigurationError
from composer_bridge.lightning.hook_map import HOOK_EVENTS
from composer_bridge.lightning.plain_loss import torch_functions
from composer_bridge.lightning.plain_loss.seen_call import (
    LossCall,
    call_options,
    class_indices_for,
    same_tensor,
    shares_storage,
)
from composer_bridge.lightning.plain_loss.setup_refusals import (
    common_key,
    loss_algorithms,
    names_of,
)
from composer_bridge.lightning.plain_loss.step_diagnostics import (
    check_batch,
    log_softmax_of_forward,
    nothing_seen,
)
from composer_bridge.lightning.plain_loss.target_rules import TargetRules

if TYPE_CHECKING:
    from composer_bridge.lightning.steps import ModuleSteps

__all__ = ["CHECKPOINT_KEY", "PlainLossStep"]

#: where a checkpoint keeps the loss a plain module's training_step was seen to compute
CHECKPOINT_KEY = "composer_bridge/plain_loss"

BEFORE_FORWARD, AFTER_FORWARD, BEFORE_LOSS, AFTER_LOSS, BEFORE_BACKWARD = HOOK_EVENTS["training_step[loss]"]


@dataclass
class _Step:
    """What one training step showed."""

    target: Any
    input: Any
    calls: int = 0
    logits: Any = None
    result: Any = None
    targets: Any = None
    forward_output: Any = None
    others: list[str] = field(default_factory=list)
    kept: Any = None  # the positions the loss keeps (not ignore_index) when the algorithms replaced the targets


@dataclass(frozen=True)
class _SeenCall:
    """A loss call on the step's targets, as the bridge will compute it (see :meth:`PlainLossStep._classify`)."""

    kind: str
    function: Callable[..., Any]
    input: Any  # the call's input; for flattened targets, laid out as (B, C, T)
    target: Any
    options: dict[str, Any]
    classes_last: bool = False  # flattened (B, T) targets: computed as a classifier's (B, C, T) logits
    derived: bool = False  # class indices derived inside the step, not the batch's own tensor


class _LossNotSeen(BridgeConfigurationError, LossNotSeenYet):
    """The loss was asked for before a step showed it (SelectiveBackprop then leaves that step whole)."""


class PlainLossStep:
    """Fire the loss events inside a plain module's ``training_step``; the :class:`LossSource` it was seen to use.

    ``run`` is the run in progress, through its module-facing step API
    (:class:`~composer_bridge.lightning.steps.ModuleSteps`: its ``state`` and ``fire_event``);
    ``training_step`` the module's own step. :meth:`step` replaces it on the
    instance (see :class:`~composer_bridge.lightning.module_hooks.ModuleHooks`), and the object
    is ``state.loss_source`` until :meth:`close`.

    Examples:
        >>> import torch
        >>> from composer_bridge.core.state import State
        >>> from composer_bridge.algorithms import LabelSmoothing
        >>> from composer_bridge.core import Engine
        >>> from composer_bridge.lightning.steps import ModuleSteps
        >>> state = State(torch.nn.Linear(2, 2), algorithms=[LabelSmoothing(0.5)])
        >>> run = ModuleSteps()
        >>> run.connect(state, Engine(state).fire)  # the smallest run: a state and an engine to fire into
        >>> def training_step(batch, batch_idx):
        ...     x, y = batch
        ...     return torch.nn.functional.cross_entropy(torch.zeros(2, 2), y)
        >>> plain = PlainLossStep(torch.nn.Linear(2, 2), run, training_step)
        >>> plain.step((torch.zeros(2, 2), torch.tensor([0, 1])), 0)  # log(2) whatever the smoothing
        tensor(0.6931)
        >>> run.state.loss_source is plain
        True
        >>> plain.close()
    """

    def __init__(self, module: torch.nn.Module, run: ModuleSteps, training_step: Callable[..., Any]) -> None:
        self.module = module
        self._run = run
        self._training_step = training_step
        state = run.live_state()  # built at setup, before the module's hooks
        needy = loss_algorithms(state.algorithms)
        self.target_key = common_key(needy, "target_key", 1)
        self.input_key = common_key(needy, "input_key", None)  # None: no algorithm reads the inputs
        self.rules = TargetRules(needy, type(module).__name__)
        self._call: LossCall | None = None
        self._several_calls = False
        self._forward_used = False  # SelectiveBackprop ran module(inputs): check that training_step does the same
        self._forward_checked = False
        self._step: _Step | None = None
        self._batch_checked = False
        self._source_used_in_step = False
        self._state = state
        state.loss_source = self

    def close(self) -> None:
        """Stop being the state's loss source."""
        if self._state.loss_source is self:
            self._state.loss_source = None

    # --- LossSource ---------------------------------------------------------------------------
    def forward(self, inputs: Any) -> Any:
        """``module(inputs)``; the next step checks that its training_step computes its logits this way."""
        self._forward_used = True
        try:
            outputs = self.module(inputs)
        except Exception as error:
            raise BridgeConfigurationError(
                f"{names_of(self.rules.needy)} runs {type(self.module).__name__}'s forward on the batch's inputs alone "
                f"(module(batch[{self.input_key!r}])) to rank the examples, and it failed ({type(error).__name__}: "
                f"{error}). Fix: make forward(inputs) return the logits training_step gives its loss, or subclass "
                "composer_bridge.ComposerModule (forward(batch) and loss(outputs, batch))."
            ) from error
        call = self._call
        if call is None or not isinstance(outputs, torch.Tensor):
            return outputs
        if call.classes_last and outputs.ndim > 2:
            outputs = outputs.movedim(-1, 1)  # (B, T, C) as the loss call saw them: (B, C, T)
        if call.kind == "nll_loss":  # the step's nll_loss reads log_softmax(self(x)); of log-probabilities, the same
            outputs = torch.log_softmax(outputs, dim=1)
        return outputs

    def loss(self, outputs: Any, targets: Any, reduction: str | None = None) -> torch.Tensor:
        """The loss the steps were seen to compute (its function and options), on ``targets``."""
        call = self._call
        if call is None:
            raise _LossNotSeen(
                f"{names_of(self.rules.loss_users or self.rules.needy)} needs {type(self.module).__name__}'s loss before its "
                "training_step has run once (the bridge learns the loss function and its options from a step, and a "
                "checkpoint written with the bridge after a step records them)."
            )
        if self._several_calls:
            raise BridgeConfigurationError(
                f"{names_of(self.rules.needy)} needs the step's one loss, but {type(self.module).__name__}'s training_step "
                "computes several from the batch's targets. Fix: use interpolate_loss=False / one loss, or subclass "
                "composer_bridge.ComposerModule."
            )
        if self._step is None:
            self._source_used_in_step = True
        return call(outputs, targets, reduction)

    # --- checkpoints: the loss learnt so far, so a resumed run can rank examples in its first step ---
    def record(self) -> dict[str, Any] | None:
        """The loss function and options seen so far (plain data), for ``checkpoint[CHECKPOINT_KEY]``."""
        if self._call is None:
            return None
        return {"kind": self._call.kind, "options": dict(self._call.options), "classes_last": self._call.classes_last}

    def load_from(self, checkpoint: dict[str, Any]) -> None:
        """Take the loss a checkpoint recorded, unless this run has seen one already."""
        saved = checkpoint.get(CHECKPOINT_KEY)
        if self._call is None and isinstance(saved, dict) and saved.get("kind") in torch_functions.INTERCEPTED:
            self._call = LossCall(saved["kind"], torch_functions.original(saved["kind"]), dict(saved["options"]),
                                   bool(saved.get("classes_last", False)))

    # --- the wrapped training_step --------------------------------------------------------------
    def step(self, *args: Any, **kwargs: Any) -> Any:
        """The module's ``training_step`` with the loss events around its loss call."""
        run = self._run
        state = run.state
        if state is None:
            return self._training_step(*args, **kwargs)
        in_kwargs = not args
        batch = kwargs["batch"] if in_kwargs else args[0]
        if not self._batch_checked:  # the batch's structure is checked once, in the first step
            check_batch(batch, self.module, self.rules.needy, self.target_key, self.input_key)
            self._batch_checked = True
        state.batch = batch
        run.fire_event(BEFORE_FORWARD)
        batch = state.batch
        if in_kwargs:
            kwargs = {**kwargs, "batch": batch}
        else:
            args = (batch, *args[1:])
        inputs = get_batch_item(batch, self.input_key) if self.input_key is not None else None
        record = _Step(target=get_batch_item(batch, self.target_key), input=inputs)
        watch = self._watch_forward(record) if self._forward_used and not self._forward_checked else None
        self._step = record
        try:
            with torch_functions.intercept(self._on_loss_call):
                output = self._training_step(*args, **kwargs)
        finally:
            self._step = None
            if watch is not None:
                watch.remove()
        state.batch = batch
        loss = output.get("loss") if isinstance(output, Mapping) else output
        if not isinstance(loss, torch.Tensor):  # None: Lightning skips the batch, nothing trains
            return output
        self._check_step(record, loss)
        self._source_used_in_step = False
        state.outputs, state.loss = record.logits, loss
        run.fire_event(BEFORE_BACKWARD)
        if state.loss is loss:
            return output
        return {**output, "loss": state.loss} if isinstance(output, Mapping) else state.loss

    def _watch_forward(self, record: _Step) -> Any:
        def seen(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if record.forward_output is None and len(args) == 1 and not kwargs and args[0] is record.input:
                record.forward_output = output

        return self.module.register_forward_hook(seen, with_kwargs=True)

    def _check_step(self, record: _Step, loss: torch.Tensor) -> None:
        name = type(self.module).__name__
        if record.calls == 0:
            raise BridgeConfigurationError(nothing_seen(self.module, self.rules.needy, self.target_key, record))
        if self._forward_used and not self._forward_checked:
            if not shares_storage(record.logits, record.forward_output) and not log_softmax_of_forward(self._call, record):
                raise BridgeConfigurationError(
                    f"{names_of(self.rules.needy)} ranks the examples with {name}(inputs), but {name}'s training_step does "
                    "not give its loss the output of self(inputs) (it calls a submodule, passes more arguments or "
                    "transforms the output), so the ranking would come from another function. Fix: compute "
                    "logits = self(x) in training_step, or pass SelectiveBackprop(loss_fn=...) and subclass "
                    "composer_bridge.ComposerModule."
                )
            self._forward_checked = True
        if self.rules.interpolating and loss is not record.result:
            raise BridgeConfigurationError(
                f"{names_of(self.rules.interpolating)} interpolates the loss between the example's and its partner's targets, "
                f"but {name}'s training_step returns a loss other than the {self._call.kind if self._call else 'loss'} "
                "call itself (a sum with other terms, a mean of reduction='none', ...), which cannot be interpolated "
                "exactly. Fix: use interpolate_loss=False (the targets are mixed instead), or return the loss call's value."
            )

    def _on_loss_call(self, kind: str, function: Callable[..., Any], input: Any, target: Any,
                      args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The handler :func:`~.torch_functions.intercept` hands each loss call of the step to."""
        record = self._step
        if record is None:
            return function(input, target, *args, **kwargs)
        seen = self._classify(record, kind, function, input, target, args, kwargs)
        if seen is None:  # not on the batch's targets: the call runs as written
            return function(input, target, *args, **kwargs)
        if record.calls:
            return self._repeat_call(record, seen.kind, seen.function, seen.input, seen.options)
        return self._fire_loss_events(record, seen)

    def _classify(self, record: _Step, kind: str, function: Callable[..., Any], input: Any, target: Any,
                  args: tuple[Any, ...], kwargs: dict[str, Any]) -> _SeenCall | None:
        """How a loss call reads against the step's batch; ``None`` (noted in ``record.others``) when it is not on its targets."""
        if same_tensor(target, record.target):
            return _SeenCall(kind, function, input, target, call_options(kind, function, input, target, args, kwargs))
        if self.rules.relabelled(kind, input, target, record.target):
            # y.view(-1) of the batch's (B, T) targets and logits.view(-1, C): the same values laid out as a
            # classifier's (B, C, T) logits and (B, T) targets, so that every position keeps its sample
            options = call_options(kind, function, input, target, args, kwargs)
            laid_out = input.view(*record.target.shape, input.shape[1]).movedim(-1, 1)
            return _SeenCall(kind, function, laid_out, record.target, options, classes_last=True)
        if not record.calls and self.rules.per_position_only and class_indices_for(kind, input, target, record.target):
            # targets derived inside the step (Hugging Face shifts the labels): per-position algorithms only
            options = call_options(kind, function, input, target, args, kwargs)
            return _SeenCall(kind, function, input, target, options, derived=True)
        shape = tuple(target.shape) if isinstance(target, torch.Tensor) else type(target).__name__
        record.others.append(f"{kind} with targets {shape} that are not that tensor")
        return None

    def _fire_loss_events(self, record: _Step, seen: _SeenCall) -> Any:
        """The step's loss: AFTER_FORWARD, BEFORE_LOSS on a copy of the batch, the call on the new targets, AFTER_LOSS."""
        kind, options, input = seen.kind, seen.options, seen.input
        record.calls = 1
        run = self._run
        state = run.live_state()
        state.outputs = input
        run.fire_event(AFTER_FORWARD)
        batch = state.batch
        state.batch = copy.copy(batch)  # the algorithms' targets go into a copy: the user's batch keeps its own
        try:
            if seen.derived:  # the algorithms act on the targets this call was given, in the batch's place
                state.batch = set_batch_item(state.batch, self.target_key, seen.target)
                record.target = seen.target
            ignored = self.rules.ignored_positions(kind, options, record.target)
            if ignored is not None:  # the algorithms see a valid class there; the loss leaves those positions out
                state.batch = set_batch_item(state.batch, self.target_key, record.target.masked_fill(ignored, 0))
                shown = get_batch_item(state.batch, self.target_key)
            run.fire_event(BEFORE_LOSS)
            targets = get_batch_item(state.batch, self.target_key)
            if ignored is not None and targets is shown:
                targets = record.target  # no algorithm replaced them: the call's own index targets
            self.rules.check_targets(kind, options, record.target, targets, input)
            call = LossCall(kind, seen.function, options, seen.classes_last)
            if self._source_used_in_step and self._call is not None and (call.kind, call.options) != (
                    self._call.kind, self._call.options):
                raise BridgeConfigurationError(
                    f"{names_of(self.rules.needy)} ranked this step's examples with {self._call.kind}{self._call.options}, "
                    f"but the step computes {kind}{options}. Fix: compute the same loss in every step."
                )
            self._call = call
            record.kept = None if ignored is None else ~ignored
            state.loss = call(input, targets, kept=record.kept if targets is not record.target else None)
            run.fire_event(AFTER_LOSS)
        finally:
            state.batch = batch
        record.logits, record.targets, record.result = input, targets, state.loss
        return state.loss

    def _repeat_call(self, record: _Step, kind: str, function: Callable[..., Any], input: Any,
                     options: dict[str, Any]) -> Any:
        """A second loss on the batch's targets (an auxiliary head): the same new targets, or a refusal."""
        name = type(self.module).__name__
        record.calls += 1
        self._several_calls = True
        if self.rules.interpolating or self._source_used_in_step:
            users = self.rules.interpolating or self.rules.needy
            raise BridgeConfigurationError(
                f"{names_of(users)} needs the step's one loss, but {name}'s training_step computes several from the "
                "batch's targets. Fix: use interpolate_loss=False / one loss, or subclass composer_bridge.ComposerModule."
            )
        if not isinstance(input, torch.Tensor) or input.shape != record.logits.shape:
            shape = tuple(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__
            raise BridgeConfigurationError(
                f"{name}'s training_step computes a second loss from the batch's targets, on outputs of shape {shape} "
                f"where the first had {tuple(record.logits.shape)}; {names_of(self.rules.needy)} made the targets for the "
                "first. Fix: compute the losses on outputs of one shape, or subclass composer_bridge.ComposerModule."
            )
        self.rules.check_targets(kind, options, record.target, record.targets, input)
        kept = None
        if record.kept is not None and record.targets is not record.target:
            kept = record.target != options.get("ignore_index", -100)
        return LossCall(kind, function, options)(input, record.targets, kept=kept)
