"""CutMix: paste a box from a partner example into each image and mix the targets by area (Yun et al., 2019).

Functional form :func:`cutmix_batch`; the :class:`CutMix` algorithm cuts and pastes at
``BEFORE_FORWARD`` and then mixes the targets at ``BEFORE_LOSS`` (per-pixel targets get the
partner's box pasted instead) or, with ``interpolate_loss=True``, interpolates two losses at
``BEFORE_BACKWARD``.

A box is ``(row_start, col_start, row_end, col_end)``: rows index dimension ``-2`` (height),
columns dimension ``-1`` (width), ends excluded, so it selects ``x[..., r0:r1, c0:c1]``.

Examples:
    >>> import torch
    >>> x = torch.stack([torch.zeros(1, 2, 4), torch.ones(1, 2, 4)])
    >>> mixed, y_partner, area, box = cutmix_batch(x, torch.tensor([0, 1]), bbox=(0, 0, 2, 1),
    ...                                            indices=torch.tensor([1, 0]))
    >>> mixed[0, 0].tolist(), area
    ([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]], 0.75)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from composer_bridge.algorithms._boxes import Box, random_box
from composer_bridge.algorithms._draws import random_permutation, sample_beta
from composer_bridge.algorithms._mixing import (
    LossOrTargetMixing,
    check_alpha,
    loss_against,
    require_floating_inputs,
    require_tensors,
)
from composer_bridge.algorithms._targets import targets_as_probabilities
from composer_bridge.core.algorithm import Algorithm
from composer_bridge.core.batch import BatchKey
from composer_bridge.core.event import Event

if TYPE_CHECKING:
    from composer_bridge.core.logger import Logger
    from composer_bridge.core.state import State

__all__ = ["CutMix", "cutmix_batch"]


def _box_for_lambda(height: int, width: int, cutmix_lambda: float, uniform_sampling: bool,
                    generator: torch.Generator | None) -> Box:
    """A box covering about ``1 - cutmix_lambda`` of the image (sides scaled by ``sqrt(1 - lambda)``)."""
    ratio = math.sqrt(1.0 - cutmix_lambda)
    return random_box(height, width, int(height * ratio), int(width * ratio), uniform_sampling, generator)


def _unmixed_fraction(height: int, width: int, box: Box) -> float:
    return 1.0 - (box[2] - box[0]) * (box[3] - box[1]) / (height * width)


def cutmix_batch(
    input: torch.Tensor,
    target: torch.Tensor,
    length: float | None = None,
    alpha: float = 1.0,
    bbox: Box | None = None,
    indices: torch.Tensor | None = None,
    uniform_sampling: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, float, Box]:
    """Replace one box of every image with the same box of its partner ``input[indices]``.

    The box is, in order of precedence: ``bbox``; a ``length * H`` by ``length * W`` box around a
    random centre; or a box covering about ``1 - lambda`` of the image, ``lambda ~ Beta(alpha,
    alpha)``. Boxes are clipped at the image edges, and the returned ``area`` is measured after
    clipping. One box serves the whole batch.

    Args:
        input: ``(N, C, H, W)`` images (any ``(N, ..., H, W)``).
        target: ``(N, ...)`` targets, returned permuted (mix them with the weights
            ``area`` for the example's own target and ``1 - area`` for its partner's).
        length: the box's side as a fraction of each image side, in ``[0, 1]``.
        alpha: Beta concentration for the box's area when neither ``bbox`` nor ``length`` is given.
        bbox: ``(row_start, col_start, row_end, col_end)``.
        indices: each example's partner (a permutation of ``range(N)``); drawn if ``None``.
        uniform_sampling: draw the centre so that every pixel is equally likely to be covered.
        generator: the source of the draws (a CPU generator keeps the box off the device).

    Returns:
        ``(mixed_input, permuted_target, area, bbox)``, where ``area`` is the fraction of each
        image that is still its own.

    Examples:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> mixed, y_perm, area, box = cutmix_batch(torch.randn(4, 3, 8, 6), torch.arange(4), generator=g)
        >>> mixed.shape, 0.0 <= area <= 1.0, len(box)
        (torch.Size([4, 3, 8, 6]), True, 4)
    """
    if input.ndim < 3:
        raise ValueError(f"cutmix_batch needs images of shape (N, C, H, W), got shape {tuple(input.shape)}.")
    if bbox is not None and length is not None:
        raise ValueError(f"cutmix_batch: give bbox or length, not both (got length={length!r}, bbox={bbox!r}).")
    height, width = input.shape[-2], input.shape[-1]
    if bbox is None:
        if length is not None:
            if isinstance(length, bool) or not isinstance(length, (int, float)) or not 0 <= length <= 1:
                raise ValueError(f"cutmix_batch(length={length!r}): length must be a fraction in [0, 1].")
            bbox = random_box(height, width, int(length * height), int(length * width), uniform_sampling, generator)
        else:
            check_alpha(alpha, "cutmix_batch", 1.0)
            bbox = _box_for_lambda(height, width, sample_beta(alpha, generator), uniform_sampling, generator)
    r0, c0, r1, c1 = (int(v) for v in bbox)
    if not (0 <= r0 <= r1 <= height and 0 <= c0 <= c1 <= width):
        raise ValueError(
            f"cutmix_batch(bbox={bbox!r}) does not fit {height}x{width} images: expected "
            "(row_start, col_start, row_end, col_end) with 0 <= start <= end <= size."
        )
    if indices is None:
        indices = random_permutation(input.shape[0], input.device, generator)
    mixed = input.clone()
    mixed[..., r0:r1, c0:c1] = input[..., r0:r1, c0:c1][indices]
    return mixed, target[indices], _unmixed_fraction(height, width, (r0, c0, r1, c1)), (r0, c0, r1, c1)


def _is_dense(target: torch.Tensor, input: torch.Tensor) -> bool:
    """Per-pixel targets (segmentation): the box is pasted into them rather than mixed by area."""
    return target.ndim > 2 and target.shape[-2:] == input.shape[-2:]


class CutMix(LossOrTargetMixing, Algorithm):
    """Train on images with a box pasted in from a partner image, and targets mixed by area.

    At ``BEFORE_FORWARD`` a random pairing and one box per micro-batch are drawn from the run's
    generator (box area ``~ 1 - lambda``, ``lambda ~ Beta(alpha, alpha)``) and the partner's box
    is pasted into every image. At ``BEFORE_LOSS`` the targets become
    ``area * own + (1 - area) * partner`` (one-hot), where ``area`` is the share of the image
    that is still its own; per-pixel targets (same height and width as the images) get the
    partner's box pasted instead. With ``interpolate_loss=True`` the targets stay and at
    ``BEFORE_BACKWARD`` the loss becomes ``area * loss + (1 - area) * loss_against_partners``.

    Args:
        alpha: Beta concentration, ``>= 0``. Default ``1.0`` (the box area is uniform).
        interpolate_loss: interpolate the losses instead of the targets. Default ``False``.
        uniform_sampling: every pixel equally likely to be covered. Default ``False``
            (centre uniform over the image, as in the paper).
        input_key: where the inputs are in the batch (index, dict key or ``(getter, setter)``).
        target_key: where the targets are in the batch.

    Examples:
        >>> CutMix(alpha=1.0)
        CutMix(alpha=1.0, interpolate_loss=False, uniform_sampling=False, input_key=0, target_key=1)
    """

    needs = frozenset({"image"})
    unique = True
    augments_data = True
    mixes_examples = True
    needs_loss_events = True

    def __init__(
        self,
        alpha: float = 1.0,
        interpolate_loss: bool = False,
        uniform_sampling: bool = False,
        input_key: BatchKey = 0,
        target_key: BatchKey = 1,
    ) -> None:
        check_alpha(alpha, "CutMix", 1.0)
        for name, value in (("interpolate_loss", interpolate_loss), ("uniform_sampling", uniform_sampling)):
            if not isinstance(value, bool):
                raise TypeError(f"CutMix({name}={value!r}): must be True or False.")
        self.alpha = alpha
        self.interpolates_loss = interpolate_loss
        self.uniform_sampling = uniform_sampling
        self.input_key = input_key
        self.target_key = target_key
        self.area = 1.0
        self.bbox: Box = (0, 0, 0, 0)
        self.indices: torch.Tensor | None = None
        self.permuted_target: torch.Tensor | None = None

    def match(self, event: Event, state: State) -> bool:
        second = Event.BEFORE_BACKWARD if self.interpolates_loss else Event.BEFORE_LOSS
        return event == Event.BEFORE_FORWARD or event == second

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        name = type(self).__name__
        input = state.batch_get_item(self.input_key)
        target = state.batch_get_item(self.target_key)
        require_tensors(name, inputs=input, targets=target)
        if event == Event.BEFORE_FORWARD:
            require_floating_inputs(name, input, self.input_key)
            if input.ndim < 3:
                raise ValueError(f"CutMix needs images of shape (N, C, H, W), got inputs of shape {tuple(input.shape)}.")
            host = state.generator(name, "cpu")
            self.bbox = _box_for_lambda(
                input.shape[-2], input.shape[-1], sample_beta(self.alpha, host), self.uniform_sampling, host
            )
            self.indices = random_permutation(input.shape[0], input.device, state.generator(name, input.device))
            mixed, self.permuted_target, self.area, _ = cutmix_batch(
                input, target, bbox=self.bbox, indices=self.indices
            )
            state.batch_set_item(self.input_key, mixed)
            return
        partner = self.permuted_target
        assert partner is not None, "CutMix: BEFORE_FORWARD did not run for this micro-batch"
        self.permuted_target = None
        if event == Event.BEFORE_LOSS:
            if _is_dense(partner, input):
                r0, c0, r1, c1 = self.bbox
                pasted = target.clone()
                pasted[..., r0:r1, c0:c1] = partner[..., r0:r1, c0:c1]
                state.batch_set_item(self.target_key, pasted)
            else:
                require_tensors(name, outputs=state.outputs)
                own = targets_as_probabilities(state.outputs, target)
                other = targets_as_probabilities(state.outputs, partner)
                state.batch_set_item(self.target_key, own * self.area + other * (1.0 - self.area))
            return
        if _is_dense(partner, input):
            raise ValueError(
                "CutMix(interpolate_loss=True) cannot interpolate the loss of per-pixel targets (their boxes are "
                "pasted, not weighted). Use CutMix(interpolate_loss=False) for segmentation."
            )
        partner_loss = loss_against(state, self.target_key, partner, name)
        state.loss = state.loss * self.area + partner_loss * (1.0 - self.area)
