"""ZLoss: keep the softmax normaliser near one (PaLM, Chowdhery et al., 2022, section 5).

The auxiliary loss ``coefficient * mean(logsumexp(logits) ** 2)`` pulls ``log Z``, the log of the
softmax's normaliser, towards zero. Large logits are what make bf16 training of language models
diverge in loss spikes; PaLM trained with ``coefficient = 1e-4``, and OLMo 2 and others keep it.

Functional form :func:`z_loss` (what ``F.cross_entropy`` takes: the logits, classes along dimension
1 by default, and optionally the targets, whose ``ignore_index`` positions are left out of the
mean). The :class:`ZLoss` algorithm computes it on the logits the loss sees, at ``AFTER_FORWARD``,
and adds it to ``state.loss`` at ``AFTER_LOSS``.

Examples:
    >>> import torch
    >>> logits = torch.zeros(2, 4)  # log Z = log 4 for every row
    >>> round(float(z_loss(logits, coefficient=1.0)), 4)  # (log 4) ** 2
    1.9218
    >>> float(z_loss(logits, torch.tensor([1, -100]), coefficient=1.0)) == float(z_loss(logits[:1], coefficient=1.0))
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from composer_bridge.core.algorithm import Algorithm, declares
from composer_bridge.core.batch import BatchKey
from composer_bridge.core.event import Event

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["ZLoss", "z_loss"]


def z_loss(
    logits: torch.Tensor,
    target: torch.Tensor | None = None,
    coefficient: float = 1e-4,
    ignore_index: int = -100,
    class_dim: int = 1,
    ignore_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``coefficient * mean(logsumexp(logits, class_dim) ** 2)`` over the positions that are not ignored.

    Args:
        logits: ``(N, C)``, ``(N, C, d1, ...)`` (classes along ``class_dim=1``, as ``F.cross_entropy``
            takes them) or ``(..., C)`` with ``class_dim=-1`` (Hugging Face's ``(batch, sequence, vocabulary)``).
        target: optional, only to find the ignored positions: class indices shaped like ``logits``
            without the class dimension (positions equal to ``ignore_index`` are left out), or
            probabilities shaped like ``logits`` (all-zero rows are left out, as
            ``HuggingFaceModel``'s loss leaves them out).
        coefficient: the weight of the term (PaLM: ``1e-4``); ``>= 0``.
        ignore_index: the index targets' value for "no loss here" (``F.cross_entropy``'s default ``-100``).
        class_dim: where the classes are: ``1`` (default) or ``-1``.
        ignore_mask: instead of ``target``, a boolean tensor shaped like ``logits`` without the
            class dimension, ``True`` where a position is left out.

    Returns:
        A float32 scalar (float64 for float64 logits); ``0`` when every position is ignored. Its gradient with respect to the
        logits is ``coefficient * 2 * logsumexp * softmax / kept_positions`` at each kept position.

    Examples:
        >>> import torch
        >>> logits = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
        >>> round(float(z_loss(logits, coefficient=1.0)), 4)  # ((log 2)^2 + (2 + log(1 + e^-2))^2) / 2
        2.5021
        >>> float(z_loss(logits, ignore_mask=torch.tensor([True, True])))
        0.0
    """
    _check_coefficient(coefficient)
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.ndim < 1:
        raise TypeError(f"z_loss needs floating-point logits, got {type(logits).__name__} "
                        f"{getattr(logits, 'dtype', '')} {tuple(getattr(logits, 'shape', ()))}.")
    wide = logits if logits.dtype == torch.float64 else logits.float()  # bf16/fp16 logits: the sum in float32
    log_normaliser = torch.logsumexp(wide, dim=class_dim)
    squares = log_normaliser.square()
    if ignore_mask is None and target is not None:
        ignore_mask = ignored_positions(logits, target, ignore_index, class_dim)
    if ignore_mask is None:
        return coefficient * squares.mean()
    if ignore_mask.shape != squares.shape:
        raise ValueError(
            f"z_loss: ignore_mask has shape {tuple(ignore_mask.shape)} but the logits {tuple(logits.shape)} have "
            f"{tuple(squares.shape)} positions (classes along dimension {class_dim}). Fix: pass one boolean per "
            "position, True where it is ignored."
        )
    kept = (~ignore_mask.bool()).to(squares.dtype)
    return coefficient * (squares * kept).sum() / kept.sum().clamp(min=1)


class TargetShapeError(ValueError):
    """The targets fit neither class indices nor probabilities for the logits."""


def ignored_positions(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, class_dim: int) -> torch.Tensor:
    """``True`` where ``target`` marks a position of ``logits`` as ignored (see :func:`z_loss`)."""
    positions = logits.shape[:class_dim % logits.ndim] + logits.shape[class_dim % logits.ndim + 1:]
    if target.is_floating_point() and target.shape == logits.shape:  # probabilities: all-zero rows are ignored
        return ~(target != 0).any(dim=class_dim)
    if not target.is_floating_point() and target.shape == positions:
        return target == ignore_index
    raise TargetShapeError(
        f"z_loss: targets of shape {tuple(target.shape)} ({target.dtype}) fit neither class indices for logits "
        f"{tuple(logits.shape)} with the classes along dimension {class_dim} (expected {tuple(positions)}) nor "
        "probabilities shaped like the logits. Fix: pass the targets the loss uses (ZLoss: target_key=), the right "
        "class_dim, or target=None to count every position."
    )


def _check_coefficient(coefficient: float) -> None:
    if (isinstance(coefficient, bool) or not isinstance(coefficient, (int, float)) or not math.isfinite(coefficient)
            or coefficient < 0):
        raise ValueError(
            f"coefficient={coefficient!r} must be a finite number >= 0: the weight of the z-loss term added to the "
            "loss (PaLM used 1e-4; 0 adds nothing)."
        )


class ZLoss(Algorithm):
    """Add :func:`z_loss` of the logits the loss sees to the loss.

    At ``AFTER_FORWARD`` it computes the term on the outputs (a logits tensor, classes along
    dimension 1 unless the targets show them last; or an output object with ``.logits``, classes
    last) and the batch's targets at ``target_key`` (positions equal to ``ignore_index``, or
    all-zero probability rows, are left out of the mean); at ``AFTER_LOSS`` it adds it to
    ``state.loss``. With ``composer_bridge.hf.HuggingFaceModel`` the logits and labels are the ones
    its loss compares (shifted by one token for causal language models). A plain LightningModule
    works through the bridge's loss events: its ``training_step`` calls ``F.cross_entropy`` (or a
    criterion module) on the logits and the batch's targets, or their flattened views.

    Args:
        coefficient: weight of the term, ``>= 0``. Default ``1e-4`` (PaLM).
        target_key: where the targets are in the batch (index, dict key or ``(getter, setter)``),
            to find the ignored positions; ``None`` counts every position. A module's
            ``batch_keys`` sets it (``HuggingFaceModel``: ``"labels"``).
        ignore_index: the targets' value for an ignored position (``-100``, torch's and Hugging
            Face's default). Set it to the ``ignore_index`` your loss uses.
        class_dim: where the classes are in a logits tensor: ``None`` (default) infers it from
            the targets' shape (dimension 1 as ``F.cross_entropy``, or the last one); ``1`` or ``-1``.
            It describes a ComposerModule's outputs; for a plain LightningModule the bridge hands
            over the logits as its loss call took them (classes along dimension 1) and reads none,
            so a recipe's ``class_dim=-1`` works on both.

    Examples:
        >>> ZLoss()
        ZLoss(coefficient=0.0001, target_key=1, ignore_index=-100, class_dim=None)
    """

    unique = True
    needs_loss_events = True
    acts_per_position = True

    def __init__(
        self, coefficient: float = 1e-4, target_key: BatchKey | None = 1, ignore_index: int = -100,
        class_dim: int | None = None,
    ) -> None:
        _check_coefficient(coefficient)
        if class_dim not in (None, 1, -1):
            raise ValueError(f"ZLoss(class_dim={class_dim!r}): choose None (infer it), 1 or -1.")
        self.coefficient = coefficient
        self.target_key = target_key
        self.ignore_index = ignore_index
        self.class_dim = class_dim
        self._term: torch.Tensor | None = None  # computed at AFTER_FORWARD, added at AFTER_LOSS
        self._with_the_loss = False  # the targets did not fit the logits at AFTER_FORWARD

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.AFTER_FORWARD, Event.AFTER_LOSS)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.AFTER_FORWARD:
            # the targets are read here, before BEFORE_LOSS: algorithms that replace them (LabelSmoothing,
            # MixUp) have not run yet, so the ignored positions are still visible
            try:
                self._term, self._with_the_loss = self._computed(state), False
            except TargetShapeError:  # a plain module's derived targets (Hugging Face's shifted labels): read with the loss
                self._term, self._with_the_loss = None, True
        elif self._term is not None or self._with_the_loss:
            replacing = [type(a).__name__ for a in state.algorithms if declares(a, "replaces_targets")]
            if self._with_the_loss and replacing:
                raise ValueError(
                    f"ZLoss reads the ignored positions from the targets the step derives (the labels shifted inside "
                    f"the model), but {', '.join(replacing)} replaced them first, so the positions the loss leaves out "
                    "can no longer be told apart. Fix: use composer_bridge.hf.HuggingFaceModel (the targets stay the "
                    f"batch's), or leave {', '.join(replacing)} out beside ZLoss."
                )
            term = self._computed(state) if self._with_the_loss else self._term
            assert term is not None
            state.loss = state.loss + term.to(state.loss.dtype)
            self._term, self._with_the_loss = None, False

    def _computed(self, state: State) -> torch.Tensor:
        if True:
            logits, target, class_dim = self._logits_and_targets(state)
            if logits.ndim < 1 or logits.shape[class_dim] < 2:
                raise ValueError(
                    f"ZLoss needs logits over at least two classes, but the outputs have shape {tuple(logits.shape)} "
                    f"(one value along the class dimension {class_dim}: a regression or a binary logit), where "
                    "logsumexp is the output itself and the term would only shrink it. Fix: leave ZLoss out for this "
                    "model, or output one logit per class."
                )
            return z_loss(logits, target, self.coefficient, self.ignore_index, class_dim)

    def _logits_and_targets(self, state: State) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        outputs = state.outputs
        aligned = getattr(state.model, "logits_and_labels", None)  # HuggingFaceModel: the pairs its loss compares
        if not isinstance(outputs, torch.Tensor):
            logits = getattr(outputs, "logits", None)
            if logits is None and isinstance(outputs, Mapping):
                logits = outputs.get("logits")
            if not isinstance(logits, torch.Tensor):
                raise TypeError(
                    f"ZLoss needs the logits: a tensor, or an output object with a .logits tensor; the model "
                    f"returned {type(outputs).__name__}. Fix: return the logits from forward (ComposerModule), or "
                    "compute the loss with F.cross_entropy on them in training_step."
                )
            if self.target_key is None:
                return logits, None, -1
            if callable(aligned):
                logits, target = aligned(outputs, state.batch)
                return logits, target, -1
            return logits, self._target(state), -1
        target = self._target(state) if self.target_key is not None else None
        if state.loss_source is not None:
            # a plain module's loss call, as the bridge saw it: the logits as F.cross_entropy takes them, classes along
            # dimension 1 ((B, T, C) logits viewed as (B*T, C) are laid out as (B, C, T)); class_dim describes a
            # model's own outputs (a ComposerModule's), which a plain module's step never hands over
            return outputs, target, 1
        return outputs, target, self._class_dim(outputs, target)

    def _target(self, state: State) -> torch.Tensor:
        target = state.batch_get_item(self.target_key)
        if not isinstance(target, torch.Tensor):
            raise TypeError(
                f"ZLoss reads the targets at target_key={self.target_key!r} to leave the ignored positions out, but "
                f"found {type(target).__name__}. Fix: point target_key at the target tensor, or target_key=None to "
                "count every position."
            )
        return target

    def _class_dim(self, logits: torch.Tensor, target: torch.Tensor | None) -> int:
        if self.class_dim is not None or logits.ndim <= 2:
            return self.class_dim or 1
        fits = []
        if target is not None:
            for dim in (1, -1):
                if target.shape == logits.shape or target.shape == logits.shape[:dim % logits.ndim] + logits.shape[
                        dim % logits.ndim + 1:]:
                    fits.append(dim)
        if len(fits) == 1:
            return fits[0]
        seen = "no targets" if target is None else f"targets {tuple(target.shape)}"
        raise ValueError(
            f"ZLoss cannot tell where the classes are in logits of shape {tuple(logits.shape)} from {seen}: "
            "dimension 1 (F.cross_entropy's layout) and the last dimension both fit. Fix: pass ZLoss(class_dim=1) "
            "or ZLoss(class_dim=-1)."
        )
