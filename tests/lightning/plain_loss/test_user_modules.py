"""Modules as users bring them (Lightning's demos, a torchmetrics classifier, a Hugging Face model in the
user's own module) with the loss algorithms and one algorithm of each other family: each either acts
(its events ran; for a loss the bridge can see, the loss is the one with the new targets) or is refused
with a message naming the algorithm, what was seen and the fix, before any weight changes."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torchmetrics
from helpers.support import L, image_dataset, quiet_trainer
from torch.utils.data import DataLoader, TensorDataset

from composer_bridge import AlgorithmEngineCallback
from composer_bridge.algorithms import EMA, CutMix, GradientClipping, LabelSmoothing, MixUp, SelectiveBackprop
from composer_bridge.core.algorithm import AlgorithmError
from composer_bridge.functional import smooth_labels
from composer_bridge.lightning.setup_checks import BridgeConfigurationError

# Lightning's own demo modules, from the package under test
LightningTransformer = importlib.import_module(f"{L.__name__}.demos").LightningTransformer
_boring_classes = importlib.import_module(f"{L.__name__}.demos.boring_classes")
BoringModel, RandomDataset = _boring_classes.BoringModel, _boring_classes.RandomDataset

transformers = pytest.importorskip("transformers")


class MetricsClassifier(L.LightningModule):
    """The usual torchmetrics classifier: criterion, accuracy on the integer targets, logging."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 4))
        self.criterion = torch.nn.CrossEntropyLoss()
        self.acc = torchmetrics.Accuracy(task="multiclass", num_classes=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = self.criterion(logits, y)
        self.acc(logits, y)
        self.log_dict({"train_loss": loss, "train_acc": self.acc})
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class HFClassifier(L.LightningModule):
    """A user's own module around a Hugging Face model: the model computes the loss from ``labels``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        config = transformers.BertConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                                         vocab_size=50, max_position_embeddings=16, num_labels=3,
                                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        self.model = transformers.BertForSequenceClassification(config)
        self.seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        out = self.model(**batch)
        self.seen.append((out.loss.detach(), out.logits.detach(), batch["labels"].clone()))
        return out.loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def hf_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    ids, labels = torch.randint(0, 50, (16, 8), generator=g), torch.randint(0, 3, (16,), generator=g)
    rows = [{"input_ids": i, "labels": y} for i, y in zip(ids, labels, strict=True)]
    return DataLoader(rows, batch_size=8)


def token_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (8, 9), generator=g)
    return DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4)


class OfflineTransformer(LightningTransformer):
    def prepare_data(self) -> None:  # the demo downloads WikiText-2 here; the tests feed random tokens
        pass


def transformer() -> LightningTransformer:
    torch.manual_seed(0)
    return OfflineTransformer(vocab_size=50)


MODULES = {
    "BoringModel": (BoringModel, lambda: DataLoader(RandomDataset(32, 16), batch_size=4), 1),
    "LightningTransformer": (transformer, token_loader, 1),
    "MetricsClassifier": (MetricsClassifier, lambda: DataLoader(image_dataset(16), batch_size=4), 1),
    "HFClassifier": (HFClassifier, hf_loader, "labels"),
}
SB = dict(start="1ba", end=1.0, interrupt=0)
ALGORITHMS = {
    "LabelSmoothing": lambda key: LabelSmoothing(0.1, target_key=key),
    "MixUp": lambda key: MixUp(0.4, target_key=key),
    "CutMix": lambda key: CutMix(1.0, target_key=key),
    "SelectiveBackprop": lambda key: SelectiveBackprop(**SB, target_key=key),
    "EMA": lambda key: EMA(half_life="1ba"),
    "GradientClipping": lambda key: GradientClipping("norm", 1.0),
}
# (module, algorithm) -> what the refusal says; anything not listed must act.
REFUSED = {
    **{("BoringModel", a): r"training_step receives one tensor of shape \(4, 32\)" for a in list(ALGORITHMS)[:4]},
    ("LightningTransformer", "MixUp"): r"MixUp mixes the inputs at input_key=0, but they are torch.int64",
    ("LightningTransformer", "CutMix"): r"CutMix mixes the inputs at input_key=0, but they are torch.int64",
    # the demo's forward(inputs, target) needs the targets: no forward pass on the inputs alone to rank by
    ("LightningTransformer", "SelectiveBackprop"): r"SelectiveBackprop runs OfflineTransformer's forward on the batch's "
                                                   r"inputs alone .*missing 1 required positional argument: 'target'",
    ("HFClassifier", "MixUp"): r"MixUp reads the inputs at 0",
    ("HFClassifier", "CutMix"): r"CutMix reads the inputs at 0",
    ("HFClassifier", "SelectiveBackprop"): r"SelectiveBackprop reads the inputs at 0",
}


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("module", list(MODULES))
def test_third_party_module_acts_or_refuses_clearly(module: str, algorithm: str) -> None:
    make_model, make_loader, target_key = MODULES[module]
    model = make_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    callback = AlgorithmEngineCallback([ALGORITHMS[algorithm](target_key)], seed=0)
    trainer = quiet_trainer(max_steps=3, callbacks=[callback])
    refusal = REFUSED.get((module, algorithm))
    if refusal is not None:
        with pytest.raises((BridgeConfigurationError, AlgorithmError), match=refusal):
            trainer.fit(model, make_loader())
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items()), "weights changed before refusal"
        return
    trainer.fit(model, make_loader())
    ran = {key for key, (calls, _) in callback.cost.items() if calls > 0}
    assert any(key.startswith(f"{algorithm}/") for key in ran), ran
    assert not all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    if module == "HFClassifier" and algorithm == "LabelSmoothing":  # the model's own loss got the smoothed labels
        for loss, logits, labels in model.seen:
            torch.testing.assert_close(loss, F.cross_entropy(logits, smooth_labels(logits, labels, 0.1)))


def test_lightning_demo_transformer_with_label_smoothing_equals_torchs_label_smoothing() -> None:
    """The demo's nll_loss(log_softmax(...).view(-1, V), target.view(-1)) with LabelSmoothing against the same demo,
    no bridge, whose step gives torch's cross_entropy(label_smoothing=0.1) the same log-probabilities (log_softmax
    of log-probabilities is themselves, so this is the smoothed loss of the logits)."""

    class TorchSmoothing(OfflineTransformer):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            inputs, target = batch
            return F.cross_entropy(self(inputs, target), target.view(-1), label_smoothing=0.1)

    torch.manual_seed(0)
    expected = TorchSmoothing(vocab_size=50)
    quiet_trainer(max_steps=2).fit(expected, token_loader())
    model = transformer()
    quiet_trainer(max_steps=2, callbacks=[AlgorithmEngineCallback([LabelSmoothing(0.1)], seed=0)]).fit(model, token_loader())
    for (name, got), want in zip(model.state_dict().items(), expected.state_dict().values(), strict=True):
        torch.testing.assert_close(got, want, msg=name)
