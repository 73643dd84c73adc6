"""SelectiveBackprop: the schedule, the loss-weighted draw, and the per-example loss paths of the algorithm."""

from __future__ import annotations

import doctest
import functools
import itertools
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import composer_bridge.algorithms.selective_backprop as selective_backprop_module
from composer_bridge import ComposerClassifier, Event, Logger, State, Timestamp
from composer_bridge.algorithms import SelectiveBackprop
from composer_bridge.functional import select_using_loss, should_selective_backprop


def test_should_selective_backprop_follows_the_interval_and_the_interruptions() -> None:
    for duration, batch_idx, interrupt in itertools.product([0.0, 0.3, 0.5, 0.7, 0.9, 0.95], range(6), [0, 1, 2, 3]):
        expected = 0.5 <= duration < 0.9 and (interrupt == 0 or (batch_idx + 1) % interrupt != 0)
        assert should_selective_backprop(duration, batch_idx, 0.5, 0.9, interrupt) == expected


def per_example_identity_loss(outputs: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    return outputs.squeeze(1)


def inclusion_by_enumeration(weights: list[float], count: int) -> list[float]:
    """P(item in the sample) when ``count`` items are drawn one by one without replacement, by weight."""
    total = sum(weights)
    inclusion = [0.0] * len(weights)
    for order in itertools.permutations(range(len(weights)), count):
        probability, left = 1.0, total
        for item in order:
            probability *= weights[item] / left
            left -= weights[item]
        for item in order:
            inclusion[item] += probability
    return inclusion


def test_the_draw_favours_high_losses_exactly_as_weighted_sampling_without_replacement() -> None:
    losses = torch.tensor([[3.0], [0.0], [2.0], [1.0]])  # ranks 3, 0, 2, 1
    keep, n, draws = 0.5, 4, 4000
    rank_weights = [((r + 0.5) / n) ** (1 / keep - 1) for r in range(n)]
    expected = inclusion_by_enumeration(rank_weights, 2)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(n)
    for _ in range(draws):
        _, kept = select_using_loss(losses, torch.arange(n), lambda x: x, per_example_identity_loss, keep,
                                    generator=generator)
        counts[kept] += 1
    ranks = [3, 0, 2, 1]
    for example in range(n):
        assert abs(counts[example].item() / draws - expected[ranks[example]]) < 0.03


def test_selection_keeps_inputs_and_targets_paired_and_at_least_one_example() -> None:
    x = torch.arange(10.0).view(10, 1)
    kept_x, kept_y = select_using_loss(x, x.squeeze(1).long(), lambda v: v, per_example_identity_loss, keep=1.0)
    assert sorted(kept_y.tolist()) == list(range(10)) and torch.equal(kept_x.squeeze(1).long(), kept_y)
    one_x, one_y = select_using_loss(x[:1], torch.tensor([7]), lambda v: v, per_example_identity_loss, keep=0.5)
    assert one_x.shape == (1, 1) and one_y.tolist() == [7]


def test_scale_factor_shrinks_only_the_selection_pass() -> None:
    seen: list[tuple[int, ...]] = []

    def model(inputs: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(inputs.shape))
        return inputs.flatten(1).mean(1, keepdim=True)

    x = torch.randn(6, 3, 8, 10)
    kept, _ = select_using_loss(x, torch.arange(6), model, per_example_identity_loss, keep=0.5, scale_factor=0.5)
    assert seen == [(6, 3, 4, 5)] and kept.shape == (3, 3, 8, 10)


def test_a_loss_that_reduces_over_the_batch_is_refused_with_the_fix() -> None:
    def mean_loss(outputs: torch.Tensor, target: torch.Tensor, reduction: str = "none") -> torch.Tensor:
        return outputs.mean()

    with pytest.raises(ValueError, match=r"one loss per example.*reduction='none'"):
        select_using_loss(torch.randn(4, 1), torch.arange(4), lambda v: v, mean_loss)


class ClassifierWithReduction(ComposerClassifier):
    """Composer's convention: loss(outputs, batch, reduction=...)."""

    def loss(self, outputs: torch.Tensor, batch: Any, reduction: str = "mean") -> torch.Tensor:
        return F.cross_entropy(outputs, batch[1], reduction=reduction)


def make_state(model_class: type = ComposerClassifier, precision: str = "32-true") -> State:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    state = State(model_class(net, num_classes=3), max_duration="10ba", seed=5, precision=precision)
    state.timestamp = Timestamp(batch=4, batch_in_epoch=4)
    state.batch = (torch.randn(10, 3, 2, 2), torch.randint(0, 3, (10,)))
    return state


@pytest.mark.parametrize(
    "model_class, loss_fn",
    [(ComposerClassifier, None), (ClassifierWithReduction, None),
     (ComposerClassifier, functools.partial(F.cross_entropy, reduction="none"))],
    ids=["vmap-over-model-loss", "model-loss-with-reduction", "loss_fn"],
)
def test_every_per_example_loss_path_selects_what_the_functional_form_selects(model_class: type, loss_fn: Any) -> None:
    state = make_state(model_class)
    x, y = state.batch
    net = state.model.module
    expected = select_using_loss(x, y, net, F.cross_entropy, keep=0.3,
                                 generator=make_state().generator("SelectiveBackprop", "cpu"))
    algorithm = SelectiveBackprop(start=0.0, end=1.0, keep=0.3, interrupt=0, loss_fn=loss_fn)
    assert algorithm.match(Event.AFTER_DATALOADER, state)
    algorithm.apply(Event.AFTER_DATALOADER, state, Logger())
    assert torch.equal(state.batch[0], expected[0]) and torch.equal(state.batch[1], expected[1])
    assert state.batch[0].shape[0] == 3


def test_the_selection_pass_runs_in_the_runs_mixed_precision_without_gradients() -> None:
    seen: list[tuple[bool, bool]] = []
    state = make_state(precision="bf16-mixed")
    original_forward = state.model.forward

    def recording_forward(batch: Any) -> torch.Tensor:
        seen.append((torch.is_autocast_enabled("cpu"), torch.is_grad_enabled()))
        return original_forward(batch)

    state.model.forward = recording_forward
    SelectiveBackprop(start=0, end=1, interrupt=0).apply(Event.AFTER_DATALOADER, state, Logger())
    assert seen == [(True, False)]


def test_a_model_loss_that_cannot_be_taken_per_example_asks_for_loss_fn() -> None:
    class Unvectorisable(ComposerClassifier):
        def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
            return F.cross_entropy(outputs, batch[1]) * float(outputs.sum().item() != 0)

    state = make_state(Unvectorisable)
    with pytest.raises(RuntimeError, match=r"per example.*loss_fn="):
        SelectiveBackprop(start=0, end=1, interrupt=0).apply(Event.AFTER_DATALOADER, state, Logger())


@pytest.mark.parametrize("start, end", [(0.5, 0.9), ("0.5dur", "0.9dur"), ("5ba", "9ba"), ("1ep", "0.9dur")])
def test_match_follows_the_schedule_given_as_fractions_or_time_strings(start: Any, end: Any) -> None:
    algorithm = SelectiveBackprop(start=start, end=end, interrupt=2)
    matched = []
    for batch in range(10):
        state = make_state()
        state.dataloader_len = 5
        state.timestamp = Timestamp(batch=batch, batch_in_epoch=batch % 5)
        matched.append(algorithm.match(Event.AFTER_DATALOADER, state))
    expected = [0.5 <= b / 10 < 0.9 and ((b % 5) + 1) % 2 != 0 for b in range(10)]
    assert matched == expected
    assert not algorithm.match(Event.BEFORE_FORWARD, make_state())
    assert not SelectiveBackprop(start=0, end=1, keep=1.0).match(Event.AFTER_DATALOADER, make_state())


@pytest.mark.parametrize("kwargs, match", [
    ({"keep": 0}, r"keep=0.*\(0, 1\]"),
    ({"keep": 1.5}, r"keep=1.5"),
    ({"scale_factor": 0}, r"scale_factor=0.*\(0, 1\]"),
    ({"interrupt": -1}, r"interrupt=-1.*>= 0"),
    ({"interrupt": "2ep"}, r"interrupt='2ep'.*'2ba'"),
    ({"start": 0.9, "end": 0.5}, "start must not come after end"),
    ({"start": "2.0dur"}, r"\[0, 1\]"),
])
def test_bad_hyper_parameters_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SelectiveBackprop(**kwargs)


def test_interrupt_may_be_a_batch_count() -> None:
    algorithm = SelectiveBackprop(start=0, end=1, interrupt="3ba")
    state = make_state()
    state.timestamp = Timestamp(batch=2, batch_in_epoch=2)
    assert not algorithm.match(Event.AFTER_DATALOADER, state)


def test_repr_evaluates_back_to_an_equal_algorithm() -> None:
    algorithm = SelectiveBackprop(start="0.2dur", end=0.8, keep=0.25, scale_factor=0.5, interrupt=0,
                                  input_key="x", target_key="y")
    assert eval(repr(algorithm)) == algorithm
    assert algorithm.unique and algorithm.needs_loss_events


def test_docstring_examples_run() -> None:
    assert doctest.testmod(selective_backprop_module).failed == 0


def test_apply_at_init_is_set_up_only_and_selects_nothing() -> None:
    state, fresh = make_state(), make_state()
    before = state.batch
    algorithm = SelectiveBackprop(start=0, end=1, interrupt=0)
    algorithm.apply(Event.INIT, state, Logger())
    assert state.batch is before, "INIT leaves the batch alone"
    algorithm.apply(Event.AFTER_DATALOADER, state, Logger())
    SelectiveBackprop(start=0, end=1, interrupt=0).apply(Event.AFTER_DATALOADER, fresh, Logger())
    assert torch.equal(state.batch[0], fresh.batch[0]), "INIT drew nothing from the run's generator"
    assert not algorithm.match(Event.INIT, state)  # the bridge checks the loss at set-up instead
    no_loss = State(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"Linear has no loss\(outputs, batch\).*loss_fn="):
        algorithm.apply(Event.INIT, no_loss, Logger())
    SelectiveBackprop(loss_fn=functools.partial(F.cross_entropy, reduction="none")).apply(Event.INIT, no_loss, Logger())


def test_a_loss_function_without_a_reduction_argument_is_told_it_needs_one() -> None:
    def plain_loss(outputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (outputs.squeeze(1) - target) ** 2

    x, y = torch.randn(4, 1), torch.zeros(4)
    with pytest.raises(TypeError, match=r"plain_loss must take a keyword argument `reduction`.*reduction='none'"):
        select_using_loss(x, y, lambda v: v, plain_loss)
    kept, _ = select_using_loss(x, y, lambda v: v, lambda out, t, **kw: plain_loss(out, t), keep=0.5)
    assert kept.shape == (2, 1)
