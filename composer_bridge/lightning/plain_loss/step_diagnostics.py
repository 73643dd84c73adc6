"""Why a plain module's step could not be followed, in words: what the plain-loss step says when it refuses.

Examples:
    >>> log_softmax_of_forward(None, None)
    False
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from composer_bridge.core.algorithm import declares
from composer_bridge.core.batch import get_batch_item
from composer_bridge.lightning.errors import BridgeConfigurationError
from composer_bridge.lightning.plain_loss import torch_functions
from composer_bridge.lightning.plain_loss.setup_refusals import FIX_SHAPE, names_of

__all__ = ["check_batch", "log_softmax_of_forward", "nothing_seen"]


def check_batch(batch: Any, module: torch.nn.Module, needy: Sequence[Any], target_key: Any, input_key: Any) -> None:
    """Refuse a batch the loss algorithms cannot read: one bare tensor, or no item at their keys, naming the fix."""
    names = names_of(needy)
    if isinstance(batch, torch.Tensor):
        raise BridgeConfigurationError(
            f"{names} needs the batch's inputs and targets, but {type(module).__name__}'s training_step receives one "
            f"tensor of shape {tuple(batch.shape)} (no targets to smooth, mix or rank by). Fix: have the dataloader "
            "yield (inputs, targets) (or a dict, with target_key=...), or remove these algorithms."
        )
    for what, key in (("targets", target_key), ("inputs", input_key)):
        if key is None:
            continue
        try:
            item = get_batch_item(batch, key)
        except KeyError as error:
            raise BridgeConfigurationError(
                f"{names} reads the {what} at {key!r}: {error.args[0]} Fix: pass target_key=/input_key= naming them, "
                "or declare them on the module once: batch_keys = {'input_key': ..., 'target_key': ...}."
            ) from None
        if what == "targets" and not isinstance(item, torch.Tensor):
            raise BridgeConfigurationError(
                f"{names} needs one tensor of targets at target_key={key!r}, got {type(item).__name__}. Fix: point "
                "target_key at the target tensor."
            )


def log_softmax_of_forward(call: Any, record: Any) -> bool:
    """An ``nll_loss`` whose input is ``log_softmax(self(inputs))`` over the classes (checked on the values, once).

    ``call``: the step's loss call (its kind and layout); ``record``: the step, with the forward's output and the
    logits the loss received.
    """
    if call is None or call.kind != "nll_loss" or not isinstance(record.forward_output, torch.Tensor):
        return False
    output, logits = record.forward_output, record.logits
    if call.classes_last and output.ndim > 2:
        output = output.movedim(-1, 1)
    if not isinstance(logits, torch.Tensor) or output.shape != logits.shape:
        return False
    return bool(torch.allclose(torch.log_softmax(output.detach().float(), dim=1), logits.detach().float(), atol=1e-5))


def nothing_seen(module: torch.nn.Module, needy: Sequence[Any], target_key: Any, record: Any) -> str:
    """The refusal when a step computed its loss without a call the bridge can see on the batch's targets:
    what it saw instead, a hint when the module imports loss functions by name, the fix."""
    name = type(module).__name__
    seen = "; ".join(record.others) if record.others else "no call of cross_entropy, binary_cross_entropy(_with_logits) or nll_loss at all"
    direct = torch_functions.direct_imports(inspect.getmodule(type(module)))
    hint = (
        f" Its module imports {', '.join(direct)} by name (from torch.nn.functional import ...): the bridge sees "
        "calls made through torch.nn.functional (F.cross_entropy) and the nn loss modules."
        if direct else ""
    )
    target = record.target
    per_sample = [a for a in needy if not (declares(a, "replaces_targets") or declares(a, "acts_per_position"))
                  or declares(a, "mixes_examples")]
    if record.others and per_sample:
        hint += (
            f" {names_of(per_sample)} acts per sample, so it needs the batch's own target tensor (or a view of it: "
            "y.view(-1)) to map each target back to its sample; targets derived inside the model (Hugging Face "
            "shifts the labels inside model(**batch).loss) lose that map. LabelSmoothing alone can act on them."
        )
    return (
        f"{names_of(needy)} acts on the loss {name}'s training_step computes from the batch's targets "
        f"(batch[{target_key!r}], {tuple(target.shape)} {target.dtype}), but the step computed its loss "
        f"without passing that tensor to a loss the bridge can see: {seen}.{hint} Derived targets (y.float(), "
        f"y.view(...) of another shape, targets computed inside the model) cannot be traced back. Fix: {FIX_SHAPE}."
    )
