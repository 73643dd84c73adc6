"""The loss events for a plain LightningModule, whose ``training_step`` computes forward and loss itself.

LabelSmoothing, MixUp, CutMix and SelectiveBackprop act between the forward pass and the loss.
A :class:`~composer_bridge.ComposerModule` keeps the two apart; a plain module's
``training_step`` does both, in one of two shapes::

    loss = self.criterion(self(x), y)          # a criterion submodule (nn.CrossEntropyLoss(), ...)
    loss = F.cross_entropy(self(x), y)         # a functional call

Both end in a call of ``torch.nn.functional.cross_entropy`` (or ``binary_cross_entropy_with_logits``,
``binary_cross_entropy``, ``nll_loss``): the criterion modules call the functional form.
:class:`PlainLossStep` wraps ``training_step`` so that, for one step:

1. ``BEFORE_FORWARD`` fires on the batch Lightning passes (MixUp and CutMix mix its inputs), and
   ``training_step`` receives the result;
2. while it runs, those functions are seen on this thread (:mod:`~composer_bridge.lightning.loss_calls`);
   the first call whose target *is* the batch's target tensor (``batch[target_key]``, or a view
   of it with the same shape, such as ``y.view(-1)`` of a 1-D ``y``) becomes the step's loss:
   ``AFTER_FORWARD`` (``state.outputs`` = the call's input, the logits), ``BEFORE_LOSS`` (the
   algorithms replace the targets in a copy of the batch), the call itself with the new targets
   and the call's own options, ``AFTER_LOSS``; the call returns ``state.loss``;
3. after the step, ``BEFORE_BACKWARD`` on the loss the step returned (MixUp's and CutMix's
   ``interpolate_loss=True`` act here, through :class:`~composer_bridge.core.loss_source.LossSource`).

Sequence shapes, recognised in step 2:

- **flattened targets**: ``F.cross_entropy(logits.view(-1, C), y.view(-1))`` where ``y.view(-1)``
  shares the storage of the batch's ``(B, T)`` targets, element for element: the call's logits are
  shown to the algorithms, and the call computed, as a classifier's ``(B, C, T)`` logits against
  the ``(B, T)`` targets, so per-sample algorithms pair and select samples, not positions;
- **ignored positions**: with algorithms that replace targets position by position (LabelSmoothing),
  the positions equal to the call's ``ignore_index`` get all-zero target rows and the mean is over
  the others, as torch computes it for index targets;
- **targets derived inside the step** (a Hugging Face model's shifted labels): when every loss
  algorithm acts position by position, the first cross-entropy/nll call on class indices of the
  labels' dtype is the loss;
- **nll_loss** with probability targets is ``-sum(p * input)``, checked once to read log-probabilities.

The loss is then exactly the one a ComposerModule computes with the same network and loss
function: the same targets go into the same function. The user's code never sees the new
targets: its ``y`` is still the batch's tensor, so metrics computed from it (torchmetrics),
logging and validation see the real labels.

What cannot be made exact is refused, at setup where the module shows it (a criterion
submodule's options, manual optimization) and otherwise in the first step that shows it, before
any backward pass (so no weight changes): a step that never calls a supported loss on the
batch's targets, ``nll_loss`` on values that are not log-probabilities, an ``ignore_index`` with
targets mixed across examples, ``label_smoothing=`` with targets turned into probabilities, derived
targets (``y.float()``, a copy) for algorithms that act per sample, a batch that is a bare tensor.

Example:
    >>> import torch
    >>> from composer_bridge.algorithms import LabelSmoothing
    >>> check_plain_module([LabelSmoothing(0.1)], torch.nn.Module())  # nothing to refuse
    >>> class Model(torch.nn.Module):
    ...     automatic_optimization = True
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.2)
    >>> try:
    ...     check_plain_module([LabelSmoothing(0.1)], Model())
    ... except ValueError as error:
    ...     print(str(error)[:73])
    LabelSmoothing replaces the targets by probabilities, but Model.criterion
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from composer_bridge.core.algorithm import declaring
from composer_bridge.core.batch import BatchKey, get_batch_item, set_batch_item
from composer_bridge.core.loss_source import LossNotSeenYet
from composer_bridge.lightning import loss_calls
from composer_bridge.lightning.errors import BridgeConfigurationError
from composer_bridge.lightning.hook_map import HOOK_EVENTS
from composer_bridge.lightning.loss_call import (
    LossCall,
    call_options,
    class_indices_for,
    flattened_view,
    not_log_probabilities,
    same_tensor,
    shares_storage,
    weighted_mean_with_ignored_positions,
)

__all__ = ["CHECKPOINT_KEY", "PlainLossStep", "check_plain_module"]

#: where a checkpoint keeps the loss a plain module's training_step was seen to compute
CHECKPOINT_KEY = "composer_bridge/plain_loss"

BEFORE_FORWARD, AFTER_FORWARD, BEFORE_LOSS, AFTER_LOSS, BEFORE_BACKWARD = HOOK_EVENTS["training_step[loss]"]

_CRITERIA: dict[type, str] = {
    torch.nn.CrossEntropyLoss: "cross_entropy",
    torch.nn.BCEWithLogitsLoss: "binary_cross_entropy_with_logits",
    torch.nn.BCELoss: "binary_cross_entropy",
    torch.nn.NLLLoss: "nll_loss",
}
_FIX_SHAPE = (
    "compute the loss in training_step with nn.CrossEntropyLoss / F.cross_entropy on the logits (or "
    "nn.BCEWithLogitsLoss / F.binary_cross_entropy_with_logits) and the batch's target tensor itself, or subclass "
    "composer_bridge.ComposerModule (forward(batch) and loss(outputs, batch))"
)


def _needy(algorithms: Sequence[Any]) -> list[Any]:
    return declaring(algorithms, "needs_loss_events")


def _names(algorithms: Sequence[Any]) -> str:
    return ", ".join(type(a).__name__ for a in algorithms)


def _common_key(algorithms: Sequence[Any], attribute: str, default: BatchKey | None) -> BatchKey | None:
    keys = [(type(a).__name__, getattr(a, attribute)) for a in algorithms if hasattr(a, attribute)]
    if any(key != keys[0][1] for _, key in keys):
        listed = ", ".join(f"{name}({attribute}={key!r})" for name, key in keys)
        raise BridgeConfigurationError(
            f"{listed} point at different parts of the batch; with a plain LightningModule the bridge recognises "
            f"the loss by the one tensor they name. Fix: give them the same {attribute}."
        )
    return keys[0][1] if keys else default


def _refusal(kind: str, options: Mapping[str, Any], replacing: Sequence[Any], where: str) -> str | None:
    """Why ``kind`` with ``options`` cannot take the probability targets ``replacing`` produce, if it cannot.

    ``nll_loss`` can, on log-probabilities (checked in the first step, where its input shows); an
    ``ignore_index`` can for algorithms that replace each target position by itself (LabelSmoothing),
    whose ignored positions are left out exactly as torch leaves them out, but not for algorithms that
    mix an example's targets with a partner's (MixUp, CutMix): the partner's positions are not ignored.
    """
    if kind not in ("cross_entropy", "nll_loss"):
        return None
    names = _names(replacing)
    ignore_index = options.get("ignore_index", -100)
    mixing = [a for a in replacing if getattr(a, "mixes_examples", False)]
    if ignore_index != -100 and mixing:
        return (
            f"{_names(mixing)} mixes each example's targets with a partner's, but {where} has "
            f"ignore_index={ignore_index}: a position ignored in one example is a real target in its partner, so the "
            "mixed targets cannot leave the ignored positions out. Fix: use "
            f"{_names(mixing)}(interpolate_loss=True) (each loss keeps its own ignored positions), or drop ignore_index."
        )
    # with a class weight, a mean and padding (a non-default ignore_index says there is some), refused here;
    # torch's default -100 is refused in the step where the padding shows (LossCall), so classifiers still train
    if ignore_index != -100 and options.get("weight") is not None and options.get("reduction", "mean") == "mean":
        return weighted_mean_with_ignored_positions(names, where)
    smoothing = options.get("label_smoothing", 0.0)
    if smoothing:
        return (
            f"{names} replaces the targets by probabilities, but {where} has label_smoothing={smoothing}, which "
            "cross_entropy would apply on top of them (smoothing twice, or smoothing mixed targets). Fix: drop "
            "label_smoothing= from the loss and use composer_bridge.algorithms.LabelSmoothing(" f"{smoothing}) instead."
        )
    return None


def _criterion_options(criterion: torch.nn.Module) -> dict[str, Any]:
    return {name: getattr(criterion, name) for name in ("ignore_index", "label_smoothing") if hasattr(criterion, name)}


def check_plain_module(algorithms: Sequence[Any], module: torch.nn.Module) -> None:
    """Refuse, at setup, loss algorithms on a plain module where what the module shows cannot be made exact."""
    needy = _needy(algorithms)
    if not needy:
        return
    _common_key(needy, "target_key", 1)
    _common_key(needy, "input_key", 0)
    _check_forward_takes_inputs(needy, module)
    interpolating = [a for a in needy if getattr(a, "interpolates_loss", False)]
    if interpolating and not getattr(module, "automatic_optimization", True):
        raise BridgeConfigurationError(
            f"{_names(interpolating)} interpolates the loss your training_step returns, just before the backward "
            f"pass, but {type(module).__name__} sets automatic_optimization=False: its training_step calls "
            "manual_backward itself, before the bridge sees the loss. Fix: use interpolate_loss=False (the targets "
            "are mixed instead, exact for cross-entropy), or automatic optimization."
        )
    replacing = [a for a in needy if getattr(a, "replaces_targets", False)]
    criteria = [(name, m) for name, m in module.named_modules() if isinstance(m, torch.nn.modules.loss._Loss)]
    if not replacing or len(criteria) != 1:
        return  # several criteria (or none): which one the step uses shows in the first step
    name, criterion = criteria[0]
    kind = _CRITERIA.get(type(criterion))
    where = f"{type(module).__name__}.{name} ({type(criterion).__name__})"
    if kind is None:
        raise BridgeConfigurationError(
            f"{_names(replacing)} replaces the targets by probabilities at BEFORE_LOSS, but the only loss module of "
            f"{where} is not one the bridge can give them to (cross-entropy, BCE-with-logits, BCE). Fix: {_FIX_SHAPE}."
        )
    reason = _refusal(kind, _criterion_options(criterion), replacing, where)
    if reason is not None:
        raise BridgeConfigurationError(reason)


def _check_forward_takes_inputs(needy: Sequence[Any], module: torch.nn.Module) -> None:
    """Refuse, at setup, ranking examples with ``module(inputs)`` when ``forward`` needs more than the inputs."""
    ranking = [a for a in needy if not getattr(a, "interpolates_loss", False) and not getattr(a, "replaces_targets", False)]
    if not ranking or not callable(getattr(module, "forward", None)):
        return
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return
    required = [p.name for p in parameters if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if len(required) > 1:
        name = type(module).__name__
        raise BridgeConfigurationError(
            f"{_names(ranking)} runs {name}'s forward on the batch's inputs alone (module(inputs)) to rank the "
            f"examples, but {name}.forward takes {', '.join(required)} (missing 1 required positional argument: "
            f"{required[1]!r}). Fix: make forward(inputs) return the logits training_step gives its loss, or "
            "subclass composer_bridge.ComposerModule (forward(batch) and loss(outputs, batch))."
        )


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


class _LossNotSeen(BridgeConfigurationError, LossNotSeenYet):
    """The loss was asked for before a step showed it (SelectiveBackprop then leaves that step whole)."""


class PlainLossStep:
    """Fire the loss events inside a plain module's ``training_step``; the :class:`LossSource` it was seen to use.

    ``bridge`` is the :class:`~composer_bridge.AlgorithmEngineCallback` (its ``state`` and
    ``fire_event``); ``training_step`` the module's own step. :meth:`step` replaces it on the
    instance (see :class:`~composer_bridge.lightning.module_hooks.ModuleHooks`), and the object
    is ``state.loss_source`` until :meth:`close`.

    Example:
        >>> import torch
        >>> from composer_bridge.core.state import State
        >>> from composer_bridge.algorithms import LabelSmoothing
        >>> class Bridge:
        ...     state = State(torch.nn.Linear(2, 2), algorithms=[LabelSmoothing(0.5)])
        ...     def fire_event(self, event):
        ...         for algorithm in self.state.algorithms:
        ...             if algorithm.match(event, self.state):
        ...                 algorithm.apply(event, self.state, None)
        >>> def training_step(batch, batch_idx):
        ...     x, y = batch
        ...     return torch.nn.functional.cross_entropy(torch.zeros(2, 2), y)
        >>> plain = PlainLossStep(torch.nn.Linear(2, 2), Bridge(), training_step)
        >>> plain.step((torch.zeros(2, 2), torch.tensor([0, 1])), 0)  # log(2) whatever the smoothing
        tensor(0.6931)
        >>> Bridge.state.loss_source is plain
        True
        >>> plain.close()
    """

    def __init__(self, module: torch.nn.Module, bridge: Any, training_step: Callable[..., Any]) -> None:
        self.module = module
        self._bridge = bridge
        self._training_step = training_step
        state = bridge.state
        needy = _needy(state.algorithms)
        self.target_key = _common_key(needy, "target_key", 1)
        self.input_key = _common_key(needy, "input_key", None)  # None: no algorithm reads the inputs
        self._needy = needy
        self._interpolating = [a for a in needy if getattr(a, "interpolates_loss", False)]
        # the algorithms that call loss(): not those that only replace the targets
        self._loss_users = [
            a for a in needy if getattr(a, "interpolates_loss", False) or not getattr(a, "replaces_targets", False)
        ]
        self._call: LossCall | None = None
        self._several_calls = False
        self._forward_used = False  # SelectiveBackprop ran module(inputs): check that training_step does the same
        self._forward_checked = False
        self._step: _Step | None = None
        self._batch_checked = False
        self._source_used_in_step = False
        self._log_probabilities_checked = False
        # LabelSmoothing acts on each target position by itself, so it can act on targets the step derives
        # (Hugging Face's shifted labels); algorithms that act per sample need the batch's own targets
        self._per_position_only = all(
            getattr(a, "replaces_targets", False) and not getattr(a, "mixes_examples", False) for a in needy
        )
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
                f"{_names(self._needy)} runs {type(self.module).__name__}'s forward on the batch's inputs alone "
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
                f"{_names(self._loss_users or self._needy)} needs {type(self.module).__name__}'s loss before its "
                "training_step has run once (the bridge learns the loss function and its options from a step, and a "
                "checkpoint written with the bridge after a step records them)."
            )
        if self._several_calls:
            raise BridgeConfigurationError(
                f"{_names(self._needy)} needs the step's one loss, but {type(self.module).__name__}'s training_step "
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
        if self._call is None and isinstance(saved, dict) and saved.get("kind") in loss_calls.INTERCEPTED:
            self._call = LossCall(saved["kind"], loss_calls.original(saved["kind"]), dict(saved["options"]),
                                   bool(saved.get("classes_last", False)))

    # --- the wrapped training_step --------------------------------------------------------------
    def step(self, *args: Any, **kwargs: Any) -> Any:
        """The module's ``training_step`` with the loss events around its loss call."""
        bridge = self._bridge
        state = bridge.state
        if state is None:
            return self._training_step(*args, **kwargs)
        in_kwargs = not args
        batch = kwargs["batch"] if in_kwargs else args[0]
        if not self._batch_checked:  # the batch's structure is checked once, in the first step
            self._check_batch(batch)
            self._batch_checked = True
        state.batch = batch
        bridge.fire_event(BEFORE_FORWARD)
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
            with loss_calls.intercept(self._on_loss_call):
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
        bridge.fire_event(BEFORE_BACKWARD)
        if state.loss is loss:
            return output
        return {**output, "loss": state.loss} if isinstance(output, Mapping) else state.loss

    def _check_batch(self, batch: Any) -> None:
        if isinstance(batch, torch.Tensor):
            raise BridgeConfigurationError(
                f"{_names(self._needy)} needs the batch's inputs and targets, but {type(self.module).__name__}'s "
                f"training_step receives one tensor of shape {tuple(batch.shape)} (no targets to smooth, mix or rank "
                "by). Fix: have the dataloader yield (inputs, targets) (or a dict, with target_key=...), or remove "
                "these algorithms."
            )
        for what, key in (("targets", self.target_key), ("inputs", self.input_key)):
            if key is None:
                continue
            try:
                item = get_batch_item(batch, key)
            except KeyError as error:
                raise BridgeConfigurationError(
                    f"{_names(self._needy)} reads the {what} at {key!r}: {error.args[0]} Fix: pass "
                    f"target_key=/input_key= naming them, or declare them on the module once: "
                    f"batch_keys = {{'input_key': ..., 'target_key': ...}}."
                ) from None
            if what == "targets" and not isinstance(item, torch.Tensor):
                raise BridgeConfigurationError(
                    f"{_names(self._needy)} needs one tensor of targets at target_key={key!r}, got "
                    f"{type(item).__name__}. Fix: point target_key at the target tensor."
                )

    def _watch_forward(self, record: _Step) -> Any:
        def seen(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if record.forward_output is None and len(args) == 1 and not kwargs and args[0] is record.input:
                record.forward_output = output

        return self.module.register_forward_hook(seen, with_kwargs=True)

    def _check_step(self, record: _Step, loss: torch.Tensor) -> None:
        name = type(self.module).__name__
        if record.calls == 0:
            raise BridgeConfigurationError(self._nothing_seen(record))
        if self._forward_used and not self._forward_checked:
            if not shares_storage(record.logits, record.forward_output) and not self._log_softmax_of_forward(record):
                raise BridgeConfigurationError(
                    f"{_names(self._needy)} ranks the examples with {name}(inputs), but {name}'s training_step does "
                    "not give its loss the output of self(inputs) (it calls a submodule, passes more arguments or "
                    "transforms the output), so the ranking would come from another function. Fix: compute "
                    "logits = self(x) in training_step, or pass SelectiveBackprop(loss_fn=...) and subclass "
                    "composer_bridge.ComposerModule."
                )
            self._forward_checked = True
        if self._interpolating and loss is not record.result:
            raise BridgeConfigurationError(
                f"{_names(self._interpolating)} interpolates the loss between the example's and its partner's targets, "
                f"but {name}'s training_step returns a loss other than the {self._call.kind if self._call else 'loss'} "
                "call itself (a sum with other terms, a mean of reduction='none', ...), which cannot be interpolated "
                "exactly. Fix: use interpolate_loss=False (the targets are mixed instead), or return the loss call's value."
            )

    def _log_softmax_of_forward(self, record: _Step) -> bool:
        """An ``nll_loss`` whose input is ``log_softmax(self(inputs))`` over the classes (checked on the values, once)."""
        output, logits = record.forward_output, record.logits
        if self._call is None or self._call.kind != "nll_loss" or not isinstance(output, torch.Tensor):
            return False
        if self._call.classes_last and output.ndim > 2:
            output = output.movedim(-1, 1)
        if not isinstance(logits, torch.Tensor) or output.shape != logits.shape:
            return False
        return bool(torch.allclose(torch.log_softmax(output.detach().float(), dim=1), logits.detach().float(), atol=1e-5))

    def _nothing_seen(self, record: _Step) -> str:
        name = type(self.module).__name__
        seen = "; ".join(record.others) if record.others else "no call of cross_entropy, binary_cross_entropy(_with_logits) or nll_loss at all"
        direct = loss_calls.direct_imports(inspect.getmodule(type(self.module)))
        hint = (
            f" Its module imports {', '.join(direct)} by name (from torch.nn.functional import ...): the bridge sees "
            "calls made through torch.nn.functional (F.cross_entropy) and the nn loss modules."
            if direct else ""
        )
        target = record.target
        per_sample = [a for a in self._needy if not getattr(a, "replaces_targets", False) or getattr(a, "mixes_examples", False)]
        if record.others and per_sample:
            hint += (
                f" {_names(per_sample)} acts per sample, so it needs the batch's own target tensor (or a view of it: "
                "y.view(-1)) to map each target back to its sample; targets derived inside the model (Hugging Face "
                "shifts the labels inside model(**batch).loss) lose that map. LabelSmoothing alone can act on them."
            )
        return (
            f"{_names(self._needy)} acts on the loss {name}'s training_step computes from the batch's targets "
            f"(batch[{self.target_key!r}], {tuple(target.shape)} {target.dtype}), but the step computed its loss "
            f"without passing that tensor to a loss the bridge can see: {seen}.{hint} Derived targets (y.float(), "
            f"y.view(...) of another shape, targets computed inside the model) cannot be traced back. Fix: {_FIX_SHAPE}."
        )

    def _on_loss_call(self, kind: str, function: Callable[..., Any], input: Any, target: Any,
                      args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        record = self._step
        if record is None:
            return function(input, target, *args, **kwargs)
        classes_last = False
        derived = False
        if not same_tensor(target, record.target):
            if self._relabelled(kind, input, target, record.target):
                # y.view(-1) of the batch's (B, T) targets and logits.view(-1, C): the same values laid out as a
                # classifier's (B, C, T) logits and (B, T) targets, so that every position keeps its sample
                options = call_options(kind, function, input, target, args, kwargs)
                input, classes_last = input.view(*record.target.shape, input.shape[1]).movedim(-1, 1), True
                target = record.target
            elif not record.calls and self._per_position_only and class_indices_for(kind, input, target, record.target):
                # targets derived inside the step (Hugging Face shifts the labels): per-position algorithms only
                options = call_options(kind, function, input, target, args, kwargs)
                derived = True
            else:
                shape = tuple(target.shape) if isinstance(target, torch.Tensor) else type(target).__name__
                record.others.append(f"{kind} with targets {shape} that are not that tensor")
                return function(input, target, *args, **kwargs)
        else:
            options = call_options(kind, function, input, target, args, kwargs)
        if record.calls:
            return self._repeat_call(record, kind, function, input, options)
        record.calls = 1
        bridge = self._bridge
        state = bridge.state
        state.outputs = input
        bridge.fire_event(AFTER_FORWARD)
        batch = state.batch
        state.batch = copy.copy(batch)  # the algorithms' targets go into a copy: the user's batch keeps its own
        try:
            if derived:  # the algorithms act on the targets this call was given, in the batch's place
                state.batch = set_batch_item(state.batch, self.target_key, target)
                record.target = target
            ignored = self._ignored_positions(kind, options, record.target)
            if ignored is not None:  # the algorithms see a valid class there; the loss leaves those positions out
                state.batch = set_batch_item(state.batch, self.target_key, record.target.masked_fill(ignored, 0))
                shown = get_batch_item(state.batch, self.target_key)
            bridge.fire_event(BEFORE_LOSS)
            targets = get_batch_item(state.batch, self.target_key)
            if ignored is not None and targets is shown:
                targets = record.target  # no algorithm replaced them: the call's own index targets
            self._check_targets(kind, options, record.target, targets, input)
            call = LossCall(kind, function, options, classes_last)
            if self._source_used_in_step and self._call is not None and (call.kind, call.options) != (
                    self._call.kind, self._call.options):
                raise BridgeConfigurationError(
                    f"{_names(self._needy)} ranked this step's examples with {self._call.kind}{self._call.options}, "
                    f"but the step computes {kind}{options}. Fix: compute the same loss in every step."
                )
            self._call = call
            record.kept = None if ignored is None else ~ignored
            state.loss = call(input, targets, kept=record.kept if targets is not record.target else None)
            bridge.fire_event(AFTER_LOSS)
        finally:
            state.batch = batch
        record.logits, record.targets, record.result = input, targets, state.loss
        return state.loss

    def _relabelled(self, kind: str, input: Any, target: Any, batch_target: torch.Tensor) -> bool:
        """The call's target is the batch's ``(B, T)`` class indices flattened, and its input one row of logits per position."""
        return (
            kind in ("cross_entropy", "nll_loss") and not batch_target.dtype.is_floating_point
            and flattened_view(target, batch_target)
            and isinstance(input, torch.Tensor) and input.ndim == 2 and input.shape[0] == target.numel()
        )

    def _ignored_positions(self, kind: str, options: Mapping[str, Any], target: torch.Tensor) -> torch.Tensor | None:
        """Where the index targets equal the call's ``ignore_index``, when algorithms replace them by probabilities.

        torch ignores those positions only for index targets; with probability targets the bridge
        leaves them out itself (:func:`~composer_bridge.lightning.loss_call.probability_loss`). Mixing algorithms are refused with an
        ``ignore_index`` of their own (:func:`_refusal`), so here only position-wise replacements act.
        """
        replacing = [a for a in self._needy if getattr(a, "replaces_targets", False)]
        if kind not in ("cross_entropy", "nll_loss") or target.dtype.is_floating_point or not replacing:
            return None
        if any(getattr(a, "mixes_examples", False) for a in replacing):
            return None
        return target == options.get("ignore_index", -100)

    def _repeat_call(self, record: _Step, kind: str, function: Callable[..., Any], input: Any,
                     options: dict[str, Any]) -> Any:
        """A second loss on the batch's targets (an auxiliary head): the same new targets, or a refusal."""
        name = type(self.module).__name__
        record.calls += 1
        self._several_calls = True
        if self._interpolating or self._source_used_in_step:
            users = self._interpolating or self._needy
            raise BridgeConfigurationError(
                f"{_names(users)} needs the step's one loss, but {name}'s training_step computes several from the "
                "batch's targets. Fix: use interpolate_loss=False / one loss, or subclass composer_bridge.ComposerModule."
            )
        if not isinstance(input, torch.Tensor) or input.shape != record.logits.shape:
            shape = tuple(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__
            raise BridgeConfigurationError(
                f"{name}'s training_step computes a second loss from the batch's targets, on outputs of shape {shape} "
                f"where the first had {tuple(record.logits.shape)}; {_names(self._needy)} made the targets for the "
                "first. Fix: compute the losses on outputs of one shape, or subclass composer_bridge.ComposerModule."
            )
        self._check_targets(kind, options, record.target, record.targets, input)
        kept = None
        if record.kept is not None and record.targets is not record.target:
            kept = record.target != options.get("ignore_index", -100)
        return LossCall(kind, function, options)(input, record.targets, kept=kept)

    def _check_targets(self, kind: str, options: Mapping[str, Any], original: torch.Tensor, targets: Any,
                       input: Any) -> None:
        if targets is original:
            return
        to_probabilities = (
            isinstance(targets, torch.Tensor) and targets.dtype.is_floating_point and not original.dtype.is_floating_point
        )
        if not to_probabilities:
            return
        replacing = [a for a in self._needy if getattr(a, "replaces_targets", False)] or self._needy
        where = f"{type(self.module).__name__}'s loss ({kind})"
        reason = _refusal(kind, options, replacing, where)
        if reason is None and kind == "nll_loss" and not self._log_probabilities_checked:
            reason = not_log_probabilities(input, _names(replacing), where)
            self._log_probabilities_checked = True
        if reason is not None:
            raise BridgeConfigurationError(reason)
