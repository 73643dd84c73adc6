"""Loss and target algorithms on a plain LightningModule equal the ComposerModule path, or are refused.

The reference for every comparison is the same network trained as a ComposerModule (the path the
algorithms were written for) with the same data, seed and algorithms: the losses given to
backward, the targets the loss saw and the final weights must be equal (``torch.equal``: the same
functions run on the same tensors, so no tolerance is needed).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torchmetrics
from helpers.plain_loss_probes import Recorder, TargetProbe
from helpers.support import ComposerClassifier, ComposerModule, L, image_dataset, quiet_trainer
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import (
    Algorithm,
    AlgorithmEngineCallback,
)
from composer_bridge.algorithms import CutMix, LabelSmoothing, MixUp, SelectiveBackprop
from composer_bridge.lightning.setup_checks import BridgeConfigurationError

CLASSES = 4


def network() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 64, CLASSES)
    )


def loader(targets: str = "index") -> DataLoader:
    x, y = image_dataset(80).tensors
    if targets == "multilabel":  # BCE-with-logits: one float column per class
        y = F.one_hot(y, CLASSES).float()
    elif targets == "probabilities":  # cross-entropy on the dataset's own soft labels
        y = F.one_hot(y, CLASSES).float() * 0.7 + 0.3 / CLASSES
    return DataLoader(TensorDataset(x, y), batch_size=16)


class Plain(Recorder, L.LightningModule):
    """A classifier written the usual Lightning way: the loss is computed inside training_step."""

    def __init__(self, shape: str = "criterion", loss: str = "ce") -> None:
        super().__init__()
        self.net = network()
        self.shape, self.loss_kind = shape, loss
        self.criterion = torch.nn.CrossEntropyLoss() if loss == "ce" else torch.nn.BCEWithLogitsLoss()
        self.backward_losses = []
        self.seen_targets: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        if self.shape == "criterion":
            loss = self.criterion(logits, y)
        elif self.loss_kind == "ce":
            loss = F.cross_entropy(logits, y)
        else:
            loss = F.binary_cross_entropy_with_logits(logits, y)
        self.seen_targets.append(y.clone())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class CrossEntropyReference(Recorder, ComposerClassifier):
    def __init__(self) -> None:
        super().__init__(network(), CLASSES, optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
        self.backward_losses = []

    @property
    def net(self) -> torch.nn.Module:
        return self.module

    def update_train_metrics(self, outputs: Any, batch: Any, loss: torch.Tensor) -> None:
        pass


class BCEReference(Recorder, ComposerModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = network()
        self.backward_losses = []

    def forward(self, batch: Any) -> torch.Tensor:
        return self.net(batch[0])

    def loss(self, outputs: torch.Tensor, batch: Any, reduction: str = "mean") -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(outputs, batch[1], reduction=reduction)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


ALGORITHMS = {
    "LabelSmoothing": lambda: [LabelSmoothing(0.1)],
    "MixUp": lambda: [MixUp(0.4)],
    "MixUp-interpolate": lambda: [MixUp(0.4, interpolate_loss=True)],
    "CutMix": lambda: [CutMix(1.0)],
    "CutMix-interpolate": lambda: [CutMix(1.0, interpolate_loss=True)],
    "SelectiveBackprop": lambda: [SelectiveBackprop(start="1ba", end=1.0, keep=0.5, interrupt=0)],
    "all four": lambda: [SelectiveBackprop(start="1ba", end=1.0, interrupt=0), LabelSmoothing(0.1), MixUp(0.4)],
}


def train(model: L.LightningModule, algorithms: list[Algorithm], targets: str) -> TargetProbe:
    probe = TargetProbe()
    quiet_trainer(max_steps=5, callbacks=[AlgorithmEngineCallback([*algorithms, probe], seed=7)]).fit(model, loader(targets))
    return probe


_REFERENCES: dict[tuple[str, str], tuple[L.LightningModule, TargetProbe]] = {}


def reference(algorithms: str, targets: str) -> tuple[L.LightningModule, TargetProbe]:
    key = (algorithms, targets)
    if key not in _REFERENCES:
        model = BCEReference() if targets == "multilabel" else CrossEntropyReference()
        _REFERENCES[key] = (model, train(model, ALGORITHMS[algorithms](), targets))
    return _REFERENCES[key]


@pytest.mark.parametrize("targets", ["index", "multilabel"])
@pytest.mark.parametrize("shape", ["criterion", "functional"])
@pytest.mark.parametrize("algorithms", list(ALGORITHMS))
def test_plain_module_trains_exactly_as_the_composer_module(algorithms: str, shape: str, targets: str) -> None:
    expected, expected_probe = reference(algorithms, targets)
    model = Plain(shape, "ce" if targets == "index" else "bce")
    probe = train(model, ALGORITHMS[algorithms](), targets)

    assert len(model.backward_losses) == 5
    assert torch.equal(torch.stack(model.backward_losses), torch.stack(expected.backward_losses))
    assert len(probe.targets) == 5
    for got, want in zip(probe.targets, expected_probe.targets, strict=True):
        assert torch.equal(got, want)
    for (name, got), want in zip(model.net.state_dict().items(), expected.net.state_dict().values(), strict=True):
        assert torch.equal(got, want), name


@pytest.mark.parametrize("algorithms", ["LabelSmoothing", "MixUp"])
def test_probability_targets_from_the_dataset(algorithms: str) -> None:
    expected, _ = reference(algorithms, "probabilities")
    model = Plain("functional", "ce")
    train(model, ALGORITHMS[algorithms](), "probabilities")
    assert torch.equal(torch.stack(model.backward_losses), torch.stack(expected.backward_losses))
    assert torch.equal(model.net[0].weight, expected.net[0].weight)


def test_the_users_targets_metrics_and_validation_are_untouched() -> None:
    class WithMetrics(Plain):
        def __init__(self) -> None:
            super().__init__("criterion")
            self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)
            self.val_losses: list[torch.Tensor] = []
            self.val_expected: list[torch.Tensor] = []
            self.batch_targets: list[torch.Tensor] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            self.batch_targets.append(batch[1].clone())  # read from the batch again, after the loss call
            self.train_acc(self(batch[0]).detach(), batch[1])  # integer targets, as torchmetrics needs
            self.log("train_acc", self.train_acc)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            logits = self(x)
            self.val_losses.append(self.criterion(logits, y).detach())
            self.val_expected.append(F.cross_entropy(logits, y).detach())

    model = WithMetrics()
    quiet_trainer(max_steps=3, limit_val_batches=1, val_check_interval=3,
                  callbacks=[AlgorithmEngineCallback([MixUp(0.4), LabelSmoothing(0.3)], seed=7)]).fit(
        model, loader(), loader())
    labels = loader().dataset.tensors[1]
    for step, (seen, in_batch) in enumerate(zip(model.seen_targets, model.batch_targets, strict=True)):
        assert torch.equal(seen, labels[16 * step:16 * step + 16])  # the batch's own integer labels
        assert torch.equal(in_batch, seen)  # the batch (a list, changed in place by nothing) still holds them
    assert model.val_losses and torch.equal(torch.stack(model.val_losses), torch.stack(model.val_expected))
    assert 0.0 <= float(model.train_acc.compute()) <= 1.0


def test_the_patch_is_scoped_to_the_step_and_its_thread() -> None:
    original = F.cross_entropy
    from_other_thread: list[torch.Tensor] = []
    unsmoothed: list[torch.Tensor] = []

    class Threaded(Plain):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            logits = self(x)
            worker = threading.Thread(target=lambda: from_other_thread.append(F.cross_entropy(logits.detach(), y)))
            worker.start()
            worker.join()
            unsmoothed.append(original(logits.detach(), y))
            return F.cross_entropy(logits, y)

    model = Threaded("functional")
    train(model, [LabelSmoothing(0.5)], "index")
    assert F.cross_entropy is original and torch.nn.functional.cross_entropy is original
    assert torch.equal(torch.stack(from_other_thread), torch.stack(unsmoothed))  # the other thread: plain CE
    assert not torch.equal(torch.stack(model.backward_losses), torch.stack(unsmoothed))  # this thread: smoothed


def test_the_patch_is_restored_when_the_step_raises() -> None:
    class Failing(Plain):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            super().training_step(batch, batch_idx)
            raise RuntimeError("user error")

    original = F.cross_entropy
    with pytest.raises(RuntimeError, match="user error"):
        train(Failing(), [LabelSmoothing(0.1)], "index")
    assert F.cross_entropy is original


def test_an_auxiliary_head_gets_the_same_targets() -> None:
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    class TwoHeads(Plain):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            logits = self(x)
            aux = logits * 0.5
            main, second = F.cross_entropy(logits, y), F.cross_entropy(aux, y)
            seen.append((second.detach(), F.cross_entropy(aux.detach(), F.one_hot(y, CLASSES) * 0.7 + 0.3 / CLASSES)))
            return main + 0.4 * second

    train(TwoHeads("functional"), [LabelSmoothing(0.3)], "index")
    assert seen and all(torch.equal(got, want) for got, want in seen)


# --- refusals: at setup, or in the first step before any backward ------------------------------------------


def fit_refused(model: Plain, algorithms: list[Algorithm], match: str, targets: str = "index") -> None:
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(BridgeConfigurationError, match=match):
        train(model, algorithms, targets)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed before the refusal"
    assert F.cross_entropy is torch.nn.modules.loss.F.cross_entropy


class InlineLoss(Plain):
    def __init__(self, loss_fn: Any) -> None:
        super().__init__("functional")
        self.loss_fn = loss_fn

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.loss_fn(self(x), y)


class LogSoftmaxNLL(Plain):
    """The other classic classifier shape: nn.LogSoftmax then nn.NLLLoss."""

    def __init__(self) -> None:
        super().__init__("criterion")
        self.log_softmax, self.criterion = torch.nn.LogSoftmax(dim=1), torch.nn.NLLLoss()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.criterion(self.log_softmax(self(x)), y)


@pytest.mark.parametrize("shape", ["modules", "functional"])
@pytest.mark.parametrize("algorithms", ["LabelSmoothing", "MixUp", "CutMix", "SelectiveBackprop", "all four"])
def test_nll_loss_on_log_probabilities_trains_as_the_cross_entropy_module(algorithms: str, shape: str) -> None:
    if shape == "functional" and algorithms not in ("LabelSmoothing", "all four"):
        pytest.skip("the modules cover each algorithm; the functional form is the same call")
    model = LogSoftmaxNLL() if shape == "modules" else InlineLoss(lambda out, y: F.nll_loss(F.log_softmax(out, 1), y))
    probe = train(model, ALGORITHMS[algorithms](), "index")
    expected, expected_probe = reference(algorithms, "index")
    # -sum(p * log_softmax(logits)) is cross-entropy's maths, computed by the bridge: equal to float rounding
    torch.testing.assert_close(torch.stack(model.backward_losses), torch.stack(expected.backward_losses))
    for got, want in zip(probe.targets, expected_probe.targets, strict=True):
        assert torch.equal(got, want)
    torch.testing.assert_close(model.net[0].weight, expected.net[0].weight)


def test_nll_loss_keeps_working_where_the_targets_stay_indices() -> None:
    model = InlineLoss(lambda out, y: F.nll_loss(F.log_softmax(out, 1), y))
    train(model, [MixUp(0.4, interpolate_loss=True)], "index")
    expected, _ = reference("MixUp-interpolate", "index")
    torch.testing.assert_close(torch.stack(model.backward_losses), torch.stack(expected.backward_losses))


def test_criterion_label_smoothing_with_target_algorithms_is_refused_at_setup() -> None:
    model = Plain("criterion")
    model.criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    fit_refused(model, [LabelSmoothing(0.1)], r"label_smoothing=0.1.*smoothing twice")


def test_ignore_index_with_probability_targets_is_refused_in_the_first_step() -> None:
    fit_refused(InlineLoss(lambda out, y: F.cross_entropy(out, y, ignore_index=3)), [CutMix()],
                r"CutMix .*ignore_index=3")


def test_a_loss_the_bridge_cannot_see_is_refused_in_the_first_step() -> None:
    fit_refused(InlineLoss(lambda out, y: F.mse_loss(out.softmax(1), F.one_hot(y, CLASSES).float())),
                [LabelSmoothing(0.1)],
                r"LabelSmoothing acts on the loss .* no call of cross_entropy.*Fix: compute the loss in training_step")


def test_derived_targets_are_refused_in_the_first_step() -> None:
    fit_refused(InlineLoss(lambda out, y: F.binary_cross_entropy_with_logits(out[:, 0], (y == 0).float())),
                [MixUp()], r"binary_cross_entropy_with_logits with targets \(16,\) that are not that tensor")


def test_a_direct_import_is_named_in_the_refusal() -> None:
    from torch.nn.functional import cross_entropy

    globals()["imported_cross_entropy"] = cross_entropy
    try:
        fit_refused(InlineLoss(lambda out, y: cross_entropy(out, y)), [LabelSmoothing()],
                    r"imports imported_cross_entropy by name")
    finally:
        del globals()["imported_cross_entropy"]


def test_interpolating_a_loss_with_other_terms_is_refused() -> None:
    fit_refused(InlineLoss(lambda out, y: F.cross_entropy(out, y) + 0.01 * out.pow(2).mean()),
                [MixUp(interpolate_loss=True)], r"MixUp interpolates .* returns a loss other than the cross_entropy")


def test_interpolating_with_manual_optimization_is_refused_at_setup() -> None:
    model = Plain()
    model.automatic_optimization = False
    fit_refused(model, [CutMix(interpolate_loss=True)], r"CutMix interpolates .*automatic_optimization=False")


def test_selective_backprop_needs_the_forward_the_step_uses() -> None:
    class OtherForward(Plain):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self.net(x) * 2, y)

    model = OtherForward("functional")
    with pytest.raises(BridgeConfigurationError, match=r"SelectiveBackprop ranks the examples with OtherForward\(inputs\)"):
        train(model, [SelectiveBackprop(start="1ba", end=1.0, interrupt=0)], "index")


@pytest.mark.parametrize("saved", ["during fit", "after fit"])
def test_a_resumed_plain_run_equals_the_uninterrupted_one(saved: str, tmp_path: Any) -> None:
    def algorithms() -> list[Algorithm]:
        return [SelectiveBackprop(start="1ba", end=1.0, interrupt=2), LabelSmoothing(0.1), CutMix(1.0)]

    uninterrupted = Plain("criterion")
    quiet_trainer(max_epochs=2, callbacks=[AlgorithmEngineCallback(algorithms(), seed=7)]).fit(uninterrupted, loader())

    # The checkpoint records the loss the steps computed, so the resumed run's first step (a
    # selective one) can rank its examples: written during fit, as ModelCheckpoint does, or after
    # it, with trainer.save_checkpoint.
    checkpoint = tmp_path / "epoch1.ckpt"
    if saved == "during fit":
        saving = L.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="epoch1", save_on_train_epoch_end=True)
        quiet_trainer(max_epochs=1, enable_checkpointing=True,
                      callbacks=[AlgorithmEngineCallback(algorithms(), seed=7), saving]).fit(Plain("criterion"), loader())
    else:
        first = quiet_trainer(max_epochs=1, callbacks=[AlgorithmEngineCallback(algorithms(), seed=7)])
        first.fit(Plain("criterion"), loader())
        first.save_checkpoint(checkpoint)
    resumed = Plain("criterion")
    quiet_trainer(max_epochs=2, callbacks=[AlgorithmEngineCallback(algorithms(), seed=7)]).fit(
        resumed, loader(), ckpt_path=checkpoint)

    assert torch.equal(torch.stack(resumed.backward_losses), torch.stack(uninterrupted.backward_losses[5:]))
    for (name, got), want in zip(resumed.state_dict().items(), uninterrupted.state_dict().values(), strict=True):
        assert torch.equal(got, want), name


@pytest.mark.parametrize("name", ["plain_loss", "plain_loss.torch_functions", "plain_loss.seen_call",
                                  "plain_loss.setup_refusals", "plain_loss.step_events"])
def test_docstring_examples_hold(name: str) -> None:
    import doctest
    import importlib

    module = importlib.import_module(f"composer_bridge.lightning.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_the_loss_calls_own_options_pass_through() -> None:
    weight = torch.tensor([1.0, 2.0, 0.5, 1.5])

    class WeightedSum(Recorder, ComposerModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = network()
            self.backward_losses = []

        def forward(self, batch: Any) -> torch.Tensor:
            return self.net(batch[0])

        def loss(self, outputs: torch.Tensor, batch: Any, reduction: str = "sum") -> torch.Tensor:
            targets = batch[1].to(outputs.dtype) if batch[1].is_floating_point() else batch[1]
            return F.cross_entropy(outputs, targets, weight=weight, reduction=reduction)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class PlainWeightedSum(Plain):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self(x), y, weight, None, -100, None, "sum")  # positional, as some code does

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def algorithms() -> list[Algorithm]:
        return [SelectiveBackprop(start="1ba", end=1.0, interrupt=0), LabelSmoothing(0.2)]

    expected, plain = WeightedSum(), PlainWeightedSum("functional")
    train(expected, algorithms(), "index")
    train(plain, algorithms(), "index")
    assert torch.equal(torch.stack(plain.backward_losses), torch.stack(expected.backward_losses))
    assert torch.equal(plain.net[3].weight, expected.net[3].weight)
