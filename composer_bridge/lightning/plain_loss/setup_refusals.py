"""The set-up refusals: what a plain module shows before its first step that the loss algorithms cannot take.

At ``setup`` the bridge reads the module, not a step: the algorithms must agree on which part of
the batch holds the targets and the inputs (:func:`common_key`); ranking examples
(SelectiveBackprop) needs ``forward(inputs)``; interpolating the loss needs automatic
optimization; and a module with one criterion submodule shows its options (``label_smoothing=``,
``ignore_index=``, a class ``weight=``), which :func:`refusal` checks against the algorithms that
replace the targets. The per-step interception (:mod:`.step_events`) asks :func:`refusal` the same
question about the options a loss call shows in a step.

Examples:
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

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from composer_bridge.core.algorithm import Algorithm, declares, declaring
from composer_bridge.core.batch import BatchKey
from composer_bridge.lightning.errors import BridgeConfigurationError
from composer_bridge.lightning.plain_loss.seen_call import weighted_mean_with_ignored_positions

__all__ = ["FIX_SHAPE", "check_plain_module", "common_key", "loss_algorithms", "names_of", "refusal"]

_CRITERIA: dict[type, str] = {
    torch.nn.CrossEntropyLoss: "cross_entropy",
    torch.nn.BCEWithLogitsLoss: "binary_cross_entropy_with_logits",
    torch.nn.BCELoss: "binary_cross_entropy",
    torch.nn.NLLLoss: "nll_loss",
}
FIX_SHAPE = (
    "compute the loss in training_step with nn.CrossEntropyLoss / F.cross_entropy on the logits (or "
    "nn.BCEWithLogitsLoss / F.binary_cross_entropy_with_logits) and the batch's target tensor itself, or subclass "
    "composer_bridge.ComposerModule (forward(batch) and loss(outputs, batch))"
)


def loss_algorithms(algorithms: Sequence[Algorithm]) -> list[Algorithm]:
    """The algorithms that act between the forward pass and the loss (``needs_loss_events``)."""
    return declaring(algorithms, "needs_loss_events")


def names_of(algorithms: Sequence[Algorithm]) -> str:
    """``"LabelSmoothing, MixUp"``: the algorithms' class names, for messages."""
    return ", ".join(type(a).__name__ for a in algorithms)


def common_key(algorithms: Sequence[Algorithm], attribute: str, default: BatchKey | None) -> BatchKey | None:
    """The one ``target_key``/``input_key`` (``attribute``) the algorithms name, or ``default``; refused if they differ."""
    keys = [(type(a).__name__, getattr(a, attribute)) for a in algorithms if hasattr(a, attribute)]
    if any(key != keys[0][1] for _, key in keys):
        listed = ", ".join(f"{name}({attribute}={key!r})" for name, key in keys)
        raise BridgeConfigurationError(
            f"{listed} point at different parts of the batch; with a plain LightningModule the bridge recognises "
            f"the loss by the one tensor they name. Fix: give them the same {attribute}."
        )
    return keys[0][1] if keys else default


def refusal(kind: str, options: Mapping[str, Any], replacing: Sequence[Algorithm], where: str) -> str | None:
    """Why ``kind`` with ``options`` cannot take the probability targets ``replacing`` produce, if it cannot.

    ``nll_loss`` can, on log-probabilities (checked in the first step, where its input shows); an
    ``ignore_index`` can for algorithms that replace each target position by itself (LabelSmoothing),
    whose ignored positions are left out exactly as torch leaves them out, but not for algorithms that
    mix an example's targets with a partner's (MixUp, CutMix): the partner's positions are not ignored.
    """
    if kind not in ("cross_entropy", "nll_loss"):
        return None
    names = names_of(replacing)
    ignore_index = options.get("ignore_index", -100)
    mixing = [a for a in replacing if declares(a, "mixes_examples")]
    if ignore_index != -100 and mixing:
        return (
            f"{names_of(mixing)} mixes each example's targets with a partner's, but {where} has "
            f"ignore_index={ignore_index}: a position ignored in one example is a real target in its partner, so the "
            "mixed targets cannot leave the ignored positions out. Fix: use "
            f"{names_of(mixing)}(interpolate_loss=True) (each loss keeps its own ignored positions), or drop ignore_index."
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


def check_plain_module(algorithms: Sequence[Algorithm], module: torch.nn.Module) -> None:
    """Refuse, at setup, loss algorithms on a plain module where what the module shows cannot be made exact."""
    needy = loss_algorithms(algorithms)
    if not needy:
        return
    common_key(needy, "target_key", 1)
    common_key(needy, "input_key", 0)
    _check_forward_takes_inputs(needy, module)
    interpolating = [a for a in needy if declares(a, "interpolates_loss")]
    if interpolating and not getattr(module, "automatic_optimization", True):
        raise BridgeConfigurationError(
            f"{names_of(interpolating)} interpolates the loss your training_step returns, just before the backward "
            f"pass, but {type(module).__name__} sets automatic_optimization=False: its training_step calls "
            "manual_backward itself, before the bridge sees the loss. Fix: use interpolate_loss=False (the targets "
            "are mixed instead, exact for cross-entropy), or automatic optimization."
        )
    replacing = [a for a in needy if declares(a, "replaces_targets")]
    criteria = [(name, m) for name, m in module.named_modules() if isinstance(m, torch.nn.modules.loss._Loss)]
    if not replacing or len(criteria) != 1:
        return  # several criteria (or none): which one the step uses shows in the first step
    name, criterion = criteria[0]
    kind = _CRITERIA.get(type(criterion))
    where = f"{type(module).__name__}.{name} ({type(criterion).__name__})"
    if kind is None:
        raise BridgeConfigurationError(
            f"{names_of(replacing)} replaces the targets by probabilities at BEFORE_LOSS, but the only loss module of "
            f"{where} is not one the bridge can give them to (cross-entropy, BCE-with-logits, BCE). Fix: {FIX_SHAPE}."
        )
    reason = refusal(kind, _criterion_options(criterion), replacing, where)
    if reason is not None:
        raise BridgeConfigurationError(reason)


def _check_forward_takes_inputs(needy: Sequence[Algorithm], module: torch.nn.Module) -> None:
    """Refuse, at setup, ranking examples with ``module(inputs)`` when ``forward`` needs more than the inputs."""
    ranking = [a for a in needy if not declares(a, "interpolates_loss") and not declares(a, "replaces_targets")
               and not declares(a, "acts_per_position")]
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
            f"{names_of(ranking)} runs {name}'s forward on the batch's inputs alone (module(inputs)) to rank the "
            f"examples, but {name}.forward takes {', '.join(required)} (missing 1 required positional argument: "
            f"{required[1]!r}). Fix: make forward(inputs) return the logits training_step gives its loss, or "
            "subclass composer_bridge.ComposerModule (forward(batch) and loss(outputs, batch))."
        )
