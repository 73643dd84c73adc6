"""CutMix: cutmix_batch against an explicit paste, the box draws, and the algorithm's target handling."""

from __future__ import annotations

import doctest

import pytest
import torch
import torch.nn.functional as F

import composer_bridge.algorithms.cutmix as cutmix_module
from composer_bridge import ComposerClassifier, Event, Logger, State
from composer_bridge.algorithms import CutMix
from composer_bridge.algorithms._boxes import random_box
from composer_bridge.functional import cutmix_batch


def pasted_one_by_one(x: torch.Tensor, permutation: list[int], box: tuple[int, int, int, int]) -> torch.Tensor:
    r0, c0, r1, c1 = box
    out = x.clone()
    for i, j in enumerate(permutation):
        for r in range(r0, r1):
            for c in range(c0, c1):
                out[i, ..., r, c] = x[j, ..., r, c]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape, box", [((5, 3, 6, 9), (1, 2, 5, 8)), ((1, 2, 4, 4), (0, 0, 4, 2))], ids=["non-square", "batch-of-1"]
)
def test_cutmix_batch_pastes_the_partners_box(dtype: torch.dtype, shape: tuple[int, ...],
                                              box: tuple[int, int, int, int]) -> None:
    x, y = torch.randn(shape).to(dtype), torch.randint(0, 4, shape[:1])
    permutation, before = torch.randperm(shape[0]), x.clone()
    mixed, y_perm, area, used = cutmix_batch(x, y, bbox=box, indices=permutation)
    assert used == box and mixed.dtype == dtype
    assert torch.equal(mixed, pasted_one_by_one(x, permutation.tolist(), box))
    assert torch.equal(y_perm, y[permutation])
    height, width = shape[-2:]
    assert area == pytest.approx(1 - (box[2] - box[0]) * (box[3] - box[1]) / (height * width))
    assert torch.equal(x, before)  # the input itself is left alone


def test_a_drawn_box_is_consistent_with_the_reported_area_and_reproducible() -> None:
    x, y = torch.randn(4, 1, 10, 7), torch.arange(4)
    first = cutmix_batch(x, y, alpha=1.0, generator=torch.Generator().manual_seed(5))
    again = cutmix_batch(x, y, alpha=1.0, generator=torch.Generator().manual_seed(5))
    mixed, y_perm, area, box = first
    assert torch.equal(mixed, again[0]) and box == again[3] and area == again[2]
    assert torch.equal(mixed, pasted_one_by_one(x, y_perm.tolist(), box))  # y = arange: y_perm is the pairing
    assert area == pytest.approx(1 - (box[2] - box[0]) * (box[3] - box[1]) / 70)


def test_length_sets_the_box_sides_as_fractions_of_the_image() -> None:
    for seed in range(20):
        _, _, _, (r0, c0, r1, c1) = cutmix_batch(torch.zeros(2, 1, 10, 20), torch.arange(2), length=0.4,
                                                 generator=torch.Generator().manual_seed(seed))
        assert r1 - r0 <= 4 and c1 - c0 <= 8
        assert 0 <= r0 <= r1 <= 10 and 0 <= c0 <= c1 <= 20


def coverage(uniform_sampling: bool, draws: int = 3000) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(8, 8)
    for _ in range(draws):
        r0, c0, r1, c1 = random_box(8, 8, 4, 4, uniform_sampling, generator)
        counts[r0:r1, c0:c1] += 1
    return counts / draws


def test_uniform_sampling_covers_corners_as_often_as_the_centre() -> None:
    uniform, paper = coverage(True), coverage(False)
    assert abs(uniform[0, 0] - uniform[3, 3]) < 0.05
    assert paper[0, 0] < 0.7 * paper[3, 3]  # 9/64 vs 16/64 of the draws


def test_bad_boxes_and_arguments_are_refused() -> None:
    x, y = torch.zeros(2, 1, 4, 4), torch.arange(2)
    with pytest.raises(ValueError, match="bbox or length, not both"):
        cutmix_batch(x, y, length=0.5, bbox=(0, 0, 1, 1))
    with pytest.raises(ValueError, match=r"bbox=\(0, 0, 5, 1\)\) does not fit 4x4"):
        cutmix_batch(x, y, bbox=(0, 0, 5, 1))
    with pytest.raises(ValueError, match=r"length=1.5"):
        cutmix_batch(x, y, length=1.5)
    with pytest.raises(ValueError, match=r"CutMix\(alpha=-1\).*>= 0"):
        CutMix(alpha=-1)
    with pytest.raises(TypeError, match="uniform_sampling"):
        CutMix(uniform_sampling="yes")  # type: ignore[arg-type]


def classifier_state(batch: object, classes: int = 3) -> State:
    net = torch.nn.Sequential(torch.nn.Conv2d(2, classes, 1))
    model = ComposerClassifier(torch.nn.Sequential(net, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()),
                               num_classes=classes)
    state = State(model, seed=3)
    state.batch = batch
    return state


def run_step(algorithm: CutMix, state: State, forward=None) -> None:
    forward = forward or state.model
    for event in (Event.BEFORE_FORWARD, Event.BEFORE_LOSS):
        if algorithm.match(event, state):
            algorithm.apply(event, state, Logger())
        if event == Event.BEFORE_FORWARD:
            state.outputs = forward(state.batch)
    state.loss = state.model.loss(state.outputs, state.batch)
    if algorithm.match(Event.BEFORE_BACKWARD, state):
        algorithm.apply(Event.BEFORE_BACKWARD, state, Logger())


def test_the_algorithm_mixes_class_targets_by_the_share_of_the_image_each_keeps() -> None:
    x, y = torch.randn(6, 2, 5, 7), torch.tensor([0, 1, 2, 0, 1, 2])
    algorithm = CutMix(alpha=1.0)
    state = classifier_state((x, y))
    run_step(algorithm, state)
    perm, area, box = algorithm.indices.tolist(), algorithm.area, algorithm.bbox
    assert torch.equal(state.batch[0], pasted_one_by_one(x, perm, box))
    expected = torch.stack([area * F.one_hot(y[i], 3).float() + (1 - area) * F.one_hot(y[perm[i]], 3).float()
                            for i in range(6)])
    torch.testing.assert_close(state.batch[1], expected)


def test_segmentation_targets_get_the_partners_box_pasted() -> None:
    x, y = torch.randn(4, 2, 6, 5), torch.randint(0, 3, (4, 6, 5))
    algorithm = CutMix(alpha=1.0)
    state = classifier_state((x, y))
    run_step(algorithm, state, forward=lambda batch: torch.zeros(4, 3, 6, 5))
    perm, box = algorithm.indices.tolist(), algorithm.bbox
    assert torch.equal(state.batch[1], pasted_one_by_one(y.unsqueeze(1), perm, box).squeeze(1))
    assert state.batch[1].dtype == y.dtype


def test_interpolate_loss_weights_the_two_losses_by_area() -> None:
    x, y = torch.randn(5, 2, 4, 4), torch.tensor([0, 1, 2, 1, 0])
    algorithm = CutMix(alpha=1.0, interpolate_loss=True)
    assert algorithm.interpolates_loss
    state = classifier_state((x, y))
    run_step(algorithm, state)
    assert torch.equal(state.batch[1], y)
    perm, area = algorithm.indices, algorithm.area
    logits = state.model.module(pasted_one_by_one(x, perm.tolist(), algorithm.bbox))
    torch.testing.assert_close(state.loss, area * F.cross_entropy(logits, y) + (1 - area) * F.cross_entropy(logits, y[perm]))


def test_interpolating_the_loss_of_segmentation_targets_is_refused() -> None:
    algorithm = CutMix(interpolate_loss=True)
    state = classifier_state((torch.randn(2, 2, 4, 4), torch.randint(0, 3, (2, 4, 4))))
    with pytest.raises(ValueError, match="per-pixel targets"):
        run_step(algorithm, state, forward=lambda batch: torch.zeros(2, 3, 4, 4))


def test_repr_evaluates_back_to_an_equal_algorithm() -> None:
    algorithm = CutMix(alpha=0.5, uniform_sampling=True, input_key="image", target_key="label")
    assert eval(repr(algorithm)) == algorithm
    assert algorithm.unique and algorithm.needs_loss_events


def test_docstring_examples_run() -> None:
    assert doctest.testmod(cutmix_module).failed == 0
