"""Sequence losses written the usual way: ``F.cross_entropy(logits.view(-1, C), y.view(-1))``.

(Per-pixel targets flattened the same way, ``y.view(-1)`` of ``(B, H, W)``, are covered at the end.)

The step flattens the batch's ``(B, T)`` targets with a view (``view``, ``reshape``, ``flatten``),
so every position still belongs to its sample. The references need no trust in the bridge:

- per-token classifiers (float features, so MixUp can mix them) against the same network trained as
  a ComposerModule whose ``forward`` returns ``(B, C, T)`` logits: equal losses, targets and weights;
- LabelSmoothing with an ``ignore_index`` against plain Lightning, no callback, whose step passes
  torch's own ``label_smoothing=`` (the same maths by another implementation: equal to float rounding);
- ``nll_loss`` after ``log_softmax`` against the same torch reference on the logits.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.plain_loss_probes import Recorder, TargetProbe
from helpers.support import ComposerModule, L, quiet_trainer
from helpers.tolerances import assert_float32_runs_near_float64
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import Algorithm, AlgorithmEngineCallback
from composer_bridge.algorithms import CutMix, LabelSmoothing, MixUp, SelectiveBackprop
from composer_bridge.core.algorithm import AlgorithmError
from composer_bridge.lightning.setup_checks import BridgeConfigurationError

B, T, FEATURES, CLASSES, VOCAB = 8, 6, 5, 4, 11
STEPS = 4


class SGDRecorder(Recorder):
    """The shared recorder with this file's optimizer."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.9)  # type: ignore[attr-defined]


# --- per-token classifiers on float features: (B, T, F) -> (B, T, C) --------------------------------
def tagger() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))


def feature_loader() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4 * B, T, FEATURES, generator=g)
    y = (x[..., 0] > 0).long() + 2 * (x[..., 1] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=B)


class Tagger(SGDRecorder, L.LightningModule):
    """The step flattens (B, T, C) logits and (B, T) targets, as language models do."""

    def __init__(self, shape: str) -> None:
        super().__init__()
        self.net, self.shape = tagger(), shape
        self.criterion = torch.nn.CrossEntropyLoss()
        self.backward_losses = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        if self.shape == "view":
            return F.cross_entropy(logits.view(-1, CLASSES), y.view(-1))
        if self.shape == "reshape":
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        if self.shape == "flatten":
            return self.criterion(logits.flatten(0, 1), y.flatten())
        assert self.shape == "nll"
        return F.nll_loss(F.log_softmax(logits, dim=-1).view(-1, CLASSES), y.view(-1))


class TaggerReference(SGDRecorder, ComposerModule):
    """The same network as a ComposerModule: (B, C, T) logits, cross-entropy against (B, T) or (B, C, T) targets."""

    def __init__(self) -> None:
        super().__init__()
        self.net = tagger()
        self.backward_losses = []

    def forward(self, batch: Any) -> torch.Tensor:
        return self.net(batch[0]).transpose(1, 2)

    def loss(self, outputs: torch.Tensor, batch: Any, reduction: str = "mean") -> torch.Tensor:
        return F.cross_entropy(outputs, batch[1], reduction=reduction)


SEQUENCE_ALGORITHMS = {
    "LabelSmoothing": lambda: [LabelSmoothing(0.1)],
    "MixUp": lambda: [MixUp(0.4)],
    "MixUp-interpolate": lambda: [MixUp(0.4, interpolate_loss=True)],
    "SelectiveBackprop": lambda: [SelectiveBackprop(start="1ba", end=1.0, keep=0.5, interrupt=0)],
    "all three": lambda: [SelectiveBackprop(start="1ba", end=1.0, interrupt=0), LabelSmoothing(0.1), MixUp(0.4)],
}


def fit(model: L.LightningModule, algorithms: list[Algorithm], loader: DataLoader) -> TargetProbe:
    probe = TargetProbe()
    callbacks = [AlgorithmEngineCallback([*algorithms, probe], seed=7)] if algorithms else []
    quiet_trainer(max_steps=STEPS, callbacks=callbacks).fit(model, loader)
    return probe


@pytest.mark.parametrize("shape", ["view", "reshape", "flatten", "nll"])
@pytest.mark.parametrize("algorithms", list(SEQUENCE_ALGORITHMS))
def test_flattened_targets_train_exactly_as_the_composer_module(algorithms: str, shape: str) -> None:
    if shape in ("reshape", "flatten", "nll") and algorithms not in ("all three", "LabelSmoothing"):
        pytest.skip("one shape per algorithm is enough; the combinations cover the others")
    expected = TaggerReference()
    expected_probe = fit(expected, SEQUENCE_ALGORITHMS[algorithms](), feature_loader())
    model = Tagger(shape)
    probe = fit(model, SEQUENCE_ALGORITHMS[algorithms](), feature_loader())

    assert len(model.backward_losses) == STEPS
    # Equal to float rounding, not bit for bit: the reference's transpose and the step's view reach the same
    # (B, T, C) gradient through different memory layouts, and the nll path computes -sum(p * log_softmax) itself.
    torch.testing.assert_close(model.backward_losses[0], expected.backward_losses[0], rtol=0, atol=0 if shape != "nll" else 1e-6)
    torch.testing.assert_close(torch.stack(model.backward_losses), torch.stack(expected.backward_losses))
    assert len(probe.targets) == STEPS
    for got, want in zip(probe.targets, expected_probe.targets, strict=True):
        assert torch.equal(got, want)  # the targets the algorithms made, per sample, in the classifier's layout
    for (name, got), want in zip(model.net.state_dict().items(), expected.net.state_dict().values(), strict=True):
        torch.testing.assert_close(got, want, msg=name)


# --- a nanoGPT-style language model with ignored positions --------------------------------------------
class TinyGPT(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wte = torch.nn.Embedding(VOCAB, 16)
        self.wpe = torch.nn.Embedding(T, 16)
        self.lm_head = torch.nn.Linear(16, VOCAB)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, ignore_index: int = -1,
                smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        logits = self.lm_head(torch.tanh(h))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=ignore_index,
                               label_smoothing=smoothing)
        return logits, loss


def token_loader(ignore_index: int) -> DataLoader:
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(1, VOCAB, (4 * B, T + 1), generator=g)
    x, y = tokens[:, :-1].clone(), tokens[:, 1:].clone()
    y[:, -2:] = ignore_index  # padding at the end of each sequence, as a collator writes it
    y[::3, 0] = ignore_index
    return DataLoader(TensorDataset(x, y), batch_size=B)


class GPTModule(SGDRecorder, L.LightningModule):
    """nanoGPT's loss line inside the model (``"inside"``) or in the step with a criterion (``"criterion"``)."""

    def __init__(self, ignore_index: int, shape: str, smoothing: float = 0.0) -> None:
        super().__init__()
        self.model, self.ignore_index, self.shape, self.smoothing = TinyGPT(), ignore_index, shape, smoothing
        self.criterion = torch.nn.CrossEntropyLoss(ignore_index=ignore_index, label_smoothing=smoothing)
        self.backward_losses = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.shape == "inside":
            _, loss = self.model(x, y, self.ignore_index, self.smoothing)
            return loss
        logits, _ = self.model(x)
        return self.criterion(logits.view(-1, VOCAB), y.view(-1))


@pytest.mark.parametrize("shape", ["inside", "criterion"])
@pytest.mark.parametrize("ignore_index", [-1, -100, 0])
def test_label_smoothing_with_ignore_index_equals_torchs_label_smoothing(ignore_index: int, shape: str) -> None:
    expected = GPTModule(ignore_index, shape, smoothing=0.2)  # plain Lightning, torch's label_smoothing=
    fit(expected, [], token_loader(ignore_index))
    model = GPTModule(ignore_index, shape)
    fit(model, [LabelSmoothing(0.2)], token_loader(ignore_index))

    torch.testing.assert_close(torch.stack(model.backward_losses), torch.stack(expected.backward_losses))
    for (name, got), want in zip(model.state_dict().items(), expected.state_dict().values(), strict=True):
        torch.testing.assert_close(got, want, msg=name)
    # ignored positions count for nothing: the first step's loss is torch's on the kept positions alone
    x, y = next(iter(token_loader(ignore_index)))
    logits, _ = GPTModule(ignore_index, shape).model(x)
    kept = y.view(-1) != ignore_index
    torch.testing.assert_close(model.backward_losses[0],
                               F.cross_entropy(logits.view(-1, VOCAB)[kept], y.view(-1)[kept], label_smoothing=0.2))


def test_mixing_targets_with_an_ignore_index_is_refused_before_training() -> None:
    class IgnoringTagger(Tagger):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self(x).view(-1, CLASSES), y.view(-1), ignore_index=3)

    model = IgnoringTagger("view")
    before = model.net[0].weight.clone()
    with pytest.raises(BridgeConfigurationError, match=r"MixUp mixes each example's targets with a partner's, but "
                       r"IgnoringTagger's loss \(cross_entropy\) has ignore_index=3.*interpolate_loss=True"):
        fit(model, [MixUp(0.4)], feature_loader())
    assert torch.equal(model.net[0].weight, before)
    fit(IgnoringTagger("view"), [MixUp(0.4, interpolate_loss=True)], feature_loader())  # the fix it names trains


def test_nll_loss_on_values_that_are_not_log_probabilities_is_refused() -> None:
    class NotLogProbabilities(Tagger):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.nll_loss(self(x).view(-1, CLASSES), y.view(-1))  # logits, not log_softmax

    model = NotLogProbabilities("view")
    before = model.net[0].weight.clone()
    with pytest.raises((BridgeConfigurationError, AlgorithmError), match=r"LabelSmoothing replaces the targets by "
                       r"probabilities, and NotLogProbabilities's loss \(nll_loss\) is nll_loss.*F.log_softmax"):
        fit(model, [LabelSmoothing(0.1)], feature_loader())
    assert torch.equal(model.net[0].weight, before)


def test_targets_copied_before_the_loss_are_still_refused() -> None:
    class Copying(Tagger):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self(x).reshape(-1, CLASSES), y.transpose(0, 1).reshape(-1))  # a copy: order lost

    with pytest.raises((BridgeConfigurationError, AlgorithmError), match=r"cross_entropy with targets \(48,\) that are not"):
        fit(Copying("view"), [MixUp(0.4)], feature_loader())


def test_selective_backprop_from_the_first_step_takes_that_step_whole_and_says_so_once() -> None:
    model = Tagger("view")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, [SelectiveBackprop(start=0.0, end=1.0, keep=0.5, interrupt=0)], feature_loader())
    told = [w for w in caught if "SelectiveBackprop" in str(w.message) and "whole batch" in str(w.message)]
    assert len(told) == 1, [str(w.message) for w in caught]
    # the first step is the unselected one; from the second on the steps are selected, as with start='1ba'
    expected = Tagger("view")
    fit(expected, [SelectiveBackprop(start="1ba", end=1.0, keep=0.5, interrupt=0)], feature_loader())
    assert torch.equal(torch.stack(model.backward_losses), torch.stack(expected.backward_losses))
    assert torch.equal(model.net[0].weight, expected.net[0].weight)


# --- per-pixel targets flattened: segmentation written as a token loss ---------------------------------
def segmenter() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(2, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, CLASSES, 1))


def pixel_loader() -> DataLoader:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4 * B, 2, 8, 8, generator=g)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0.5).long()
    return DataLoader(TensorDataset(x, y), batch_size=B)


class Segmenter(SGDRecorder, L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = segmenter()
        self.backward_losses = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x).permute(0, 2, 3, 1).reshape(-1, CLASSES)  # a copy of the logits; the targets stay a view
        return F.cross_entropy(logits, y.view(-1))


class SegmenterReference(SGDRecorder, ComposerModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = segmenter()
        self.backward_losses = []

    def forward(self, batch: Any) -> torch.Tensor:
        return self.net(batch[0])

    def loss(self, outputs: torch.Tensor, batch: Any, reduction: str = "mean") -> torch.Tensor:
        return F.cross_entropy(outputs, batch[1], reduction=reduction)


@pytest.mark.parametrize("algorithm", ["CutMix", "MixUp", "LabelSmoothing"])
def test_flattened_per_pixel_targets_train_as_the_composer_module(algorithm: str) -> None:
    make = {"CutMix": lambda: CutMix(1.0), "MixUp": lambda: MixUp(0.4), "LabelSmoothing": lambda: LabelSmoothing(0.1)}
    expected = SegmenterReference()
    expected_probe = fit(expected, [make[algorithm]()], pixel_loader())
    model = Segmenter()
    probe = fit(model, [make[algorithm]()], pixel_loader())
    torch.testing.assert_close(torch.stack(model.backward_losses), torch.stack(expected.backward_losses))
    for got, want in zip(probe.targets, expected_probe.targets, strict=True):
        assert torch.equal(got, want)  # CutMix pastes the partner's box into the (B, H, W) targets
    for (name, got), want in zip(model.net.state_dict().items(), expected.net.state_dict().values(), strict=True):
        torch.testing.assert_close(got, want, msg=name)


class WeightedGPT(GPTModule):
    """A class ``weight=`` beside padding: torch's mean divides by the kept positions' summed class weights."""

    def __init__(self, explicit_ignore_index: bool, reduction: str = "mean", smoothing: float = 0.0) -> None:
        super().__init__(-1 if explicit_ignore_index else -100, "criterion", smoothing)
        self.class_weight = torch.linspace(0.5, 2.0, VOCAB)
        self.explicit_ignore_index, self.reduction = explicit_ignore_index, reduction
        self.criterion = torch.nn.CrossEntropyLoss(weight=self.class_weight, reduction=reduction,
                                                   label_smoothing=smoothing, ignore_index=self.ignore_index)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.explicit_ignore_index:  # a criterion with ignore_index=-1: seen at setup
            return super().training_step(batch, batch_idx)
        x, y = batch  # inline, torch's default ignore_index (-100): the padding is seen in the step
        logits, _ = self.model(x)
        return F.cross_entropy(logits.view(-1, VOCAB), y.view(-1), weight=self.class_weight,
                               reduction=self.reduction, label_smoothing=self.smoothing)


@pytest.mark.parametrize("explicit_ignore_index", [True, False])
def test_a_class_weight_with_ignored_positions_and_a_mean_is_refused_before_any_update(explicit_ignore_index: bool) -> None:
    model = WeightedGPT(explicit_ignore_index)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises((BridgeConfigurationError, AlgorithmError), match=r"LabelSmoothing|the algorithms") as raised:
        fit(model, [LabelSmoothing(0.2)], token_loader(model.ignore_index))
    assert "weight=" in str(raised.value) and "reduction='sum'" in str(raised.value)
    # a criterion's ignore_index is known at setup, which names the algorithm; an inline call's padding shows in the step
    assert str(raised.value).startswith("LabelSmoothing replaces" if explicit_ignore_index else "the algorithms replace")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the refused step changed nothing


# The summed loss's gradients are 48 tokens large, and SGD at lr 0.5 with momentum moves the weights by up to 12 in
# 4 steps: float32 rounding alone, which another CPU's vector width changes, moves them by more than
# assert_close's default tolerance. Both float32 runs (the bridge's and torch's label_smoothing=) are held to the
# bound of what rounding may change against torch's in float64: a chain of about REDUCTIONS float32 sums per step
# (lm_head 16, log-softmax and the smoothing's sum over 11 classes, the sum over 48 tokens; backward: 11 classes,
# the weight and embedding gradients over 48 tokens). Measured: both runs within 0.1 of the bound on the AVX-512,
# AVX2 and scalar kernels; LabelSmoothing(0.201) is 500 x over it.
REDUCTIONS = 150


def test_a_class_weight_with_ignored_positions_and_a_sum_equals_torchs_label_smoothing() -> None:
    start = {k: v.clone() for k, v in WeightedGPT(True, reduction="sum").state_dict().items()}
    exact = WeightedGPT(True, reduction="sum", smoothing=0.2)  # plain Lightning, torch's label_smoothing=, float64
    quiet_trainer(max_steps=STEPS, precision="64-true").fit(exact, token_loader(-1))
    expected = WeightedGPT(True, reduction="sum", smoothing=0.2)  # the same in float32
    fit(expected, [], token_loader(-1))
    model = WeightedGPT(True, reduction="sum")
    fit(model, [LabelSmoothing(0.2)], token_loader(-1))
    torch.testing.assert_close(torch.stack(model.backward_losses), torch.stack(expected.backward_losses))
    assert_float32_runs_near_float64({"bridge": model.state_dict(), "torch": expected.state_dict()},
                                     exact.state_dict(), start, REDUCTIONS, STEPS)
