"""MixUp: mixup_batch against explicit per-example mixing, the Beta draws, and the algorithm's two modes."""

from __future__ import annotations

import doctest
import math

import pytest
import torch
import torch.nn.functional as F

import composer_bridge.algorithms.mixup as mixup_module
from composer_bridge import ComposerClassifier, Event, Logger, State
from composer_bridge.algorithms import MixUp
from composer_bridge.algorithms._draws import sample_beta
from composer_bridge.functional import mixup_batch


def mixed_one_by_one(x: torch.Tensor, permutation: list[int], mixing: float) -> torch.Tensor:
    return torch.stack([(1 - mixing) * x[i] + mixing * x[permutation[i]] for i in range(x.shape[0])])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "input_shape, target_shape",
    [((6, 3, 5, 7), (6,)), ((1, 3, 4, 4), (1,)), ((4, 2, 6, 3), (4, 6, 3))],
    ids=["non-square", "batch-of-1", "segmentation"],
)
def test_mixup_batch_mixes_each_example_with_its_partner(dtype: torch.dtype, input_shape: tuple[int, ...],
                                                         target_shape: tuple[int, ...]) -> None:
    x = torch.randn(input_shape).to(dtype)
    y = torch.randint(0, 5, target_shape)
    permutation = torch.randperm(x.shape[0])
    mixed, y_perm, mixing = mixup_batch(x, y, mixing=0.3, indices=permutation)
    assert mixing == 0.3 and mixed.dtype == dtype
    torch.testing.assert_close(mixed, mixed_one_by_one(x, permutation.tolist(), 0.3))
    assert torch.equal(y_perm, torch.stack([y[int(j)] for j in permutation]))


def test_mixup_batch_draws_the_weight_of_the_partner_at_most_one_half_and_reproducibly() -> None:
    x, y = torch.randn(8, 3), torch.arange(8)
    first = mixup_batch(x, y, alpha=1.0, generator=torch.Generator().manual_seed(3))
    again = mixup_batch(x, y, alpha=1.0, generator=torch.Generator().manual_seed(3))
    assert 0 <= first[2] <= 0.5
    assert first[2] == again[2] and torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert sorted(first[1].tolist()) == list(range(8))


@pytest.mark.parametrize("alpha", [0.2, 1.0, 3.0])
def test_sample_beta_has_the_mean_and_variance_of_beta_alpha_alpha(alpha: float) -> None:
    generator = torch.Generator().manual_seed(0)
    draws = torch.tensor([sample_beta(alpha, generator) for _ in range(3000)], dtype=torch.float64)
    variance = 1 / (4 * (2 * alpha + 1))
    assert abs(draws.mean().item() - 0.5) < 4 * math.sqrt(variance / 3000)
    assert abs(draws.var().item() - variance) < 0.15 * variance
    assert ((draws >= 0) & (draws <= 1)).all()


def test_alpha_zero_means_no_mixing() -> None:
    x = torch.randn(4, 2)
    mixed, _, mixing = mixup_batch(x, torch.arange(4), alpha=0.0)
    assert mixing == 0.0 and torch.equal(mixed, x)


@pytest.mark.parametrize("bad", [-1, -0.5, math.inf, math.nan, "0.2"])
def test_a_negative_or_non_finite_alpha_is_refused_with_the_allowed_range(bad: object) -> None:
    with pytest.raises(ValueError, match=r"alpha=.*>= 0"):
        MixUp(alpha=bad)  # type: ignore[arg-type]


def test_mixing_outside_zero_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"mixing=1.5.*\[0, 1\]"):
        mixup_batch(torch.zeros(2, 1), torch.zeros(2), mixing=1.5)


def classifier_state(batch: object, seed: int = 0) -> State:
    model = ComposerClassifier(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3)), num_classes=3,
                               input_key="x", target_key="y")
    state = State(model, seed=seed)
    state.batch = batch
    return state


def run_step(algorithm: MixUp, state: State) -> None:
    """What the bridge does for one micro-batch, with the algorithm's events in between."""
    for event in (Event.BEFORE_FORWARD, Event.BEFORE_LOSS):
        if algorithm.match(event, state):
            algorithm.apply(event, state, Logger())
        if event == Event.BEFORE_FORWARD:
            state.outputs = state.model(state.batch)
    state.loss = state.model.loss(state.outputs, state.batch)
    if algorithm.match(Event.BEFORE_BACKWARD, state):
        algorithm.apply(Event.BEFORE_BACKWARD, state, Logger())


def test_the_algorithm_mixes_inputs_and_one_hot_targets_with_the_same_pairs_and_weight() -> None:
    x, y = torch.randn(5, 3, 2, 2), torch.tensor([0, 1, 2, 1, 0])
    algorithm = MixUp(alpha=1.0, input_key="x", target_key="y")
    state = classifier_state({"x": x, "y": y})
    run_step(algorithm, state)
    m, perm = algorithm.mixing, algorithm.indices.tolist()
    assert 0 < m <= 0.5
    torch.testing.assert_close(state.batch["x"], mixed_one_by_one(x, perm, m))
    expected = torch.stack([(1 - m) * F.one_hot(y[i], 3).float() + m * F.one_hot(y[perm[i]], 3).float()
                            for i in range(5)])
    torch.testing.assert_close(state.batch["y"], expected)


def test_interpolate_loss_keeps_the_targets_and_interpolates_two_losses() -> None:
    x, y = torch.randn(6, 3, 2, 2), torch.tensor([0, 1, 2, 1, 0, 2])
    algorithm = MixUp(alpha=1.0, interpolate_loss=True, input_key="x", target_key="y")
    assert algorithm.interpolates_loss and not MixUp().interpolates_loss
    state = classifier_state({"x": x, "y": y})
    run_step(algorithm, state)
    assert torch.equal(state.batch["y"], y)
    m, perm = algorithm.mixing, algorithm.indices
    logits = state.model.module(mixed_one_by_one(x, perm.tolist(), m))
    expected = (1 - m) * F.cross_entropy(logits, y) + m * F.cross_entropy(logits, y[perm])
    torch.testing.assert_close(state.loss, expected)


def test_draws_depend_only_on_the_run_seed_and_position() -> None:
    batch = {"x": torch.randn(8, 3, 2, 2), "y": torch.randint(0, 3, (8,))}
    draws = []
    for seed, micro in ((1, 0), (1, 0), (1, 1), (2, 0)):
        algorithm = MixUp(alpha=1.0, input_key="x", target_key="y")
        state = classifier_state(dict(batch), seed=seed)
        state.microbatch_index = micro
        algorithm.apply(Event.BEFORE_FORWARD, state, Logger())
        draws.append((algorithm.mixing, algorithm.indices.tolist()))
    assert draws[0] == draws[1]
    assert draws[2] != draws[0] and draws[3] != draws[0]


def test_repr_evaluates_back_to_an_equal_algorithm() -> None:
    algorithm = MixUp(alpha=0.4, interpolate_loss=True, input_key="image", target_key="label")
    assert eval(repr(algorithm)) == algorithm
    assert algorithm.unique and algorithm.needs_loss_events


def test_docstring_examples_run() -> None:
    assert doctest.testmod(mixup_module).failed == 0
