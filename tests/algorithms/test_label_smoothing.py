"""LabelSmoothing: smooth_labels against the formula, and the algorithm swapping targets around the loss."""

from __future__ import annotations

import doctest
import itertools
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import composer_bridge.algorithms.label_smoothing as label_smoothing_module
from composer_bridge import Event, Logger, State
from composer_bridge.algorithms import LabelSmoothing
from composer_bridge.functional import smooth_labels


def smoothed_by_formula(target: torch.Tensor, num_classes: int, smoothing: float) -> torch.Tensor:
    """Class indices (N, ...) -> smoothed probabilities (N, C, ...), one element at a time."""
    out = torch.empty(target.shape[0], num_classes, *target.shape[1:])
    for index in itertools.product(*(range(size) for size in target.shape)):
        for c in range(num_classes):
            hit = 1.0 if int(target[index]) == c else 0.0
            out[(index[0], c, *index[1:])] = (1 - smoothing) * hit + smoothing / num_classes
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5,), (1,), (2, 3, 5)], ids=["classification", "batch-of-1", "segmentation"])
def test_smooth_labels_matches_the_formula_for_index_targets(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    num_classes, smoothing = 4, 0.2
    target = torch.randint(0, num_classes, shape)
    logits = torch.randn(shape[0], num_classes, *shape[1:]).to(dtype)
    out = smooth_labels(logits, target, smoothing)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, smoothed_by_formula(target, num_classes, smoothing))


def test_smooth_labels_shrinks_probability_targets_and_keeps_their_dtype() -> None:
    soft = torch.softmax(torch.randn(3, 5), dim=1).to(torch.bfloat16)
    out = smooth_labels(torch.zeros(3, 5), soft, smoothing=0.5)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, soft * 0.5 + 0.1)
    torch.testing.assert_close(out.float().sum(1), torch.ones(3), atol=2e-2, rtol=0)


@pytest.mark.parametrize("smoothing", [0.0, 1.0])
def test_the_ends_of_the_range_leave_the_targets_or_make_them_uniform(smoothing: float) -> None:
    out = smooth_labels(torch.zeros(2, 4), torch.tensor([1, 3]), smoothing)
    expected = torch.full((2, 4), 0.25) if smoothing == 1 else torch.eye(4)[[1, 3]]
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan, "0.1", True])
def test_smoothing_outside_zero_one_is_refused_with_the_allowed_range(bad: object) -> None:
    with pytest.raises(ValueError, match=r"smoothing=.*\[0, 1\]"):
        LabelSmoothing(smoothing=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"smoothing"):
        smooth_labels(torch.zeros(2, 3), torch.tensor([0, 1]), bad)  # type: ignore[arg-type]


def test_targets_that_fit_neither_indices_nor_probabilities_are_refused() -> None:
    with pytest.raises(ValueError, match=r"shape \(2, 7\).*target_key"):
        smooth_labels(torch.zeros(2, 3), torch.zeros(2, 7))


def test_the_algorithm_smooths_for_the_loss_and_restores_the_labels_after_it() -> None:
    algorithm = LabelSmoothing(smoothing=0.3, target_key="label")
    labels = torch.tensor([2, 0])
    state = State(torch.nn.Identity())
    state.batch = {"image": torch.zeros(2, 1), "label": labels}
    state.outputs = torch.zeros(2, 3)
    assert algorithm.match(Event.BEFORE_LOSS, state) and algorithm.match(Event.AFTER_LOSS, state)
    assert not algorithm.match(Event.AFTER_DATALOADER, state)
    algorithm.apply(Event.BEFORE_LOSS, state, Logger())
    torch.testing.assert_close(state.batch["label"], smoothed_by_formula(labels, 3, 0.3))
    algorithm.apply(Event.AFTER_LOSS, state, Logger())
    assert state.batch["label"] is labels


def test_classes_last_smooths_along_the_last_dimension_and_keeps_ignored_rows_zero() -> None:
    logits = torch.randn(2, 5, 7)  # (batch, sequence, vocabulary), as Hugging Face's LM logits
    target = torch.randint(0, 7, (2, 5))
    target[0, :2] = -100
    target[1, 4] = -3  # any negative label is ignored
    out = smooth_labels(logits, target, 0.2, class_dim=-1)
    ignored = target < 0
    expected = smoothed_by_formula(target.clamp(min=0).reshape(-1), 7, 0.2).reshape(2, 5, 7)
    torch.testing.assert_close(out[~ignored], expected[~ignored])
    assert not out[ignored].any()
    # soft cross-entropy over the kept rows is PyTorch's label-smoothed cross-entropy
    log_p = F.log_softmax(logits, dim=-1)
    soft = -(out * log_p).sum(-1).sum() / (~ignored).sum()
    reference_target = target.masked_fill(ignored, -100).reshape(-1)
    torch.testing.assert_close(soft, F.cross_entropy(logits.reshape(-1, 7), reference_target, label_smoothing=0.2))


def test_tensor_outputs_keep_classes_on_dimension_1_even_when_the_last_would_fit() -> None:
    # (N, C, L) logits with N == C == L: targets (N, L) fit both layouts; a tensor means classes at 1.
    algorithm = LabelSmoothing(smoothing=0.3, target_key="y")
    labels = torch.randint(0, 3, (3, 3))
    state = State(torch.nn.Identity())
    state.batch, state.outputs = {"y": labels}, torch.zeros(3, 3, 3)
    algorithm.apply(Event.BEFORE_LOSS, state, Logger())
    torch.testing.assert_close(state.batch["y"], smoothed_by_formula(labels, 3, 0.3))


@pytest.mark.parametrize("wrap", [lambda x: SimpleNamespace(logits=x, loss=None), lambda x: {"logits": x}],
                         ids=["attribute", "mapping"])
def test_outputs_with_logits_smooth_over_the_last_dimension_and_restore_the_labels(wrap) -> None:
    algorithm = LabelSmoothing(smoothing=0.1, target_key="labels")
    labels = torch.tensor([[1, 2, -100], [-100, 0, 3]])
    state = State(torch.nn.Identity())
    state.batch, state.outputs = {"input_ids": labels.clamp(min=0), "labels": labels}, wrap(torch.zeros(2, 3, 4))
    algorithm.apply(Event.BEFORE_LOSS, state, Logger())
    torch.testing.assert_close(state.batch["labels"], smooth_labels(torch.zeros(2, 3, 4), labels, 0.1, class_dim=-1))
    assert state.batch["labels"][0, 1].tolist() == pytest.approx([0.025, 0.025, 0.925, 0.025])
    assert not state.batch["labels"][1, 0].any()
    algorithm.apply(Event.AFTER_LOSS, state, Logger())
    assert state.batch["labels"] is labels


def test_outputs_without_logits_are_refused_naming_the_types() -> None:
    state = State(torch.nn.Identity())
    state.batch, state.outputs = (torch.zeros(2, 1), torch.tensor([0, 1])), ("not", "logits")
    with pytest.raises(TypeError, match=r"tensor outputs.*\.logits.*tuple"):
        LabelSmoothing().apply(Event.BEFORE_LOSS, state, Logger())


def test_class_dim_other_than_1_or_last_is_refused() -> None:
    with pytest.raises(ValueError, match=r"class_dim=2"):
        smooth_labels(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), class_dim=2)


def test_repr_evaluates_back_to_an_equal_algorithm() -> None:
    algorithm = LabelSmoothing(smoothing=0.05, target_key="y")
    assert eval(repr(algorithm)) == algorithm
    assert algorithm.unique and algorithm.needs_loss_events


def test_docstring_examples_run() -> None:
    assert doctest.testmod(label_smoothing_module).failed == 0
