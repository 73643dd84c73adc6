"""The loss events for a plain LightningModule, whose ``training_step`` computes forward and loss itself.

LabelSmoothing, MixUp, CutMix and SelectiveBackprop act between the forward pass and the loss.
A :class:`~composer_bridge.ComposerModule` keeps the two apart; a plain module's
``training_step`` does both, in one of two shapes::

    loss = self.criterion(self(x), y)          # a criterion submodule (nn.CrossEntropyLoss(), ...)
    loss = F.cross_entropy(self(x), y)         # a functional call

Both end in a call of ``torch.nn.functional.cross_entropy`` (or ``binary_cross_entropy_with_logits``,
``binary_cross_entropy``, ``nll_loss``): the criterion modules call the functional form. This
package makes such a step fire Composer's loss events, in four parts, read in this order:

1. **Intercepting torch's loss calls** (:mod:`.torch_functions`): while a step runs, those
   functions of ``torch.nn.functional`` hand each call, on the step's own thread only, to a
   handler; other threads and calls made by the handler itself get the original function.
2. **The seen call** (:mod:`.seen_call`): a call the step made, with its options
   (:class:`~.seen_call.LossCall`), recomputed exactly on the targets the algorithms produce
   (probabilities, with ignored positions left out as torch leaves them out), and the tests that
   tell the batch's own target tensor, a flattened view of it and derived class indices apart.
3. **The set-up refusals** (:mod:`.setup_refusals`, :func:`check_plain_module`): what the module
   shows before its first step (a criterion submodule's options, manual optimization, a
   ``forward`` that needs more than the inputs) and cannot be made exact is refused at ``setup``.
4. **The per-step interception** (:mod:`.step_events`, :class:`PlainLossStep`): ``training_step``
   wrapped for the run (the targets' rules in :mod:`.target_rules`, its refusals in words in
   :mod:`.step_diagnostics`). For one step:

   a. ``BEFORE_FORWARD`` fires on the batch Lightning passes (MixUp and CutMix mix its inputs),
      and ``training_step`` receives the result;
   b. each loss call is classified; the first whose target *is* the batch's target tensor
      (``batch[target_key]``, or a view of it with the same shape, such as ``y.view(-1)`` of a 1-D
      ``y``) becomes the step's loss, and its loss events fire: ``AFTER_FORWARD``
      (``state.outputs`` = the call's input, the logits), ``BEFORE_LOSS`` (the algorithms replace
      the targets in a copy of the batch), the call itself with the new targets and the call's
      own options, ``AFTER_LOSS``; the call returns ``state.loss``;
   c. after the step, ``BEFORE_BACKWARD`` on the loss the step returned (MixUp's and CutMix's
      ``interpolate_loss=True`` act here, through :class:`~composer_bridge.core.loss_source.LossSource`).

Sequence shapes, recognised in step b:

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

What cannot be made exact is refused, at setup where the module shows it (part 3) and otherwise
in the first step that shows it, before any backward pass (so no weight changes): a step that
never calls a supported loss on the batch's targets, ``nll_loss`` on values that are not
log-probabilities, an ``ignore_index`` with targets mixed across examples, ``label_smoothing=``
with targets turned into probabilities, derived targets (``y.float()``, a copy) for algorithms
that act per sample, a batch that is a bare tensor.

Examples:
    A module that runs its own backward pass cannot have its loss interpolated; mixing the targets works
    (more set-up refusals in :mod:`.setup_refusals`):

    >>> import torch
    >>> from composer_bridge.algorithms import MixUp
    >>> class Manual(torch.nn.Module):
    ...     automatic_optimization = False
    >>> check_plain_module([MixUp()], Manual())  # the targets are mixed: nothing to refuse
    >>> try:
    ...     check_plain_module([MixUp(interpolate_loss=True)], Manual())
    ... except ValueError as error:
    ...     print(str(error)[:72])
    MixUp interpolates the loss your training_step returns, just before the
"""

from composer_bridge.lightning.plain_loss.setup_refusals import check_plain_module
from composer_bridge.lightning.plain_loss.step_events import CHECKPOINT_KEY, PlainLossStep

__all__ = ["CHECKPOINT_KEY", "PlainLossStep", "check_plain_module"]
